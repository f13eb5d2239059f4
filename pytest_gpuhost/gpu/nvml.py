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
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..host import Host, HostError, Request
from ..linux.pciaddr import normalize_address

RECORDED_NVML = "var/lib/pytest-gpuhost/nvml"
INSTALL_HINT = "install nvidia-ml-py: pip install 'pytest-gpuhost[nvml]'"


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why and what to do (checks skip with it)."""


class NvmlPermissionError(Exception):
    """A setter NVML refused for lack of privilege (persistence mode needs root)."""


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
        self._unavailable: NvmlUnavailable | None = None

    def get(self) -> Nvml:
        if self._nvml is not None:
            return self._nvml
        if self._unavailable is None:
            try:
                self._nvml = self._factory()
                return self._nvml
            except NvmlUnavailable as exc:
                self._unavailable = exc
        raise self._unavailable

    def reads(self) -> tuple[Request, ...]:
        """The host reads NVML's calls make (a recorded snapshot's files), for a prefetch."""
        try:
            nvml = self.get()
        except NvmlUnavailable:
            return ()
        return tuple(getattr(nvml, "reads", ()))


def default_factory(host: Host) -> NvmlFactory:
    """NVML for ``host``: the real library on ``/``, the recorded snapshot in a fake tree."""

    def open_nvml() -> Nvml:
        if host.local_machine():
            return PynvmlNvml.open()
        if host.exists(f"{RECORDED_NVML}/gpus"):
            return RecordedNvml(host)
        raise NvmlUnavailable(
            f"the host root {host.describe()} is not this machine, so this machine's NVML "
            f"does not describe it, and it has no recorded {RECORDED_NVML}")

    return open_nvml


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlNvml:
    """nvidia-ml-py (``import pynvml``), imported lazily."""

    def __init__(self, pynvml: Any) -> None:
        self._nv = pynvml
        count = pynvml.nvmlDeviceGetCount()
        self._handles: dict[str, Any] = {}
        for index in range(count):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
            self._handles[normalize_address(bus_id)] = handle

    @classmethod
    def open(cls) -> PynvmlNvml:
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {INSTALL_HINT}") from None
        try:
            pynvml.nvmlInit()
            return cls(pynvml)
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
            return getattr(self._nv, name)(*args)
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
            self._nv.nvmlDeviceSetPersistenceMode(self._handle(address), value)
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
            level = self._nv.nvmlDeviceGetTopologyCommonAncestor(self._handle(one),
                                                                  self._handle(other))
        except self._nv.NVMLError:
            return None
        return TOPOLOGY.get(int(level))


@dataclass
class FakeGpu:
    persistence_mode: bool = False
    max_link_generation: int = 5


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

    def files(self) -> dict[str, str]:
        """This state as the files of a recorded NVML directory (see ``RecordedNvml``)."""
        files = {"driver_version": self.driver + "\n",
                 "gpus": "".join(f"{a}\n" for a in self.devices),
                 "p2p_read_status": "".join(f"{k} {v}\n" for k, v in sorted(self.p2p.items())),
                 "topology": "".join(f"{k} {v}\n" for k, v in sorted(self.topologies.items()))}
        for address, gpu in self.devices.items():
            mode = persistence_text(gpu.persistence_mode).capitalize()
            files[f"{address}/persistence_mode"] = mode + "\n"
            files[f"{address}/max_link_generation"] = f"{gpu.max_link_generation}\n"
        return files


class RecordedNvml:
    """NVML facts recorded as files in a fake host tree, like sysfs: ``RECORDED_NVML/gpus`` (one
    address a line, in NVML order), ``driver_version``, ``ADDR/persistence_mode`` (Enabled or
    Disabled; a setter writes it, never creates it), ``ADDR/max_link_generation``, and
    ``p2p_read_status`` / ``topology`` lines ``A->B VALUE``. Read fresh on every call."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def _read(self, name: str) -> str:
        return self.host.read_text(f"{RECORDED_NVML}/{name}").strip()

    def _pairs(self, name: str) -> dict[str, str]:
        if not self.host.exists(f"{RECORDED_NVML}/{name}"):
            return {}
        lines = (line.split(None, 1) for line in self._read(name).splitlines())
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
