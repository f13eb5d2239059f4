"""Every ``python -m pytest_gpuhost.X`` entry point answers ``--help`` and ``-h`` with its usage
and writes nothing: ``python -m pytest_gpuhost.fakehost --help`` once wrote an 8.5 MB example
host into a directory named ``--help``. The entry points are found in the package's source (a
module with an ``if __name__ == "__main__":`` block, a package with a ``__main__.py``), so one
added later is held to the same."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gpuhost"


def _runs_as_main(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
                isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__" and \
                any(isinstance(c, ast.Constant) and c.value == "__main__"
                    for c in node.test.comparators):
            return True
    return False


def entry_points() -> list[str]:
    """The modules ``python -m`` runs: each ``pytest_gpuhost.X`` with a ``__main__`` block
    (a package by its ``__main__.py``)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if not _runs_as_main(ast.parse(path.read_text(), str(path))):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__main__" else parts))
    return sorted(found)


def test_the_entry_points_are_found() -> None:
    """The search finds the ones the docs name (a search that found none would hold nothing)."""
    found = entry_points()
    assert {"pytest_gpuhost.fakehost", "pytest_gpuhost.fleet", "pytest_gpuhost.state",
            "pytest_gpuhost.reports.slurm", "pytest_gpuhost.options",
            "pytest_gpuhost.config.options", "pytest_gpuhost.testing.example",
            "pytest_gpuhost.host.agent.serving"} <= set(found)


@pytest.mark.parametrize("flag", ["--help", "-h"])
@pytest.mark.parametrize("module", entry_points())
def test_every_entry_point_answers_help_and_writes_nothing(module: str, flag: str,
                                                           tmp_path: Path) -> None:
    made = subprocess.run([sys.executable, "-m", module, flag], cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    # the old import paths of a module say the documented one
    assert made.stdout.startswith("usage: python -m pytest_gpuhost."), made.stdout
    assert made.stderr == ""
    assert list(tmp_path.iterdir()) == []
