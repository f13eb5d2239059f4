"""pytest glue: options, collection of spec files into check items, the FIXED status, reports."""

from __future__ import annotations

from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from . import builtin, hookspecs
from .checks import Check, Facts, Kind
from .conditions import ConditionFn
from .engine import RunOptions, run_check
from .host import LocalHost
from .report import format_failure, summary_lines, write_json_report
from .result import CheckResult, Outcome
from .spec import Spec, SpecError, load_spec
from .workers import WAIT_TIMEOUT_S, DoneMarks, SharedDirectory, worker_marks

SPEC_SUFFIXES = (".yaml", ".yml")
REPORT_ATTR = "gpuhost"


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
    results: dict[str, tuple[int, CheckResult]] = field(default_factory=dict)
    """nodeid -> (collection index, record), gathered from local or xdist worker reports."""


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


def _display(config: pytest.Config) -> Any:
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


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpuhost: a host check generated from a gpuhost spec")
    if not config.pluginmanager.is_registered(builtin):
        config.pluginmanager.register(builtin, "gpuhost-builtin")
    paths = _spec_paths(config)
    if not paths:
        for flag, given in (("--fix", config.option.fix),
                            ("--gpuhost-report", config.option.gpuhost_report),
                            ("--gpuhost-root", config.option.gpuhost_root)):
            if given:
                raise pytest.UsageError(f"{flag} needs a spec: pass --gpuhost-spec=FILE "
                                        "(or name a .yaml spec as an argument)")
        return
    root = _root(config)
    kinds, conditions = _registered(config)
    specs: dict[Path, Spec] = {}
    for path in paths:
        try:
            specs[path] = load_spec(path, kinds, conditions, display=_display(config))
        except SpecError as exc:
            raise pytest.UsageError(f"bad gpuhost spec: {exc}") from None
    report = config.option.gpuhost_report
    host = LocalHost(root)
    config.stash[STATE] = GpuhostState(
        specs=specs,
        kinds=kinds,
        conditions=conditions,
        host=host,
        options=RunOptions(fix=config.option.fix),
        report_path=config.invocation_params.dir / report if report else None,
        is_worker=hasattr(config, "workerinput"),
        facts=Facts(host),
        marks=worker_marks(config),
    )
    _add_spec_args(config, specs)
    config.pluginmanager.register(RunReporter(config.stash[STATE]), "gpuhost-run")
    if not hasattr(config, "workerinput") and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(SharedDirectory(), "gpuhost-shared-dir")


def _add_spec_args(config: pytest.Config, specs: Iterable[Path]) -> None:
    """Collect the specs: alone when no test paths were given, else beside the given ones."""
    given = {(config.invocation_params.dir / a.split("::", 1)[0]).resolve() for a in config.args}
    missing = [str(path) for path in specs if path not in given]
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(path) for path in specs]
    else:
        config.args = [*config.args, *missing]


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> SpecFile | None:
    state = parent.config.stash.get(STATE, None)
    if state is not None and file_path.resolve() in state.specs:
        return SpecFile.from_parent(parent, path=file_path)
    return None


class SpecFile(pytest.File):
    def collect(self) -> Iterable[GpuhostItem]:
        state = self.config.stash[STATE]
        spec = state.specs[self.path.resolve()]
        for section, model in spec.sections.items():
            for check in state.kinds[section].expand(model, state.facts):
                yield GpuhostItem.from_parent(self, name=check.id, check=check)


class CheckFailed(Exception):
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
        self.add_marker("gpuhost")

    def runtest(self) -> None:
        __tracebackhide__ = True
        state = self.config.stash[STATE]
        if state.marks is not None and self.waits_for:
            missing = state.marks.wait_for(self.waits_for)
            if missing:
                pytest.fail(f"{self.check.id} ran before {len(missing)} other check(s) "
                                  "finished on the other xdist workers (waited "
                                  f"{WAIT_TIMEOUT_S:.0f} s)", pytrace=False)
        self.result = run_check(self.check, state.host, state.conditions, state.options)
        if self.result.outcome is Outcome.SKIPPED:
            pytest.skip(self.result.message)
        if self.result.outcome not in (Outcome.PASSED, Outcome.FIXED):
            raise CheckFailed(self.result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, CheckFailed):
            return format_failure(excinfo.value.result)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        # The domain must not be a suffix of the nodeid, or -v rewrites its dots into '::'.
        line = int(self.check.options.where.rsplit(":", 1)[-1]) - 1
        return self.path, line, f"gpuhost check {self.check.id}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Checks that must see the others' effects (dmesg) run after every other check."""
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if not isinstance(item, GpuhostItem):
        return report
    if call.when == "call" and item.result is not None:
        setattr(report, REPORT_ATTR, {"index": item.index, "result": item.result.as_dict()})
    marks = item.config.stash[STATE].marks
    if call.when == "teardown" and marks is not None:
        marks.mark(item.index)
    return report


def _record(report: pytest.TestReport | pytest.CollectReport) -> CheckResult | None:
    payload = getattr(report, REPORT_ATTR, None)
    return CheckResult.from_dict(payload["result"]) if payload else None


def pytest_report_teststatus(
    report: pytest.TestReport | pytest.CollectReport, config: pytest.Config
) -> tuple[str, str, str] | None:
    result = _record(report)
    if result is None:
        return None
    if result.outcome is Outcome.FIXED:
        return "fixed", "+", "FIXED"
    if result.outcome is Outcome.FIX_FAILED:
        return "failed", "F", "FIX_FAILED"
    if result.outcome is Outcome.ERROR:
        return "error", "E", "ERROR"
    return None


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
        specs = ", ".join(spec.name for spec in state.specs.values())
        terminalreporter.section(f"gpuhost: {specs} on {state.host.describe()}")
        for line in summary_lines(self.ordered(), fix=state.options.fix):
            terminalreporter.write_line(line)

    def pytest_sessionfinish(self) -> None:
        state = self.state
        if state.is_worker or state.report_path is None:
            return
        write_json_report(state.report_path, specs=list(state.specs.values()),
                          root=state.host.describe(), fix=state.options.fix,
                          results=self.ordered())
