"""The controller of a gpuhost run (a run without xdist, or xdist's controller; never a
worker): every check's report into the record book, pytest's word for the outcomes that are
not its own, and the end of the run: a rollback closed, the exit status, the reports.

A new step at the session's end goes into ``pytest_sessionfinish``, in the order it must run
(before the reports, which show what it did).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import pytest

from ..reports import Reporter, RunInfo, TargetInfo
from ..result import BETWEEN_SOCKETS, NOT_RUN, CheckResult, Outcome
from ..runstate import with_state
from .book import RecordBook, never_collected
from .items import GpuhostItem
from .nodeids import ill_parsed, junit_name
from .run import REPORT_ATTR

if TYPE_CHECKING:
    from .envelopes import EnvelopeBook
    from .run import Run
    from .workers import Progress

STATUSES = {
    Outcome.FIXED.value: ("fixed", "+", "FIXED"),
    Outcome.FIX_FAILED.value: ("failed", "F", "FIX_FAILED"),
    Outcome.ERROR.value: ("error", "E", "ERROR"),
    Outcome.WOULD_FIX.value: ("would_fix", "W", "WOULD_FIX"),
    Outcome.REBOOT_REQUIRED.value: ("reboot_required", "R", "REBOOT_REQUIRED"),
}
"""pytest's (category, letter, word) for the outcomes that are not its own."""
PHASES = {"setup": "at setup", "call": "while it ran", "teardown": "at teardown"}


class Controller:
    def __init__(self, run: Run) -> None:
        self.run = run
        self.book = RecordBook()
        self.progress: Callable[[], Progress | None] = lambda: None
        """The xdist workers' logs (``distributing.py``), which tell why a check never
        reported; nothing without xdist."""
        self.workers_cut_short: Callable[[], dict[str, tuple[int, CheckResult]]] = dict
        """nodeid -> (index, record) of each check whose fix an interrupt cut short on an
        xdist worker, from the workers' logs (``distributing.py``): no report of it came."""
        self.uncollected: Callable[[], list[tuple[str, str | None]]] = lambda: []
        """The remote targets no xdist worker collected, each with how the last worker
        given it ended (``distributing.py``)."""
        self.close_failed = False
        self.stopped_early: str | None = None
        """pytest's own reason to stop (-x, --maxfail, an interrupt)."""
        self.envelopes: EnvelopeBook | None = None
        """The benchmarks' envelopes (``envelopes.py``); None under --gpuhost-envelope=off."""

    # -- the checks' reports ----------------------------------------------------------------

    @pytest.hookimpl(trylast=True)  # after the checks have their indices (``CheckHooks``)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Without xdist: the checks collected here (xdist's workers tell theirs)."""
        checks = [item for item in session.items if isinstance(item, GpuhostItem)]
        self.book.expect((item.nodeid for item in checks),
                         {item.nodeid: item.index for item in checks})

    def pytest_report_teststatus(self, report: pytest.TestReport | pytest.CollectReport,
                                 config: pytest.Config) -> tuple[str, str, str] | None:
        payload = getattr(report, REPORT_ATTR, None)  # read, not rebuilt: called thrice a test
        return STATUSES.get(payload["result"].outcome.value) if payload else None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, REPORT_ATTR, None)
        if payload is None:
            if report.failed:
                self.book.incident(report.nodeid, incident(report))
            return
        target = TargetInfo.from_dict(payload["target"]) if "target" in payload else None
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "")
        self.book.add(report.nodeid, payload["index"], payload["result"], target,
                      worker or "local")

    # -- the end ----------------------------------------------------------------------------

    def records(self, missing: dict[str, CheckResult] | None = None,
                unreported: dict[str, CheckResult] | None = None) -> list[CheckResult]:
        """Every check's record in collection order (``RecordBook.records``); ``missing``
        gets nodeid -> record of each that no pytest report told of, ``unreported`` of each
        that no worker reported (a crash xdist reported included)."""
        if self.run.config.option.collectonly:
            return self.book.ordered()
        stopped = self.run.stopped or self.stopped_early
        for nodeid, (index, record) in {**self.workers_cut_short(),
                                        **self.run.cut_short}.items():
            if nodeid not in self.book.results:
                self.book.add(nodeid, index, record)
        progress = None if stopped else self.progress()  # the workers' logs: why not reported
        return self.book.records(stopped, progress, missing, unreported) + \
            self._never_collected(stopped, progress, missing, unreported)

    def _never_collected(self, stopped: str | None, progress: Progress | None,
                         missing: dict[str, CheckResult] | None = None,
                         unreported: dict[str, CheckResult] | None = None
                         ) -> list[CheckResult]:
        """An error record per spec section of each remote target that no xdist worker
        collected: its checks are known to no process, yet the target is not checked
        (``missing``: each under the nodeid its section's checks would have had)."""
        session, settings = self.run.session, self.run.settings
        records = []
        for name, ended in self.uncollected():
            if stopped == "interrupted":
                why = f"{NOT_RUN}the run was interrupted before its checks were collected"
            elif stopped:
                why = f"{NOT_RUN}the run stopped before its checks were collected ({stopped})"
            else:
                down = "; ".join(progress.down.values()) if progress is not None else ""
                why = (f"{NOT_RUN}no xdist worker collected the checks of {name}"
                       + (f": {ended or down}" if ended or down else "") + " (xdist starts "
                       "no more workers once --max-worker-restart workers have crashed): run "
                       "again")
            for spec in session.specs_of(session.targets[name]):
                location = f"{settings.display(spec.path)}:1"
                for section in spec.sections:
                    record = never_collected(name, location, section, why)
                    records.append(record)
                    nodeid = f"{self.run.spec_file_id(spec.path)}::{section}@{name}"
                    for each in (missing, unreported):
                        if each is not None:
                            each[nodeid] = record
        return records

    def info(self) -> RunInfo:
        session, settings = self.run.session, self.run.settings
        ran = {record.target for _, record in self.book.results.values()}
        own = {name: target.info() for name, target in session.targets.items()
               if target.address.implied is None or name in ran}  # a host given no check
        targets = self.book.targets(own, add_own=settings.distributing)
        first = targets[0]
        fixrun = session.target.fixrun
        return RunInfo(
            specs=tuple((settings.display(spec.path), spec.name)
                        for spec in session.specs.values()),
            root=session.target.host.describe(), hostname=first.hostname, kernel=first.kernel,
            driver=first.driver, gpus=first.gpus, gpu_models=first.gpu_models,
            fix=settings.fix, dry_run=settings.dry_run,
            journal=first.journal or (fixrun.journal_path.shown if fixrun.journal_path and
                                      fixrun.journal_used() else None),
            rollback=fixrun.rollback.shown if fixrun.rollback else None,
            restored_earlier=sum(
                entry.restored for name in session.rollbacks
                for entry in getattr(session.targets[name].fixrun.rollback, "entries", ())),
            json_report=settings.report is not None,
            targets=targets if session.named else (),
            node_targets=settings.node_targets if session.named else None,
            stopped=self.run.stopped or self.stopped_early,
            topologies=tuple((name, target.topology(self._between_sockets(name))) for name,
                             target in session.targets.items() if target.unreachable is None)
            if settings.topology else (),
            benchmarks=tuple(self.envelopes.benchmarks) if self.envelopes is not None else ())

    def _between_sockets(self, target: str) -> float | None:
        """GB/s the hop between sockets carries on ``target``, as the p2p records of its GPUs
        say the spec stated it: its own, and those of each container whose kernel it holds
        (their pairs' paths are its); the lowest, where two specs differ; None where none
        says."""
        kernel_on = {address.name: address.kernel_on for address in self.run.settings.targets}

        def on_target(name: str | None) -> bool:
            seen: list[str] = []
            while name is not None and name not in seen:
                if name == target:
                    return True
                seen.append(name)
                name = kernel_on.get(name)
            return False

        named = self.run.session.named
        stated = [float(record.details[BETWEEN_SOCKETS])
                  for _, record in self.book.results.values()
                  if isinstance(record.details.get(BETWEEN_SOCKETS), (int, float))
                  and (not named or on_target(record.target))]
        return min(stated, default=None)

    def reporters(self) -> list[tuple[str, Reporter]]:
        """The reports the run asks for, by name (``reports.REPORTS`` and every plugin's)."""
        chosen = []
        for name, report in self.run.reports.items():
            asked = self.asked(report.asked)
            if asked not in (None, False, "", ()):
                module, _, factory = report.factory.partition(":")
                make = getattr(importlib.import_module(module), factory)
                made = make(asked, self.run) if report.run else make(asked)
                if made is not None:  # None: nothing of this run to write
                    chosen.append((name, made))
        return chosen

    def asked(self, name: str) -> object:
        """What asks for a report: a setting, else a plugin's own option."""
        if hasattr(self.run.settings, name):
            return getattr(self.run.settings, name)
        return self.run.config.getoption(name, None)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The end of the run, before the terminal summary is printed: a rollback closed, the
        exit status, then the reports (NPD's answer last: its status replaces pytest's)."""
        reason = session.shouldstop or session.shouldfail
        self.stopped_early = str(reason) if reason else None
        if not reason and session.exitstatus == pytest.ExitCode.INTERRUPTED:
            self.stopped_early = "interrupted"  # Ctrl-C, or a plugin's pytest.exit()
        if not reason and session.exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            self.stopped_early = "an internal error: see INTERNALERROR in the run's output"
        if self.run.session.rollback is not None and not self.run.settings.dry_run:
            self._close_rollback(session)
        if self.run.stopped is not None:
            at_least(session, pytest.ExitCode.INTERRUPTED)
        missing: dict[str, CheckResult] = {}
        unreported: dict[str, CheckResult] = {}
        records, info = self.records(missing, unreported), self.info()
        info = with_state(self.run.config, self.run.settings, self.run.session, records, info)
        if len(records) > len(self.book.results):  # a check that never reported
            at_least(session, pytest.ExitCode.TESTS_FAILED)
        if missing and not self.stopped_early and self.run.stopped is None:
            junit_test_cases(self.run.config, missing)
        if unreported and not self.stopped_early and self.run.stopped is None and \
                self.run.settings.alluredir is not None:
            from ..reports.allure import unreported_results

            names = {target.name: target.hostname for target in info.targets}
            unreported_results(self.run.settings.alluredir, unreported,
                               lambda target: names.get(target or "") or target or
                               info.hostname or "unknown")
        unwritten = []
        for name, reporter in self.reporters():
            try:
                reporter.write(records, info)
                self.run.notes += getattr(reporter, "notes", ())  # the capture's
            except Exception as exc:  # a writer's bug never takes the other reports down
                from ..files import OutputError  # what writing a report's file raises

                self.run.problems.append(
                    str(exc) if isinstance(exc, OutputError) else
                    f"{type(reporter).__name__}: not written: {type(exc).__name__}: {exc}")
                at_least(session, pytest.ExitCode.TESTS_FAILED)
                unwritten.append(name)
        if self.run.settings.npd:
            from ..reports import npd
            from ..reports.nodehealth import on_node

            session.exitstatus = npd.answer_run(on_node(records, info.node_targets),
                                                int(session.exitstatus),
                                                self.run.config.stash.get(npd.STDOUT, None),
                                                stopped_early=self.stopped_early is not None,
                                                unwritten=unwritten)

    def _close_rollback(self, session: pytest.Session) -> None:
        from ..fix.journal import JournalError

        try:
            self.run.session.close_rollback(self.records())  # each journal's: rollback_closed
        except (JournalError, OSError) as exc:  # read-only, or its directory is gone
            self.run.problems.append(
                f"rollback: the changes are restored, but {exc}: a later default rollback "
                "will offer this journal again (each change then passes as restored)")
            self.close_failed = True
            at_least(session, pytest.ExitCode.TESTS_FAILED)

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self) -> None:
        self.book.clear()


def at_least(session: pytest.Session, code: pytest.ExitCode) -> None:
    """Raise the exit status to ``code`` unless it already says worse (2 beats 1)."""
    current = int(session.exitstatus)
    if current in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) or (
            current == pytest.ExitCode.TESTS_FAILED and code == pytest.ExitCode.INTERRUPTED):
        session.exitstatus = code


def incident(report: pytest.TestReport) -> str:
    """One line of what a report without a record says (xdist's 'worker crashed while
    running ...')."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(crash.message if crash is not None else report.longrepr or "").strip()
    line = text.splitlines()[0] if text else "no details"
    return f"error {PHASES[report.when]}: {line}" if report.when in PHASES else line


def junit_test_cases(config: pytest.Config, missing: Mapping[str, CheckResult]) -> None:
    """Each check that no pytest report told of (its xdist worker died first, no worker
    collected its target) as a JUnit test case with an ``<error>`` and its facts: pytest's
    JUnit file holds a test case for a test that reported only, and these were missing from it
    while every other report counted them. Not where pytest stopped the run (-x, Ctrl-C):
    there pytest's JUnit leaves out what did not run, as for any test."""
    from _pytest.junitxml import xml_key  # the JUnit file pytest writes, not yet written

    from ..reports.junit import add_junit_facts, junit_family

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    family = junit_family(config)
    for nodeid, record in missing.items():
        path, _, name = nodeid.partition("::")
        location = (path, None, name)
        failed = pytest.TestReport(nodeid, location, {}, "failed", record.message, "setup")
        closed = pytest.TestReport(nodeid, location, {}, "passed", None, "teardown")
        add_junit_facts(closed, record, family)
        if ill_parsed(nodeid):
            junit_name(config, failed)
        xml.pytest_runtest_logreport(failed)
        xml.pytest_runtest_logreport(closed)
