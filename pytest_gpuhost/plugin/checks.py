"""The hooks of a process that runs checks (a run without xdist, or an xdist worker): collect
the specs into items, order them, gate the user's tests, and attach each check's record to its
reports. Registered only there (``start.py``): an xdist controller collects and runs nothing.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from .. import long_lived
from ..reports.junit import add_junit_facts, junit_family
from ..result import CheckResult, Outcome
from ..runstate import requests_state
from ..session.collecting import collect_remote
from .gate import OPEN_OUTCOMES, judge, verdict_text
from .items import GpuhostItem, JournalFile, PersistFile, SpecFile, error_record
from .run import REPORT_ATTR, refuse_before_changes

if TYPE_CHECKING:
    from .run import Run

PHASES = {"setup": "at setup", "call": "while it ran", "teardown": "at teardown"}


def gated(item: pytest.Item, config: pytest.Config) -> bool:
    """A test of the user's that must wait for the host checks to pass."""
    if isinstance(item, GpuhostItem):
        return False
    return bool(config.option.gpuhost_gate) or item.get_closest_marker("gpuhost") is not None


def waits(item: pytest.Item, config: pytest.Config) -> bool:
    """A test of the user's that runs after the host checks: gated, or asking for the host's
    state (``gpuhost_state``), which it waits for as a gated test does."""
    return not isinstance(item, GpuhostItem) and (gated(item, config) or requests_state(item))


class CheckHooks:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.session = run.session
        self.junit_family = junit_family(run.config)

    # -- collection -------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """Connect to the remote targets together before the specs expand on them one by one
        (a worker started from the controller's collection has nothing left to read)."""
        collect_remote(self.session)
        if self.session.workerinput is None:  # else the controller refused before it started
            refuse_before_changes(self.session)

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector
                            ) -> pytest.File | None:
        resolved = file_path.resolve()
        if resolved in self.session.specs:
            return SpecFile.from_parent(parent, path=file_path,
                                        nodeid=self.run.spec_nodeid(file_path))
        if self.session.rollback_of(resolved) is not None:
            return JournalFile.from_parent(parent, path=file_path,
                                           nodeid=self._journal_nodeid(file_path))
        return None

    def _journal_nodeid(self, path: Path) -> str | None:
        """A journal's id: a remote target's by its file name (what pytest collects is a copy
        made for the run, in a temporary directory no progress line or id should show), one
        of this machine's as a spec's."""
        copied = any(opened.copied is not None and opened.anchor == path
                     for opened in self.session.rollbacks.values())
        return path.name if copied else self.run.spec_nodeid(path)

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Checks that must see the others' effects (dmesg, the persistence files) run after
        every other check; when a test is gated or asks for the host's state
        (``gpuhost_state``), every host check runs before the session's other tests."""
        if any(waits(item, config) for item in items):
            items.sort(key=lambda item: (0, item.check.order) if isinstance(item, GpuhostItem)
                       else (1, 0))
        else:
            items.sort(key=lambda item: item.check.order if isinstance(item, GpuhostItem)
                       else 0)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Number the selected checks; a last-ranked check waits for every lower-ranked one."""
        checks = [item for item in session.items if isinstance(item, GpuhostItem)]
        for item, index in zip(checks, run_indices(checks, list(self.session.specs),
                                                   list(self.session.targets)), strict=True):
            item.index = index
        # Per target and rank, not per item: O(checks x ranks). dmesg and p2p order within
        # their own target; the gate waits for every target's checks.
        lower: dict[tuple[str, int], list[int]] = {}
        for name in {item.target.name for item in checks}:
            own = [other for other in checks if other.target.name == name]
            for rank in sorted({item.check.order for item in own}):
                lower[name, rank] = [other.index for other in own if other.check.order < rank]
        by_index = {item.index: item for item in checks}  # the run's indices, not positions
        for item in checks:
            item.waits_for = lower[item.target.name, item.check.order]
            if isinstance(item, PersistFile):  # made of its own spec's records on its target
                item.sources = [index for index in item.waits_for
                                if by_index[index].path == item.path]
        self.run.names.update((item.index, item.check.id) for item in checks)
        # the gate's message names each check as its test does: with its target (``@pve``)
        self.run.host_checks[:] = [(item.index, item.name) for item in checks
                                   if item.check.kind != "persist"]
        if any(requests_state(item) for item in session.items
               if not isinstance(item, GpuhostItem)):
            self.run.ledger.share_records()  # the state is made of every worker's records
        for target in self.session.targets.values():
            target.select(item.check for item in checks if item.target is target)
        self.run.ledger.collected(
            [(item.index, item.nodeid, item.check.id, item.check.kind != "persist")
             for item in checks],
            [name for name, target in self.session.targets.items()
             if self.session.collects(target)])
        long_lived.freeze()  # the items and their checks live to the end of the session

    # -- running ----------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """A gated test runs only when every host check passed, was fixed or did not apply;
        else it is an error (before any of its fixtures run) naming what closed the gate."""
        __tracebackhide__ = True
        if not gated(item, item.config):
            return
        ledger = self.run.ledger
        host_checks = ledger.host_checks(self.run.host_checks, list(self.session.targets))
        indices = [index for index, _ in host_checks]
        missing = ledger.wait_for(indices)
        gate = judge(host_checks, ledger.verdicts_of(indices))
        if not gate.open:
            pytest.fail(gate.message() + ledger.lost(missing), pytrace=False)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if not isinstance(item, GpuhostItem):
            return report
        made = around_the_check(item, call, report, named=self.session.named)
        if made is not None:  # skipped or broken by pytest or a plugin, not by the check
            item.result = made
        if (call.when == "call" or made is not None) and item.result is not None:
            # The record itself, not a copy: a run holds each record once (the item's and the
            # report's are one object). It becomes a dict only to cross to xdist's controller.
            payload: dict[str, object] = {"index": item.index, "result": item.result}
            if self.session.named:  # what the target said of itself and what reaching it cost
                payload["target"] = item.target.info().as_dict()
            setattr(report, REPORT_ATTR, payload)
        if call.when == "teardown":
            if item.result is not None:
                # JUnit reads a test's properties from its teardown report: made here, from
                # the record as it ends, so they say what every other report says (an error
                # at set-up or teardown, a lost lock), never the check's own run before it.
                add_junit_facts(report, item.result, self.junit_family)
            self.run.ledger.finished(item.index, verdict_text(item.check.id, item.result),
                                     item.result)
            long_lived.made_one()
        return report


def run_indices(checks: Sequence[GpuhostItem], specs: Sequence[Path], targets: Sequence[str]
                ) -> list[int]:
    """Each check's index in the run, in collection order (by rank, then spec, then target,
    then its place among that target's checks of that spec), and the same in every process
    that collects it, whatever else that process collects: an xdist worker under the target
    scheduler collects only its own targets, yet its indices are the run's, which the
    workers' logs and the controller's record book go by. ``checks``: as collected (ordered
    by rank)."""
    places: dict[tuple[int, int], int] = {}
    spec_of = {path: number for number, path in enumerate(specs)}
    target_of = {name: number for number, name in enumerate(targets)}
    width = len(spec_of) + 1, len(target_of) + 1, 1 << 32  # a group's checks: fewer than 2**32
    per_rank = width[0] * width[1] * width[2]
    resolved: dict[Path, int] = {}
    indices = []
    for item in checks:
        if item.path not in resolved:
            resolved[item.path] = spec_of.get(item.path.resolve(), len(spec_of))
        group = resolved[item.path], target_of.get(item.target.name, len(target_of))
        place = places[group] = places.get(group, -1) + 1
        indices.append(item.check.order * per_rank +
                       (group[0] * width[1] + group[1]) * width[2] + place)
    return indices


def around_the_check(item: GpuhostItem, call: pytest.CallInfo[None],
                     report: pytest.TestReport, *, named: bool) -> CheckResult | None:
    """The record of what pytest or another plugin did to a check outside its own run: a skip
    mark (skipped at setup), an error at setup (the check never ran) or one at teardown after
    the check passed (pytest counts an error and exits 1, so no report may say it passed).
    None when the check's own record stands."""
    excinfo = call.excinfo
    if excinfo is None or call.when not in PHASES or not (report.failed or report.skipped):
        return None
    result = item.result
    if result is None:
        target = item.target.name if named else None
        if report.skipped:
            reason = getattr(excinfo.value, "msg", None) or excinfo.exconly()
            return msgspec.structs.replace(error_record(item.check, str(reason), target),
                                       outcome=Outcome.SKIPPED)
        return error_record(item.check, f"error {PHASES[call.when]}: {excinfo.exconly()}",
                            target)
    if call.when == "teardown" and report.failed and result.outcome in OPEN_OUTCOMES:
        said = f": {result.message}" if result.message else ""
        return msgspec.structs.replace(
            result, outcome=Outcome.ERROR,
            message=f"error at teardown: {excinfo.exconly()} (the check itself "
                    f"{result.outcome.value}{said})")
    return None
