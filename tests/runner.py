"""The tests' one way to run a spec without pytest's glue: the product's pytest-free session
(``pytest_gpuhost.session``), driven as the plugin drives it. The spec is loaded and expanded on
the target's facts in one batch, the checks run in rank order with each phase's reads batched,
and at the end come the ``--fix-persist`` files, a rollback's journal closed and the captured
spec, as a whole run has them.

``run_spec(spec, root, ...)`` runs everything and returns the records; ``open_run`` hands the
expanded checks over to run one at a time (a test that changes the host between two checks);
the ``runner`` fixture (``tests/conftest.py``) is both on the test's fake host. The options are
the command line's (``fix``, ``persist``, ``journal``, ``rollback``, ``capture``) plus what only
a test injects: NVML, the host class, the wait of a residency window.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from pytest_gpuhost import builtin
from pytest_gpuhost.checks import Check
from pytest_gpuhost.config.settings import RawOptions, Settings, resolve
from pytest_gpuhost.config.targets import TargetAddress
from pytest_gpuhost.gpu.nvml import Nvml, NvmlFactory, default_factory
from pytest_gpuhost.host import Clock, Host, LocalHost
from pytest_gpuhost.reports import RunInfo
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.session import Session
from pytest_gpuhost.testing.clock import FakeClock

if TYPE_CHECKING:  # typing's own Unpack of keyword arguments is Python 3.12's
    from typing_extensions import Unpack

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = dict(builtin.pytest_gpuhost_conditions())
CLEAN = frozenset({Outcome.PASSED, Outcome.SKIPPED})

SpecSource = str | Path | Sequence[Path]
"""A spec's text (written to ``spec.yaml`` in the working directory), a spec file, or several
(none: a run of the built-in catalog with ``capture``, or a ``rollback``)."""


class Options(TypedDict, total=False):
    """What a test may ask of a run (every one optional)."""

    workdir: Path
    """Where the run is invoked: relative paths and the written spec; the root's parent."""
    fix: bool
    persist: bool
    """``--fix-persist``: boot-time checks write their drop-ins, and the persistence files are
    written at the end (their records follow the checks')."""
    journal: Path
    """``--gpuhost-journal``: the fix's journal in this file, not a new one on the host."""
    rollback: Path
    """``--gpuhost-rollback``: restore this journal's changes (run it without a spec)."""
    capture: str
    """``--gpuhost-capture``: write the captured spec to this file (of the working directory)."""
    overwrite: bool
    """``--gpuhost-capture-overwrite``."""
    nvml: Nvml
    """The NVML the checks see (a ``FakeNvml``); by default the root's recorded one."""
    open_nvml: NvmlFactory
    """How NVML is opened, when a test fakes the binding under it (``PynvmlNvml.open``)."""
    host: Callable[[Path], Host]
    """The host at the root: a ``LocalHost`` unless the test gives a subclass of its own."""
    clock: Clock
    """The clock of the run's phase cache (when each reply was read): by default a
    ``FakeClock`` that moves only by ``sleep``, so that no window is shortened by how long a
    busy machine took between the batch and the check."""
    sleep: Callable[[float], None]
    """How a residency window is waited out: by default on ``clock``, at once; a test's own
    changes the tree meanwhile."""


class Run(Mapping[str, CheckResult]):
    """A run's records by check id, in the order they ran, and its settings."""

    def __init__(self, records: Sequence[CheckResult], settings: Settings) -> None:
        self.records = list(records)
        self.settings = settings
        self._by_id = {record.id: record for record in self.records}
        assert len(self._by_id) == len(self.records), \
            f"two records of one id: {[r.id for r in self.records]}"

    def __getitem__(self, check_id: str) -> CheckResult:
        return self._by_id[check_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def bad(self) -> list[str]:
        """Every record that is not a pass or a skip, with its message."""
        return [f"{r.id}: {r.outcome.value}: {r.message}" for r in self.records
                if r.outcome not in CLEAN]


class Running:
    """An open session: its checks expanded, in rank order, each run when the test says."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.checks = sorted((c for spec in session.specs.values() for c in session.expand(spec)),
                             key=lambda c: c.order)
        self.checks += [check for rollback in session.rollbacks.values()
                        for check in rollback.checks]
        session.target.select(self.checks)

    def run(self, check: Check) -> CheckResult:
        return self.session.run(check)

    def finish(self, records: Sequence[CheckResult]) -> list[CheckResult]:
        """The end of a run, as the plugin's: the persistence files (their records), the
        rollback's journal closed, the captured spec written."""
        done = self.session.finish(records)
        settings = self.session.settings
        if settings.rollback is not None:
            self.session.close_rollback(records)
        if settings.capture is not None:
            facts = self.session.target.host_facts()
            info = RunInfo(specs=(), root=str(settings.root), hostname=facts.hostname)
            self.session.capture_reporter("pytest (tests/runner.py)").write([*records, *done],
                                                                            info)
        return done


def _spec_paths(spec: SpecSource | None, workdir: Path) -> tuple[str, ...]:
    if spec is None:
        return ()
    if isinstance(spec, str):
        path = workdir / "spec.yaml"
        path.write_text(textwrap.dedent(spec))
        return (str(path),)
    if isinstance(spec, Path):
        return (str(spec),)
    return tuple(map(str, spec))


@contextlib.contextmanager
def open_run(spec: SpecSource | None, root: Path, **options: Unpack[Options]
             ) -> Iterator[Running]:
    """A session over ``root``, as ``pytest --gpuhost-spec=... --gpuhost-root=ROOT [--fix]``
    invoked from the working directory opens it; closed at the end."""
    workdir = options.get("workdir", root.parent)
    journal, rollback = options.get("journal"), options.get("rollback")
    raw = RawOptions(invocation=workdir, ini_base=workdir, spec=_spec_paths(spec, workdir),
                     root=str(root), fix=options.get("fix", False),
                     persist=options.get("persist", False),
                     journal=None if journal is None else str(journal),
                     rollback=None if rollback is None else str(rollback),
                     capture=options.get("capture"),
                     capture_overwrite=options.get("overwrite", False))
    make = options.get("host", LocalHost)
    nvml, open_nvml = options.get("nvml"), options.get("open_nvml")

    def make_host(target: TargetAddress, settings: Settings) -> Host:
        return make(settings.root)

    def nvml_for(host: Host) -> NvmlFactory:
        if nvml is not None:
            return lambda: nvml
        return open_nvml if open_nvml is not None else default_factory(host)

    clock = options.get("clock", FakeClock())
    session = Session(resolve(raw), KINDS, CONDITIONS, make_host, nvml_for)
    try:
        session.target.host.clock = clock
        session.target.facts.sleep = options.get("sleep", clock.sleep)
        yield Running(session)
    finally:
        session.close()


def run_spec(spec: SpecSource | None, root: Path, **options: Unpack[Options]) -> Run:
    """Every check of ``spec`` on the host at ``root``, then the run's end (``Running.finish``):
    the records by check id."""
    with open_run(spec, root, **options) as running:
        records = [running.run(check) for check in running.checks]
        records += running.finish(records)
        return Run(records, running.session.settings)


class Runner:
    """The ``runner`` fixture: ``run_spec`` and ``open_run`` on the test's fake host."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, spec: SpecSource | None, **options: Unpack[Options]) -> Run:
        return run_spec(spec, self.root, **options)

    def open(self, spec: SpecSource | None, **options: Unpack[Options]
             ) -> contextlib.AbstractContextManager[Running]:
        return open_run(spec, self.root, **options)
