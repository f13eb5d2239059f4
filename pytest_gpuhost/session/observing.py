"""Reading remote targets' observations ahead of their checks' turns, where that cannot
change what the checks see.

``collecting.collect_remote`` connects to a process's remote targets a few at a time. Where
the run changes nothing, each target's checks are expanded right after its facts arrive and
what they observe is read then, in the batch its first check would ask for
(``Target.prefetch``), while the other targets still connect. A worker's checks of that target
then wait on no round trip but their fresh phase's (dmesg, AER, read after the other checks):
over a network, one round trip a target less once collection is over.

The fresh phase begins for one target at its first fresh check, once every check ranked before
it has run (pytest runs the checks by rank: ``CheckHooks.pytest_collection_modifyitems``).
Where this process runs every check of its remote targets, and no check of any of them that
reads the host as it stands is left, every remote target whose fresh checks are all that is
left begins its fresh phase then too, ``at_once`` at a time (``read_fresh_together``): each
still reads after every check ranked before its own, and the run waits for one round trip
instead of one a target in turn. That is a serial run's case: xdist's workers are given their
targets one after another (``plugin/scheduling.py``), each with all of its checks, so a
worker's next target still has its other checks to run when a target's fresh phase comes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable
from typing import Protocol, TypeVar

from ..checks import Check
from ..config.settings import Settings
from ..host import HostError, doing
from ..specmodel import Spec
from .limits import each_at_once
from .target import LOCAL, Target


def observes_early(settings: Settings, targets: Iterable[Target], *,
                   runs_what_it_collects: bool) -> bool:
    """Whether a process may read its targets' observations at collection: it runs every
    remote target it collects (serially, or an xdist worker under the target scheduler; not a
    worker that started from the controller's collection of every target, which would open a
    session to each), and the run changes nothing (no --fix, no rollback, no capture) and has
    no container pair (a container's kernel checks run on its host, placed at expansion)."""
    return runs_what_it_collects and not (
        settings.fix or settings.rollback is not None or settings.capture is not None
        or any(target.kernel_on is not None for target in targets))


def observe_early(target: Target, expanded: Callable[[Spec], list[Check]],
                  specs: Iterable[Spec]) -> None:
    """``target``'s checks expanded (``expanded`` keeps them for collection, the same checks)
    and what its checks observe read now, the fresh ones left to their turn. Anything
    unexpected is left to collection, which expands again and says it where it belongs."""
    if target.unreachable is not None or target.dormant:
        return
    try:
        checks = [check for spec in specs for check in expanded(spec)]
    except Exception:  # a kind's bug: collection reports it on the spec
        return
    target.select(checks)
    first = next((check for check in checks if not check.fresh), None)
    if first is not None:
        with doing("reading the observations"), contextlib.suppress(HostError):
            target.prefetch(first)


class Phased(Protocol):
    """A target as its fresh phase sees it (``Target``, or a test's stand-in)."""

    @property
    def url(self) -> str: ...

    @property
    def kernel_on(self) -> object: ...

    def reads_as_it_stands(self) -> bool: ...

    def fresh_turn(self) -> bool: ...

    def start_fresh(self) -> None: ...


P = TypeVar("P", bound=Phased)


def fresh_together(targets: Collection[Phased], *, runs_what_it_collects: bool) -> bool:
    """Whether the process's targets may begin their fresh phases together: it runs every
    check of the remote targets it collects (else another process may still run a check
    ranked before), it has two remote targets or more, and no container pair (a container and
    its host are one machine, whose checks are placed on either)."""
    return (runs_what_it_collects
            and sum(1 for target in targets if target.url != LOCAL) >= 2
            and not any(target.kernel_on is not None for target in targets))


def read_fresh_together(first: P, targets: Iterable[P], at_once: int) -> None:
    """``first``'s first fresh check is about to run: where no target has a check left that
    reads the host as it stands, ``first`` and every remote target whose fresh checks are all
    it has left begin their fresh phase now, each in one batch, ``at_once`` at a time. A read
    that fails is left to the check, whose own read says why."""
    every = list(targets)
    if any(target.reads_as_it_stands() for target in every):
        return  # a check ranked before a fresh one is still to run: each in its turn
    ready = [first, *(t for t in every if t is not first and t.url != LOCAL
                      and t.fresh_turn())]
    if len(ready) < 2:
        return

    def start(target: P) -> None:
        with doing("reading the observations"), contextlib.suppress(HostError):
            target.start_fresh()

    each_at_once(start, ready, at_once, "gpuhost-fresh")
