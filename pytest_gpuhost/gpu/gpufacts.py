"""What one GPU's driver says at one moment (``GpuFacts``): the one model of a GPU sample, which
the host's own driver gives (``nvmlsample.take_sample``), a plugin's sampler builds, and a
benchmark's envelope judges (``envelope.facts`` re-exports it).

Counters are as NVML gives them: cumulative since the driver loaded (violation times in
nanoseconds, ECC errors, PCIe replays), so that a window's share or count is a difference of
two samples; readings (clocks, temperature, power, the clock event reasons, the processes) are
what the GPU does at that moment. Units are NVML's: clocks in MHz, temperature in C, power in
mW, memory in bytes. A value a source cannot read is None, never 0; ``missing`` says why, by
the driver's name of the fact.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

# nvmlClocksEventReasons (nvml.h; ``nvmlClocksThrottleReasons`` on older drivers)
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
POLICIES = ("power", "thermal", "sync_boost", "board_limit", "reliability", "total_app_clocks",
            "total_base_clocks")
"""``nvmlDeviceGetViolationStatus``'s policies (``NVML_PERF_POLICY_POWER``...), by name."""


class GpuFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    """One GPU at one moment; None: the source could not read it."""

    violation_ns: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Policy (``POLICIES``) -> nanoseconds spent in violation since the driver loaded."""
    violation_at_us: int | None = None
    """The driver's own timestamp of those times (``referenceTime``, microseconds): where two
    samples have it, a share is over its difference, the driver's clock for its counters."""
    reasons: int | None = None
    """The clock event reasons' bit mask."""
    sm_clock: int | None = None
    sm_max: int | None = None
    mem_clock: int | None = None
    mem_max: int | None = None
    temperature: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    processes: Mapping[int, str] | None = None
    """Compute processes on the GPU: pid (as the GPU's host numbers it) -> name ("" where the
    source gave none)."""
    process_memory: Mapping[int, int] = msgspec.field(default_factory=dict)
    """Of those processes, the GPU memory each uses (bytes), where the source says."""
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    remapped_corrected: int | None = None
    """Rows remapped for corrected errors (``nvmlDeviceGetRemappedRows``)."""
    remapped_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    pcie_replays: int | None = None
    link_generation: int | None = None
    link_width: int | None = None
    monotonic: float | None = None
    """The reading agent's clock (seconds) when this GPU's reads began."""
    missing: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Each fact the source did not give, by the driver's name of it (``power_usage``,
    ``violations.thermal``, ``ecc_errors.uncorrected_volatile``), and why (``not supported:
    ...`` where the driver does not support it)."""
