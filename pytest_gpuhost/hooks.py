"""The hooks of a gpuhost run, registered by ``plugin.pytest_configure`` only when the run has
one (a spec or a rollback). Each hook delegates: collection and checks to the session, ordering
to ``workers``, the gate to ``gate``, statuses and reports to ``reports``.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Generator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from . import builtin, long_lived, specs
from .builtin import kind_name
from .files import OutputError
from .fix.locking import LockUnavailable
from .fix.run import JOURNAL_KEY
from .gate import OPEN_OUTCOMES, judge, verdict_text
from .items import RUN as RUN
from .items import GpuhostItem, JournalFile, SpecFile, error_record
from .printable import printable
from .reports import Reporter, RunInfo, TargetInfo
from .reports.failure import format_failure
from .reports.junit import junit_properties
from .reports.terminal import TerminalSummary
from .result import NOT_RUN, CheckResult, Outcome
from .session import Session
from .settings import Settings, SettingsError, target_record
from .spec import SpecError

if TYPE_CHECKING:  # xdist's, the reports' and a rollback's modules load when a run uses them
    from .checks import Kind
    from .checks.conditions import ConditionFn
    from .host import Host
    from .workers import DoneLog, Progress, SharedDirectory

REPORT_ATTR = "gpuhost"

STATUSES = {
    Outcome.FIXED.value: ("fixed", "+", "FIXED"),
    Outcome.FIX_FAILED.value: ("failed", "F", "FIX_FAILED"),
    Outcome.ERROR.value: ("error", "E", "ERROR"),
    Outcome.WOULD_FIX.value: ("would_fix", "W", "WOULD_FIX"),
    Outcome.REBOOT_REQUIRED.value: ("reboot_required", "R", "REBOOT_REQUIRED"),
}
"""pytest's (category, letter, word) for the outcomes that are not its own."""


def registered(config: pytest.Config) -> tuple[dict[str, Kind], dict[str, ConditionFn]]:
    """The check kinds and conditions every plugin registered through the hooks."""
    kinds: dict[str, Kind] = {}
    for batch in config.hook.pytest_gpuhost_check_kinds():
        for kind in batch:
            claimed = kinds.get(kind.section)
            if claimed is not None and kind_name(claimed) != kind_name(kind):
                raise SettingsError(
                    f"two gpuhost check kinds claim section {kind.section!r}: "
                    f"{kind_name(claimed)} and {kind_name(kind)}")
            kinds.setdefault(kind.section, kind)  # the same kind twice: a re-exported hook
    conditions: dict[str, ConditionFn] = {}
    for batch in config.hook.pytest_gpuhost_conditions():
        conditions.update(batch)
    return kinds, conditions


def gated(item: pytest.Item, config: pytest.Config) -> bool:
    """A test of the user's that must wait for the host checks."""
    if isinstance(item, GpuhostItem):
        return False
    return bool(config.option.gpuhost_gate) or item.get_closest_marker("gpuhost") is not None


class GpuhostRun:
    """One pytest process's hooks of a gpuhost run."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.shared: SharedDirectory | None = None
        if settings.distributing:  # made now: the targets' ssh command lines name it
            from .workers import TARGETS_KEY, SharedDirectory

            self.shared = SharedDirectory(
                {TARGETS_KEY: [target_record(target) for target in settings.targets]})
            if any(target.scheme == "ssh" for target in settings.targets):
                settings = dataclasses.replace(settings, ssh_masters=self.shared.ssh_masters())
        self.settings = settings
        workerinput = getattr(config, "workerinput", None)
        self.log: DoneLog | None = None
        if workerinput is not None:
            from .workers import worker_log

            self.log = worker_log(config)
        if not config.pluginmanager.is_registered(builtin):
            config.pluginmanager.register(builtin, "gpuhost-builtin")
        kinds, conditions = registered(config)

        def make_host(url: str, settings: Settings) -> Host:
            made: Host | None = config.hook.pytest_gpuhost_make_host(url=url, settings=settings)
            if made is None:
                raise SettingsError(f"no pytest-gpuhost plugin knows the target {url!r}")
            return made

        def nvml_for(host: Host) -> Any:
            return config.hook.pytest_gpuhost_nvml(host=host)

        try:
            self.session = Session(settings, kinds, conditions, make_host, nvml_for,
                                   shared_dir=self.log.directory if self.log else None,
                                   workerinput=workerinput)
        except BaseException as exc:
            if self.shared is not None:
                self.shared.pytest_unconfigure()
            if isinstance(exc, SpecError):
                raise pytest.UsageError(f"bad gpuhost spec: {exc}") from None
            if isinstance(exc, LockUnavailable):  # a rollback waits for every other run
                pytest.exit(f"--gpuhost-rollback: {exc}", returncode=pytest.ExitCode.INTERRUPTED)
            raise
        collected = None
        if self.log is not None:  # a worker: what its controller collected, if it shared it
            from .workers import shared_collection

            collected = shared_collection(self.log)
        if collected is not None:
            self.session.seed(collected)
        self.results: dict[str, tuple[int, CheckResult]] = {}
        """nodeid -> (collection index, record), gathered from local or xdist worker reports."""
        self.host_checks: list[tuple[int, str]] = []
        """(collection index, id) of every selected host check, the same on every worker."""
        self.collected: dict[str, None] = {}
        """nodeids of every selected check (on the controller, every worker's too)."""
        self.verdicts: dict[int, str] = {}
        self.problems: list[str] = []
        """Session-end work that failed (a report that could not be written): summary lines."""
        self.rolled_back = False
        self.close_failed = False
        self.target_infos: dict[tuple[str, str], TargetInfo] = {}
        """(target, worker) -> the target's info as the worker that ran its checks last saw it."""
        self.stopped: str | None = None
        """Why the run stopped early (the root's lock could not be had)."""
        self.stopped_early: str | None = None
        """pytest's own reason to stop (-x, --maxfail, an interrupt)."""
        self.incidents: dict[str, list[str]] = {}
        """nodeid -> what went wrong with a check that no record of it tells: its xdist worker
        crashed while it ran (xdist reports that, and may run the check again elsewhere)."""

    @property
    def is_worker(self) -> bool:
        return self.settings.worker

    def start(self) -> None:
        """What happens at configure time once the run is known: xdist's shared directory, the
        run lock taken before any worker starts, Allure's per-check evidence."""
        config, settings = self.config, self.settings
        if settings.distributing:
            # This machine's target, wherever it is in the list: its workers share the journal
            # chosen here and fix under the run lock held here. A remote target's one worker
            # takes that target's run lock itself (held here, it would lock its own run out).
            local = next((t for t in self.session.targets.values() if t.url == "local"), None)
            fixrun = local.fixrun if local is not None else None
            journal = fixrun.journal_path if fixrun is not None else None
            assert self.shared is not None
            if journal is not None:
                self.shared.extra[JOURNAL_KEY] = str(journal)
            config.pluginmanager.register(self.shared, "gpuhost-shared-dir")
            from .dead_workers import DeadWorkerSends

            config.pluginmanager.register(DeadWorkerSends(), "gpuhost-dead-worker-sends")
            fixer = fixrun.fixer if fixrun is not None else None
            if fixer is not None and fixer.run_lock is not None:
                try:  # before any worker starts: the workers' fixes run under this run's lock
                    fixer.run_lock.acquire(settings.lock_timeout)
                except LockUnavailable as exc:
                    pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
        if not self.is_worker:  # the checks' failures written in one pass, folded
            from .failure_summary import register

            register(config, REPORT_ATTR)
        if settings.alluredir is not None:
            from .reports.allure import AllureEvidence

            config.pluginmanager.register(AllureEvidence(self._host_name), "gpuhost-allure")

    def stop(self, item: GpuhostItem, reason: str) -> None:
        """The root's lock cannot be had: the run stops after this check and exits 2 (another
        run holds the root, or the lock cannot be taken at all)."""
        self.stopped = reason
        item.session.shouldstop = reason

    def _host_name(self) -> str:
        return self.session.target.host_facts().hostname or "unknown"

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """On an xdist controller with remote targets, before its workers start (xdist starts
        them last): collect every remote target once, in parallel, for all the workers."""
        if self.shared is not None and self.session.named and self.session.specs:
            self.shared.share_collection(self.session.export_collection())

    # -- collection -------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection(self, session: pytest.Session) -> None:
        """Connect to the remote targets together before the specs expand on them one by one
        (a worker started from the controller's collection has nothing left to read)."""
        if not self.settings.distributing:
            self.session.collect_remote_facts()

    def pytest_collect_file(self, file_path: Path, parent: pytest.Collector
                            ) -> pytest.File | None:
        resolved = file_path.resolve()
        if resolved in self.session.specs:
            return SpecFile.from_parent(parent, path=file_path, nodeid=self._nodeid(file_path))
        rollback = self.session.rollback
        anchor = self.session.rollback_file
        if rollback is not None and anchor is not None and resolved == anchor.resolve():
            return JournalFile.from_parent(parent, path=file_path,
                                           nodeid=self._nodeid(file_path))
        return None

    def _nodeid(self, path: Path) -> Any:
        """The spec file's id where it is not pytest's own (``_file_id``), else None."""
        own = self._own_id(path)
        file_id = self._file_id(path)
        return None if file_id == own else file_id

    def _own_id(self, path: Path) -> str | None:
        """pytest's id for a file under the rootdir (None outside it, where pytest would say
        ``::sysctl[...]``)."""
        try:
            return path.relative_to(self.config.rootpath).as_posix()
        except ValueError:
            return None

    def _file_id(self, path: Path) -> str:
        """The part of a spec's check ids before ``::``. A bundled spec's file name
        (``blackwell8.yaml``): its ids must not depend on where the package is installed (the
        venv, the Python version), and they are those of a copy of it at the top of the
        rootdir, unless such a copy runs too. Else pytest's own id for a file under the
        rootdir, or for one outside it the path as the user named it, so every id names its
        spec."""
        name = specs.bundled_name(path)
        if name is not None and (self.config.rootpath / name).resolve() not in self.session.specs:
            return name
        own = self._own_id(path)
        return own if own is not None else self.settings.display(path)

    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        """Checks that must see the others' effects (dmesg) run after every other check; when
        a test is gated, every host check runs before the session's other tests."""
        if any(gated(item, config) for item in items):
            items.sort(key=lambda item: (0, item.check.order) if isinstance(item, GpuhostItem)
                       else (1, 0))
        else:
            items.sort(key=lambda item: item.check.order if isinstance(item, GpuhostItem)
                       else 0)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Number the selected checks; a last-ranked check waits for every lower-ranked one."""
        checks = [item for item in session.items if isinstance(item, GpuhostItem)]
        for index, item in enumerate(checks):
            item.index = index
        # Per target and rank, not per item: O(checks x ranks). dmesg and p2p order within
        # their own target; the gate waits for every target's checks.
        lower: dict[tuple[str, int], list[int]] = {}
        for name in {item.target.name for item in checks}:
            own = [other for other in checks if other.target.name == name]
            for rank in sorted({item.check.order for item in own}):
                lower[name, rank] = [other.index for other in own if other.check.order < rank]
        for item in checks:
            item.waits_for = lower[item.target.name, item.check.order]
        self.host_checks = [(item.index, item.check.id) for item in checks]
        self.collected = dict.fromkeys(item.nodeid for item in checks)
        for target in self.session.targets.values():
            target.select(item.check for item in checks if item.target is target)
            if self.is_worker and self.session.named:
                # A worker runs some targets only (xdist sends each target's checks to one):
                # it holds no idle connection to the others; its own reconnect when used.
                target.disconnect()
        long_lived.freeze()  # the items and their checks live to the end of the session

    # -- running ----------------------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """A gated test runs only when every host check passed, was fixed or did not apply;
        else it is an error (before any of its fixtures run) naming what closed the gate."""
        __tracebackhide__ = True
        if not gated(item, item.config):
            return
        indices = [index for index, _ in self.host_checks]
        if self.log is not None:
            missing = self.log.wait_for(indices)
            verdicts: dict[int, str | None] = {i: self.log.progress.done.get(i)
                                               for i in indices}
            lost = self._lost(missing)
        else:
            verdicts, lost = dict(self.verdicts), ""
        gate = judge(self.host_checks, verdicts)
        if not gate.open:
            pytest.fail(gate.message() + lost, pytrace=False)

    def _lost(self, missing: Sequence[int]) -> str:
        if not missing or self.log is None:
            return ""
        down = self.log.progress.down
        return f" ({'; '.join(down.values())})" if down else ""

    def unfinished_message(self, check_id: str, missing: Sequence[int]) -> str:
        """Why a last-ranked check did not run: the checks it waited for that never finished."""
        from .workers import WAIT_TIMEOUT_S

        assert self.log is not None
        names = dict(self.host_checks)
        lost = self.log.progress.lost(missing)
        shown = ", ".join(names.get(i, str(i)) for i in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        if lost:
            why = "; ".join(self.log.progress.down.values())
            return (f"{check_id} did not run: {len(missing)} check(s) it must follow never "
                    f"finished, because an xdist worker went down ({why}), with them or with "
                    f"the order they were to run in: {shown}{more}")
        return (f"{check_id} ran before {len(missing)} other check(s) finished on the other "
                f"xdist workers (waited {WAIT_TIMEOUT_S:.0f} s): {shown}{more}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if not isinstance(item, GpuhostItem):
            return report
        made = _around_the_check(item, call, report, named=self.session.named)
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
                report.user_properties = [*report.user_properties,
                                          *junit_properties(item.result)]
            verdict = verdict_text(item.check.id, item.result)
            self.verdicts[item.index] = verdict
            if self.log is not None:
                self.log.mark(item.index, verdict)
            long_lived.made_one()
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, config: pytest.Config, report: Any
                                      ) -> Generator[None, Any, Any]:
        """A check's report leaves this process (an xdist worker's to its controller, a report
        log) with its record as a dict."""
        data = yield
        payload = data.get(REPORT_ATTR) if isinstance(data, dict) else None
        if isinstance(payload, dict) and isinstance(payload.get("result"), CheckResult):
            data[REPORT_ATTR] = {**payload, "result": payload["result"].as_dict()}
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self, config: pytest.Config, data: Any
                                        ) -> Generator[None, Any, Any]:
        """A worker's report arrives: its record is made once, here, and the report keeps it."""
        report = yield
        payload = getattr(report, REPORT_ATTR, None)
        if isinstance(payload, dict) and isinstance(payload.get("result"), dict):
            payload["result"] = CheckResult.from_dict(payload["result"])
        return report

    def pytest_report_teststatus(self, report: pytest.TestReport | pytest.CollectReport,
                                 config: pytest.Config) -> tuple[str, str, str] | None:
        payload = getattr(report, REPORT_ATTR, None)  # read, not rebuilt: called thrice a test
        return STATUSES.get(payload["result"].outcome.value) if payload else None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, REPORT_ATTR, None)
        if payload is None and report.failed and report.nodeid in self.collected and \
                not self.is_worker:
            self.incidents.setdefault(report.nodeid, []).append(_incident(report))
        if payload is not None and not self.is_worker:  # the records are the controller's
            record: CheckResult = payload["result"]
            self.results[report.nodeid] = (payload["index"], record)
            if "target" in payload:
                worker = getattr(report, "node", None)
                where = getattr(getattr(worker, "gateway", None), "id", "") or "local"
                info = TargetInfo.from_dict(payload["target"])
                self.target_infos[info.name, where] = info

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """With remote or several targets, each target's checks go to one worker."""
        if not self.session.named or getattr(config.option, "dist", "load") not in (
                "load", "loadscope"):
            return None

        from .workers import make_target_scheduler

        return make_target_scheduler(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        """On the controller: the checks a worker collected, so that one whose worker died
        before reporting it still counts (as an error) in every report."""
        files = {self._file_id(path) for path in self.session.specs}
        for nodeid in ids:
            if nodeid not in self.collected and nodeid.split("::", 1)[0] in files:
                self.collected[nodeid] = None

    # -- the end ----------------------------------------------------------------------------

    def ordered(self) -> list[CheckResult]:
        return [result for _, result in sorted(self.results.values(), key=lambda p: p[0])]

    def records(self) -> list[CheckResult]:
        """Every check's record in collection order; a collected check without one (its worker
        died, the run stopped before it) is an error record, never missing, and one whose
        worker crashed while it ran is an error even when a run of it elsewhere passed."""
        if self.config.option.collectonly:
            return self.ordered()
        placed: list[tuple[int, CheckResult]] = []
        for nodeid, (index, record) in self.results.items():
            incidents = self.incidents.get(nodeid)
            if incidents and record.outcome in OPEN_OUTCOMES:
                said = f": {record.message}" if record.message else ""
                record = dataclasses.replace(
                    record, outcome=Outcome.ERROR,
                    message=f"{_told(incidents)}; run again, the check {record.outcome.value}"
                            f"{said}")
            placed.append((index, record))
        stopped = self.stopped or self.stopped_early
        if stopped == "interrupted":
            why = f"{NOT_RUN}the run was interrupted before it"
        elif stopped:
            why = f"{NOT_RUN}the run stopped before it ({stopped})"
        else:
            why = "no result: the check never reported"
        progress = self._workers_progress() if not stopped else None
        for position, nodeid in enumerate(self.collected):
            if nodeid not in self.results:
                incidents = self.incidents.get(nodeid)
                if incidents:
                    told = f"no result: the check never reported ({_told(incidents)})"
                elif progress:
                    told = _unreported(position, progress, self.incidents)
                else:
                    told = why
                placed.append((position, _no_record(nodeid, told)))
        return [record for _, record in sorted(placed, key=lambda pair: pair[0])]

    def _workers_progress(self) -> Progress | None:
        """On an xdist controller: what the workers' logs say they started and finished, and
        which went down (a check's position in ``collected`` is its index there)."""
        if self.shared is None:
            return None
        from .workers import CONTROLLER, DoneLog

        return DoneLog(self.shared.path, CONTROLLER).read()

    def targets(self) -> tuple[TargetInfo, ...]:
        """Each target as its checks' reports described it (summed over the xdist workers
        that reached it), else as this process knows it."""
        infos = []
        for name, target in self.session.targets.items():
            seen = [info for (each, _), info in sorted(self.target_infos.items())
                    if each == name]
            if not seen:
                infos.append(target.info())
                continue
            merged = seen[0]
            for other in seen[1:]:
                merged = merged.add_traffic(other)
            if self.settings.distributing:  # the controller's own collection
                merged = merged.add_traffic(target.info())
            infos.append(merged)
        return tuple(infos)

    def info(self) -> RunInfo:
        session, settings = self.session, self.settings
        targets = self.targets()
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
            json_report=settings.report is not None,
            targets=targets if session.named else (),
            stopped=self.stopped or self.stopped_early)

    def reporters(self) -> list[Reporter]:
        settings = self.settings
        chosen: list[Reporter] = []
        if settings.report is not None:
            from .reports.jsonfile import JsonReport

            chosen.append(JsonReport(settings.report))
        if settings.prom is not None:
            from .reports.prometheus import PrometheusTextfile

            chosen.append(PrometheusTextfile(settings.prom))
        if settings.nfd is not None:
            from .reports.nfd import NfdFeatureFile

            chosen.append(NfdFeatureFile(settings.nfd))
        if settings.alluredir is not None:
            from .reports.allure import AllureSessionFiles

            chosen.append(AllureSessionFiles(settings.alluredir))
        if settings.fleet_html is not None:
            from .reports.fleethtml import FleetHtml

            chosen.append(FleetHtml(settings.fleet_html))
        if settings.capture is not None:
            command = shlex.join(["pytest", *self.config.invocation_params.args])
            chosen.append(self.session.capture_reporter(command))
        return chosen

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session-end work on the controller (persistence, closing a rollback), then the
        reports, before the terminal summary is printed."""
        if self.is_worker:
            return
        reason = session.shouldstop or session.shouldfail
        self.stopped_early = str(reason) if reason else None
        if not reason and session.exitstatus == pytest.ExitCode.INTERRUPTED:
            self.stopped_early = "interrupted"  # Ctrl-C, or a plugin's pytest.exit()
        if not reason and session.exitstatus == pytest.ExitCode.INTERNAL_ERROR:
            self.stopped_early = "an internal error: see INTERNALERROR in the run's output"
        if self.session.target.fixrun.persist:
            try:
                extra = self.session.finish(self.ordered())
            except LockUnavailable as exc:
                self.problems.append(f"--fix-persist: nothing written: {exc}")
                _at_least(session, pytest.ExitCode.INTERRUPTED)
                extra = []
            self._report_persistence(session, extra)
            failed = (Outcome.FAILED, Outcome.FIX_FAILED, Outcome.ERROR)
            if any(record.outcome in failed for record in extra):  # refused or not written
                _at_least(session, pytest.ExitCode.TESTS_FAILED)
        if self.session.rollback is not None and not self.settings.dry_run:
            from .fix.journal import JournalError

            try:
                self.rolled_back = self.session.close_rollback(self.records())
            except (JournalError, OSError) as exc:  # read-only, or its directory is gone
                self.problems.append(
                    f"rollback: the changes are restored, but {exc}: a later default rollback "
                    "will offer this journal again (each change then passes as restored)")
                self.close_failed = True
                _at_least(session, pytest.ExitCode.TESTS_FAILED)
        if self.stopped is not None:
            _at_least(session, pytest.ExitCode.INTERRUPTED)
        records, info = self.records(), self.info()
        if len(records) > len(self.results):  # a check that never reported
            _at_least(session, pytest.ExitCode.TESTS_FAILED)
        for reporter in self.reporters():
            try:
                reporter.write(records, info)
            except OutputError as exc:
                self.problems.append(str(exc))
                _at_least(session, pytest.ExitCode.TESTS_FAILED)
            except Exception as exc:  # a writer's bug never takes the other reports down
                self.problems.append(f"{type(reporter).__name__}: not written: "
                                     f"{type(exc).__name__}: {exc}")
                _at_least(session, pytest.ExitCode.TESTS_FAILED)
        if self.settings.npd:  # last: NPD's exit status replaces pytest's
            from .reports import npd

            session.exitstatus = npd.answer_run(records, int(session.exitstatus),
                                                self.config.stash.get(npd.STDOUT, None),
                                                stopped_early=self.stopped_early is not None)

    def _report_persistence(self, session: pytest.Session, records: Sequence[CheckResult]
                            ) -> None:
        """Each persistence file's record as a test report of its own, so pytest's own count,
        JUnit and every other report hold the same checks (``spec.yaml::persist[FILE]``)."""
        spec = next(iter(self.session.specs.values()))
        base = next((nodeid.split("::", 1)[0] for nodeid in self.collected), None) or \
            self._file_id(spec.path)
        for offset, record in enumerate(records):
            name = record.id if not record.target else f"{record.id}@{record.target}"
            report = _persist_report(f"{base}::{name}", self.settings.display(spec.path),
                                     record, len(self.collected) + offset)
            self.config.hook.pytest_runtest_logreport(report=report)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.is_worker:
            return
        session = self.session
        rollback = session.rollback
        info = self.info()
        subject = (f"rollback of {rollback.shown}" if rollback is not None else
                   ", ".join(name for name in info.spec_names))
        where = ", ".join(t.name for t in info.targets) if len(info.targets) > 1 else info.root
        terminalreporter.section(f"gpuhost: {subject} on {where}")
        TerminalSummary(terminalreporter.write_line).write(self.records(), info)
        remote = [t for t in info.targets if t.journal and t.url != "local"]
        if info.journal is not None and not remote:
            terminalreporter.write_line(f"journal: {info.journal} "
                                        f"(undo: --gpuhost-rollback={info.journal})")
        for target in remote:
            name = str(target.journal).rsplit("/", 1)[-1]
            terminalreporter.write_line(
                f"journal of {target.name}: {target.journal} (undo: --gpuhost-rollback={name} "
                f"{self._naming(target.name, target.url)})")
        if rollback is not None and rollback.damaged_lines:
            terminalreporter.write_line(f"journal: {rollback.damaged_lines} line(s) cut short "
                                        "by a crash were skipped")
        if rollback is not None and not self.settings.dry_run and not self.close_failed:
            done = self.rolled_back
            terminalreporter.write_line(
                f"rollback: {rollback.shown} is {'closed' if done else 'still open'}"
                + ("" if done else " (some changes are not back: run it again once fixed)"))
        for problem in self.problems:
            terminalreporter.write_line(printable(problem), red=True)

    def _naming(self, name: str, url: str) -> str:
        """The options that name one target again: an inventory's host by the inventory (its
        key and ssh arguments come with it) and --gpuhost-limit, any other by its URL."""
        given = next((t for t in self.settings.targets if t.name == name), None)
        source = given.source if given is not None else ""
        if source.startswith("--gpuhost-inventory="):
            return f"{source} --gpuhost-limit={name}"
        if source.startswith("gpuhost_inventory "):
            return f"--gpuhost-limit={name}"
        return f"--gpuhost-target={url}"

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self) -> None:
        """The run is over: its connections and files closed, and what only it held let go
        (the records stay with pytest's reports) before pytest's last collections and the
        interpreter's at exit, each of which would walk it all again."""
        if self.log is not None:
            self.log.close()
        self.session.close()
        self.results.clear()
        self.verdicts.clear()
        self.collected.clear()
        self.host_checks.clear()
        long_lived.thaw()  # before pytest's last collections, which must see every object


def _persist_report(nodeid: str, path: str, record: CheckResult, index: int
                    ) -> pytest.TestReport:
    """A persistence file's record as pytest's report of a test that ran at session end."""
    outcome: Literal["passed", "failed", "skipped"] = "failed"
    if record.outcome in (Outcome.PASSED, Outcome.FIXED):
        outcome = "passed"
    elif record.outcome is Outcome.SKIPPED:
        outcome = "skipped"
    longrepr: Any = None
    if outcome == "failed":
        longrepr = format_failure(record)
    elif outcome == "skipped":
        longrepr = (path, 0, f"Skipped: {record.message}")
    report = pytest.TestReport(
        nodeid=nodeid, location=(path, 0, nodeid.split("::", 1)[-1]), keywords={"gpuhost": 1},
        outcome=outcome, longrepr=longrepr, when="call",
        user_properties=junit_properties(record))
    setattr(report, REPORT_ATTR, {"index": index, "result": record})
    return report


def _at_least(session: pytest.Session, code: pytest.ExitCode) -> None:
    """Raise the exit status to ``code`` unless it already says worse (2 beats 1)."""
    current = int(session.exitstatus)
    if current in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED) or (
            current == pytest.ExitCode.TESTS_FAILED and code == pytest.ExitCode.INTERRUPTED):
        session.exitstatus = code


PHASES = {"setup": "at setup", "call": "while it ran", "teardown": "at teardown"}


def _around_the_check(item: GpuhostItem, call: pytest.CallInfo[None],
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
            return dataclasses.replace(error_record(item.check, str(reason), target),
                                       outcome=Outcome.SKIPPED)
        return error_record(item.check, f"error {PHASES[call.when]}: {excinfo.exconly()}",
                            target)
    if call.when == "teardown" and report.failed and result.outcome in OPEN_OUTCOMES:
        said = f": {result.message}" if result.message else ""
        return dataclasses.replace(
            result, outcome=Outcome.ERROR,
            message=f"error at teardown: {excinfo.exconly()} (the check itself "
                    f"{result.outcome.value}{said})")
    return None


def _incident(report: pytest.TestReport) -> str:
    """One line of what a report without a record says (xdist's 'worker crashed while
    running ...')."""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = str(crash.message if crash is not None else report.longrepr or "").strip()
    line = text.splitlines()[0] if text else "no details"
    return f"error {PHASES[report.when]}: {line}" if report.when in PHASES else line


def _told(incidents: Sequence[str]) -> str:
    more = f" (and {len(incidents) - 2} more)" if len(incidents) > 2 else ""
    return "; ".join(incidents[:2]) + more


def _unreported(index: int, progress: Progress, incidents: Mapping[str, Sequence[str]]
                ) -> str:
    """Why a check under xdist never reported: its worker went down while it ran, it ran on a
    worker that never sent its report, or no worker started it (xdist gives out no more tests
    once --max-worker-restart workers have crashed; ``incidents``: the checks they crashed
    on)."""
    worker = progress.started.get(index)
    if worker is not None and worker in progress.down:
        return (f"no result: the check never reported (its xdist worker went down while it "
                f"ran: {progress.down[worker]})")
    if worker is not None:
        return f"no result: the check never reported (it started on xdist worker {worker})"
    if progress.down:
        crashed = ", ".join(sorted(incidents)) or "the check its worker crashed on"
        return (f"{NOT_RUN}no xdist worker started it after {'; '.join(progress.down.values())} "
                "(xdist gives out no more tests once --max-worker-restart workers have "
                f"crashed): see {crashed}, then run again")
    return "no result: the check never reported"


def _no_record(nodeid: str, why: str) -> CheckResult:
    """The record of a check that never reported: an error, with what is known of it."""
    name, at, target = nodeid.split("::", 1)[-1].rpartition("@")
    if not at or "]" in target:  # no target in the id (an @ inside a key)
        name, target = nodeid.split("::", 1)[-1], ""
    kind, _, key = name.partition("[")
    return CheckResult(id=name, kind=kind, key=key[:-1] if key else None, expected="",
                       observed=None, outcome=Outcome.ERROR, message=why,
                       target=target or None,
                       location=nodeid.split("::", 1)[0])

