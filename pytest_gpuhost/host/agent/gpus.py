"""The GPUs' facts on the machine that has them: the root's own libnvidia-ml.so.1 through ctypes
(nothing installed), everything the NVML checks ask in one answer (their health included,
``nvmlreads.py``), one fresh sample of every GPU, and the settings a fix changes;
``nvidia-smi`` (``smi.py``) where the library cannot be loaded."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import time

from .commands import COMMAND_DIRS
from .errors import OpError
from .nvmlreads import health_of, moment_of
from .smi import bus_id, smi_facts, smi_sample, smi_set

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from collections.abc import Callable
    from typing import Any

    from .commands import Commands

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
             "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
"""Where distributions, the NVIDIA installer and the container toolkit put the NVML library."""
NVML_NO_PERMISSION = 4
NVML_NOT_SUPPORTED = (3, 13)
"""NVML_ERROR_NOT_SUPPORTED and NVML_ERROR_FUNCTION_NOT_FOUND: the fact is "not supported" (a
GPU or driver without it), never a failure that loses the others."""


class _PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)."""

    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class _Bar1(ctypes.Structure):
    """nvmlBAR1Memory_t."""

    _fields_ = [("bar1Total", ctypes.c_ulonglong), ("bar1Free", ctypes.c_ulonglong),
                ("bar1Used", ctypes.c_ulonglong)]


class Gpus:
    """The GPUs as the NVIDIA driver of this machine describes them: through the root's own
    libnvidia-ml.so.1 (ctypes: nothing installed), or ``nvidia-smi --query-gpu`` under the root
    where the library cannot be loaded. ``facts`` is everything the checks ask, in one answer;
    ``set`` changes one setting (persistence mode, power limit, the pending ECC mode)."""

    def __init__(self, root: Commands) -> None:
        self.root = root
        self.lib: Any = None
        self.where = ""
        self.problem = ""
        self.handles: dict[str, Any] = {}

    def _candidates(self) -> list[str]:
        found = [NVML_LIBRARY] if self.root.real else []
        for directory in NVML_DIRS:
            try:
                fd = self.root.open(f"{directory}/{NVML_LIBRARY}", os.O_PATH)
            except (OSError, OpError):
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    found.append(self.root.real_path(fd))
            finally:
                os.close(fd)
        return found

    def _load(self) -> bool:
        """The library, loaded and started once; False (``problem`` says why) where none."""
        if self.lib is not None or self.problem:
            return self.lib is not None
        problems = []
        for path in self._candidates():
            try:
                lib = ctypes.CDLL(path)
                lib.nvmlErrorString.restype = ctypes.c_char_p
                start = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
                code = start()
            except (OSError, AttributeError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            if code != 0:
                problems.append(f"{path}: nvmlInit failed: {self._words(lib, code)}")
                continue
            self.lib, self.where = lib, path
            return True
        self.problem = "; ".join(problems) or (
            f"no {NVML_LIBRARY} in " + ", ".join(self.root.shown(d) for d in NVML_DIRS))
        return False

    @staticmethod
    def _words(lib: Any, code: int) -> str:
        try:
            return (lib.nvmlErrorString(code) or b"").decode("utf-8", "replace") or str(code)
        except (OSError, AttributeError):
            return f"error {code}"

    def _call(self, name: str, *args: Any) -> None:
        self.check(name, getattr(self.lib, name)(*args))

    call = _call
    """``nvmlreads``' way in: AttributeError where the library lacks ``name``."""

    def check(self, name: str, code: int) -> None:
        """OpError for an NVML return code that is not NVML_SUCCESS (EOPNOTSUPP: not
        supported, EPERM: not allowed)."""
        if code != 0:
            raise OpError(f"NVML {name} failed: {self._words(self.lib, code)}",
                          errno.EPERM if code == NVML_NO_PERMISSION else
                          errno.EOPNOTSUPP if code in NVML_NOT_SUPPORTED else errno.EIO)

    def _each(self, facts: dict[str, object], key: str, read: Callable[[], object]) -> None:
        """``facts[key]``: what ``read`` gives, or ``{"error": why}`` (with ``"unsupported":
        true`` where the driver does not support it or the library lacks the call)."""
        try:
            facts[key] = read()
        except AttributeError as exc:
            facts[key] = {"error": f"not supported by this library: {exc}",
                          "unsupported": True}
        except OpError as exc:
            failed: dict[str, object] = {"error": str(exc)}
            if exc.errno == errno.EOPNOTSUPP:
                failed["unsupported"] = True
            facts[key] = failed
        except (OSError, ValueError) as exc:
            facts[key] = {"error": str(exc)}

    each = _each

    def _text(self, name: str) -> str:
        buffer = ctypes.create_string_buffer(96)
        self._call(name, buffer, ctypes.c_uint(96))
        return buffer.value.decode("utf-8", "replace")

    def _number(self, name: str, handle: Any) -> int:
        value = ctypes.c_uint()
        self._call(name, handle, ctypes.byref(value))
        return value.value

    def _handles(self) -> dict[str, Any]:
        if not self.handles:
            count = ctypes.c_uint()
            self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
            for index in range(count.value):
                handle = ctypes.c_void_p()
                self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index),
                           ctypes.byref(handle))
                info = _PciInfo()
                self._call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
                self.handles[bus_id(info.busId.decode("ascii", "replace"))] = handle
        return self.handles

    def _gpu(self, handle: Any) -> dict[str, object]:
        gpu: dict[str, object] = {}
        mode = ctypes.c_int()
        low, high, current, pending = (ctypes.c_uint(), ctypes.c_uint(), ctypes.c_int(),
                                       ctypes.c_int())
        bar1 = _Bar1()

        def persistence() -> bool:
            self._call("nvmlDeviceGetPersistenceMode", handle, ctypes.byref(mode))
            return mode.value == 1

        def limits() -> list[int]:
            self._call("nvmlDeviceGetPowerManagementLimitConstraints", handle, ctypes.byref(low),
                       ctypes.byref(high))
            return [low.value, high.value]

        def ecc() -> list[bool]:
            self._call("nvmlDeviceGetEccMode", handle, ctypes.byref(current),
                       ctypes.byref(pending))
            return [current.value == 1, pending.value == 1]

        def bar1_total() -> int:
            self._call("nvmlDeviceGetBAR1MemoryInfo", handle, ctypes.byref(bar1))
            return int(bar1.bar1Total)

        self._each(gpu, "persistence_mode", persistence)
        self._each(gpu, "max_link_generation",
                   lambda: self._number("nvmlDeviceGetMaxPcieLinkGeneration", handle))
        self._each(gpu, "power_limit",
                   lambda: self._number("nvmlDeviceGetEnforcedPowerLimit", handle))
        self._each(gpu, "power_limit_range", limits)
        self._each(gpu, "ecc_mode", ecc)
        self._each(gpu, "bar1_total", bar1_total)
        health_of(self, handle, gpu)
        return gpu

    def _pairs(self, handles: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
        """(the P2P read status of every ordered pair that is not ok, the topology level of
        every pair), as NVML's numbers."""
        p2p: dict[str, int] = {}
        levels: dict[str, int] = {}
        status, level = ctypes.c_int(), ctypes.c_int()
        for one, first in handles.items():
            for other, second in handles.items():
                if one == other:
                    continue
                try:
                    self._call("nvmlDeviceGetP2PStatus", first, second, ctypes.c_int(0),
                               ctypes.byref(status))
                    if status.value:
                        p2p[f"{one}->{other}"] = status.value
                    if one < other:
                        self._call("nvmlDeviceGetTopologyCommonAncestor", first, second,
                                   ctypes.byref(level))
                        levels[f"{one}->{other}"] = level.value
                except (OpError, AttributeError):
                    continue
        return p2p, levels

    def facts(self) -> dict[str, object]:
        """Everything the NVML checks ask: ``{"source", "driver_version", "library_version",
        "gpus": {address: {...}}, "p2p", "topology"}`` (a value that could not be read is
        ``{"error": ...}``), or ``{"unavailable": why}``."""
        if self._load():
            facts: dict[str, object] = {"source": f"{NVML_LIBRARY} ({self.where})"}
            self._each(facts, "driver_version", lambda: self._text("nvmlSystemGetDriverVersion"))
            self._each(facts, "library_version", lambda: self._text("nvmlSystemGetNVMLVersion"))
            handles = self._handles()
            facts["gpus"] = {address: self._gpu(handle) for address, handle in handles.items()}
            facts["p2p"], facts["topology"] = self._pairs(handles)
            return facts
        smi = self.root.which("nvidia-smi")
        if smi is None:
            return {"unavailable": f"{self.problem}; and no nvidia-smi in "
                                   + ", ".join(self.root.shown(d) for d in COMMAND_DIRS)}
        return smi_facts(self.root, self.problem)

    def sample(self) -> dict[str, object]:
        """Every GPU now, read fresh (never kept): ``{"source", "monotonic", "gpus": {address:
        {...}}}`` (``nvmlreads.moment_of``; nvidia-smi's fields where the library cannot be
        loaded), ``monotonic`` the agent's clock when the sample began; or ``{"unavailable":
        why}``."""
        began = time.monotonic()
        if self._load():
            gpus = {address: moment_of(self, handle) for address, handle in
                    self._handles().items()}
            return {"source": f"{NVML_LIBRARY} ({self.where})", "monotonic": began,
                    "gpus": gpus}
        if self.root.which("nvidia-smi") is None:
            return {"unavailable": f"{self.problem}; and no nvidia-smi in "
                                   + ", ".join(self.root.shown(d) for d in COMMAND_DIRS)}
        return dict(smi_sample(self.root, self.problem), monotonic=began)

    def set(self, address: str, setting: str, value: str) -> None:
        """Persistence mode and ECC ``enabled``/``disabled``, the power limit in W: through
        the library, else nvidia-smi; EPERM where the driver refuses it for want of root."""
        if self._load():
            handle = self._handles().get(address)
            if handle is None:
                raise OpError(f"NVML has no GPU at {address}", errno.ENODEV)
            if setting == "power_limit":
                self._call("nvmlDeviceSetPowerManagementLimit", handle,
                           ctypes.c_uint(round(float(value) * 1000)))
            elif setting in ("persistence_mode", "ecc"):
                name = "nvmlDeviceSetPersistenceMode" if setting == "persistence_mode" else \
                    "nvmlDeviceSetEccMode"
                self._call(name, handle, ctypes.c_int(1 if value == "enabled" else 0))
            else:
                raise OpError(f"no NVML setting {setting!r}", errno.EINVAL)
            return
        smi_set(self.root, address, setting, value)
