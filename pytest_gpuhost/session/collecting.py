"""Collecting a process's remote targets: its own, connecting a few at a time
(``collect_remote``), or, on xdist's controller, every target once for the workers
(``export_collection``), each of which then starts from that collection (``seed``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .limits import each_at_once, room_for_sessions
from .target import LOCAL, Target

if TYPE_CHECKING:
    from . import Session

def collect_remote(session: Session, *, observe: bool = True) -> None:
    """The first batch of collection (every spec's facts) from every remote target this
    process collects, ``concurrency`` connections at a time: connecting is most of a
    remote target's time, and one target's wait no longer holds up the others. Expansion
    then reads from the cache. ``observe``: each target's checks read what they observe
    as soon as it is collected (``observing.py``), where this process runs them."""
    remote = [t for t in session.targets.values()
              if t.url != LOCAL and t.unreachable is None and session.collects(t)]
    room_for_sessions(len(remote))
    if len(remote) < 2 or not session.specs:
        return
    facts = list(dict.fromkeys(f for spec in session.specs.values()
                               for f in session.facts_of(spec)))
    from .observing import observe_early, observes_early

    early = observe and observes_early(session.settings, session.targets.values(),
                                       runs_what_it_collects=session.runs_own)

    def collect(target: Target) -> None:
        target.collect_facts(facts, session.shared_dir)
        if early:
            observe_early(target, lambda spec: session.expanded(spec, target),
                          session.specs_of(target))

    def collect_machine(group: list[Target]) -> None:
        for target in group:
            collect(target)

    each_at_once(collect_machine, by_machine(remote), session.connect_at_once,
                 "gpuhost-collect")


def by_machine(remote: list[Target]) -> list[list[Target]]:
    """The targets grouped by the machine they reach, its host first, then its containers:
    a container of an ssh host rides on its host's ssh connection (one login), which exists
    only once its host has connected; connecting both at once would make two."""
    groups: dict[str, list[Target]] = {}
    for target in remote:
        host = target.kernel_on if target.kernel_on in remote else None
        groups.setdefault((host or target).name, []).append(target)
    return [sorted(group, key=lambda target: target.kernel_on is not None)
            for group in groups.values()]


def export_collection(session: Session) -> dict[str, object]:
    """Collect every remote target here, once, for xdist's workers (``seed``): they then
    expand the same checks without connecting (each connects only to the targets it runs)
    and cannot disagree on what they collected. The connections made here are ended."""
    collect_remote(session, observe=False)  # the workers run the checks
    remote = [t for t in session.targets.values() if t.url != LOCAL]
    for spec in session.specs.values():
        for target in remote:
            session.expand(spec, target)
    exported: dict[str, object] = {}
    for target in remote:
        exported[target.name] = target.export()
        target.disconnect()
    return exported


def seed(session: Session, collected: Mapping[str, Any]) -> None:
    """Start each remote target from what the xdist controller collected of it."""
    room_for_sessions(sum(1 for t in session.targets.values() if t.url != LOCAL))
    for name, record in collected.items():
        target = session.targets.get(name)
        if target is not None and target.url != LOCAL:
            target.seed(record)
