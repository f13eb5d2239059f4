"""What NVML knows about the GPUs, behind a small interface that tests replace with a fake.

``Nvml`` is the handful of calls the checks need (``nvmlapi``, re-exported here).
``PynvmlNvml`` (``nvmllib``) wraps nvidia-ml-py, imported only when a check first needs it (the
extra ``pytest-gpuhost[nvml]``), each call bounded in time by an injectable clock. ``FakeNvml``
(``nvmlrecorded``) is the in-memory stand-in for tests; ``RecordedNvml`` reads NVML facts
recorded as files in a fake host tree (``var/lib/pytest-gpuhost/nvml/``), so an offline root
has NVML facts too.

NVML describes the machine the process runs on, so the real library is used only when the host
root is ``/``: a fake tree never mixes its sysfs with this machine's GPUs. Any other host (an ssh
target, a container, a tree with a driver of its own) answers from its own NVIDIA driver
through its agent (``agentnvml``): its libnvidia-ml.so.1, or nvidia-smi there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import Host, HostError, Request
from .nvmlapi import (  # re-exported: the interface every NVML builds on
    ECC_COUNTS,
    HEALTH,
    INSTALL_HINT,
    NVML_TIMEOUT_S,
    PERSISTENCE,
    RECORDED_NVML,
    RECORDED_READS,
    HostNvml,
    Nvml,
    NvmlFactory,
    NvmlHung,
    NvmlNotSupported,
    NvmlPermissionError,
    NvmlUnavailable,
    RemappedRows,
    persistence_text,
)


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
    "ECC_COUNTS",
    "HEALTH",
    "INSTALL_HINT",
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
    "NvmlNotSupported",
    "NvmlPermissionError",
    "NvmlSource",
    "NvmlUnavailable",
    "PynvmlNvml",
    "RecordedNvml",
    "RemappedRows",
    "default_factory",
    "persistence_text",
]
