"""Fixtures: fake host trees built in tmp_path, and the bundled example host copied there."""

from __future__ import annotations

import importlib.util
import inspect
import shutil
from pathlib import Path

import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.checks import Facts
from pytest_gpuhost.engine import RunOptions, run_check
from pytest_gpuhost.fix.fixer import Fixer
from pytest_gpuhost.gpu.nvml import NvmlSource
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.result import CheckResult
from pytest_gpuhost.spec import load_spec
from pytest_gpuhost.testing.fakehost import FakeHost

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_HOST = REPO / "examples" / "hosts" / "blackwell8-untuned"
BLACKWELL8 = REPO / "pytest_gpuhost" / "specs" / "blackwell8.yaml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


EXTRAS = (
    # (module, the extra that brings it, what in a test's source means it needs it)
    ("xdist", "xdist", ('"-n", "',)),
    ("allure", "allure", ("--alluredir",)),
    ("ansible", "ansible", ("read_inventory(", "--gpuhost-inventory")),
)
"""Tests of optional extras skip where the extra is not installed, naming it (issue 10): found by
what the test runs, so a new test of -n or --alluredir is covered without a marker to forget."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    missing = [(extra, needles) for module, extra, needles in EXTRAS
               if importlib.util.find_spec(module) is None]
    if not missing:
        return
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            continue
        if 'sys.modules, "ansible", None' in source:  # the test of its absence runs anyway
            continue
        for extra, needles in missing:
            if any(needle in source for needle in needles):
                item.add_marker(pytest.mark.skip(
                    reason=f"needs the [{extra}] extra: pip install '.[{extra}]'"))
                break


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    """An empty fake host (a kernel release and an empty proc/modules) to build on."""
    return FakeHost(tmp_path / "host")


@pytest.fixture
def host(fake: FakeHost) -> LocalHost:
    return LocalHost(fake.root)


@pytest.fixture
def example_host(tmp_path: Path) -> Path:
    """A private copy of the bundled untuned blackwell8 host: --fix may change it."""
    target = tmp_path / "blackwell8-untuned"
    shutil.copytree(EXAMPLE_HOST, target, symlinks=True)
    return target


def counts(result: pytest.RunResult) -> dict[str, int]:
    """A whole run's final counts, FIXED included (assert_outcomes knows only pytest's own)."""
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning")}


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, to prove that a run wrote nothing."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def run_spec(spec_text: str, root: Path, *, fix: bool = False,
             nvml: NvmlSource | None = None) -> dict[str, CheckResult]:
    """Expand a spec on the host at ``root`` and run every check without pytest's glue
    (``nvml``: an injected NVML; by default the root's, recorded or real)."""
    import textwrap

    spec_path = root.parent / "spec.yaml"
    spec_path.write_text(textwrap.dedent(spec_text))
    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    conditions = dict(builtin.pytest_gpuhost_conditions())
    spec = load_spec(spec_path, kinds, conditions)
    host = LocalHost(root)
    facts = Facts(host, nvml=nvml)
    checks = [check for section, model in spec.sections.items()
              for check in kinds[section].expand(model, facts)]
    fixer = Fixer(host, None, run_lock=None, apply_lock=None, lock_timeout=0, nvml=facts.nvml)
    return {check.id: run_check(check, host, conditions, RunOptions(fix=fix), fixer)
            for check in checks}
