"""An xdist worker's side of a gpuhost run (registered only there, ``start.py``): its ledger in
the directory its controller shares, the remote targets it collects itself (its own, under the
target scheduler) or the controller's collection of them, and no idle connection held to the
targets other workers run, nor to its own after their last check."""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..result import CheckResult
from .items import GpuhostItem
from .ledger import Ledger
from .workers import (
    COLLECTED,
    CONCURRENCY_KEY,
    OWN_KEY,
    WAIT_TIMEOUT_S,
    WORKERINPUT_KEY,
    DoneLog,
)

NEVER_COLLECTED = -(1 << 256)
"""Below every check's index: where the checks of a target no worker collected stand."""

if TYPE_CHECKING:
    from .run import Run


class Worker:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.left: dict[str, int] = {}
        """Each of this worker's own targets -> how many of its checks have yet to run here."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """xdist sends each target's checks to one worker: a worker holds no idle connection
        to the targets other workers run. Under the target scheduler a worker collected only
        its own, and keeps their connections for their checks (one agent session a target),
        each ended after its last check; else it collected from the controller's collection
        and connects to a target when its checks come."""
        targets = self.run.session.targets
        own = self.run.session.own
        if not self.run.session.named:
            return
        for name, target in targets.items():
            if own is None or name not in own:
                target.disconnect()
        if own is None:
            return
        for item in session.items:
            if isinstance(item, GpuhostItem) and item.target.name in own:
                self.left[item.target.name] = self.left.get(item.target.name, 0) + 1
        for name in sorted(own - set(self.left)):  # nothing selected: nothing will use it
            if name in targets:
                targets[name].finish()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        """After the last check of one of this worker's own targets: its session ends."""
        done = yield
        name = item.target.name if isinstance(item, GpuhostItem) else None
        if name is not None and name in self.left:
            self.left[name] -= 1
            if not self.left[name]:
                del self.left[name]
                self.run.session.targets[name].finish()
        return done


def worker_log(config: pytest.Config) -> DoneLog | None:
    """On an xdist worker started by a gpuhost controller, its log; else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKERINPUT_KEY not in workerinput:
        return None
    return DoneLog(Path(workerinput[WORKERINPUT_KEY]), str(workerinput.get("workerid", "gw")))


def own_targets(config: pytest.Config) -> tuple[frozenset[str] | None, int | None]:
    """Under the target scheduler, the remote targets this worker collects and runs itself
    and how many it connects to at once (``distributing.py`` gave them); else (None, None)."""
    workerinput = getattr(config, "workerinput", None) or {}
    if OWN_KEY not in workerinput:
        return None, None
    return (frozenset(str(name) for name in workerinput[OWN_KEY]),
            int(workerinput[CONCURRENCY_KEY]))


def shared_collection(log: DoneLog | None) -> dict[str, object] | None:
    """What the controller collected of the remote targets, if it did."""
    if log is None:
        return None
    try:
        data = json.loads((log.directory / COLLECTED).read_text())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


class SharedLedger(Ledger):
    """An xdist worker: its own checks in its log, the others' read from theirs. ``records``:
    whether the done lines carry each record (for the persistence files)."""

    def __init__(self, log: DoneLog, *, records: bool) -> None:
        super().__init__()
        self.log = log
        self.sharing = records

    def started(self, index: int) -> None:
        self.log.start(index)

    def collected(self, checks: Sequence[tuple[int, str, str, bool]], targets: Sequence[str]
                  ) -> None:
        self.log.collected(checks, targets)

    def host_checks(self, own: Sequence[tuple[int, str]], targets: Sequence[str]
                    ) -> list[tuple[int, str]]:
        """Every host check of the run: this worker's and, under the target scheduler, those
        of the targets the other workers collected (each its own), once every target has
        been collected. A target no worker collected (its worker went down first) stands for
        its checks as one that never finishes, so the gate stays closed naming it."""
        missing = self.log.wait_collected(targets)
        every = {**self.log.progress.host_checks, **dict(own)}
        for number, name in enumerate(missing):
            every[NEVER_COLLECTED - number] = (f"every check of {name} (no xdist worker "
                                               "collected it)")
        return sorted(every.items())

    def share_records(self) -> None:
        self.sharing = True

    def finished(self, index: int, verdict: str, record: CheckResult | None) -> None:
        super().finished(index, verdict, record)
        shared = record.as_dict() if self.sharing and record is not None else None
        self.log.mark(index, verdict, shared)

    def cut_short(self, nodeid: str, index: int, record: CheckResult) -> None:
        """In this worker's log, for the controller: no report of the check follows."""
        self.log.cut(index, nodeid, record.as_dict())

    def wait_for(self, indices: Iterable[int]) -> list[int]:
        return self.log.wait_for(indices)

    def verdicts_of(self, indices: Iterable[int]) -> dict[int, str | None]:
        done = self.log.progress.done
        return {index: done.get(index) for index in indices}

    def records_of(self, indices: Iterable[int]) -> dict[int, CheckResult]:
        shared = self.log.progress.records
        return {index: self.records[index] if index in self.records else
                CheckResult.from_dict(shared[index])
                for index in indices if index in self.records or index in shared}

    def lost(self, missing: Sequence[int]) -> str:
        down = self.log.progress.down
        return f" ({'; '.join(down.values())})" if missing and down else ""

    def unfinished(self, check_id: str, missing: Sequence[int], names: Mapping[int, str]
                   ) -> str:
        progress = self.log.progress
        shown = ", ".join(names.get(i, str(i)) for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        if progress.lost(missing):
            why = "; ".join(progress.down.values())
            return (f"{check_id} did not run: {len(missing)} check(s) it must follow never "
                    f"finished, because an xdist worker went down ({why}), with them or with "
                    f"the order they were to run in: {shown}{more}")
        return (f"{check_id} ran before {len(missing)} other check(s) finished on the other "
                f"xdist workers (waited {WAIT_TIMEOUT_S:.0f} s): {shown}{more}")

    def close(self) -> None:
        super().close()
        self.log.close()
