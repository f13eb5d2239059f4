"""The checks layer: each kind expands its spec section into checks, observes, and knows its fix.

A *kind* (one module per kind) owns a top-level spec section. It parses the section (the spec
side), then, given a host, expands it into ``Check`` objects with stable ids. Each check carries
an expectation and a *probe* that observes the host and, where the value is fixable, applies it.
Built-in kinds register through the ``pytest_gpuhost_check_kinds`` hook like third-party ones do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..fix.changes import Plan
from ..host import Host
from ..spec import EntryOptions, Node, SpecContext
from ..spec.matchers import Expectation

if TYPE_CHECKING:
    from ..gpu.nvml import NvmlSource

T = TypeVar("T")


@dataclass(frozen=True)
class Evidence:
    """One thing that was read or run: where, and the raw value it gave."""

    source: str
    raw: str

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "raw": self.raw}


@dataclass(frozen=True)
class Observation:
    """What a probe saw. ``value`` is the raw string (None when there is nothing to read);
    ``problem`` explains a None value or a partial reading."""

    value: str | None
    evidence: tuple[Evidence, ...] = ()
    problem: str | None = None
    persisted: tuple[str, str] | None = None
    """(value, where) when boot-time configuration sets this value too (sysctl.d)."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """Kind-specific facts carried into the result record (p2p: gbps, class, floor)."""
    culprits: str | None = None
    """What made a wrong value wrong, named in the failure's message (the line pytest's short
    summary shows): dmesg's first offending records."""


class NotApplicable(Exception):
    """Raised by ``observe`` when the check cannot apply here (NVML absent): the check is
    skipped with this reason."""


class CannotFix(Exception):
    """A failing check that has no safe fix on this host (nothing to write to, builtin module)."""


class Probe(Protocol):
    """Observes one value; if ``fixable``, plans the changes that would make it right."""

    fixable: bool

    def observe(self, host: Host) -> Observation: ...

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        """The changes that make the host hold ``value``, each with its original. Raise
        CannotFix when there is no safe way. Planning reads but never writes."""


class NoFix:
    """Mixin for probes of values that are checked only."""

    fixable = False

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        raise CannotFix("this check has no fixer")


@dataclass(frozen=True)
class Check:
    """One test: a kind, a key (None for host-wide checks), what to expect, and how to look."""

    kind: str
    key: str | None
    expect: Expectation
    options: EntryOptions
    probe: Probe = field(compare=False)
    order: int = 0
    """Sort rank among kinds; checks that must see the others' effects (dmesg) rank last."""

    @property
    def id(self) -> str:
        return self.kind if self.key is None else f"{self.kind}[{self.key}]"


class Facts:
    """Host facts read once per session during expansion (GPU list, CPU list, cpuidle names),
    and the session's ways to reach the GPUs: NVML, opened lazily, and the directory shared
    with xdist workers (where bandwidth is measured once, under a lock).

    Observations never come from here: they are read fresh by each check, after any fix.
    """

    def __init__(self, host: Host, *, nvml: NvmlSource | None = None,
                 shared_dir: Path | None = None) -> None:
        self.host = host
        self.shared_dir = shared_dir
        """Shared with the other xdist workers of this session; None without xdist."""
        self._nvml = nvml
        self._cache: dict[Callable[[Host], Any], Any] = {}

    @property
    def nvml(self) -> NvmlSource:
        if self._nvml is None:
            from ..gpu.nvml import NvmlSource, default_factory

            self._nvml = NvmlSource(default_factory(self.host))
        return self._nvml

    def get(self, reader: Callable[[Host], T]) -> T:
        if reader not in self._cache:
            self._cache[reader] = reader(self.host)
        value: T = self._cache[reader]
        return value


class Kind(Protocol):
    """A check kind, as registered through the ``pytest_gpuhost_check_kinds`` hook."""

    section: str

    def parse(self, node: Node, context: SpecContext) -> object:
        """Validate the spec section into a frozen model; raise SpecError."""

    def expand(self, section: Any, facts: Facts) -> Sequence[Check]:
        """One check per item of the section on this host, in a stable order."""
