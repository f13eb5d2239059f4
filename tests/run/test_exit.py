"""A run's process ends without the collector's last walk over every object
(``long_lived.at_exit``): a gpuhost run freezes everything in an exit handler; a pytest run
without gpuhost work does not; and nothing stays frozen in a process that goes on after
pytest (pytester's inline runs, a script calling pytest.main)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import BLACKWELL8

WATCH = """\
import atexit, gc, sys
import pytest

def seen():  # registered first: runs last, after every handler pytest's run registered
    with open(sys.argv[1], "w") as out:
        out.write(str(gc.get_freeze_count() > 0))

atexit.register(seen)
code = pytest.main(sys.argv[2:])
with open(sys.argv[1] + ".after", "w") as out:  # pytest.main has returned: the process goes on
    out.write(str(gc.get_freeze_count() > 0))
"""


def _frozen_at_exit(tmp_path: Path, *args: str) -> tuple[str, str]:
    """(frozen when pytest.main returned, frozen when the process ended)."""
    script = tmp_path / "watch.py"
    script.write_text(WATCH)
    seen = tmp_path / "seen"
    subprocess.run([sys.executable, str(script), str(seen), "-q", "-p", "no:cacheprovider",
                    *args], cwd=tmp_path, check=False, timeout=300, capture_output=True)
    return (tmp_path / "seen.after").read_text(), seen.read_text()


def test_a_gpuhost_run_freezes_the_collector_only_when_its_process_exits(
        tmp_path: Path, example_host: Path) -> None:
    assert _frozen_at_exit(tmp_path, f"--gpuhost-spec={BLACKWELL8}",
                           f"--gpuhost-root={example_host}") == ("False", "True")


def test_a_run_without_gpuhost_work_is_left_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    assert _frozen_at_exit(tmp_path, "test_one.py") == ("False", "False")


def test_an_inline_run_leaves_this_process_collecting(pytester: pytest.Pytester,
                                                      example_host: Path) -> None:
    before = gc.get_freeze_count()
    result = pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={example_host}",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the example host is untuned
    assert gc.get_freeze_count() == before
