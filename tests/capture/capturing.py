"""A pytest-free run of the session, as the plugin drives it: expand, run in rank order, finish,
and the capture reporter at the end. The round-trip tests use it on many trees quickly."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_gpuhost import builtin
from pytest_gpuhost.gpu.nvml import default_factory
from pytest_gpuhost.host import Host, LocalHost
from pytest_gpuhost.reports import RunInfo
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.session import Session
from pytest_gpuhost.settings import RawOptions, Settings, resolve
from pytest_gpuhost.targets import TargetAddress

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = dict(builtin.pytest_gpuhost_conditions())
CLEAN = frozenset({Outcome.PASSED, Outcome.SKIPPED})


@dataclass(frozen=True)
class Run:
    records: list[CheckResult]
    settings: Settings

    def bad(self) -> list[str]:
        """Every record that is not a pass or a skip, with its message."""
        return [f"{r.id}: {r.outcome.value}: {r.message}" for r in self.records
                if r.outcome not in CLEAN]

    def of(self, check_id: str) -> CheckResult:
        [found] = [r for r in self.records if r.id == check_id]
        return found


def run(root: Path, workdir: Path, specs: Sequence[Path] = (), *, capture: str | None = None,
        fix: bool = False, persist: bool = False, overwrite: bool = False) -> Run:
    """One session over ``root`` from ``workdir`` (where relative paths are), like
    ``pytest --gpuhost-spec=... --gpuhost-root=ROOT [--fix] [--gpuhost-capture=OUT]``."""
    raw = RawOptions(invocation=workdir, ini_base=workdir, ini_name="the ini file",
                     spec=tuple(str(s) for s in specs), root=str(root), fix=fix,
                     persist=persist, capture=capture, capture_overwrite=overwrite)
    settings = resolve(raw)

    def make_host(target: TargetAddress, settings: Settings) -> Host:
        return LocalHost(settings.root)

    session = Session(settings, KINDS, CONDITIONS, make_host, default_factory)
    session.target.facts.sleep = lambda seconds: None  # cpuidle residency: no waiting
    checks = [c for spec in session.specs.values() for c in session.expand(spec)]
    checks.sort(key=lambda c: c.order)
    session.target.select(checks)
    try:
        records = [session.run(check) for check in checks]
        records += session.finish(records)
        if settings.capture is not None:
            facts = session.target.host_facts()
            info = RunInfo(specs=(), root=str(root), hostname=facts.hostname)
            session.capture_reporter("pytest (tests/capture/capturing.py)").write(records, info)
    finally:
        session.close()
    return Run(records, settings)


def round_trip(root: Path, workdir: Path, specs: Sequence[Path] = (),
               name: str = "captured.yaml") -> tuple[str, Run]:
    """Capture ``root`` (for ``specs``' keys, or the catalog's), then verify it with the spec
    captured: (the captured text, the verifying run)."""
    run(root, workdir, specs, capture=name)
    captured = workdir / name
    return captured.read_text(), run(root, workdir, [captured])
