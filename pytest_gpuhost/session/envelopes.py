"""A benchmark's envelope on one of the run's targets: where it is taken (the machine whose
GPUs and kernel the target uses: a container's host), the spec's limits, the GPU sampler a
plugin supplies, and the host checks observed again at both ends of the window.

The host checks are every check of the target's specs that reads a setting (not a measurement,
not the kernel log or the AER counters, which the envelope reads itself). Their values by id,
``@target`` added where the run names its targets, are the window's ``state`` (``verdict``'s
comparison). At the window's end they are read live, in one batch with the host half's own
reads there (the kernel log, the AER counters): one round trip on a remote target. At its
start, a value this process already read (``KnownState``: the record of the run's own check
of it, the gate's, or the last envelope's end) is taken as it is, so that a benchmark after
the gate pays for one read of the host checks, not two; only the others are read, in that
end's one batch too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from ..checks import Check, NotApplicable, reads_of
from ..checks.gpus import GPUS
from ..host import CachedHost, Host, HostError, Request
from ..specmodel.envelope import DEFAULTS, Limits
from .target import LOCAL

if TYPE_CHECKING:
    from ..envelope.facts import GpuSampler
    from ..envelope.window import Envelope
    from ..result import CheckResult
    from . import Session, Target

SamplerFor = Callable[[Host], "GpuSampler | str"]
"""The GPU sampler of a host, or why it has none (``pytest_gpuhost_envelope_sampler``)."""


def limits_of(session: Session, target: Target) -> Limits:
    """The first of the target's specs that has an ``envelope:`` section, else the defaults."""
    for spec in session.specs_of(target):
        if spec.envelope is not None:
            return spec.envelope
    return DEFAULTS


def kernel_of(target: Target) -> Target:
    """Where the target's GPUs and kernel log are: a container's host, else itself."""
    seen: set[int] = set()
    while target.kernel_on is not None and id(target) not in seen:
        seen.add(id(target))
        target = target.kernel_on
    return target


def settings_of(session: Session, target: Target) -> list[tuple[Check, Target]]:
    """The target's checks that read a setting, each with the target it runs on."""
    found = []
    for spec in session.specs_of(target):
        for check, where in session.placed(spec, target):
            if not (check.measured or check.fresh or check.slow):
                found.append((check, where))
    return found


def key_of(check: Check, where: Target, named: bool) -> str:
    """A host check's name in an envelope's ``state``: its id, ``@target`` in a run that
    names its targets (as its record's id and target say it)."""
    return f"{check.id}@{where.name}" if named else check.id


class KnownState:
    """The host checks' values this process has read, by ``key_of``: its own checks' records
    (``records``: what the run observed, or read back after a fix), then each envelope's read
    at its end, the host as the next benchmark finds it. A value not read (None) is not
    known: it is read again."""

    def __init__(self, records: Callable[[], Iterable[CheckResult]] = tuple) -> None:
        self.records = records
        self.read: dict[str, str] = {}

    def values(self) -> dict[str, str]:
        found = {f"{r.id}@{r.target}" if r.target else r.id: r.observed
                 for r in self.records() if r.observed is not None and not r.measured}
        found.update(self.read)
        return found

    def remember(self, values: dict[str, str | None]) -> dict[str, str | None]:
        self.read.update({key: value for key, value in values.items() if value is not None})
        return values


class HostChecks:
    """The host checks of one envelope, read at its two ends: at its end live, at its start
    ``known``'s values and only the others live (``known`` None: live too). The reads of those
    placed on the kernel's host go in one batch with the host half's own reads of that end
    (``batch``, handed to ``HostHalf``): one round trip an end there."""

    def __init__(self, checks: Sequence[tuple[Check, Target]], named: bool,
                 known: KnownState | None, kernel: Host) -> None:
        self.checks = checks
        self.named = named
        self.known = known
        self.kernel = kernel
        self._end: CachedHost | None = None

    def _split(self) -> tuple[dict[str, str | None], list[tuple[Check, Target]]]:
        """At the start: the values known, and the checks to read."""
        if self.known is None:
            return {}, list(self.checks)
        have = self.known.values()
        values: dict[str, str | None] = {}
        unread = []
        for check, where in self.checks:
            key = key_of(check, where, self.named)
            if key in have:
                values[key] = have[key]
            else:
                unread.append((check, where))
        return values, unread

    def batch(self, requests: Sequence[Request], closing: bool) -> CachedHost:
        """``requests`` of the kernel's host with this end's reads of the checks placed there,
        in one batch, served from it (a failed batch: each read says why when read)."""
        pending = self.checks if closing else self._split()[1]
        own = [request for check, where in pending if where.connection is self.kernel
               for request in reads_of(check.probe)]
        end = CachedHost(self.kernel)
        with contextlib.suppress(HostError):
            end.prefetch([*requests, *own])
        self._end = end
        return end

    def _observe(self, checks: Sequence[tuple[Check, Target]]) -> dict[str, str | None]:
        ready, self._end = self._end, None  # this end's batch, once
        return observe(checks, self.named, ready=(self.kernel, ready) if ready else None)

    def after(self) -> dict[str, str | None]:
        values = self._observe(self.checks)
        return self.known.remember(values) if self.known is not None else values

    def before(self) -> dict[str, str | None]:
        values, unread = self._split()
        return {**values, **(self._observe(unread) if unread else {})}


def observe(checks: Sequence[tuple[Check, Target]], named: bool, *,
            ready: tuple[Host, CachedHost] | None = None) -> dict[str, str | None]:
    """Each check's value read now (None: it read nothing, or could not be read), by id; every
    host's reads in one batch (``ready``: a host whose reads are in that cache already)."""
    hosts: dict[int, CachedHost] = {}
    reads: dict[int, list[Request]] = {}
    for check, where in checks:
        given = ready is not None and where.connection is ready[0]
        hosts.setdefault(id(where), ready[1] if ready is not None and given
                         else CachedHost(where.connection))
        reads.setdefault(id(where), []).extend(reads_of(check.probe))
    for key, host in hosts.items():
        with contextlib.suppress(HostError):  # each check's own read says why
            host.prefetch(reads[key])  # none where ``ready`` has them
    values: dict[str, str | None] = {}
    for check, where in checks:
        name = key_of(check, where, named)
        try:
            values[name] = check.probe.observe(hosts[id(where)]).value
        except (HostError, NotApplicable):
            values[name] = None
        except Exception as exc:  # a probe's bug: a value of its own, never the benchmark's
            values[name] = f"<{type(exc).__name__}: {exc}>"
    return values


def open_envelope(session: Session, sampler_for: SamplerFor, *,
                  target: str | None = None, gpus: Sequence[str] | None = None,
                  roots: Callable[[], Sequence[int]] | None = None,
                  limits: Limits | None = None, pids_there: bool = False,
                  known: KnownState | None = None) -> Envelope:
    """An envelope (not yet entered) on ``target`` (None: the run's first), taken on the
    machine whose GPUs and kernel it uses. The benchmark runs here (``roots``: this process,
    or the pids given): on a target that is this machine, or a container of it, its process
    tree is read there; on a remote target only when ``pids_there`` says the ``roots`` are
    that target's pids. ``known``: the host checks' values this process already read, the
    window's start where it has them (None: read at both ends)."""
    from ..envelope.window import Envelope

    chosen = session.targets[target] if target is not None else session.target
    kernel = kernel_of(chosen)
    found = sampler_for(kernel.connection)
    checks = settings_of(session, chosen) if session.specs else []
    here = chosen.url == LOCAL  # this machine at its root, or a container of it
    runs_on = chosen.connection if here or pids_there else None
    read = HostChecks(checks, session.named, known, kernel.connection) if checks else None
    return Envelope(kernel.connection, limits=limits or limits_of(session, chosen),
                    sampler=None if isinstance(found, str) else found,
                    without=found if isinstance(found, str) else None,
                    state=read.after if read else None,
                    state_before=read.before if read and known is not None else None,
                    end_batch=read.batch if read else None,
                    gpus=gpus, roots=roots, runs_on=runs_on,
                    known_gpus=lambda: kernel.facts.get(GPUS))
