"""Starting a gpuhost run: its settings from pytest's options (``options.OPTIONS``), the
session, and each of the run's plugins registered only in the role it has, as pytest-xdist
registers its ``DSession`` only on a controller that distributes:

- a run without xdist: ``checks.CheckHooks`` (collect and run the checks) and
  ``controller.Controller`` with ``summary.Summary`` (keep the records, end the run);
- an xdist controller: the ``Controller`` and its ``Summary``, and ``distributing.Distributing``;
- an xdist worker: ``CheckHooks`` and ``worker.Worker``.

``Run`` (``run.py``), registered in every role, is what they share: the settings, the session,
the ledger the checks say they ran in, and how the run stopped. A new controller-side step at the
session's end goes into ``Controller.pytest_sessionfinish``; a new report is a module and a
line of ``reports.REPORTS``; a new option a line of ``options.OPTIONS``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import builtin, bundled, long_lived
from ..builtin import kind_name
from ..config.options import OPTIONS, RawOptions
from ..config.settings import Settings, SettingsError, resolve
from ..fix import LockUnavailable
from ..runstate import benchmark_files, finished_state
from ..session import Session
from ..specmodel import SpecError
from . import interrupts
from .items import RUN
from .ledger import Ledger
from .run import REPORT_ATTR as REPORT_ATTR  # re-exported: its old import path
from .run import Run as Run
from .run import refuse_before_changes as refuse_before_changes

if TYPE_CHECKING:  # xdist's modules load when a run uses it
    from ..checks import Kind
    from ..checks.conditions import ConditionFn
    from ..config.targets import TargetAddress
    from ..host import Host
    from ..reports import Report
    from .distributing import SharedDirectory

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
    from ..specmodel.cache import DIRECTORY

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
        if settings.envelope != "off":
            from .envelopes import EnvelopeHooks

            manager.register(EnvelopeHooks(run), "gpuhost-envelopes")
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
        if settings.envelope != "off":
            from .envelopes import EnvelopeBook

            controller.envelopes = EnvelopeBook()
            manager.register(controller.envelopes, "gpuhost-envelope-book")
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
            controller.workers_cut_short = distributing.cut_short
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
