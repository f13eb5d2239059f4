"""A benchmark's envelope on one of the run's targets: where it is taken (the machine whose
GPUs and kernel the target uses: a container's host), the spec's limits, the GPU sampler a
plugin supplies, and the host checks observed again at both ends of the window.

The host checks are read live, each phase in one batch (one round trip on a remote target):
every check of the target's specs that reads a setting (not a measurement, not the kernel log
or the AER counters, which the envelope reads itself). Their values by id, ``@target`` added
where the run names its targets, are the window's ``state`` (``verdict``'s comparison).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..checks import Check, NotApplicable, reads_of
from ..checks.gpus import GPUS
from ..host import CachedHost, Host, HostError, Request
from ..specmodel.envelope import DEFAULTS, Limits
from .target import LOCAL

if TYPE_CHECKING:
    from ..envelope.facts import GpuSampler
    from ..envelope.window import Envelope
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


def observe(checks: Sequence[tuple[Check, Target]], named: bool) -> dict[str, str | None]:
    """Each check's value read now (None: it read nothing, or could not be read), by id; every
    host's reads in one batch."""
    hosts: dict[int, CachedHost] = {}
    reads: dict[int, list[Request]] = {}
    for check, where in checks:
        hosts.setdefault(id(where), CachedHost(where.connection))
        reads.setdefault(id(where), []).extend(reads_of(check.probe))
    for key, host in hosts.items():
        with contextlib.suppress(HostError):  # each check's own read says why
            host.prefetch(reads[key])
    values: dict[str, str | None] = {}
    for check, where in checks:
        name = f"{check.id}@{where.name}" if named else check.id
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
                  limits: Limits | None = None, pids_there: bool = False) -> Envelope:
    """An envelope (not yet entered) on ``target`` (None: the run's first), taken on the
    machine whose GPUs and kernel it uses. The benchmark runs here (``roots``: this process,
    or the pids given): on a target that is this machine, or a container of it, its process
    tree is read there; on a remote target only when ``pids_there`` says the ``roots`` are
    that target's pids."""
    from ..envelope.window import Envelope

    chosen = session.targets[target] if target is not None else session.target
    kernel = kernel_of(chosen)
    found = sampler_for(kernel.connection)
    checks = settings_of(session, chosen) if session.specs else []
    here = chosen.url == LOCAL  # this machine at its root, or a container of it
    runs_on = chosen.connection if here or pids_there else None
    return Envelope(kernel.connection, limits=limits or limits_of(session, chosen),
                    sampler=None if isinstance(found, str) else found,
                    without=found if isinstance(found, str) else None,
                    state=(lambda: observe(checks, session.named)) if checks else None,
                    gpus=gpus, roots=roots, runs_on=runs_on,
                    known_gpus=lambda: kernel.facts.get(GPUS))
