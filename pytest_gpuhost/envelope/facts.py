"""What one sample of a benchmark's envelope holds: each GPU's counters and readings at one
moment (``GpuFacts``, the GPU layer's one model of them, re-exported here where a sampler
plugin has always imported it), the small interface every source of them answers
(``GpuSampler``: NVML over ctypes, nvidia-smi, a target's agent, or a test's fake), and the
host's half of a window.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec

from ..gpu.gpufacts import GPU_IDLE as GPU_IDLE  # re-exported: the envelope's names
from ..gpu.gpufacts import HW_POWER_BRAKE_SLOWDOWN as HW_POWER_BRAKE_SLOWDOWN
from ..gpu.gpufacts import HW_SLOWDOWN as HW_SLOWDOWN
from ..gpu.gpufacts import HW_THERMAL_SLOWDOWN as HW_THERMAL_SLOWDOWN
from ..gpu.gpufacts import POLICIES as POLICIES
from ..gpu.gpufacts import SW_POWER_CAP as SW_POWER_CAP
from ..gpu.gpufacts import SW_THERMAL_SLOWDOWN as SW_THERMAL_SLOWDOWN
from ..gpu.gpufacts import GpuFacts as GpuFacts

SLOWDOWNS = {
    "HW slowdown": HW_SLOWDOWN,
    "HW thermal slowdown": HW_THERMAL_SLOWDOWN,
    "HW power brake slowdown": HW_POWER_BRAKE_SLOWDOWN,
    "SW thermal slowdown": SW_THERMAL_SLOWDOWN,
}
"""The reasons the ``slowdown`` limit judges, by the words a reason says them in."""
POWER_CAPS = {"SW power cap": SW_POWER_CAP}
"""The reason the ``power_cap`` limit judges."""
JUDGED_POLICIES = {"thermal": "slowdown", "power": "power_cap"}
"""The violation times a limit judges (the others are shown, not judged: base clocks are
"violated" by every boost)."""


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
