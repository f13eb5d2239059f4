"""What NVML knows about the GPUs, behind a small interface that tests replace with a fake.

``Nvml`` is the handful of calls the checks need. ``PynvmlNvml`` wraps nvidia-ml-py, imported
only when a check first needs it (the extra ``pytest-gpuhost[nvml]``). ``FakeNvml`` is the
in-memory stand-in for tests; ``RecordedNvml`` reads NVML facts recorded as files in a fake host
tree (``var/lib/pytest-gpuhost/nvml/``), so an offline root has NVML facts too.

NVML describes the machine the process runs on, so the real library is used only when the host
root is ``/``: a fake tree never mixes its sysfs with this machine's GPUs.
"""

from __future__ import annotations

import ctypes
import errno
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..bounded import StillRunning, within
from ..host import Glob, Host, HostError, Request
from ..linux.pciaddr import normalize_address

RECORDED_NVML = "var/lib/pytest-gpuhost/nvml"
INSTALL_HINT = ("install nvidia-ml-py: pip install 'pytest-gpuhost[nvml]' (from a checkout: "
                "pip install '.[nvml]')")


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why and what to do (checks skip with it)."""


class NvmlPermissionError(Exception):
    """A setter NVML refused for lack of privilege (persistence mode needs root)."""


NVML_TIMEOUT_S = 60.0
"""The longest one call into the NVML library may take (nvmlInit included: without persistence
mode it starts every GPU, seconds each) before NVML is given up on for the run."""


class NvmlHung(HostError):
    """A call into NVML did not return in time: a GPU fallen off the bus or a wedged driver
    blocks it in the kernel, where no signal ends it (``nvidia-smi`` hangs the same way). The
    call's thread is left behind, and every later NVML call of the run fails at once with
    this, so NVML's checks are errors naming it and the rest of the run goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno.ETIMEDOUT)


class _Watchdog:
    """Makes each call into the NVML library in a thread of its own, waited for NVML_TIMEOUT_S
    (``bounded.within``: ctypes lets go of the GIL in the call); after one hangs, every later
    call fails at once."""

    def __init__(self) -> None:
        self.hung: str | None = None

    def call(self, name: str, function: Callable[..., Any], *args: Any) -> Any:
        if self.hung is not None:
            raise NvmlHung(self.hung)
        try:
            return within(NVML_TIMEOUT_S, lambda: function(*args), name=f"nvml-{name}")
        except StillRunning:
            self.hung = (f"NVML {name} did not return within {NVML_TIMEOUT_S:g} s: a GPU may "
                         "have fallen off the bus or the driver is wedged (look for Xid 79 or "
                         "\"fallen off the bus\" in the kernel log, or try nvidia-smi); NVML is "
                         "given up on for the rest of this run")
            raise NvmlHung(self.hung) from None


class Nvml(Protocol):
    """The NVML calls pytest-gpuhost uses. GPUs are named by sysfs PCI address."""

    def driver_version(self) -> str: ...

    def gpus(self) -> list[str]:
        """The GPUs NVML sees, as sysfs addresses (``0000:81:00.0``), in NVML's index order."""

    def persistence_mode(self, address: str) -> bool: ...

    def set_persistence_mode(self, address: str, enabled: bool) -> None:
        """Raise NvmlPermissionError without root."""

    def max_link_generation(self, address: str) -> int: ...

    def p2p_read_status(self, source: str, target: str) -> str:
        """``ok``, or NVML's reason why P2P reads between the two are not supported."""

    def topology(self, one: str, other: str) -> str | None:
        """Their common ancestor as ``nvidia-smi topo -m`` names it (PIX, PXB, PHB, NODE, SYS),
        or None when NVML does not say."""

    def library_version(self) -> str:
        """nvmlSystemGetNVMLVersion: the user-space library's version (``13.580.95.05``)."""

    def power_limit(self, address: str) -> int:
        """nvmlDeviceGetEnforcedPowerLimit, in milliwatts."""

    def power_limit_range(self, address: str) -> tuple[int, int]:
        """nvmlDeviceGetPowerManagementLimitConstraints: (min, max) milliwatts."""

    def set_power_limit(self, address: str, milliwatts: int) -> None:
        """nvmlDeviceSetPowerManagementLimit; raise NvmlPermissionError without root."""

    def ecc_mode(self, address: str) -> tuple[bool, bool]:
        """nvmlDeviceGetEccMode: (current, pending); pending takes effect at the next reset."""

    def set_ecc_mode(self, address: str, enabled: bool) -> None:
        """nvmlDeviceSetEccMode: sets the pending mode; raise NvmlPermissionError without root."""

    def bar1_total(self, address: str) -> int:
        """nvmlDeviceGetBAR1MemoryInfo(...).bar1Total, in bytes."""


PERSISTENCE = ("enabled", "disabled")
"""Persistence mode as the spec names it (the ``gpus.persistence_mode`` choice); a recorded
NVML file holds it capitalized, as nvidia-smi prints it (``Enabled``)."""


def persistence_text(enabled: bool) -> str:
    return PERSISTENCE[0] if enabled else PERSISTENCE[1]


NvmlFactory = Callable[[], Nvml]
"""Opens NVML; raises NvmlUnavailable with the reason. Called at most once per session."""

P2P_STATUS = {  # nvmlGpuP2PStatus_t
    0: "ok",
    1: "the chipset does not support P2P",
    2: "the GPU does not support P2P",
    3: "the IOH topology does not support P2P",
    4: "P2P is disabled by a registry key",
    5: "P2P is not supported",
    6: "P2P status unknown",
}

P2P_CAPS_INDEX_READ = 0
"""nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_READ."""

TOPOLOGY = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""nvmlGpuTopologyLevel_t: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM."""


class NvmlSource:
    """Opens NVML once, when first asked, and remembers the instance or why it is unavailable."""

    def __init__(self, factory: NvmlFactory) -> None:
        self._factory = factory
        self._nvml: Nvml | None = None
        self._unavailable: str | None = None
        """Why not, kept as words: a kept exception would keep the frames of the first ask
        (the whole collection, at the session's start) and grow a traceback at each raise."""
        self._hung: str | None = None
        """Why opening NVML hung: asked again, it fails at once instead of hanging again."""

    def get(self) -> Nvml:
        if self._nvml is not None:
            return self._nvml
        if self._hung is not None:
            raise NvmlHung(self._hung)
        if self._unavailable is None:
            try:
                self._nvml = self._factory()
                return self._nvml
            except NvmlUnavailable as exc:
                self._unavailable = str(exc)
            except NvmlHung as exc:
                self._hung = str(exc)
                raise NvmlHung(self._hung) from None
        raise NvmlUnavailable(self._unavailable)

    def reads(self) -> tuple[Request, ...]:
        """The host reads NVML's calls make (a recorded snapshot's files), for a prefetch."""
        try:
            nvml = self.get()
        except (NvmlUnavailable, HostError):  # each check that asks says why
            return ()
        return tuple(getattr(nvml, "reads", ()))


def default_factory(host: Host) -> NvmlFactory:
    """NVML for ``host``: the real library on ``/``, the recorded snapshot in a fake tree."""

    def open_nvml() -> Nvml:
        if host.local_machine():
            return PynvmlNvml.open()
        recorded = host.batch(RecordedNvml.reads)  # the same batch its calls read, cached
        if any(path == f"{RECORDED_NVML}/gpus" for reply in recorded if reply.error is None
               for path, _ in reply.matches()):
            return RecordedNvml(host)
        raise NvmlUnavailable(
            f"the host root {host.describe()} is not this machine, so this machine's NVML "
            f"does not describe it, and it has no recorded {RECORDED_NVML}")

    return open_nvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlNvml:
    """nvidia-ml-py (``import pynvml``), imported lazily. Every call into the library is
    bounded by NVML_TIMEOUT_S (``NvmlHung``)."""

    def __init__(self, pynvml: Any, watchdog: _Watchdog | None = None) -> None:
        self._nv = pynvml
        self._watchdog = watchdog or _Watchdog()
        call = self._watchdog.call
        count = call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        self._handles: dict[str, Any] = {}
        for index in range(count):
            handle = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
            info = call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
            self._handles[normalize_address(_text(info.busId))] = handle

    @classmethod
    def open(cls) -> PynvmlNvml:
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {INSTALL_HINT}") from None
        watchdog = _Watchdog()
        try:
            watchdog.call("nvmlInit", pynvml.nvmlInit)
            return cls(pynvml, watchdog)
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML did not start ({exc}): the NVIDIA driver is not "
                                  "loaded or libnvidia-ml.so.1 is missing") from None

    def _handle(self, address: str) -> Any:
        try:
            return self._handles[address]
        except KeyError:
            raise HostError(f"NVML has no GPU at {address}") from None

    def _call(self, name: str, *args: Any) -> Any:
        """Any failure of the binding, not only an NVMLError (a ctypes.ArgumentError from a
        mistyped constant, a TypeError, an OSError from the library), is a HostError naming
        the function: the check reports it instead of a traceback."""
        try:
            return self._watchdog.call(name, getattr(self._nv, name), *args)
        except self._nv.NVMLError as exc:
            raise HostError(f"NVML {name} failed: {exc}") from exc
        except (ctypes.ArgumentError, TypeError, ValueError, OSError, AttributeError) as exc:
            raise HostError(f"NVML {name} failed in nvidia-ml-py: {type(exc).__name__}: "
                            f"{exc}") from exc

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def gpus(self) -> list[str]:
        return list(self._handles)

    def persistence_mode(self, address: str) -> bool:
        mode = self._call("nvmlDeviceGetPersistenceMode", self._handle(address))
        return bool(mode == self._nv.NVML_FEATURE_ENABLED)

    def set_persistence_mode(self, address: str, enabled: bool) -> None:
        value = self._nv.NVML_FEATURE_ENABLED if enabled else self._nv.NVML_FEATURE_DISABLED
        try:
            self._watchdog.call("nvmlDeviceSetPersistenceMode",
                                self._nv.nvmlDeviceSetPersistenceMode, self._handle(address),
                                value)
        except self._nv.NVMLError_NoPermission as exc:
            raise NvmlPermissionError(f"NVML refused ({exc}): setting persistence mode "
                                      "needs root") from exc
        except self._nv.NVMLError as exc:
            raise HostError(f"NVML nvmlDeviceSetPersistenceMode failed: {exc}") from exc

    def max_link_generation(self, address: str) -> int:
        return int(self._call("nvmlDeviceGetMaxPcieLinkGeneration", self._handle(address)))

    def p2p_read_status(self, source: str, target: str) -> str:
        # The enum's integer, never pynvml's constant: nvidia-ml-py 13.x defines
        # ``NVML_P2P_CAPS_INDEX_READ = 0,`` (a tuple), which ctypes rejects.
        status = self._call("nvmlDeviceGetP2PStatus", self._handle(source), self._handle(target),
                            P2P_CAPS_INDEX_READ)
        return P2P_STATUS.get(int(status), f"P2P status {status}")

    def topology(self, one: str, other: str) -> str | None:
        try:
            level = self._watchdog.call("nvmlDeviceGetTopologyCommonAncestor",
                                        self._nv.nvmlDeviceGetTopologyCommonAncestor,
                                        self._handle(one), self._handle(other))
        except self._nv.NVMLError:
            return None
        return TOPOLOGY.get(int(level))

    def library_version(self) -> str:
        return _text(self._call("nvmlSystemGetNVMLVersion"))

    def power_limit(self, address: str) -> int:
        return int(self._call("nvmlDeviceGetEnforcedPowerLimit", self._handle(address)))

    def power_limit_range(self, address: str) -> tuple[int, int]:
        low, high = self._call("nvmlDeviceGetPowerManagementLimitConstraints",
                               self._handle(address))
        return int(low), int(high)

    def _set(self, name: str, what: str, *args: Any) -> None:
        try:
            self._watchdog.call(name, getattr(self._nv, name), *args)
        except self._nv.NVMLError_NoPermission as exc:
            raise NvmlPermissionError(f"NVML refused ({exc}): setting {what} needs root") from exc
        except self._nv.NVMLError as exc:
            raise HostError(f"NVML {name} failed: {exc}") from exc

    def set_power_limit(self, address: str, milliwatts: int) -> None:
        self._set("nvmlDeviceSetPowerManagementLimit", "the power limit",
                  self._handle(address), milliwatts)

    def ecc_mode(self, address: str) -> tuple[bool, bool]:
        current, pending = self._call("nvmlDeviceGetEccMode", self._handle(address))
        enabled = self._nv.NVML_FEATURE_ENABLED
        return bool(current == enabled), bool(pending == enabled)

    def set_ecc_mode(self, address: str, enabled: bool) -> None:
        value = self._nv.NVML_FEATURE_ENABLED if enabled else self._nv.NVML_FEATURE_DISABLED
        self._set("nvmlDeviceSetEccMode", "the ECC mode", self._handle(address), value)

    def bar1_total(self, address: str) -> int:
        info = self._call("nvmlDeviceGetBAR1MemoryInfo", self._handle(address))
        return int(info.bar1Total)


@dataclass
class FakeGpu:
    persistence_mode: bool = False
    max_link_generation: int = 5
    power_limit: int = 600_000
    """Enforced power limit, mW."""
    power_limit_range: tuple[int, int] = (150_000, 600_000)
    ecc_current: bool = True
    ecc_pending: bool = True
    bar1_total: int = 128 * 2**30


@dataclass
class FakeNvml:
    """An in-memory NVML for tests and recorded fake hosts."""

    driver: str = "580.95.05"
    devices: dict[str, FakeGpu] = field(default_factory=dict)
    """address -> state, in NVML's index order."""
    p2p: dict[str, str] = field(default_factory=dict)
    """``A->B`` -> a reason, for pairs whose P2P read status is not ok."""
    topologies: dict[str, str] = field(default_factory=dict)
    """``A->B`` -> PIX/PXB/PHB/NODE/SYS."""
    setter_needs_root: bool = False
    set_calls: list[tuple[str, bool]] = field(default_factory=list)
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
        return files


class RecordedNvml:
    """NVML facts recorded as files in a fake host tree, like sysfs: ``RECORDED_NVML/gpus`` (one
    address a line, in NVML order), ``driver_version``, ``ADDR/persistence_mode`` (Enabled or
    Disabled; a setter writes it, never creates it), ``ADDR/max_link_generation``, and
    ``p2p_read_status`` / ``topology`` lines ``A->B VALUE``, ``library_version``,
    ``ADDR/power_limit`` (mW) and ``power_limit_range`` (``MIN MAX`` mW), ``ADDR/ecc_mode``
    (``CURRENT PENDING``, Enabled or Disabled) and ``ADDR/bar1_total`` (bytes). Setters write
    the files, never create them. Read fresh on every call, the whole directory in one batch
    (the same requests as ``reads``, so a session's prefetch serves it)."""

    reads = (Glob(f"{RECORDED_NVML}/*"), Glob(f"{RECORDED_NVML}/*/*"))

    def __init__(self, host: Host) -> None:
        self.host = host

    def _files(self) -> dict[str, str]:
        files = {}
        for reply in self.host.batch(self.reads):
            for path, data in reply.matches() if reply.error is None else ():
                if isinstance(data, bytes):
                    files[path[len(RECORDED_NVML) + 1:]] = data.decode("utf-8", "replace")
        return files

    def _read(self, name: str) -> str:
        text = self._files().get(name)
        if text is None:
            raise HostError(f"no recorded NVML fact {RECORDED_NVML}/{name} under "
                            f"{self.host.describe()}", errno.ENOENT)
        return text.strip()

    def _pairs(self, name: str) -> dict[str, str]:
        text = self._files().get(name)
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
