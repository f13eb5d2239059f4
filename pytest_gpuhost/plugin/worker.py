"""An xdist worker's side of a gpuhost run (registered only there, ``start.py``): its ledger in
the directory its controller shares, the controller's collection of the remote targets, and no
idle connection held to the targets other workers run."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ..result import CheckResult
from .ledger import Ledger
from .workers import COLLECTED, WAIT_TIMEOUT_S, WORKERINPUT_KEY, DoneLog

if TYPE_CHECKING:
    from .start import Run


class Worker:
    def __init__(self, run: Run) -> None:
        self.run = run

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """xdist sends each target's checks to one worker: a worker holds no idle connection
        to the others (its own reconnect when used)."""
        if self.run.session.named:
            for target in self.run.session.targets.values():
                target.disconnect()


def worker_log(config: pytest.Config) -> DoneLog | None:
    """On an xdist worker started by a gpuhost controller, its log; else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKERINPUT_KEY not in workerinput:
        return None
    return DoneLog(Path(workerinput[WORKERINPUT_KEY]), str(workerinput.get("workerid", "gw")))


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

    def share_records(self) -> None:
        self.sharing = True

    def finished(self, index: int, verdict: str, record: CheckResult | None) -> None:
        super().finished(index, verdict, record)
        shared = record.as_dict() if self.sharing and record is not None else None
        self.log.mark(index, verdict, shared)

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
