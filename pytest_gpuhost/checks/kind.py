"""What a check kind is: three members every kind has, and an optional half, declared.

The optional half is a set of small ``runtime_checkable`` protocols, each had whole or not at
all, as the host's are (``host.Closable``, ``host.Connection``, ``host.PhaseCache``): a kind is
``isinstance`` of the ones it supplies, and the functions below say, once, what the absence of
each means. A kind that stands for another (``StandIn``: a built-in kind imported on first use)
has the optional half of the kind it stands for. Nothing else asks a kind what it has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .persistence import PERSIST_TARGETS, PersistLine

if TYPE_CHECKING:
    from ..result import CheckResult
    from ..specmodel import Node, SpecContext
    from . import Check, Fact, Facts
    from .capturing import Captured, Records

KERNEL, NAMESPACE, USERSPACE = "kernel", "namespace", "userspace"
SCOPES = (KERNEL, NAMESPACE, USERSPACE)
"""Where a setting lives (docs/reference.md, "Where a setting lives"): ``kernel``, the running
kernel and the hardware (the machine that runs the kernel); ``namespace``, what a container owns
of it (the sysctls the kernel keeps per namespace: a network namespace's ``net.*``, an IPC
namespace's ``kernel.shm*``, ``kernel.msg*``, ``kernel.sem``, ``fs.mqueue.*``, a UTS
namespace's ``kernel.hostname``);
``userspace``, files and tools of the root the check runs in (the NVML library, the bandwidth
the benchmark sees)."""


class Kind(Protocol):
    """A check kind, as registered through the ``pytest_gpuhost_check_kinds`` hook.

    Beside ``section``, ``parse`` and ``expand``, a kind may be any of ``Scoped``,
    ``Measured``, ``NeedsFacts``, ``Persisting``, ``PersistsTo`` and ``Capturing``: its
    optional half (docs/adding-a-kind.md)."""

    section: str

    def parse(self, node: Node, context: SpecContext) -> object:
        """Validate the spec section into a frozen model; raise SpecError."""

    def expand(self, section: Any, facts: Facts) -> Sequence[Check]:
        """One check per item of the section on this host, in a stable order."""


# -- the optional half: each a small protocol, had whole or not at all ---------------------------


@runtime_checkable
class Scoped(Protocol):
    """A kind that says where its settings live (absent: ``kernel``)."""

    section: str
    scope: str
    """One of ``SCOPES``."""


@runtime_checkable
class Measured(Protocol):
    """A kind that says whether its checks are measurements, not settings (absent: False)."""

    measured: bool


@runtime_checkable
class NeedsFacts(Protocol):
    """A kind whose ``expand`` needs host facts (absent: none)."""

    def facts(self, section: Any) -> Sequence[Fact[Any]]:
        """The facts ``expand`` will get, read for every kind of the spec in one batch."""


@runtime_checkable
class Persisting(Protocol):
    """A kind whose values ``--fix-persist`` makes survive a reboot (absent: no lines)."""

    def persistence(self, results: Sequence[CheckResult]) -> Sequence[PersistLine]:
        """The lines for its checks' values (``persistence.settled`` gives the right ones)."""


@runtime_checkable
class PersistsTo(Protocol):
    """A kind that says, at collection, which persistence targets a check's lines may go to
    (absent: every target for a ``Persisting`` kind, none for another), so that each file
    --fix-persist may write is an item of its own."""

    def persists_to(self, check: Check) -> Sequence[str]:
        """Some of ``PERSIST_TARGETS``."""


@runtime_checkable
class Capturing(Protocol):
    """A kind that writes its section back as the host holds it, for ``--gpuhost-capture``
    (absent: the captured spec says the kind has no capture)."""

    def capture(self, section: Any, records: Records) -> Captured:
        """``checks.capturing`` has the usual forms."""


@runtime_checkable
class StandIn(Protocol):
    """A kind that stands for another (a built-in kind imported on first use): its optional
    half is that kind's."""

    def standing_for(self) -> object:
        """The kind it stands for (imported now if it is not yet)."""

    def loaded(self) -> object | None:
        """The kind it stands for if this run imported it already, else None."""


@runtime_checkable
class NamedKind(Protocol):
    """A kind that stands for another and names it (a built-in kind imported on first use)."""

    @property
    def qualname(self) -> str: ...


Capturer = Callable[[Any, "Records"], "Captured"]
"""A kind's ``capture(section, records)``."""
PersistenceSupply = Callable[[Sequence["CheckResult"]], Sequence[PersistLine]]
"""A kind's ``persistence(results)``."""
PersistTargets = Callable[["Check"], Sequence[str]]
"""A kind's ``persists_to(check)``."""


def own(kind: object) -> object:
    """The kind itself: the one a stand-in stands for."""
    return kind.standing_for() if isinstance(kind, StandIn) else kind


def kind_name(kind: object) -> str:
    """``pytest_gpuhost.checks.sysctl.SysctlKind``: the class of a kind, built-in or not."""
    if isinstance(kind, NamedKind):
        return kind.qualname
    return f"{type(kind).__module__}.{type(kind).__qualname__}"


def scope_of(kind: object) -> str:
    """The scope a kind declares; ValueError naming the kind for one that is not a scope."""
    kind = own(kind)
    if not isinstance(kind, Scoped):
        return KERNEL
    if kind.scope not in SCOPES:
        raise ValueError(f"check kind {kind_name(kind)} of section {kind.section!r} declares "
                         f"scope {kind.scope!r}; a scope is one of {', '.join(SCOPES)}")
    return str(kind.scope)


def measured_of(kind: object) -> bool:
    """Whether the kind's checks are measurements."""
    kind = own(kind)
    return bool(kind.measured) if isinstance(kind, Measured) else False


def facts_of(kind: object, section: Any) -> Sequence[Fact[Any]]:
    """The facts the kind's ``expand`` of ``section`` needs."""
    kind = own(kind)
    return kind.facts(section) if isinstance(kind, NeedsFacts) else ()


def capturer_of(kind: object) -> Capturer | None:
    """The kind's ``capture``, or None where it has none."""
    kind = own(kind)
    return kind.capture if isinstance(kind, Capturing) else None


def persistence_of(kind: object) -> PersistenceSupply | None:
    """The kind's ``persistence``, or None where it has none: a stand-in's kind that this run
    never loaded has none (it made no records)."""
    kind = kind.loaded() if isinstance(kind, StandIn) else kind
    return kind.persistence if isinstance(kind, Persisting) else None


def persists_to_of(kind: object) -> PersistTargets:
    """Where the kind's persistence lines for a check may go: its ``persists_to``, else every
    target for a kind with ``persistence`` and none for a kind without."""
    kind = own(kind)
    if isinstance(kind, PersistsTo):
        return kind.persists_to
    if not isinstance(kind, Persisting):
        return lambda check: ()
    return lambda check: PERSIST_TARGETS
