"""NVML without the library: the in-memory fake of the tests (``FakeNvml``) and NVML facts
recorded as files under a host's root (``RecordedNvml``), which ``FakeNvml.files`` writes, so
that an offline root has NVML facts too."""

from __future__ import annotations

import errno

import msgspec

from ..host import Host, HostError, PhaseCache, Read, Reply
from ..linux.pciaddr import normalize_address
from .nvmlapi import (
    ECC_COUNTS,
    PERSISTENCE,
    RECORDED_NVML,
    RECORDED_READS,
    NvmlNotSupported,
    NvmlPermissionError,
    RemappedRows,
    persistence_text,
)

UNSUPPORTED = "[Not Supported]"
"""A recorded health fact the GPU does not support, as nvidia-smi prints it."""


class FakeGpu(msgspec.Struct):
    persistence_mode: bool = False
    max_link_generation: int = 5
    power_limit: int = 600_000
    """Enforced power limit, mW."""
    power_limit_range: tuple[int, int] = (150_000, 600_000)
    ecc_current: bool = True
    ecc_pending: bool = True
    bar1_total: int = 128 * 2**30
    name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    temperature: int = 40
    """nvmlDeviceGetTemperature(GPU), C."""
    clocks_event_reasons: int = 0x1
    """nvmlDeviceGetCurrentClocksEventReasons's bits (0x1: GPU idle)."""
    ecc_errors: dict[str, int] = msgspec.field(default_factory=dict)
    """nvmlDeviceGetTotalEccErrors by count (``ECC_COUNTS``); a count not named is 0."""
    remapped_rows: tuple[int, int, bool, bool] = (0, 0, False, False)
    """nvmlDeviceGetRemappedRows: (corrected, uncorrected, pending, failure)."""
    retired_pages_pending: bool = False
    unsupported: tuple[str, ...] = ()
    """Health facts the driver does not support on this GPU (``HEALTH``' names)."""


class FakeNvml(msgspec.Struct):
    """An in-memory NVML for tests and recorded fake hosts."""

    driver: str = "580.95.05"
    devices: dict[str, FakeGpu] = msgspec.field(default_factory=dict)
    """address -> state, in NVML's index order."""
    p2p: dict[str, str] = msgspec.field(default_factory=dict)
    """``A->B`` -> a reason, for pairs whose P2P read status is not ok."""
    topologies: dict[str, str] = msgspec.field(default_factory=dict)
    """``A->B`` -> PIX/PXB/PHB/NODE/SYS."""
    setter_needs_root: bool = False
    set_calls: list[tuple[str, bool]] = msgspec.field(default_factory=list)
    library: str | None = None
    """nvmlSystemGetNVMLVersion; None: ``13.`` and the driver's version, as they ship."""

    def driver_version(self) -> str:
        return self.driver

    def gpus(self) -> list[str]:
        return list(self.devices)

    def _gpu(self, address: str) -> FakeGpu:
        if address not in self.devices:
            raise HostError(f"NVML has no GPU at {address}")
        return self.devices[address]

    def persistence_mode(self, address: str) -> bool:
        return self._gpu(address).persistence_mode

    def set_persistence_mode(self, address: str, enabled: bool) -> None:
        if self.setter_needs_root:
            raise NvmlPermissionError("NVML refused (Insufficient Permissions): setting "
                                      "persistence mode needs root")
        self.set_calls.append((address, enabled))
        self._gpu(address).persistence_mode = enabled

    def max_link_generation(self, address: str) -> int:
        return self._gpu(address).max_link_generation

    def p2p_read_status(self, source: str, target: str) -> str:
        self._gpu(source), self._gpu(target)
        return self.p2p.get(f"{source}->{target}", "ok")

    def topology(self, one: str, other: str) -> str | None:
        return self.topologies.get(f"{one}->{other}") or self.topologies.get(f"{other}->{one}")

    def library_version(self) -> str:
        return self.library or f"13.{self.driver}"

    def _refuse(self, what: str) -> None:
        if self.setter_needs_root:
            raise NvmlPermissionError(f"NVML refused (Insufficient Permissions): setting {what} "
                                      "needs root")

    def power_limit(self, address: str) -> int:
        return self._gpu(address).power_limit

    def power_limit_range(self, address: str) -> tuple[int, int]:
        return self._gpu(address).power_limit_range

    def set_power_limit(self, address: str, milliwatts: int) -> None:
        self._refuse("the power limit")
        gpu = self._gpu(address)
        low, high = gpu.power_limit_range
        if not low <= milliwatts <= high:
            raise HostError(f"NVML nvmlDeviceSetPowerManagementLimit failed: Invalid Argument "
                            f"({milliwatts} mW outside {low}-{high})")
        gpu.power_limit = milliwatts

    def ecc_mode(self, address: str) -> tuple[bool, bool]:
        gpu = self._gpu(address)
        return gpu.ecc_current, gpu.ecc_pending

    def set_ecc_mode(self, address: str, enabled: bool) -> None:
        self._refuse("the ECC mode")
        self._gpu(address).ecc_pending = enabled

    def bar1_total(self, address: str) -> int:
        return self._gpu(address).bar1_total

    def _health(self, address: str, fact: str) -> FakeGpu:
        gpu = self._gpu(address)
        if fact in gpu.unsupported:
            raise NvmlNotSupported(f"NVML {fact} of {address}: Not Supported")
        return gpu

    def name(self, address: str) -> str:
        return self._health(address, "name").name

    def ecc_errors(self, address: str, count: str) -> int:
        return self._health(address, "ecc_errors").ecc_errors.get(count, 0)

    def remapped_rows(self, address: str) -> RemappedRows:
        return RemappedRows(*self._health(address, "remapped_rows").remapped_rows)

    def retired_pages_pending(self, address: str) -> bool:
        return self._health(address, "retired_pages_pending").retired_pages_pending

    def temperature(self, address: str) -> int:
        return self._health(address, "temperature").temperature

    def clocks_event_reasons(self, address: str) -> int:
        return self._health(address, "clocks_event_reasons").clocks_event_reasons

    def files(self) -> dict[str, str]:
        """This state as the files of a recorded NVML directory (see ``RecordedNvml``)."""
        files = {"driver_version": self.driver + "\n",
                 "library_version": self.library_version() + "\n",
                 "gpus": "".join(f"{a}\n" for a in self.devices),
                 "p2p_read_status": "".join(f"{k} {v}\n" for k, v in sorted(self.p2p.items())),
                 "topology": "".join(f"{k} {v}\n" for k, v in sorted(self.topologies.items()))}
        for address, gpu in self.devices.items():
            mode = persistence_text(gpu.persistence_mode).capitalize()
            files[f"{address}/persistence_mode"] = mode + "\n"
            files[f"{address}/max_link_generation"] = f"{gpu.max_link_generation}\n"
            files[f"{address}/power_limit"] = f"{gpu.power_limit}\n"
            files[f"{address}/power_limit_range"] = " ".join(map(str, gpu.power_limit_range)) \
                + "\n"
            files[f"{address}/ecc_mode"] = " ".join(
                persistence_text(m).capitalize() for m in (gpu.ecc_current, gpu.ecc_pending)) \
                + "\n"
            files[f"{address}/bar1_total"] = f"{gpu.bar1_total}\n"
            rows = gpu.remapped_rows
            health = {"name": gpu.name, "temperature": str(gpu.temperature),
                      "clocks_event_reasons": f"{gpu.clocks_event_reasons:#x}",
                      "ecc_errors": " ".join(f"{count}={gpu.ecc_errors.get(count, 0)}"
                                             for count in ECC_COUNTS),
                      "remapped_rows": f"{rows[0]} {rows[1]} {_yes(rows[2])} {_yes(rows[3])}",
                      "retired_pages_pending": _yes(gpu.retired_pages_pending)}
            for fact, text in health.items():
                files[f"{address}/{fact}"] = \
                    (UNSUPPORTED if fact in gpu.unsupported else text) + "\n"
        return files


def _yes(flag: bool) -> str:
    return "Yes" if flag else "No"


class RecordedNvml:
    """NVML facts recorded as files in a fake host tree, like sysfs: ``RECORDED_NVML/gpus`` (one
    address a line, in NVML order), ``driver_version``, ``ADDR/persistence_mode`` (Enabled or
    Disabled; a setter writes it, never creates it), ``ADDR/max_link_generation``, and
    ``p2p_read_status`` / ``topology`` lines ``A->B VALUE``, ``library_version``,
    ``ADDR/power_limit`` (mW) and ``power_limit_range`` (``MIN MAX`` mW), ``ADDR/ecc_mode``
    (``CURRENT PENDING``, Enabled or Disabled) and ``ADDR/bar1_total`` (bytes); the health
    facts ``ADDR/name``, ``ADDR/temperature`` (C), ``ADDR/clocks_event_reasons`` (the bits, as
    ``0x1``), ``ADDR/ecc_errors`` (``corrected_volatile=N corrected_aggregate=N
    uncorrected_volatile=N uncorrected_aggregate=N``), ``ADDR/remapped_rows`` (``CORRECTED
    UNCORRECTED PENDING FAILURE``, Yes or No for the last two) and
    ``ADDR/retired_pages_pending`` (Yes or No), each ``[Not Supported]`` where the GPU does
    not support it. Setters write
    the files, never create them. Read fresh on every call: the whole directory in one batch
    (the same requests as ``reads``, so a session's prefetch serves it), or, once a change
    made the host's cache forget it, the one file a fact needs."""

    reads = RECORDED_READS

    def __init__(self, host: Host) -> None:
        self.host = host
        self._seen: tuple[list[Reply], dict[str, str]] | None = None
        """The replies last read and the files made of them: a session's cache answers with
        the same reply objects until it reads again, and each fact asks for every file."""

    def _files(self) -> dict[str, str]:
        replies = self.host.batch(self.reads)
        if self._seen is not None and len(replies) == len(self._seen[0]) and all(
                new is old for new, old in zip(replies, self._seen[0], strict=True)):
            return self._seen[1]
        files = {}
        for reply in replies:
            for path, data in reply.matches() if reply.error is None else ():
                if isinstance(data, bytes):
                    files[path[len(RECORDED_NVML) + 1:]] = data.decode("utf-8", "replace")
        self._seen = (list(replies), files)
        return files

    def _file(self, name: str) -> str | None:
        """One recorded file: from the directory's batch while the host's cache holds it (a
        session's prefetch), else that file alone (after a change made the cache forget
        everything, a fact reads its own file, not the whole directory again)."""
        host = self.host
        if not isinstance(host, PhaseCache) or all(host.cached(r) for r in self.reads):
            return self._files().get(name)
        [reply] = self.host.batch([Read(f"{RECORDED_NVML}/{name}")])
        if reply.missing:
            return None
        return reply.data().decode("utf-8", "replace")

    def _read(self, name: str) -> str:
        text = self._file(name)
        if text is None:
            raise HostError(f"no recorded NVML fact {RECORDED_NVML}/{name} under "
                            f"{self.host.describe()}", errno.ENOENT)
        return text.strip()

    def _pairs(self, name: str) -> dict[str, str]:
        text = self._file(name)
        if text is None:
            return {}
        lines = (line.split(None, 1) for line in text.splitlines())
        return {parts[0]: parts[1] for parts in lines if len(parts) == 2}

    def _gpu_file(self, address: str, name: str) -> str:
        if address not in self.gpus():
            raise HostError(f"NVML has no GPU at {address}")
        return f"{address}/{name}"

    def driver_version(self) -> str:
        return self._read("driver_version")

    def gpus(self) -> list[str]:
        return [normalize_address(line) for line in self._read("gpus").split()]

    def persistence_mode(self, address: str) -> bool:
        return self._read(self._gpu_file(address, "persistence_mode")).lower() == PERSISTENCE[0]

    def set_persistence_mode(self, address: str, enabled: bool) -> None:
        path = f"{RECORDED_NVML}/{self._gpu_file(address, 'persistence_mode')}"
        self.host.write_text(path, persistence_text(enabled).capitalize() + "\n")

    def max_link_generation(self, address: str) -> int:
        text = self._read(self._gpu_file(address, "max_link_generation"))
        try:
            return int(text)
        except ValueError:
            raise HostError(f"{RECORDED_NVML}/{address}/max_link_generation: not a number: "
                            f"{text!r}") from None

    def p2p_read_status(self, source: str, target: str) -> str:
        return self._pairs("p2p_read_status").get(f"{source}->{target}", "ok")

    def topology(self, one: str, other: str) -> str | None:
        levels = self._pairs("topology")
        return levels.get(f"{one}->{other}") or levels.get(f"{other}->{one}")

    def library_version(self) -> str:
        return self._read("library_version")

    def _numbers(self, address: str, name: str) -> list[int]:
        text = self._read(self._gpu_file(address, name))
        try:
            return [int(word) for word in text.split()]
        except ValueError:
            raise HostError(f"{RECORDED_NVML}/{address}/{name}: not numbers: {text!r}") from None

    def power_limit(self, address: str) -> int:
        return self._numbers(address, "power_limit")[0]

    def power_limit_range(self, address: str) -> tuple[int, int]:
        low, high = self._numbers(address, "power_limit_range")
        return low, high

    def set_power_limit(self, address: str, milliwatts: int) -> None:
        low, high = self.power_limit_range(address)
        if not low <= milliwatts <= high:
            raise HostError(f"NVML nvmlDeviceSetPowerManagementLimit failed: Invalid Argument "
                            f"({milliwatts} mW outside {low}-{high})")
        path = f"{RECORDED_NVML}/{self._gpu_file(address, 'power_limit')}"
        self.host.write_text(path, f"{milliwatts}\n")

    def ecc_mode(self, address: str) -> tuple[bool, bool]:
        words = self._read(self._gpu_file(address, "ecc_mode")).lower().split()
        if len(words) != 2:
            raise HostError(f"{RECORDED_NVML}/{address}/ecc_mode: expected CURRENT PENDING")
        return words[0] == PERSISTENCE[0], words[1] == PERSISTENCE[0]

    def set_ecc_mode(self, address: str, enabled: bool) -> None:
        current, _ = self.ecc_mode(address)
        path = f"{RECORDED_NVML}/{self._gpu_file(address, 'ecc_mode')}"
        modes = (persistence_text(current), persistence_text(enabled))
        self.host.write_text(path, " ".join(m.capitalize() for m in modes) + "\n")

    def bar1_total(self, address: str) -> int:
        return self._numbers(address, "bar1_total")[0]

    def _health(self, address: str, fact: str) -> str:
        text = self._read(self._gpu_file(address, fact))
        if text in (UNSUPPORTED, "[N/A]"):
            raise NvmlNotSupported(f"{RECORDED_NVML}/{address}/{fact}: {text}")
        return text

    def _flag(self, address: str, fact: str, text: str) -> bool:
        if text not in ("Yes", "No"):
            raise HostError(f"{RECORDED_NVML}/{address}/{fact}: not Yes or No: {text!r}")
        return text == "Yes"

    def name(self, address: str) -> str:
        return self._health(address, "name")

    def ecc_errors(self, address: str, count: str) -> int:
        text = self._health(address, "ecc_errors")
        counts = dict(word.partition("=")[::2] for word in text.split())
        try:
            return int(counts[count])
        except (KeyError, ValueError):
            raise HostError(f"{RECORDED_NVML}/{address}/ecc_errors: no number {count}= in "
                            f"{text!r}") from None

    def remapped_rows(self, address: str) -> RemappedRows:
        words = self._health(address, "remapped_rows").split()
        if len(words) != 4 or not all(w.isdigit() for w in words[:2]):
            raise HostError(f"{RECORDED_NVML}/{address}/remapped_rows: expected CORRECTED "
                            f"UNCORRECTED PENDING FAILURE, not {' '.join(words)!r}")
        return RemappedRows(int(words[0]), int(words[1]),
                            self._flag(address, "remapped_rows", words[2]),
                            self._flag(address, "remapped_rows", words[3]))

    def retired_pages_pending(self, address: str) -> bool:
        return self._flag(address, "retired_pages_pending",
                          self._health(address, "retired_pages_pending"))

    def temperature(self, address: str) -> int:
        text = self._health(address, "temperature")
        try:
            return int(text)
        except ValueError:
            raise HostError(f"{RECORDED_NVML}/{address}/temperature: not a number: "
                            f"{text!r}") from None

    def clocks_event_reasons(self, address: str) -> int:
        text = self._health(address, "clocks_event_reasons")
        try:
            return int(text, 0)
        except ValueError:
            raise HostError(f"{RECORDED_NVML}/{address}/clocks_event_reasons: not a number: "
                            f"{text!r}") from None
