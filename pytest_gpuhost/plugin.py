"""pytest glue: options, collection of spec files into check items, the FIXED status, reports."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import builtin, hookspecs
from .checks import Check, Facts, Kind
from .checks.conditions import ConditionFn
from .engine import RunOptions, run_check
from .fix.journal import JOURNAL_DIR, JournalError, latest_journal, read_journal
from .fix.locking import LockUnavailable
from .fix.rollback import AFTER_REBOOT, refuse_foreign, rollback_checks
from .fix.run import JOURNAL_KEY, FixRun, close_rollback, default_journal, make_fixer
from .fix.run import persist as persist_files
from .gate import judge, verdict_text
from .gpu.nvml import NvmlSource
from .host import LocalHost
from .progress import progress_to
from .reports.prometheus import write_textfile
from .reports.text import format_failure, junit_properties, summary_lines, write_json_report
from .result import CheckResult, Outcome
from .spec import Spec, SpecError, load_spec
from .workers import WAIT_TIMEOUT_S, DoneMarks, SharedDirectory, worker_marks

SPEC_SUFFIXES = (".yaml", ".yml")
REPORT_ATTR = "gpuhost"
GPUHOST_MARK = pytest.mark.gpuhost
"""Built once: looking a marker up by name costs more than the rest of an item's set-up."""


@dataclass
class GpuhostState:
    """What one pytest process knows about the gpuhost part of the session."""

    specs: dict[Path, Spec]
    kinds: Mapping[str, Kind]
    conditions: Mapping[str, ConditionFn]
    host: LocalHost
    options: RunOptions
    report_path: Path | None
    is_worker: bool
    facts: Facts
    marks: DoneMarks | None
    """On an xdist worker: where finished checks are marked, so dmesg can wait for them."""
    fixrun: FixRun
    display: Callable[[Path], str]
    """A path as the user named it: relative to where pytest was invoked, if inside it."""
    rollback_checks: list[Check] = field(default_factory=list)
    """In a --gpuhost-rollback run: one check per journaled change, newest first."""
    gate: bool = False
    """--gpuhost-gate: every other test of the session waits for the host checks."""
    prom_path: Path | None = None
    results: dict[str, tuple[int, CheckResult]] = field(default_factory=dict)
    """nodeid -> (collection index, record), gathered from local or xdist worker reports."""
    host_checks: list[tuple[int, str]] = field(default_factory=list)
    """(collection index, id) of every selected host check, the same on every xdist worker."""
    verdicts: dict[int, str] = field(default_factory=dict)
    """Collection index -> gate verdict of the host checks that finished in this process."""


STATE = pytest.StashKey[GpuhostState]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuhost", "GPU host tuning checks (pytest-gpuhost)")
    group.addoption("--gpuhost-spec", action="append", default=[], metavar="FILE",
                    help="spec of the host's tuning (YAML); may be given more than once. "
                         "ini: gpuhost_spec")
    group.addoption("--gpuhost-root", default=None, metavar="DIR",
                    help="host root that every read, write and command goes through "
                         "(default /; a fake tree for tests and offline checks). ini: gpuhost_root")
    group.addoption("--fix", action="store_true", default=False,
                    help="apply the spec's value to each failing fixable check, read it back "
                         "and re-assert")
    group.addoption("--gpuhost-report", default=None, metavar="OUT.json",
                    help="write a machine-readable JSON report of every check")
    group.addoption("--gpuhost-dry-run", action="store_true", default=False,
                    help="with --fix or --gpuhost-rollback: print and report the plan (each "
                         "change: path or command, from, to) and write nothing")
    group.addoption("--gpuhost-journal", default=None, metavar="FILE",
                    help="journal of the changes --fix makes (default: ROOT/" + JOURNAL_DIR +
                         "/<time>-<spec>-<pid>.jsonl)")
    group.addoption("--gpuhost-rollback", nargs="?", const="", default=None, metavar="JOURNAL",
                    help="restore the originals recorded in JOURNAL, newest change first (default:"
                         " the newest journal under the root not yet rolled back)")
    group.addoption(AFTER_REBOOT, action="store_true", default=False,
                    help="with --gpuhost-rollback: restore the runtime changes of a journal "
                         "written before the host's last reboot (refused by default: the "
                         "reboot reset them)")
    group.addoption("--fix-persist", action="store_true", default=False,
                    help="with --fix: also write the sysctl.d, modules-load.d, modprobe.d and "
                         "udev files under the root that make the fixes survive a reboot")
    group.addoption("--gpuhost-lock-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="how long a --fix run waits for another run's lock on the root "
                         "(default 120)")
    group.addoption("--gpuhost-gate", action="store_true", default=False,
                    help="run the host checks first; if any fails, the session's other tests "
                         "do not run and are reported as errors naming the failed checks")
    group.addoption("--gpuhost-prom", default=None, metavar="FILE",
                    help="write the checks as a Prometheus textfile (node_exporter's textfile "
                         "collector), atomically")
    parser.addini("gpuhost_spec", "spec file(s) of the host's tuning", type="args", default=[])
    parser.addini("gpuhost_root", "host root (default /)", type="string", default="")


def _spec_paths(config: pytest.Config) -> list[Path]:
    """Specs from --gpuhost-spec (else the ini), then .yaml files named as arguments."""
    invocation = config.invocation_params.dir
    paths = [invocation / p for p in config.option.gpuhost_spec]
    if not paths:
        ini_base = config.inipath.parent if config.inipath else config.rootpath
        paths = [ini_base / p for p in config.getini("gpuhost_spec")]
    for arg in config.args:
        candidate = Path(arg.split("::", 1)[0])
        if candidate.suffix in SPEC_SUFFIXES:
            paths.append(invocation / candidate)
    unique: dict[Path, None] = {}
    for path in paths:
        unique.setdefault(path.resolve(), None)
    return list(unique)


def _root(config: pytest.Config) -> Path:
    value: str
    if config.option.gpuhost_root is not None:
        source, value = "--gpuhost-root", config.option.gpuhost_root
        root = config.invocation_params.dir / value
    elif config.getini("gpuhost_root"):
        value = str(config.getini("gpuhost_root"))
        source = f"gpuhost_root in {config.inipath}"
        root = (config.inipath.parent if config.inipath else config.rootpath) / value
    else:
        return Path("/")
    if not root.is_dir():
        raise pytest.UsageError(f"{source}={value}: no such directory; the host root must be "
                                "an existing directory ('/' for this machine)")
    return root


def _display(config: pytest.Config) -> Callable[[Path], str]:
    def show(path: Path) -> str:
        try:
            return str(path.relative_to(config.invocation_params.dir))
        except ValueError:
            return str(path)

    return show


def _registered(config: pytest.Config) -> tuple[dict[str, Kind], dict[str, ConditionFn]]:
    kinds: dict[str, Kind] = {}
    for batch in config.hook.pytest_gpuhost_check_kinds():
        for kind in batch:
            claimed = kinds.get(kind.section)
            if claimed is not None and type(claimed) is not type(kind):
                raise pytest.UsageError(
                    f"two gpuhost check kinds claim section {kind.section!r}: "
                    f"{type(claimed).__module__}.{type(claimed).__qualname__} and "
                    f"{type(kind).__module__}.{type(kind).__qualname__}")
            kinds.setdefault(kind.section, kind)  # the same kind twice: a re-exported hook
    conditions: dict[str, ConditionFn] = {}
    for batch in config.hook.pytest_gpuhost_conditions():
        conditions.update(batch)
    return kinds, conditions


def _usage_checks(config: pytest.Config, has_specs: bool) -> None:
    option = config.option
    rollback = option.gpuhost_rollback is not None
    timeout = option.gpuhost_lock_timeout
    if not math.isfinite(timeout) or timeout < 0:  # nan waits forever; -5 "waited -5 s"
        raise pytest.UsageError(f"--gpuhost-lock-timeout={timeout:g}: expected a finite number "
                                "of seconds, 0 or more")
    if option.gpuhost_rollback_after_reboot and not rollback:
        raise pytest.UsageError(f"{AFTER_REBOOT} only makes sense with --gpuhost-rollback")
    if not has_specs and not rollback:
        for flag, given in (("--fix", option.fix), ("--gpuhost-report", option.gpuhost_report),
                            ("--gpuhost-root", option.gpuhost_root),
                            ("--gpuhost-gate", option.gpuhost_gate),
                            ("--gpuhost-prom", option.gpuhost_prom),
                            ("--fix-persist", option.fix_persist),
                            ("--gpuhost-dry-run", option.gpuhost_dry_run),
                            ("--gpuhost-journal", option.gpuhost_journal)):
            if given:
                raise pytest.UsageError(f"{flag} needs a spec: pass --gpuhost-spec=FILE "
                                        "(or name a .yaml spec as an argument)")
        return
    if rollback and has_specs:
        raise pytest.UsageError("--gpuhost-rollback restores a journal; run it without a spec")
    if rollback:
        for flag, given in (("--fix-persist", option.fix_persist),
                            ("--gpuhost-journal", option.gpuhost_journal)):
            if given:
                raise pytest.UsageError(f"{flag} does not go with --gpuhost-rollback (a rollback "
                                        "journals nothing and persists nothing)")

    if rollback and getattr(option, "numprocesses", None):
        raise pytest.UsageError("--gpuhost-rollback runs serially, newest change first: drop -n")
    if not rollback:
        for flag, given in (("--gpuhost-dry-run", option.gpuhost_dry_run),
                            ("--fix-persist", option.fix_persist),
                            ("--gpuhost-journal", option.gpuhost_journal)):
            if given and not option.fix:
                raise pytest.UsageError(f"{flag} only makes sense with --fix")


def _distributing(config: pytest.Config) -> bool:
    """True on an xdist controller that will start workers."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses",
                                                               None))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpuhost: on a generated host check: its kind; on a "
                            "test of yours: run it only after every host check passed "
                            "(--gpuhost-gate does this for every test)")
    if not config.pluginmanager.is_registered(builtin):
        config.pluginmanager.register(builtin, "gpuhost-builtin")
    paths = _spec_paths(config)
    _usage_checks(config, bool(paths))
    rollback = config.option.gpuhost_rollback
    if not paths and rollback is None:
        return
    root = _root(config)
    host = LocalHost(root)
    kinds, conditions = _registered(config)
    specs: dict[Path, Spec] = {}
    for path in paths:
        try:
            specs[path] = load_spec(path, kinds, conditions, display=_display(config))
        except SpecError as exc:
            raise pytest.UsageError(f"bad gpuhost spec: {exc}") from None
    option = config.option
    if option.fix_persist and len(specs) > 1:
        raise pytest.UsageError("--fix-persist names its files after the spec: run it with one "
                                "spec at a time")
    fix = option.fix or rollback is not None
    options = RunOptions(fix=fix, dry_run=option.gpuhost_dry_run)
    spec_name = next(iter(specs.values())).name if specs else "rollback"
    workerinput = getattr(config, "workerinput", None)
    journal_path = None
    if fix and not options.dry_run and rollback is None:
        journal_path = default_journal(root, option.gpuhost_journal, config.invocation_params.dir,
                                       spec_name, workerinput)
        if workerinput is None and option.gpuhost_journal and journal_path.exists():
            raise pytest.UsageError(f"--gpuhost-journal={option.gpuhost_journal}: the file exists;"
                                    " a journal records one run: name a new file")
    nvml = NvmlSource(config.hook.pytest_gpuhost_nvml(host=host))
    fixer = None
    if fix and not options.dry_run:
        fixer = make_fixer(root, host, journal_path, spec_name, worker=workerinput is not None,
                           distributing=_distributing(config),
                           lock_timeout=option.gpuhost_lock_timeout, nvml=nvml)
    report = option.gpuhost_report
    marks = worker_marks(config)
    state = GpuhostState(
        specs=specs,
        kinds=kinds,
        conditions=conditions,
        host=host,
        options=options,
        report_path=config.invocation_params.dir / report if report else None,
        is_worker=workerinput is not None,
        facts=Facts(host, nvml=nvml,
                    shared_dir=marks.directory if marks is not None else None),
        marks=marks,
        fixrun=FixRun(fixer, journal_path, persist=option.fix_persist),
        display=_display(config),
        gate=option.gpuhost_gate,
        prom_path=config.invocation_params.dir / option.gpuhost_prom
        if option.gpuhost_prom else None,
    )
    config.stash[STATE] = state
    if rollback is not None:
        _configure_rollback(config, state, root, rollback)
    else:
        _add_spec_args(config, specs)
    config.pluginmanager.register(RunReporter(state), "gpuhost-run")
    alluredir = getattr(option, "allure_report_dir", None)
    if alluredir:
        from .reports.allure import AllureEvidence

        config.pluginmanager.register(AllureEvidence(
            config.invocation_params.dir / alluredir, host,
            [spec.name for spec in specs.values()], fix=fix, is_worker=workerinput is not None),
            "gpuhost-allure")
    if _distributing(config):
        extra = {JOURNAL_KEY: str(journal_path)} if journal_path else {}
        config.pluginmanager.register(SharedDirectory(extra), "gpuhost-shared-dir")
    if fixer is not None and fixer.run_lock is not None and _distributing(config):
        try:  # before any worker starts: the workers' fixes run under this run's lock
            fixer.run_lock.acquire(option.gpuhost_lock_timeout)
        except LockUnavailable as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)


def _configure_rollback(config: pytest.Config, state: GpuhostState, root: Path,
                        option: str) -> None:
    try:
        journal = config.invocation_params.dir / option if option else latest_journal(root)
    except JournalError as exc:
        raise pytest.UsageError(str(exc)) from None
    if journal is None:
        raise pytest.UsageError(f"no journal to roll back under {root / JOURNAL_DIR} (every one "
                                "there is rolled back already); pass --gpuhost-rollback=FILE")
    if not journal.is_file():
        raise pytest.UsageError(f"--gpuhost-rollback={option}: no such journal")
    try:
        contents = read_journal(journal)
        if not contents.entries:
            raise JournalError(f"{journal}: the journal records no change to roll back")
        refuse_foreign(contents, state.host.identity(),
                       after_reboot=config.option.gpuhost_rollback_after_reboot)
        state.rollback_checks = rollback_checks(contents, _display(config)(journal),
                                                state.facts.nvml)
    except JournalError as exc:
        raise pytest.UsageError(str(exc)) from None
    state.fixrun.rollback = contents
    config.args = [str(journal)]


def _add_spec_args(config: pytest.Config, specs: Iterable[Path]) -> None:
    """Collect the specs: alone when no test paths were given, else beside the given ones."""
    given = {(config.invocation_params.dir / a.split("::", 1)[0]).resolve() for a in config.args}
    missing = [str(path) for path in specs if path not in given]
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(path) for path in specs]
    else:
        config.args = [*config.args, *missing]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.File | None:
    state = parent.config.stash.get(STATE, None)
    if state is None:
        return None
    if file_path.resolve() in state.specs:
        return SpecFile.from_parent(parent, path=file_path)
    rollback = state.fixrun.rollback
    if rollback is not None and file_path.resolve() == rollback.path.resolve():
        return JournalFile.from_parent(parent, path=file_path)
    return None


class SpecFile(pytest.File):
    def collect(self) -> Iterable[GpuhostItem]:
        state = self.config.stash[STATE]
        spec = state.specs[self.path.resolve()]
        for section, model in spec.sections.items():
            for check in state.kinds[section].expand(model, state.facts):
                yield GpuhostItem.from_parent(self, name=check.id, check=check)


class JournalFile(pytest.File):
    """A journal under --gpuhost-rollback: one check per change, newest first."""

    def collect(self) -> Iterable[GpuhostItem]:
        for check in self.config.stash[STATE].rollback_checks:
            yield GpuhostItem.from_parent(self, name=check.id, check=check)


class CheckFailed(AssertionError):
    """A check that failed (or whose fix failed): a failed test, in Allure too."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


class CheckError(Exception):
    """A host that could not be read: an error, broken in Allure."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


class GpuhostItem(pytest.Item):
    def __init__(self, *, check: Check, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.result: CheckResult | None = None
        self.index = 0
        self.waits_for: list[int] = []
        """Collection indices of the checks this one must run after (dmesg: all others)."""
        self.add_marker(GPUHOST_MARK)

    def runtest(self) -> None:
        __tracebackhide__ = True
        state = self.config.stash[STATE]
        if state.marks is not None and self.waits_for:
            missing = state.marks.wait_for(self.waits_for)
            if missing:
                pytest.fail(f"{self.check.id} ran before {len(missing)} other check(s) "
                                  "finished on the other xdist workers (waited "
                                  f"{WAIT_TIMEOUT_S:.0f} s)", pytrace=False)
        try:
            with progress_to(self._progress_sink()):
                self.result = run_check(self.check, state.host, state.conditions,
                                        state.options, state.fixrun.fixer)
        except LockUnavailable as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)
        self.user_properties.extend(junit_properties(self.result))
        if self.result.outcome is Outcome.SKIPPED:
            # Reported at the spec's line, as a skip mark's would be (not in pytest's runner).
            raise pytest.skip.Exception(self.result.message, _use_item_location=True)
        if self.result.outcome is Outcome.ERROR:
            raise CheckError(self.result)
        if self.result.outcome not in (Outcome.PASSED, Outcome.FIXED):
            raise CheckFailed(self.result)

    def _progress_sink(self) -> Any:
        """Lines a long check reports, written to the terminal past output capturing."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or capture is None or hasattr(self.config, "workerinput"):
            return None

        def show(text: str) -> None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"  {self.check.id}: {text}")

        return show

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (CheckFailed, CheckError)):
            return format_failure(excinfo.value.result)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        # The domain must not be a suffix of the nodeid, or -v rewrites its dots into '::'.
        line = int(self.check.options.where.rsplit(":", 1)[-1]) - 1
        return self.path, line, f"gpuhost check {self.check.id}"


def _gated(item: pytest.Item, config: pytest.Config) -> bool:
    """A test of the user's that must wait for the host checks."""
    if isinstance(item, GpuhostItem):
        return False
    return bool(config.option.gpuhost_gate) or item.get_closest_marker("gpuhost") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Checks that must see the others' effects (dmesg) run after every other check; when a test
    is gated, every host check runs before the session's other tests."""
    if any(_gated(item, config) for item in items):
        items.sort(key=lambda item: (0, item.check.order) if isinstance(item, GpuhostItem)
                   else (1, 0))
    else:
        items.sort(key=lambda item: item.check.order if isinstance(item, GpuhostItem) else 0)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Number the selected checks; a last-ranked check waits for every lower-ranked one."""
    checks = [item for item in session.items if isinstance(item, GpuhostItem)]
    for index, item in enumerate(checks):
        item.index = index
    lower: dict[int, list[int]] = {}  # per rank, not per item: O(checks x ranks), not checks^2
    for rank in sorted({item.check.order for item in checks}):
        lower[rank] = [other.index for other in checks if other.check.order < rank]
    for item in checks:
        item.waits_for = lower[item.check.order]
    state = session.config.stash.get(STATE, None)
    if state is not None:
        state.host_checks = [(item.index, item.check.id) for item in checks]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A gated test runs only when every host check passed, was fixed or did not apply; else
    it is an error (before any of its fixtures run) naming the checks that closed the gate."""
    __tracebackhide__ = True
    if not _gated(item, item.config):
        return
    state = item.config.stash.get(STATE, None)
    if state is None:
        pytest.fail(f"{item.nodeid} is marked gpuhost (it needs the host checks to pass) but no "
                    "gpuhost spec was given: pass --gpuhost-spec=FILE", pytrace=False)
    indices = [index for index, _ in state.host_checks]
    if state.marks is not None:
        state.marks.wait_for(indices)
        verdicts: dict[int, str | None] = {i: state.marks.verdict(i) for i in indices}
    else:
        verdicts = dict(state.verdicts)
    gate = judge(state.host_checks, verdicts)
    if not gate.open:
        pytest.fail(gate.message(), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not isinstance(item, GpuhostItem):
        return report
    if call.when == "call" and item.result is not None:
        setattr(report, REPORT_ATTR, {"index": item.index, "result": item.result.as_dict()})
    state = item.config.stash[STATE]
    if call.when == "teardown":
        verdict = verdict_text(item.check.id, item.result)
        state.verdicts[item.index] = verdict
        if state.marks is not None:
            state.marks.mark(item.index, verdict)
    return report


STATUSES = {
    Outcome.FIXED.value: ("fixed", "+", "FIXED"),
    Outcome.FIX_FAILED.value: ("failed", "F", "FIX_FAILED"),
    Outcome.ERROR.value: ("error", "E", "ERROR"),
    Outcome.WOULD_FIX.value: ("would_fix", "W", "WOULD_FIX"),
}
"""pytest's (category, letter, word) for the outcomes that are not its own."""


def pytest_report_teststatus(
    report: pytest.TestReport | pytest.CollectReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    payload = getattr(report, REPORT_ATTR, None)  # read, not rebuilt: called thrice per test
    return STATUSES.get(payload["result"]["outcome"]) if payload else None


class RunReporter:
    """Session-level hooks of a gpuhost run: gathers the records (from xdist workers too) and,
    on the controller, prints the summary and writes the reports."""

    def __init__(self, state: GpuhostState) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, REPORT_ATTR, None)
        if payload is not None:
            record = CheckResult.from_dict(payload["result"])
            self.state.results[report.nodeid] = (payload["index"], record)

    def ordered(self) -> list[CheckResult]:
        return [result for _, result in sorted(self.state.results.values(), key=lambda p: p[0])]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        state = self.state
        if state.is_worker:
            return
        rollback = state.fixrun.rollback
        subject = (f"rollback of {rollback.path}" if rollback is not None else
                   ", ".join(spec.name for spec in state.specs.values()))
        terminalreporter.section(f"gpuhost: {subject} on {state.host.describe()}")
        results = self.ordered()
        for line in summary_lines(results, fix=state.options.fix, dry_run=state.options.dry_run):
            terminalreporter.write_line(line)
        journal = state.fixrun.journal_path
        if journal is not None and state.fixrun.journal_used():
            terminalreporter.write_line(f"journal: {journal} (undo: --gpuhost-rollback={journal})")
        if rollback is not None and rollback.damaged_lines:
            terminalreporter.write_line(f"journal: {rollback.damaged_lines} line(s) cut short "
                                        "by a crash were skipped")
        if rollback is not None and not state.options.dry_run and self.close_error:
            terminalreporter.write_line(
                f"rollback: the changes are restored, but {self.close_error}: a later default "
                "rollback will offer this journal again (each change then passes as restored)",
                red=True)
        elif rollback is not None and not state.options.dry_run:
            done = self.rolled_back
            terminalreporter.write_line(
                f"rollback: {rollback.path} is {'closed' if done else 'still open'}"
                + ("" if done else " (some changes are not back: run it again once fixed)"))
        if self.persist_error:
            terminalreporter.write_line(f"--fix-persist: nothing written: {self.persist_error}",
                                        red=True)

    rolled_back = False
    persist_error = ""
    close_error = ""

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Session-end fixes (persistence, closing a rollback) and the reports, on the
        controller, before the terminal summary is printed."""
        state = self.state
        if state.is_worker:
            return
        fixrun = state.fixrun
        if fixrun.persist:
            spec = next(iter(state.specs.values()))
            try:
                records = persist_files(state.host, fixrun.fixer, state.options, spec.name,
                                        state.display(spec.path), self.ordered())
            except LockUnavailable as exc:
                self.persist_error = str(exc)
                session.exitstatus = pytest.ExitCode.INTERRUPTED
                records = []
            base = len(state.results)
            for offset, record in enumerate(records):
                state.results[f"persist::{record.key}"] = (base + offset, record)
            failed = (Outcome.FAILED, Outcome.FIX_FAILED, Outcome.ERROR)
            if any(r.outcome in failed for r in records) and session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a file refused or not written
        if fixrun.rollback is not None and not state.options.dry_run:
            try:
                self.rolled_back = close_rollback(fixrun.rollback, self.ordered())
            except JournalError as exc:  # the journal is read-only, or its directory is gone
                self.close_error = str(exc)
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if state.report_path is not None:
            write_json_report(state.report_path, specs=list(state.specs.values()),
                              root=state.host.describe(), fix=state.options.fix,
                              results=self.ordered(), extra={
                                  "dry_run": state.options.dry_run,
                                  "journal": str(fixrun.journal_path)
                                  if fixrun.journal_used() else None,
                                  "rollback": str(fixrun.rollback.path)
                                  if fixrun.rollback else None})

        if state.prom_path is not None:
            write_textfile(state.prom_path, self.ordered(),
                           spec=",".join(spec.name for spec in state.specs.values()),
                           timestamp=time.time())

    def pytest_unconfigure(self) -> None:
        if self.state.fixrun.fixer is not None:
            self.state.fixrun.fixer.close()
