"""The checks layer: each kind expands its spec section into checks, observes, and knows its fix.

A *kind* (one module per kind) owns a top-level spec section. It parses the section (the spec
side), then, given a host, expands it into ``Check`` objects with stable ids. Each check carries
an expectation and a *probe* that observes the host and, where the value is fixable, applies it.
A kind may also say where its settings live (``scope``), which lines make them survive a reboot
(``persistence``) and how a host's values are written back as a spec (``capture``): its
optional half, declared in ``kind``.
Built-in kinds register through the ``pytest_gpuhost_check_kinds`` hook like third-party ones do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, runtime_checkable

import msgspec

from ..host import Host, HostError, Reply, Request, raised
from ..specmodel import EntryOptions
from ..specmodel.matchers import Expectation
from .kind import KERNEL as KERNEL
from .kind import NAMESPACE as NAMESPACE
from .kind import SCOPES as SCOPES
from .kind import USERSPACE as USERSPACE
from .kind import Capturer as Capturer
from .kind import Capturing as Capturing
from .kind import Kind as Kind
from .kind import Measured as Measured
from .kind import NamedKind as NamedKind
from .kind import NeedsFacts as NeedsFacts
from .kind import PersistenceSupply as PersistenceSupply
from .kind import Persisting as Persisting
from .kind import PersistsTo as PersistsTo
from .kind import PersistTargets as PersistTargets
from .kind import Scoped as Scoped
from .kind import StandIn as StandIn
from .kind import capturer_of as capturer_of
from .kind import facts_of as facts_of
from .kind import kind_name as kind_name
from .kind import measured_of as measured_of
from .kind import persistence_of as persistence_of
from .kind import persists_to_of as persists_to_of
from .kind import scope_of as scope_of
from .persistence import PERSIST_TARGETS as PERSIST_TARGETS
from .persistence import BootCommand as BootCommand
from .persistence import PersistLine as PersistLine
from .persistence import right_now as right_now
from .persistence import settled as settled

if TYPE_CHECKING:
    from ..gpu.nvml import NvmlSource
    from .changes import Plan
    from .offers import Offer  # a kind's key (checks.offers): loaded by the kinds that use one
    from .persistence import CONTROL as CONTROL  # re-exported: a kind's persistence names it


def __getattr__(name: str) -> object:
    """``CONTROL``, re-exported from ``persistence``, which compiles it at its first use."""
    if name == "CONTROL":
        from . import persistence

        return persistence.CONTROL
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


T = TypeVar("T")


class Evidence(msgspec.Struct, frozen=True):
    """One thing that was read or run: where, and the raw value it gave."""

    source: str
    raw: str

    def as_dict(self) -> dict[str, str]:
        return {"source": self.source, "raw": self.raw}


class NextBoot(msgspec.Struct, frozen=True):
    """What the boot configuration gives a boot-time value on the next boot."""

    value: str
    where: str
    """The file (``file:line``) that sets it."""
    apply: str
    """What makes it take effect: ``run `update-grub`, then reboot``."""


class Observation(msgspec.Struct, frozen=True):
    """What a probe saw. ``value`` is the raw string (None when there is nothing to read);
    ``problem`` explains a None value or a partial reading."""

    value: str | None
    evidence: tuple[Evidence, ...] = ()
    problem: str | None = None
    persisted: tuple[str, str] | None = None
    """(value, where) when boot-time configuration sets this value too (sysctl.d)."""
    details: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Kind-specific facts carried into the result record (p2p: gbps, class, floor)."""
    subjects: Mapping[str, str] = msgspec.field(default_factory=dict)
    """What the observation was about beyond the check's own subjects: the CPUs a C-state is
    still enabled on (``{"cpus": "0-3,8"}``); reports show these instead of parsing text."""
    next_boot: NextBoot | None = None
    """For a value only a boot applies (kernel command line, cpufreq driver, a read-only module
    parameter): what the boot configuration sets. Running wrong but set right here: the check
    is ``reboot_required``."""
    culprits: str | None = None
    """What made a wrong value wrong, named in the failure's message (the line pytest's short
    summary shows): dmesg's first offending records, the top cause of a slow P2P pair."""
    expect: Expectation | None = None
    """What the value is held to when only the observation can say (a P2P pair's path floor,
    a share of what its path was read to carry): it replaces the check's own expectation."""


class NotApplicable(Exception):
    """Raised by ``observe`` when the check cannot apply here (NVML absent): the check is
    skipped with this reason."""


class CannotFix(Exception):
    """A failing check that has no safe fix on this host (nothing to write to, builtin module)."""


class Probe(Protocol):
    """Observes one value; if ``fixable``, plans the changes that would make it right.

    A probe may also be ``Batched`` (``reads()``: the host reads its ``observe`` makes, read
    for every check of a run in one batch) and ``BootTime`` (``boot_time``).
    """

    fixable: bool

    def observe(self, host: Host) -> Observation: ...

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        """The changes that make the host hold ``value``, each with its original. Raise
        CannotFix when there is no safe way. Planning reads but never writes."""


@runtime_checkable
class Batched(Protocol):
    """A probe that declares the host reads its ``observe`` makes, which the session fetches for
    every check of a run in one batch (a remote host then costs one round trip for all of
    them). Without it the probe's reads are simply live."""

    def reads(self) -> Sequence[Request]: ...


@runtime_checkable
class BootTime(Protocol):
    """A probe that says whether its fix writes the boot configuration."""

    boot_time: bool


def reads_of(probe: object) -> tuple[Request, ...]:
    """The reads a probe declares (``Batched``), none for one that declares none."""
    return tuple(probe.reads()) if isinstance(probe, Batched) else ()


def is_boot_time(probe: Probe) -> bool:
    """A probe whose fix writes the boot configuration (``boot_time = True``): it runs only
    under --fix --fix-persist and takes effect at the next boot."""
    return isinstance(probe, BootTime) and bool(probe.boot_time)


class NoFix:
    """Mixin for probes of values that are checked only."""

    __slots__ = ()  # a probe that is a msgspec.Struct keeps no __dict__
    fixable = False

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        raise CannotFix("this check has no fixer")


class Check(msgspec.Struct, frozen=True):
    """One test: a kind, a key (None for host-wide checks), what to expect, and how to look.

    A value: two checks are equal when every field is (the probe and the subjects too). Its
    hash is its id's and order's (equal checks hash alike), so a check can key a dict or sit
    in a set although its ``subjects`` is a mapping."""

    kind: str
    key: str | None
    expect: Expectation
    options: EntryOptions
    probe: Probe
    order: int = 0
    """Sort rank among kinds; checks that must see the others' effects (dmesg) rank last."""
    subjects: Mapping[str, str] = msgspec.field(default_factory=dict)
    """What the check is about, for reports: ``{"gpu": "0000:81:00.0"}``, a bridge, a pair."""
    hardware: bool = False
    """A failure points at the hardware (a missing GPU, a degraded link, kernel errors), not
    at a setting that --fix could change."""
    fresh: bool = False
    """It must see the host as it is when it runs, after everything ranked before it (the
    kernel log, AER counters): its reads are never served from an earlier phase's batch."""
    slow: bool = False
    """Takes long (a bandwidth measurement): marked ``gpuhost_slow``, so a health check with a
    deadline can leave it out with ``-m "not gpuhost_slow"``."""
    scope: str | None = None
    """Where its setting lives (one of ``SCOPES``); None: its kind's scope. A kind with checks
    of two scopes (sysctl: ``net.*`` keys of a network namespace) sets it per check."""
    measured: bool | None = None
    """Its value is a result (a bandwidth, records or counters since a point, use over a
    window), not a setting: the host's state (``state.py``) lists it beside its digest, never in
    it, and the fleet's drift leaves it out. None: as its kind says (``Kind.measured``)."""
    section: str | None = None
    """The spec section it came from: set as its kind's checks are expanded (a kind need not);
    a check made outside a section (``persist``, ``rollback``) is its own section."""

    def __post_init__(self) -> None:
        if self.scope is not None and self.scope not in SCOPES:
            raise ValueError(f"check {self.id}: scope {self.scope!r} is not one of "
                             f"{', '.join(SCOPES)}")

    def __hash__(self) -> int:
        return hash((self.kind, self.key, self.order))

    @property
    def id(self) -> str:
        return self.kind if self.key is None else f"{self.kind}[{self.key}]"

    @property
    def owner(self) -> str:
        """The section its record names: the one it came from, else its own kind."""
        return self.section if self.section is not None else self.kind


class Fact(msgspec.Struct, Generic[T], frozen=True):
    """A host fact read once per session (the GPU list, the CPU list, cpuidle names): the
    requests it reads, all in one batch, and how to make the fact of their replies. A kind
    names the facts it needs (``Kind.facts``), so the session reads those of every kind in
    one batch before expanding."""

    name: str
    requests: tuple[Request, ...]
    parse: Callable[[Sequence[Reply]], T]
    """Compared and hashed by identity like any function: facts are module constants."""

    def read(self, host: Host) -> T:
        return self.parse(host.batch(self.requests))


class _Unread:
    """A fact that could not be read: each asker gets the error again."""

    __slots__ = ("error",)

    def __init__(self, error: HostError) -> None:
        self.error = error


class Facts:
    """Host facts read once per session during expansion, and the session's ways to reach the
    GPUs: NVML, opened lazily, and the directory shared with xdist workers (where bandwidth is
    measured once, under a lock).

    Observations never come from here: they are read fresh by each check, after any fix.
    """

    def __init__(self, host: Host, *, nvml: NvmlSource | None = None,
                 shared_dir: Path | None = None) -> None:
        self.host = host
        self.shared_dir = shared_dir
        """Shared with the other xdist workers of this session; None without xdist."""
        self.kernel: Host | None = None
        """The machine whose kernel and hardware this root runs on, where that is another of
        the run's targets (a container's host), read live: what a container sees only part
        of (config space past its 64-byte header) is read there."""
        self._nvml = nvml
        self._cache: dict[Fact[Any] | Callable[[Host], Any], Any] = {}
        self._offers: dict[Offer[Any], Callable[[], Any]] = {}
        self.sleep: Callable[[float], None] = time.sleep
        """How a check waits out a sampling window (cpuidle residency); tests replace it."""

    @property
    def nvml(self) -> NvmlSource:
        if self._nvml is None:
            from ..gpu.nvml import NvmlSource, default_factory

            self._nvml = NvmlSource(default_factory(self.host))
        return self._nvml

    def get(self, reader: Fact[T] | Callable[[Host], T]) -> T:
        """The fact, read on first use (a ``Fact`` in one batch; a plain ``host -> value``
        function, as a third-party kind may pass, however it reads)."""
        if reader not in self._cache:
            self._keep(reader, reader.read if isinstance(reader, Fact) else reader, self.host)
        value = self._cache[reader]
        if isinstance(value, _Unread):
            raise raised(value.error)
        return cast(T, value)

    def offer(self, key: Offer[T], take: Callable[[], T]) -> None:
        """Offer what ``key`` names to the other kinds of its spec (``offers``): ``take`` gives
        it, measured on first use and once per session. A kind's ``expand`` offers; the first
        offer of a key stands."""
        self._offers.setdefault(key, take)

    def asked(self, key: Offer[T]) -> Callable[[], T | None]:
        """What ``key`` names as a call for a check to make when it runs (the offering kind
        may expand after the asking one): it gives the value, None where nothing offers it,
        and raises what taking it raised (a ``HostError`` saying why there is none)."""
        def take() -> T | None:
            offered = self._offers.get(key)
            return None if offered is None else cast(T, offered())

        return take

    def known(self, fact: Fact[Any] | Callable[[Host], Any]) -> bool:
        """Whether the fact was read already (asking for it then costs no read)."""
        return fact in self._cache

    def prime(self, facts: Iterable[Fact[Any]]) -> None:
        """Read every fact not read yet, all their requests in one batch."""
        wanted = [fact for fact in dict.fromkeys(facts) if fact not in self._cache]
        if not wanted:
            return
        requests = list(dict.fromkeys(r for fact in wanted for r in fact.requests))
        replies = dict(zip(requests, self.host.batch(requests), strict=True))
        for fact in wanted:
            self._keep(fact, fact.parse, [replies[r] for r in fact.requests])

    def _keep(self, reader: Fact[Any] | Callable[[Host], Any], make: Callable[[Any], Any],
              source: Any) -> None:
        """The fact as made, or the error making it raised: a fact the host does not give is
        an error for the kinds that ask for it only, each time they ask."""
        try:
            self._cache[reader] = make(source)
        except HostError as exc:
            self._cache[reader] = _Unread(exc)


def owned(kind: object, section: str, checks: Iterable[Check]) -> list[Check]:
    """``checks`` as the kind made them for ``section``: each names the section, and takes the
    kind's scope and ``measured`` where it says none of its own."""
    scope = scope_of(kind)
    measured = measured_of(kind)
    return [check if check.section == section and check.scope is not None
            and check.measured is not None else
            msgspec.structs.replace(check, section=section, scope=check.scope or scope,
                                measured=measured if check.measured is None else check.measured)
            for check in checks]
