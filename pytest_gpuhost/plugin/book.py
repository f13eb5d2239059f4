"""The controller's record book: every check's record as its report brought it, the checks
collected (a check that never reported is an error record, never missing), what went wrong
around a check that no record of it tells (its xdist worker crashed while it ran), and each
target's information as the workers that reached it described it.

No pytest here: the controller (``controller.py``) hands in what the reports carry, and the
tests drive it with records and worker logs of their own (tests/plugin/test_book.py), as
pytest-xdist's tests drive its scheduler with fake nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..reports import TargetInfo
from ..result import NOT_RUN, OPEN_OUTCOMES, CheckResult, Outcome

if TYPE_CHECKING:
    from .workers import Progress

NEVER_REPORTED = "no result: the check never reported"


class RecordBook:
    def __init__(self) -> None:
        self.results: dict[str, tuple[int, CheckResult]] = {}
        """nodeid -> (collection index, record), gathered from local or xdist worker reports."""
        self.collected: dict[str, None] = {}
        """nodeids of every selected check (under xdist, every worker's)."""
        self.incidents: dict[str, list[str]] = {}
        """nodeid -> what went wrong with a check that no record of it tells: its xdist worker
        crashed while it ran (xdist reports that, and may run the check again elsewhere)."""
        self.target_infos: dict[tuple[str, str], TargetInfo] = {}
        """(target, worker) -> the target's info as the worker that ran its checks last saw it."""
        self.indices: dict[str, int] = {}
        """nodeid -> index in the run of a collected check, where the collector said it."""
        self.reporters: dict[str, str] = {}
        """nodeid -> the worker whose report gave its record (``add``)."""

    def expect(self, nodeids: Iterable[str], indices: Mapping[str, int] | None = None) -> None:
        """Checks that were collected: each ends with a record, reported or not, in its place
        (``indices``: nodeid -> its index in the run, where known here; else the workers'
        logs tell it, or its place among the collected)."""
        self.collected.update(dict.fromkeys(nodeids))
        self.indices.update(indices or {})

    def add(self, nodeid: str, index: int, record: CheckResult,
            target: TargetInfo | None = None, worker: str = "local") -> None:
        """A check's report: its record, and what its target said of itself. A check that
        reports from two workers (``--dist each`` runs every check on every worker) keeps
        the worse record: a failure on any worker, else a fix one of them made. A second
        report from the same worker is a rerun (pytest-rerunfailures): the later counts."""
        earlier = self.results.get(nodeid)
        if earlier is None or self.reporters.get(nodeid) == worker or \
                _weight(record) >= _weight(earlier[1]):
            self.results[nodeid] = (index, record)
            self.reporters[nodeid] = worker
        if target is not None:
            self.target_infos[target.name, worker] = target

    def incident(self, nodeid: str, text: str) -> None:
        """A failed report of a collected check without a record (one line of it)."""
        if nodeid in self.collected:
            self.incidents.setdefault(nodeid, []).append(text)

    def ordered(self) -> list[CheckResult]:
        """The records reported, in collection order."""
        return [result for _, result in sorted(self.results.values(), key=lambda p: p[0])]

    def records(self, stopped: str | None = None, progress: Progress | None = None,
                missing: dict[str, CheckResult] | None = None,
                unreported: dict[str, CheckResult] | None = None) -> list[CheckResult]:
        """Every check's record in collection order; a collected check without one (its worker
        died, the run stopped before it: ``stopped`` says why) is an error record, and one
        whose worker crashed while it ran is an error even when a run of it elsewhere passed.
        ``progress``: the xdist workers' logs, which tell why a check never reported;
        ``missing`` gets nodeid -> the error record of each check no pytest report told of
        (not one xdist reported as crashing its worker: that report is pytest's own);
        ``unreported`` of each check no worker reported, those included (no worker wrote
        their Allure results)."""
        placed = [(index, self._told_of(nodeid, record))
                  for nodeid, (index, record) in self.results.items()]
        if stopped == "interrupted":
            why = f"{NOT_RUN}the run was interrupted before it"
        elif stopped:
            why = f"{NOT_RUN}the run stopped before it ({stopped})"
        else:
            why = NEVER_REPORTED
        known = {**(progress.indices if progress is not None else {}), **self.indices}
        for position, nodeid in enumerate(self.collected):
            if nodeid not in self.results:
                index = known.get(nodeid, position)
                record = no_record(nodeid, self._why_missing(
                    nodeid, index, why, None if stopped else progress))
                placed.append((index, record))
                if missing is not None and nodeid not in self.incidents:
                    missing[nodeid] = record
                if unreported is not None:
                    unreported[nodeid] = record
        return [record for _, record in sorted(placed, key=lambda pair: pair[0])]

    def _told_of(self, nodeid: str, record: CheckResult) -> CheckResult:
        incidents = self.incidents.get(nodeid)
        if not incidents or record.outcome not in OPEN_OUTCOMES:
            return record
        said = f": {record.message}" if record.message else ""
        return msgspec.structs.replace(
            record, outcome=Outcome.ERROR,
            message=f"{told(incidents)}; run again, the check {record.outcome.value}{said}")

    def _why_missing(self, nodeid: str, index: int, why: str, progress: Progress | None
                     ) -> str:
        incidents = self.incidents.get(nodeid)
        if incidents:
            return f"{NEVER_REPORTED} ({told(incidents)})"
        if progress:
            return unreported(index, progress, self.incidents)
        return why

    def targets(self, own: Mapping[str, TargetInfo], *, add_own: bool) -> tuple[TargetInfo, ...]:
        """Each target (``own``: as this process knows it) as its checks' reports described
        it, summed over the xdist workers that reached it; ``add_own``: this process reached
        them too (an xdist controller collects remote targets for its workers)."""
        infos = []
        for name, mine in own.items():
            seen = [info for (each, _), info in sorted(self.target_infos.items())
                    if each == name]
            if not seen:
                infos.append(mine)
                continue
            merged = seen[0]
            for other in seen[1:]:
                merged = merged.add_traffic(other)
            infos.append(merged.add_traffic(mine) if add_own else merged)
        return tuple(infos)

    def clear(self) -> None:
        """Let go of the records at the end of the run (pytest's reports keep theirs)."""
        self.results.clear()
        self.collected.clear()
        self.indices.clear()
        self.reporters.clear()


def _weight(record: CheckResult) -> int:
    """How much a record says against its host: a host not right (failed, error...) most, a
    fix made next, then passed or skipped."""
    if record.outcome not in OPEN_OUTCOMES:
        return 2
    return 1 if record.outcome is Outcome.FIXED else 0


def told(incidents: Sequence[str]) -> str:
    more = f" (and {len(incidents) - 2} more)" if len(incidents) > 2 else ""
    return "; ".join(incidents[:2]) + more


def unreported(index: int, progress: Progress, incidents: Mapping[str, Sequence[str]]) -> str:
    """Why a check under xdist never reported: its worker went down while it ran, it ran on a
    worker that never sent its report, or no worker started it (xdist gives out no more tests
    once --max-worker-restart workers have crashed; ``incidents``: the checks they crashed
    on)."""
    worker = progress.started.get(index)
    if worker is not None and worker in progress.down:
        return (f"{NEVER_REPORTED} (its xdist worker went down while it ran: "
                f"{progress.down[worker]})")
    if worker is not None:
        return f"{NEVER_REPORTED} (it started on xdist worker {worker})"
    if progress.down:
        crashed = ", ".join(sorted(incidents)) or "the check its worker crashed on"
        return (f"{NOT_RUN}no xdist worker started it after {'; '.join(progress.down.values())} "
                "(xdist gives out no more tests once --max-worker-restart workers have "
                f"crashed): see {crashed}, then run again")
    return NEVER_REPORTED


def never_collected(target: str, location: str, section: str, why: str) -> CheckResult:
    """The record of a spec section of a target whose checks no process collected (under the
    target scheduler, every xdist worker that was to collect that target went down first):
    an error in the section's place, as a section that could not be expanded is."""
    return CheckResult(id=section, kind=section, key=None, expected=f"the {section} checks",
                       observed=None, outcome=Outcome.ERROR, message=why, target=target,
                       location=location, section=section)


def no_record(nodeid: str, why: str) -> CheckResult:
    """The record of a check that never reported: an error, with what is known of it."""
    name, at, target = nodeid.split("::", 1)[-1].rpartition("@")
    if not at or "]" in target:  # no target in the id (an @ inside a key)
        name, target = nodeid.split("::", 1)[-1], ""
    kind, _, key = name.partition("[")
    return CheckResult(id=name, kind=kind, key=key[:-1] if key else None, expected="",
                       observed=None, outcome=Outcome.ERROR, message=why,
                       target=target or None, location=nodeid.split("::", 1)[0])
