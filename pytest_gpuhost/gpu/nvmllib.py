"""nvidia-ml-py behind the ``Nvml`` interface, every call into the library bounded in time.

A GPU fallen off the bus blocks NVML in the kernel, where no signal ends the call: each call is
made in a thread of its own (``bounded.within``) and waited for ``NVML_TIMEOUT_S`` on an
injectable clock; after one hangs, NVML is given up on for the run (``NvmlHung``).
"""

from __future__ import annotations

import ctypes
import importlib
from collections.abc import Callable
from typing import Any

from ..bounded import StillRunning, within
from ..host import SYSTEM_CLOCK, Clock, HostError
from ..linux.pciaddr import normalize_address
from .nvmlapi import (
    ECC_COUNTS,
    INSTALL_HINT,
    NVML_TIMEOUT_S,
    NvmlHung,
    NvmlNotSupported,
    NvmlPermissionError,
    NvmlUnavailable,
    RemappedRows,
)
from .nvmlcodes import P2P_STATUS as P2P_STATUS  # re-exported
from .nvmlcodes import TOPOLOGY as TOPOLOGY  # re-exported

P2P_CAPS_INDEX_READ = 0
"""nvmlGpuP2PCapsIndex_t NVML_P2P_CAPS_INDEX_READ."""
NOT_SUPPORTED = (3, 13)
"""NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND (an NVMLError's ``value``)."""
TEMPERATURE_GPU = 0
"""nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU."""

class Watchdog:
    """Makes each call into the NVML library in a thread of its own, waited for ``timeout``
    seconds of ``clock`` (``bounded.within``: ctypes lets go of the GIL in the call); after one
    hangs, every later call fails at once."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK, timeout: float = NVML_TIMEOUT_S) -> None:
        self.clock = clock
        self.timeout = timeout
        self.hung: str | None = None

    def call(self, name: str, function: Callable[..., Any], *args: Any) -> Any:
        if self.hung is not None:
            raise NvmlHung(self.hung)
        try:
            return within(self.timeout, lambda: function(*args), name=f"nvml-{name}",
                          clock=self.clock)
        except StillRunning:
            self.hung = (f"NVML {name} did not return within {self.timeout:g} s: a GPU may "
                         "have fallen off the bus or the driver is wedged (look for Xid 79 or "
                         "\"fallen off the bus\" in the kernel log, or try nvidia-smi); NVML is "
                         "given up on for the rest of this run")
            raise NvmlHung(self.hung) from None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class PynvmlNvml:
    """nvidia-ml-py (``import pynvml``), imported lazily. Every call into the library is
    bounded by NVML_TIMEOUT_S of its watchdog's clock (``NvmlHung``)."""

    def __init__(self, pynvml: Any, watchdog: Watchdog | None = None) -> None:
        self._nv = pynvml
        self._watchdog = watchdog or Watchdog()
        call = self._watchdog.call
        count = call("nvmlDeviceGetCount", pynvml.nvmlDeviceGetCount)
        self._handles: dict[str, Any] = {}
        for index in range(count):
            handle = call("nvmlDeviceGetHandleByIndex", pynvml.nvmlDeviceGetHandleByIndex, index)
            info = call("nvmlDeviceGetPciInfo", pynvml.nvmlDeviceGetPciInfo, handle)
            self._handles[normalize_address(_text(info.busId))] = handle

    @classmethod
    def open(cls, *, clock: Clock = SYSTEM_CLOCK) -> PynvmlNvml:
        """nvmlInit and the GPUs' handles, each call bounded by NVML_TIMEOUT_S of ``clock``."""
        try:
            pynvml = importlib.import_module("pynvml")
        except ImportError:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {INSTALL_HINT}") from None
        watchdog = Watchdog(clock)
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
            if getattr(exc, "value", None) in NOT_SUPPORTED:
                raise NvmlNotSupported(f"NVML {name}: {exc}") from exc
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

    def name(self, address: str) -> str:
        return _text(self._call("nvmlDeviceGetName", self._handle(address)))

    def ecc_errors(self, address: str, count: str) -> int:
        index = ECC_COUNTS.index(count)  # (corrected, uncorrected) x (volatile, aggregate)
        return int(self._call("nvmlDeviceGetTotalEccErrors", self._handle(address),
                              index // 2, index % 2))

    def remapped_rows(self, address: str) -> RemappedRows:
        corrected, uncorrected, pending, failure = self._call("nvmlDeviceGetRemappedRows",
                                                              self._handle(address))
        return RemappedRows(int(corrected), int(uncorrected), bool(pending), bool(failure))

    def retired_pages_pending(self, address: str) -> bool:
        state = self._call("nvmlDeviceGetRetiredPagesPendingStatus", self._handle(address))
        return bool(state == self._nv.NVML_FEATURE_ENABLED)

    def temperature(self, address: str) -> int:
        return int(self._call("nvmlDeviceGetTemperature", self._handle(address),
                              TEMPERATURE_GPU))

    def clocks_event_reasons(self, address: str) -> int:
        name = ("nvmlDeviceGetCurrentClocksEventReasons"
                if hasattr(self._nv, "nvmlDeviceGetCurrentClocksEventReasons")
                else "nvmlDeviceGetCurrentClocksThrottleReasons")
        return int(self._call(name, self._handle(address)))
