"""What NVML knows about the GPUs, behind a small interface that tests replace with a fake.

``Nvml`` is the handful of calls the checks need. ``PynvmlNvml`` (``nvmllib``) wraps
nvidia-ml-py, imported only when a check first needs it (the extra ``pytest-gpuhost[nvml]``),
each call bounded in time by an injectable clock. ``FakeNvml`` (``nvmlrecorded``) is the
in-memory stand-in for tests; ``RecordedNvml`` reads NVML facts recorded as files in a fake host
tree (``var/lib/pytest-gpuhost/nvml/``), so an offline root has NVML facts too.

NVML describes the machine the process runs on, so the real library is used only when the host
root is ``/``: a fake tree never mixes its sysfs with this machine's GPUs. Any other host (an ssh
target, a container, a tree with a driver of its own) answers from its own NVIDIA driver
through its agent (``agentnvml``): its libnvidia-ml.so.1, or nvidia-smi there.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ..host import Glob, Host, HostError, Request

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
        return tuple(nvml.reads) if isinstance(nvml, HostNvml) else ()


def default_factory(host: Host) -> NvmlFactory:
    """NVML for ``host``: the real library on ``/``, a recorded snapshot in a fake tree that
    has one, else the host's own driver asked by its agent (``agentnvml``)."""
    from .agentnvml import AgentNvml, agent_facts

    def open_nvml() -> Nvml:
        if host.local_machine():
            from .nvmllib import PynvmlNvml  # nvidia-ml-py's wrapper: the root / only

            return PynvmlNvml.open()
        # the same batch its calls read, cached; the agent's own NVML asked in it too (one
        # round trip for whichever answers)
        recorded = host.batch([*RECORDED_READS, *AgentNvml.reads])[:len(RECORDED_READS)]
        if any(path == f"{RECORDED_NVML}/gpus" for reply in recorded if reply.error is None
               for path, _ in reply.matches()):
            from .nvmlrecorded import RecordedNvml

            return RecordedNvml(host)
        try:
            agent_facts(host)
        except NvmlUnavailable as exc:
            raise NvmlUnavailable(
                f"the host root {host.describe()} is not this machine, so this machine's NVML "
                f"does not describe it, and it has no recorded {RECORDED_NVML} nor an NVML of "
                f"its own: {exc}") from None
        return AgentNvml(host)

    return open_nvml


if TYPE_CHECKING:
    from .nvmllib import P2P_STATUS, TOPOLOGY, PynvmlNvml
    from .nvmlrecorded import FakeGpu, FakeNvml, RecordedNvml

_LIBRARY = ("P2P_STATUS", "TOPOLOGY", "PynvmlNvml")
_RECORDED = ("FakeGpu", "FakeNvml", "RecordedNvml")


def __getattr__(name: str) -> object:
    """nvidia-ml-py's wrapper (``nvmllib``), imported on first use: a run on a root that is not
    this machine never opens the library; and the NVML of a recorded snapshot or of a test
    (``nvmlrecorded``, built on this module), which a run on a tree without one never uses."""
    if name in _LIBRARY:
        from . import nvmllib

        return getattr(nvmllib, name)
    if name in _RECORDED:
        from . import nvmlrecorded

        return getattr(nvmlrecorded, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "NVML_TIMEOUT_S",
    "P2P_STATUS",
    "PERSISTENCE",
    "RECORDED_NVML",
    "RECORDED_READS",
    "TOPOLOGY",
    "FakeGpu",
    "FakeNvml",
    "HostNvml",
    "Nvml",
    "NvmlFactory",
    "NvmlHung",
    "NvmlPermissionError",
    "NvmlSource",
    "NvmlUnavailable",
    "PynvmlNvml",
    "RecordedNvml",
    "default_factory",
    "persistence_text",
]
