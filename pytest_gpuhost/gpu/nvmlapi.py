"""The NVML interface: the calls pytest-gpuhost uses (``Nvml``), the errors they raise, the
recorded snapshot's place in a tree, and persistence mode as the spec names it. Every NVML
(``nvmllib``, ``nvmlrecorded``, ``agentnvml``) builds on this module; ``nvml`` re-exports it and
chooses among them."""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import msgspec

from ..host import Glob, HostError, Request

RECORDED_NVML = "var/lib/pytest-gpuhost/nvml"
RECORDED_READS = (Glob(f"{RECORDED_NVML}/*"), Glob(f"{RECORDED_NVML}/*/*"))
"""What a recorded snapshot is read with (``RecordedNvml.reads``): a target's first batch asks
for it, whether or not its tree holds one (``nvmlrecorded`` loads only where one does)."""
INSTALL_HINT = ("install nvidia-ml-py: pip install 'pytest-gpuhost[nvml]' (from a checkout: "
                "pip install '.[nvml]')")


class NvmlUnavailable(Exception):
    """NVML cannot be used here; the message says why and what to do (checks skip with it)."""


class NvmlPermissionError(Exception):
    """A setter NVML refused for lack of privilege (persistence mode needs root)."""


class NvmlNotSupported(HostError):
    """The GPU or its driver does not support a fact (NVML_ERROR_NOT_SUPPORTED, a call the
    library lacks, nvidia-smi's ``[N/A]``): that fact alone is missing, never the others."""

    def __init__(self, message: str) -> None:
        super().__init__(message, errno.EOPNOTSUPP)


ECC_COUNTS = ("corrected_volatile", "corrected_aggregate", "uncorrected_volatile",
              "uncorrected_aggregate")
"""nvmlDeviceGetTotalEccErrors's counts: (corrected, uncorrected) x (volatile: since the
driver loaded, aggregate: the card's life)."""
HEALTH = ("name", "ecc_errors", "remapped_rows", "retired_pages_pending", "temperature",
          "clocks_event_reasons")
"""The health facts of a GPU, as the agent's facts and a recorded snapshot's files name them."""


class RemappedRows(msgspec.Struct, frozen=True):
    """nvmlDeviceGetRemappedRows: rows remapped for corrected and uncorrected errors, a remap
    waiting for the GPU's next reset, and whether a remap failed."""

    corrected: int
    uncorrected: int
    pending: bool
    failure: bool


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

    # The health facts: each raises NvmlNotSupported where the GPU or driver lacks it.

    def name(self, address: str) -> str:
        """nvmlDeviceGetName: the model (``NVIDIA RTX PRO 6000 Blackwell Server Edition``)."""

    def ecc_errors(self, address: str, count: str) -> int:
        """nvmlDeviceGetTotalEccErrors of one of ``ECC_COUNTS``."""

    def remapped_rows(self, address: str) -> RemappedRows:
        """nvmlDeviceGetRemappedRows."""

    def retired_pages_pending(self, address: str) -> bool:
        """nvmlDeviceGetRetiredPagesPendingStatus: a page retirement waits for a reset."""

    def temperature(self, address: str) -> int:
        """nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU), C, now."""

    def clocks_event_reasons(self, address: str) -> int:
        """nvmlDeviceGetCurrentClocksEventReasons's bits (``nvmlcodes.CLOCKS_EVENT_REASONS``)."""


PERSISTENCE = ("enabled", "disabled")
"""Persistence mode as the spec names it (the ``gpus.persistence_mode`` choice); a recorded
NVML file holds it capitalized, as nvidia-smi prints it (``Enabled``)."""


def persistence_text(enabled: bool) -> str:
    return PERSISTENCE[0] if enabled else PERSISTENCE[1]


NvmlFactory = Callable[[], Nvml]
"""Opens NVML; raises NvmlUnavailable with the reason. Called at most once per session."""



@runtime_checkable
class HostNvml(Protocol):
    """An NVML whose calls read the host (a recorded snapshot): what a prefetch reads for it."""

    reads: Sequence[Request]
