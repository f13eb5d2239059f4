"""A GPU's health and one moment of its state, read through NVML's own calls over ctypes: what
``gpus.Gpus`` adds to its facts (``health_of``) and what one sample of every GPU holds
(``moment_of``), each fact its own call, so that a call the driver does not support costs that fact
only.

``nv`` is the caller (``gpus.Gpus``): ``nv.call(name, *args)`` raises ``OpError`` (errno
EOPNOTSUPP where NVML answers NVML_ERROR_NOT_SUPPORTED or NVML_ERROR_FUNCTION_NOT_FOUND, and
AttributeError where the library lacks the symbol) and ``nv.each(facts, key, read)`` turns what
one read raises into ``{"error": why}``, with ``"unsupported": true`` for those two.

The structures and enums are nvml.h's (12.x/13.x): ``nvmlViolationTime_t``,
``nvmlProcessInfo_v1_t`` (pid, usedGpuMemory: 16 bytes; what the unversioned
``nvmlDeviceGetComputeRunningProcesses`` fills) and ``nvmlProcessInfo_v2_t`` /
``nvmlProcessInfo_t`` (pid, usedGpuMemory, gpuInstanceId, computeInstanceId: 24 bytes; what
``_v2`` and ``_v3`` fill)."""

from __future__ import annotations

import ctypes
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from typing import Any

PERF_POLICIES = (("power", 0), ("thermal", 1), ("sync_boost", 2), ("board_limit", 3),
                 ("reliability", 5), ("total_app_clocks", 10), ("total_base_clocks", 11))
"""nvmlPerfPolicyType_t: NVML_PERF_POLICY_POWER ... _TOTAL_BASE_CLOCKS, as the sample names
them (``violations``)."""
ECC_COUNTS = (("corrected_volatile", 0, 0), ("corrected_aggregate", 0, 1),
              ("uncorrected_volatile", 1, 0), ("uncorrected_aggregate", 1, 1))
"""(name, nvmlMemoryErrorType_t, nvmlEccCounterType_t) of nvmlDeviceGetTotalEccErrors."""
CLOCK_SM, CLOCK_MEM = 1, 2
"""nvmlClockType_t NVML_CLOCK_SM and NVML_CLOCK_MEM."""
TEMPERATURE_GPU = 0
"""nvmlTemperatureSensors_t NVML_TEMPERATURE_GPU."""
INSUFFICIENT_SIZE = 7
"""NVML_ERROR_INSUFFICIENT_SIZE: more processes than the buffer holds (the count says how
many)."""
NOT_AVAILABLE = 2**64 - 1
"""NVML_VALUE_NOT_AVAILABLE: a process's used memory where the driver does not say."""
NAME_SIZE = 96
"""NVML_DEVICE_NAME_V2_BUFFER_SIZE."""


class _Violation(ctypes.Structure):
    """nvmlViolationTime_t."""

    _fields_ = [("referenceTime", ctypes.c_ulonglong), ("violationTime", ctypes.c_ulonglong)]


class _ProcessV1(ctypes.Structure):
    """nvmlProcessInfo_v1_t."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessV2(ctypes.Structure):
    """nvmlProcessInfo_v2_t, and nvmlProcessInfo_t of ``_v3``: the same layout."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


PROCESS_CALLS = (("nvmlDeviceGetComputeRunningProcesses_v3", _ProcessV2),
                 ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessV2),
                 ("nvmlDeviceGetComputeRunningProcesses", _ProcessV1))
"""The newest the library has first, each with the structure it fills."""


def _uint(nv: Any, name: str, handle: Any, *before: Any) -> int:
    value = ctypes.c_uint()
    nv.call(name, handle, *before, ctypes.byref(value))
    return int(value.value)


def ecc_counts(nv: Any, handle: Any, names: tuple[str, ...]) -> dict[str, object]:
    """nvmlDeviceGetTotalEccErrors of each count named: ``{name: count or {"error"...}}``."""
    counts: dict[str, object] = {}
    for name, error_type, counter in ECC_COUNTS:
        if name in names:
            def read(error_type: int = error_type, counter: int = counter) -> int:
                value = ctypes.c_ulonglong()
                nv.call("nvmlDeviceGetTotalEccErrors", handle, ctypes.c_int(error_type),
                        ctypes.c_int(counter), ctypes.byref(value))
                return int(value.value)
            nv.each(counts, name, read)
    return counts


def remapped_rows_of(nv: Any, handle: Any) -> dict[str, object]:
    """nvmlDeviceGetRemappedRows: ``{"corrected", "uncorrected", "pending", "failure"}``."""
    corrected, uncorrected, pending, failure = (ctypes.c_uint() for _ in range(4))
    nv.call("nvmlDeviceGetRemappedRows", handle, ctypes.byref(corrected),
            ctypes.byref(uncorrected), ctypes.byref(pending), ctypes.byref(failure))
    return {"corrected": int(corrected.value), "uncorrected": int(uncorrected.value),
            "pending": bool(pending.value), "failure": bool(failure.value)}


def retired_pending_of(nv: Any, handle: Any) -> bool:
    """nvmlDeviceGetRetiredPagesPendingStatus: a page retirement waits for the next reset."""
    state = ctypes.c_int()
    nv.call("nvmlDeviceGetRetiredPagesPendingStatus", handle, ctypes.byref(state))
    return state.value == 1


def event_reasons_of(nv: Any, handle: Any) -> int:
    """nvmlDeviceGetCurrentClocksEventReasons's bits (``...ThrottleReasons`` on a driver that
    predates the name)."""
    value = ctypes.c_ulonglong()
    try:
        nv.call("nvmlDeviceGetCurrentClocksEventReasons", handle, ctypes.byref(value))
    except AttributeError:
        nv.call("nvmlDeviceGetCurrentClocksThrottleReasons", handle, ctypes.byref(value))
    return int(value.value)


def gpu_name(nv: Any, handle: Any) -> str:
    buffer = ctypes.create_string_buffer(NAME_SIZE)
    nv.call("nvmlDeviceGetName", handle, buffer, ctypes.c_uint(NAME_SIZE))
    return buffer.value.decode("utf-8", "replace")


def health_of(nv: Any, handle: Any, gpu: dict[str, object]) -> None:
    """The health facts of one GPU, added to its facts (``name``, ``ecc_errors``,
    ``remapped_rows``, ``retired_pages_pending``, ``temperature`` in C,
    ``clocks_event_reasons``)."""
    nv.each(gpu, "name", lambda: gpu_name(nv, handle))
    gpu["ecc_errors"] = ecc_counts(nv, handle, tuple(n for n, _, _ in ECC_COUNTS))
    nv.each(gpu, "remapped_rows", lambda: remapped_rows_of(nv, handle))
    nv.each(gpu, "retired_pages_pending", lambda: retired_pending_of(nv, handle))
    nv.each(gpu, "temperature",
            lambda: _uint(nv, "nvmlDeviceGetTemperature", handle, ctypes.c_int(TEMPERATURE_GPU)))
    nv.each(gpu, "clocks_event_reasons", lambda: event_reasons_of(nv, handle))


def compute_processes(nv: Any, handle: Any) -> list[dict[str, object]]:
    """The compute processes on the GPU: ``[{"pid", "used_memory"}]`` (bytes; None where the
    driver does not say), through the newest call the library has."""
    for call, structure in PROCESS_CALLS:
        if getattr(nv.lib, call, None) is None:
            continue
        count = ctypes.c_uint(64)
        for _ in range(3):
            infos = (structure * max(count.value, 1))()
            code = getattr(nv.lib, call)(handle, ctypes.byref(count), infos)
            if code != INSUFFICIENT_SIZE:
                break
            count = ctypes.c_uint(count.value + 8)
        nv.check(call, code)
        return [{"pid": int(info.pid), "used_memory": None
                 if info.usedGpuMemory == NOT_AVAILABLE else int(info.usedGpuMemory)}
                for info in infos[:count.value]]
    raise AttributeError("no nvmlDeviceGetComputeRunningProcesses in the library")


def violations_of(nv: Any, handle: Any) -> dict[str, object]:
    """nvmlDeviceGetViolationStatus of each policy: ``{policy: {"reference_time",
    "violation_time"}}`` (the driver's microsecond stamp and nanoseconds in violation)."""
    found: dict[str, object] = {}
    for policy, number in PERF_POLICIES:
        def read(number: int = number) -> dict[str, int]:
            value = _Violation()
            nv.call("nvmlDeviceGetViolationStatus", handle, ctypes.c_int(number),
                    ctypes.byref(value))
            return {"reference_time": int(value.referenceTime),
                    "violation_time": int(value.violationTime)}
        nv.each(found, policy, read)
    return found


def moment_of(nv: Any, handle: Any) -> dict[str, object]:
    """One GPU now: what a benchmark's envelope compares between samples. ``monotonic`` is the
    agent's clock when the GPU's reads began."""
    gpu: dict[str, object] = {"monotonic": time.monotonic()}
    gpu["violations"] = violations_of(nv, handle)
    nv.each(gpu, "clocks_event_reasons", lambda: event_reasons_of(nv, handle))
    for key, call, clock in (("sm_clock", "nvmlDeviceGetClockInfo", CLOCK_SM),
                             ("mem_clock", "nvmlDeviceGetClockInfo", CLOCK_MEM),
                             ("max_sm_clock", "nvmlDeviceGetMaxClockInfo", CLOCK_SM),
                             ("max_mem_clock", "nvmlDeviceGetMaxClockInfo", CLOCK_MEM)):
        nv.each(gpu, key, lambda call=call, clock=clock: _uint(nv, call, handle,
                                                               ctypes.c_int(clock)))
    nv.each(gpu, "temperature",
            lambda: _uint(nv, "nvmlDeviceGetTemperature", handle, ctypes.c_int(TEMPERATURE_GPU)))
    nv.each(gpu, "power_usage", lambda: _uint(nv, "nvmlDeviceGetPowerUsage", handle))
    nv.each(gpu, "power_limit", lambda: _uint(nv, "nvmlDeviceGetEnforcedPowerLimit", handle))
    nv.each(gpu, "processes", lambda: compute_processes(nv, handle))
    gpu["ecc_errors"] = ecc_counts(nv, handle, ("corrected_volatile", "uncorrected_volatile"))
    nv.each(gpu, "remapped_rows", lambda: remapped_rows_of(nv, handle))
    nv.each(gpu, "retired_pages_pending", lambda: retired_pending_of(nv, handle))
    nv.each(gpu, "pcie_replays", lambda: _uint(nv, "nvmlDeviceGetPcieReplayCounter", handle))
    nv.each(gpu, "link_generation",
            lambda: _uint(nv, "nvmlDeviceGetCurrPcieLinkGeneration", handle))
    nv.each(gpu, "link_width", lambda: _uint(nv, "nvmlDeviceGetCurrPcieLinkWidth", handle))
    return gpu
