"""Starting a gpuhost run: its settings from pytest's options (``options.OPTIONS``), the
session, and each of the run's plugins registered only in the role it has, as pytest-xdist
registers its ``DSession`` only on a controller that distributes:

- a run without xdist: ``checks.CheckHooks`` (collect and run the checks) and
  ``controller.Controller`` with ``summary.Summary`` (keep the records, end the run);
- an xdist controller: the ``Controller`` and its ``Summary``, and ``distributing.Distributing``;
- an xdist worker: ``CheckHooks`` and ``worker.Worker``.

``Run`` itself, registered in every role, is what they share: the settings, the session, the
ledger the checks say they ran in, and how the run stopped. A new controller-side step at the
session's end goes into ``Controller.pytest_sessionfinish``; a new report is a module and a
line of ``reports.REPORTS``; a new option a line of ``options.OPTIONS``.
"""

from __future__ import annotations

import shlex
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import builtin, bundled, long_lived
from ..builtin import kind_name
from ..config.options import OPTIONS, RawOptions
from ..config.settings import Settings, SettingsError, resolve
from ..fix import LockUnavailable
from ..result import CheckResult
from ..runstate import benchmark_files, finished_state
from ..session import Session
from ..spec import SpecError
from . import interrupts
from .items import RUN, GpuhostItem
from .ledger import Ledger

if TYPE_CHECKING:  # xdist's modules load when a run uses it
    from ..checks import Check, Kind
    from ..checks.conditions import ConditionFn
    from ..config.targets import TargetAddress
    from ..host import Host
    from ..reports import Report
    from ..session import Target
    from .distributing import SharedDirectory

REPORT_ATTR = "gpuhost"
"""A check's report carries ``{"index": ..., "result": record}`` (and its target's info) here."""


class Run:
    """One pytest process's gpuhost run, shared by its role plugins; its own hooks carry a
    record across processes and end the run."""

    def __init__(self, config: pytest.Config, settings: Settings, session: Session,
                 ledger: Ledger, reports: dict[str, Report],
                 shared: SharedDirectory | None = None) -> None:
        self.config = config
        self.reports = reports
        """Every report the run can write, by name (the built-in ones and the plugins')."""
        self.settings = settings
        self.session = session
        self.ledger = ledger
        self.shared = shared
        """On an xdist controller: the directory its workers share (``distributing.py``)."""
        self.names: dict[int, str] = {}
        """Collection index -> id of every selected check (the same on every worker)."""
        self.host_checks: list[tuple[int, str]] = []
        """(collection index, id) of every selected host check, which the gate and the host
        state wait for (the persistence files are the run's own work, not host checks)."""
        self.problems: list[str] = []
        self.notes: list[str] = []
        """What a reporter says at the end that is no failure (where a capture was written)."""
        """Work that failed (a report that could not be written): summary lines."""
        self.stopped: str | None = None
        """Why the run stopped early (the root's lock could not be had)."""
        self._persistence: dict[str, dict[str, Check]] = {}

    def stop(self, item: GpuhostItem, reason: str) -> None:
        """The root's lock cannot be had: the run stops after this check and exits 2 (another
        run holds the root, or the lock cannot be taken at all)."""
        self.stopped = reason
        item.session.shouldstop = reason
        if item.check.kind == "persist":  # the first write of the run: nothing was written
            self.problems.append(f"--fix-persist: nothing written: {reason}")

    def persistence(self, target: Target, records: Sequence[CheckResult],
                    spec: Path | None = None) -> dict[str, Check]:
        """A target's persistence files' checks for a spec, made once, from its records when
        all are in."""
        key = f"{target.name}\0{spec}"
        if key not in self._persistence:
            from ..session.persisting import persistence_checks

            own = self.session.specs.get(spec.resolve()) if spec is not None else None
            self._persistence[key] = persistence_checks(self.session, target, records, own)
        return self._persistence[key]

    @property
    def command(self) -> str:
        """The command line, as a report that records it says it."""
        return shlex.join(["pytest", *self.config.invocation_params.args])

    def spec_nodeid(self, path: Path) -> str | None:
        """The spec file's id where it is not pytest's own (``spec_file_id``), else None."""
        own = self._own_id(path)
        file_id = self.spec_file_id(path)
        return None if file_id == own else file_id

    def _own_id(self, path: Path) -> str | None:
        """pytest's id for a file under the rootdir (None outside it, where pytest would say
        ``::sysctl[...]``)."""
        try:
            return path.relative_to(self.config.rootpath).as_posix()
        except ValueError:
            return None

    def spec_file_id(self, path: Path) -> str:
        """The part of a spec's check ids before ``::``. A bundled spec's file name
        (``blackwell8.yaml``): its ids must not depend on where the package is installed (the
        venv, the Python version), and they are those of a copy of it at the top of the
        rootdir, unless such a copy runs too. Else pytest's own id for a file under the
        rootdir, or for one outside it the path as the user named it, so every id names its
        spec."""
        name = bundled.bundled_name(path)
        if name is not None and (self.config.rootpath / name).resolve() not in self.session.specs:
            return name
        own = self._own_id(path)
        return own if own is not None else self.settings.display(path)

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

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self) -> None:
        """The run is over: its connections and files closed, and what only it held let go
        (the records stay with pytest's reports) before pytest's last collections and the
        interpreter's at exit, each of which would walk it all again."""
        self.ledger.close()
        self.session.close()
        self.names.clear()
        self.host_checks.clear()
        self._persistence.clear()
        long_lived.thaw()  # before pytest's last collections, which must see every object


def raw_options(config: pytest.Config) -> RawOptions:
    """What pytest's options and ini values say, for ``settings.resolve``."""
    option = config.option
    workerinput = getattr(config, "workerinput", None)
    shared: dict[str, Any] = {}
    if workerinput is not None:  # an xdist worker: the targets its controller resolved
        from .workers import SSH_MASTERS_KEY, TARGETS_KEY

        shared = {"resolved_targets": tuple(workerinput.get(TARGETS_KEY, ())),
                  "ssh_masters": workerinput.get(SSH_MASTERS_KEY)}
    ini_base = config.inipath.parent if config.inipath else config.rootpath
    return RawOptions(
        config.invocation_params.dir, ini_base,
        str(config.inipath) if config.inipath else "the ini file", args=tuple(config.args),
        ini={each.name: config.getini(each.ini) for each in OPTIONS if each.ini is not None},
        alluredir=getattr(option, "allure_report_dir", None),
        junitxml=getattr(option, "xmlpath", None),
        numprocesses=getattr(option, "numprocesses", None),
        worker=hasattr(config, "workerinput"),
        schemes=builtin.target_schemes(config.pluginmanager), **shared,
        **{each.name: getattr(option, each.dest) for each in OPTIONS})


def spec_cache(config: pytest.Config) -> Path | None:
    """The directory of pytest's cache where parsed specs are kept (``spec/cache.py``): None
    under ``-p no:cacheprovider``, or where pytest cannot make it (a read-only checkout)."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return None
    from ..spec.cache import DIRECTORY

    try:
        directory: Path = cache.mkdir(DIRECTORY)
    except OSError:
        return None
    return directory


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


def registered_reports(config: pytest.Config) -> dict[str, Report]:
    """Every report by name, the built-in ones first; two plugins may not claim one name."""
    reports: dict[str, Report] = {}
    for batch in config.hook.pytest_gpuhost_reports():
        for name, report in batch.items():
            if reports.get(name, report) != report:
                raise SettingsError(f"two gpuhost reports claim the name {name!r}: "
                                    f"{reports[name].factory} and {report.factory}")
            reports[name] = report
    return reports


def start_run(config: pytest.Config) -> None:
    """The run's settings, session and plugins; nothing when it has no gpuhost work."""
    with long_lived.paused():
        try:
            settings = resolve(raw_options(config))
            if not settings.active:
                return
            config.add_cleanup(interrupts.install(  # SIGTERM, SIGHUP: as SIGINT does
                worker=settings.worker, controller=settings.distributing))
            run = _make_run(config, settings)
        except SettingsError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.add_cleanup(long_lived.thaw)
    long_lived.freeze()  # the modules, the spec's model and the session live to the end
    long_lived.at_exit()  # and the interpreter's last collections walk none of it
    config.stash[RUN] = run
    _register(config, run)
    if run.settings.rollback is not None:
        config.args = [str(opened.anchor) for opened in run.session.rollbacks.values()]
    else:
        _add_spec_args(config, run.settings.specs)


def _make_run(config: pytest.Config, settings: Settings) -> Run:
    shared: SharedDirectory | None = None
    if settings.distributing:  # made now: the targets' ssh command lines name it
        from .distributing import share

        shared, settings = share(config, settings)
    log = None
    if settings.worker:
        from .worker import worker_log

        log = worker_log(config)
    if not config.pluginmanager.is_registered(builtin):
        config.pluginmanager.register(builtin, "gpuhost-builtin")
    kinds, conditions = registered(config)
    reports = registered_reports(config)

    def make_host(target: TargetAddress, settings: Settings) -> Host:
        made: Host | None = config.hook.pytest_gpuhost_make_host(
            url=target.url, settings=settings, target=target)
        if made is None:
            raise SettingsError(f"no pytest-gpuhost plugin makes a host for the target "
                                f"{target.url!r} (pytest_gpuhost_make_host)")
        return made

    def nvml_for(host: Host) -> Any:
        return config.hook.pytest_gpuhost_nvml(host=host)

    own, concurrency = None, None
    if log is not None:
        from .worker import own_targets

        own, concurrency = own_targets(config)  # under the target scheduler: its own alone
    try:
        session = Session(settings, kinds, conditions, make_host, nvml_for,
                          shared_dir=log.directory if log else None,
                          workerinput=getattr(config, "workerinput", None), own=own,
                          concurrency=concurrency, spec_cache=spec_cache(config))
    except BaseException as exc:
        if shared is not None:
            shared.pytest_unconfigure()
        if isinstance(exc, SpecError):
            raise pytest.UsageError(f"bad gpuhost spec: {exc}") from None
        if isinstance(exc, LockUnavailable):  # a rollback waits for every other run
            pytest.exit(f"--gpuhost-rollback: {exc}", returncode=pytest.ExitCode.INTERRUPTED)
        raise
    if log is None:
        return Run(config, settings, session, Ledger(), reports, shared)
    from ..session.collecting import seed
    from .worker import SharedLedger, shared_collection

    collected = shared_collection(log) if own is None else None  # the controller's, if any
    if collected is not None:
        seed(session, collected)
    return Run(config, settings, session, SharedLedger(log, records=session.persisting),
               reports)


def _register(config: pytest.Config, run: Run) -> None:
    """Each of the run's plugins where its role is (the table above)."""
    manager, settings = config.pluginmanager, run.settings
    manager.register(run, "gpuhost-run")
    if not settings.distributing:  # this process runs the checks
        from .checks import CheckHooks

        manager.register(CheckHooks(run), "gpuhost-checks")
    if settings.worker:
        from .worker import Worker

        manager.register(Worker(run), "gpuhost-worker")
        # each worker compares machine_info itself: without the warning for the state alone
        benchmark_files(config, None)
    else:
        from .controller import Controller
        from .summary import Summary

        controller = Controller(run)
        manager.register(controller, "gpuhost-controller")
        benchmark_files(config, finished_state(run.session, controller.records))
        manager.register(Summary(controller), "gpuhost-summary")
        from .nodeids import NodeNames

        manager.register(NodeNames(config), "gpuhost-node-names")
        from .failures import register as fold_failures

        # the checks' failures in one pass, folded; registered after the summary, so written
        # before it, where pytest writes its own FAILURES
        fold_failures(config, REPORT_ATTR)
        if settings.distributing:
            from .distributing import Distributing

            distributing = Distributing(run, controller.book)
            manager.register(distributing, "gpuhost-distributing")
            controller.progress = distributing.progress
            controller.uncollected = distributing.uncollected
            distributing.start()
    if settings.alluredir is not None:
        from ..reports.allure import AllureEvidence

        def host_name(target: str | None) -> str:
            """The machine a check ran on as it names itself, else its target's name."""
            session = run.session
            ran_on = session.targets.get(target) if target is not None else session.target
            facts = ran_on.host_facts() if ran_on is not None else None
            return (facts.hostname if facts is not None else None) or target or "unknown"

        manager.register(AllureEvidence(host_name, config), "gpuhost-allure")


def _add_spec_args(config: pytest.Config, paths: Sequence[Path]) -> None:
    """Collect the specs: alone when no test paths were given, else beside the given ones (a
    bundled spec's check named by its id, ``blackwell8.yaml::dmesg``, found at its path)."""
    base = config.invocation_params.dir
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(path) for path in paths]
        return
    args = [bundled.from_argument(a, paths, base) for a in config.args]
    given = {(base / a.split("::", 1)[0]).resolve() for a in args}
    config.args = [*args, *(str(path) for path in paths if path not in given)]


def refuse_before_changes(session: Session) -> None:
    """Before any check runs (a run's collection, or an xdist controller's before its workers
    start): one machine under two names, and a setting with two owners, are usage errors
    (exit 4), nothing changed."""
    from ..session.machines import SameMachine, refuse_one_machine_twice
    from ..session.owners import TwoOwners, refuse_two_owners

    try:
        refuse_one_machine_twice(session)
        refuse_two_owners(session)
    except (SameMachine, TwoOwners) as exc:
        raise pytest.UsageError(str(exc)) from None
