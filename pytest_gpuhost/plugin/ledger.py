"""Where a process's checks say they started and finished, and where a check that must follow
others (dmesg, the gate, a persistence file) learns whether they finished, with what verdict
and record.

In one process (``Ledger``) collection order is run order: what ranks before a check has run
when it runs, and nothing waits. On an xdist worker (``worker.SharedLedger``) the other workers'
checks are in the shared log (``workers.DoneLog``), and a check waits for them there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from ..result import CheckResult


class Ledger:
    """One pytest process running every check itself."""

    def __init__(self) -> None:
        self.verdicts: dict[int, str] = {}
        self.records: dict[int, CheckResult] = {}

    def started(self, index: int) -> None:
        """Nobody else needs to know."""

    def collected(self, checks: Sequence[tuple[int, str, str, bool]], targets: Sequence[str]
                  ) -> None:
        """What this process collected: each check's (index, nodeid, id, whether it is a host
        check), of ``targets``. Nobody else needs to know."""

    def host_checks(self, own: Sequence[tuple[int, str]], targets: Sequence[str]
                    ) -> list[tuple[int, str]]:
        """(index, id) of every host check of the run (``own``: those collected here), which
        the gate and the host's state wait for: here, all of them."""
        return list(own)

    def share_records(self) -> None:
        """Another process will ask for whole records (``records_of``): this one has them."""

    def finished(self, index: int, verdict: str, record: CheckResult | None) -> None:
        self.verdicts[index] = verdict
        if record is not None:
            self.records[index] = record

    def cut_short(self, nodeid: str, index: int, record: CheckResult) -> None:
        """A check whose fix an interrupt cut short: this process's controller has its record
        (``Run.cut_short``)."""

    def wait_for(self, indices: Iterable[int]) -> list[int]:
        """The checks of ``indices`` that will not finish first: none here (they ran before)."""
        return []

    def verdicts_of(self, indices: Iterable[int]) -> dict[int, str | None]:
        return {index: self.verdicts.get(index) for index in indices}

    def records_of(self, indices: Iterable[int]) -> dict[int, CheckResult]:
        return {index: self.records[index] for index in indices if index in self.records}

    def lost(self, missing: Sequence[int]) -> str:
        """Why ``missing`` never finished, as a gate message ends: `` (worker gw1 ...)``."""
        return ""

    def unfinished(self, check_id: str, missing: Sequence[int], names: Mapping[int, str]
                   ) -> str:
        """Why a check that follows others did not run: those it waited for in vain."""
        return f"{check_id} did not run: {len(missing)} check(s) it must follow never finished"

    def close(self) -> None:
        self.verdicts.clear()
        self.records.clear()
