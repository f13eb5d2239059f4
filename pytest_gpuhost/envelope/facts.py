"""What one sample of a benchmark's envelope holds: each GPU's counters and readings at one
moment (``GpuFacts``), and the small interface every source of them answers (``GpuSampler``:
NVML over ctypes, nvidia-smi, a target's agent, or a test's fake).

Counters are as NVML gives them: cumulative since the driver loaded (violation times in
nanoseconds, ECC errors, PCIe replays), so that a window's share or count is a difference of
two samples; readings (clocks, temperature, power, the clock event reasons, the processes) are
what the GPU does at that moment. A value a source cannot read is None, never 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec

# nvmlClocksEventReasons (nvml.h; ``nvmlClocksThrottleReasons`` on older drivers)
GPU_IDLE = 0x1
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL_SLOWDOWN = 0x20
HW_THERMAL_SLOWDOWN = 0x40
HW_POWER_BRAKE_SLOWDOWN = 0x80
SLOWDOWNS = {
    "HW slowdown": HW_SLOWDOWN,
    "HW thermal slowdown": HW_THERMAL_SLOWDOWN,
    "HW power brake slowdown": HW_POWER_BRAKE_SLOWDOWN,
    "SW thermal slowdown": SW_THERMAL_SLOWDOWN,
}
"""The reasons the ``slowdown`` limit judges, by the words a reason says them in."""
POWER_CAPS = {"SW power cap": SW_POWER_CAP}
"""The reason the ``power_cap`` limit judges."""
POLICIES = ("power", "thermal", "sync_boost", "board_limit", "reliability", "total_app_clocks",
            "total_base_clocks")
"""``nvmlDeviceGetViolationStatus``'s policies (``NVML_PERF_POLICY_POWER``...), by name."""
JUDGED_POLICIES = {"thermal": "slowdown", "power": "power_cap"}
"""The violation times a limit judges (the others are shown, not judged: base clocks are
"violated" by every boost)."""


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
    """Compute processes on the GPU: pid (as the GPU's host numbers it) -> name."""
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    remapped_pending: bool | None = None
    remapped_failure: bool | None = None
    pcie_replays: int | None = None
    link_generation: int | None = None
    link_width: int | None = None


class Sample(msgspec.Struct, frozen=True):
    """Every GPU's facts at ``at`` (seconds of the envelope's clock), by PCI address; or why
    none could be read (``error``: the sampler's failure is a line, not a failed benchmark)."""

    at: float
    gpus: Mapping[str, GpuFacts] = msgspec.field(default_factory=dict)
    error: str | None = None
    ours: frozenset[int] = frozenset()
    """The benchmark's processes at that moment (its process tree, as the GPUs' host numbers
    them): a process on a GPU that is not among them is another's."""


class NoGpus(Exception):
    """A sampler has no GPUs to read on this host (no NVIDIA driver, no nvidia-smi): the
    envelope holds its host half and says the GPU half is missing, once, not at every sample."""


class GpuSampler(Protocol):
    """A source of GPU facts: NVML, nvidia-smi, a target's agent, a fake."""

    def describe(self) -> str:
        """What it reads, for the envelope's record (``NVML 570.86``, ``nvidia-smi``)."""

    def sample(self) -> Mapping[str, GpuFacts]:
        """Every GPU's facts now, by sysfs PCI address (``0000:41:00.0``); raises HostError
        (or any exception: the envelope records it) where it cannot read them."""


class HostSide(msgspec.Struct, frozen=True):
    """What the host says of itself at one end of the window, without NVML."""

    aer: Mapping[str, Mapping[str, int]] = msgspec.field(default_factory=dict)
    """Device (each GPU and each bridge on its path) -> ``aer_dev_*`` -> total."""
    state: Mapping[str, str | None] | None = None
    """Each host check's id -> the value it reads now; None: not read (no spec)."""


class HostWindow(msgspec.Struct, frozen=True):
    """The host's half of an envelope: both ends, and the kernel log's records in between."""

    before: HostSide = HostSide()
    after: HostSide = HostSide()
    kernel_log: tuple[str, ...] = ()
    """The text of each new kernel log record (Xid, NVRM, AER) since the window opened."""
    errors: tuple[str, ...] = ()
    """What of the host's half could not be read, each a line."""
