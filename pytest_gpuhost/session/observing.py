"""Reading a remote target's observations as soon as it is collected.

``Session.collect_remote_facts`` connects to a process's remote targets a few at a time. Where
the run changes nothing, each target's checks are expanded right after its facts arrive and
what they observe is read then, in the batch its first check would ask for
(``Target.prefetch``), while the other targets still connect. A worker's checks of that target
then wait on no round trip but their fresh phase's (dmesg, AER, read after the other checks):
over a network, one round trip a target less once collection is over."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable

from ..checks import Check
from ..host import HostError, doing
from ..settings import Settings
from ..spec import Spec
from .target import Target


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
