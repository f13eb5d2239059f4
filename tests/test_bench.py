"""bench/bench.py's measured runs: what they must not do besides the work they measure."""

from __future__ import annotations

import getpass
import importlib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent


def load_bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("bench")


def test_xdist_runs_leave_other_runs_temporary_directories_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """(1d)'s -n 2 runs: xdist's controller makes a base temporary directory, and without one
    of their own, pytest then deletes all but the newest 3 under /tmp/pytest-of-USER, whatever
    other runs left there (a test suite's tmp_path trees: one measured run took 29 s instead of
    0.9 s, 26 s of it deleting them). Here /tmp is a directory of the test's, where another
    run's files wait in the oldest of 4 numbered directories."""
    pytest.importorskip("xdist", reason="needs the [xdist] extra: pip install '.[xdist]'")
    bench = load_bench(monkeypatch)
    temproot = tmp_path / "tmp"
    shared = temproot / f"pytest-of-{getpass.getuser()}"
    for number in range(4):
        (shared / f"pytest-{number}").mkdir(parents=True)
    left = shared / "pytest-0" / "test_of_another_run0" / "host" / "file"
    left.parent.mkdir(parents=True)
    left.write_text("another run's\n")
    monkeypatch.setenv("TMPDIR", str(temproot))  # the runs' tempfile.gettempdir()

    spec = bench.make_spec_case(tmp_path / "xdist", gpus=1, cpus=2, sysctls=4)
    for case in bench.xdist_cases(spec):
        bench.run_once(case)  # raises SystemExit where a run exits other than 0

    assert left.read_text() == "another run's\n"
    assert sorted(path.name for path in shared.iterdir()) == [
        "pytest-0", "pytest-1", "pytest-2", "pytest-3"]
