"""examples/benchmark/ runs as its README says, on a copy of the bundled example host: --fix
opens the gate, the micro-benchmark saves the host's state, the serving stand-in writes the
state beside its result, and after a sysctl changed (still passing) the comparison and the diff
name it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .test_docs import block_with


def escape(line: str) -> str:
    """``line`` as an fnmatch pattern that matches only itself."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in line)


def document_sample(document: Path, first: str) -> list[str]:
    """The lines of the block of ``document`` that starts with ``first``."""
    block = block_with(document, first)
    assert block.startswith(first)
    return block.splitlines()

EXAMPLE = REPO / "examples" / "benchmark"


def documented_diff(where: Path) -> subprocess.CompletedProcess[str]:
    """The state diff as the example's README and docs/benchmarks.md write it, run by the
    shell in ``where`` (this interpreter as ``python``)."""
    [line] = [line for line in (EXAMPLE / "README.md").read_text().splitlines()
              if line.startswith("python -m pytest_gpuhost.state diff ")]
    command = line.split("  #", 1)[0]
    assert command in (REPO / "docs" / "benchmarks.md").read_text().splitlines()
    return subprocess.run(["bash", "-c", command.replace("python ", f"{sys.executable} ", 1)],
                          cwd=where, capture_output=True, text=True, timeout=60)


def test_the_benchmark_example_saves_compares_and_diffs(pytester: pytest.Pytester,
                                                       example_host: Path) -> None:
    for path in EXAMPLE.iterdir():
        if path.is_file():
            shutil.copy(path, pytester.path / path.name)
    root = f"--gpuhost-root={example_host}"
    first = pytester.runpytest_subprocess(".", root, "--fix", "--benchmark-autosave")
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    outcomes = first.parseoutcomes()
    assert (outcomes["fixed"], outcomes["passed"]) == (41, 70)  # 68 checks, 2 benchmarks
    [saved] = (pytester.path / ".benchmarks").glob("*/0001_*.json")
    benchmark_state = json.loads(saved.read_text())["machine_info"]["gpuhost"]
    [written] = (pytester.path / "bench-results").glob("*/gpuhost-state.json")
    assert json.loads(written.read_text()) == benchmark_state
    assert json.loads((written.parent / "serving.jsonl").read_text())["completed"] == 200
    assert benchmark_state["spec"]["name"] == "inference-node"
    assert benchmark_state["targets"]["local"]["failing"] == []

    (example_host / "proc/sys/net/core/rmem_max").write_text("33554432\n")  # still >= 16 MiB
    second = pytester.runpytest_subprocess(".", root, "--benchmark-compare")
    assert second.ret == pytest.ExitCode.OK, second.stdout.str()
    second.stdout.fnmatch_lines(["0001_*.json: host state differs (* 1 check changed",
                                 "  sysctl[net.core.rmem_max]: 16777216 -> 33554432"])
    for document in (REPO / "docs" / "benchmarks.md", REPO / "README.md"):
        # the sample the docs show, digests and all ("the same on any copy of the example host
        # fixed this way"); the saved file's name (its commit and time) aside
        sample = document_sample(
            document, "0001_09ee7161d5eb..._20261204_190531.json: host state differs")
        second.stdout.fnmatch_lines(
            [escape(line).replace(escape("0001_09ee7161d5eb..._20261204_190531.json"),
                                  "0001_*.json") for line in sample], consecutive=True)
    old, new = sorted((pytester.path / "bench-results").glob("*/gpuhost-state.json"),
                      key=lambda path: path.stat().st_mtime_ns)
    diff = subprocess.run([sys.executable, "-m", "pytest_gpuhost.state", "diff", str(old),
                           str(new)], capture_output=True, text=True, timeout=60)
    assert diff.returncode == 1, diff.stderr
    assert "  sysctl[net.core.rmem_max]: 16777216 -> 33554432" in diff.stdout.splitlines()
    assert documented_diff(pytester.path).returncode == 1  # two runs: theirs

    # docs/benchmarks.md's two blocks of the compare: the same state once the value is back,
    # then the value raised again and `nvidia_peermem: absent` added to the spec
    documented = REPO / "docs" / "benchmarks.md"
    (example_host / "proc/sys/net/core/rmem_max").write_text("16777216\n")
    same = pytester.runpytest_subprocess(".", root, "--benchmark-compare")
    assert same.ret == pytest.ExitCode.OK, same.stdout.str()
    (example_host / "proc/sys/net/core/rmem_max").write_text("33554432\n")
    spec = pytester.path / "inference-node.yaml"
    spec.write_text(spec.read_text().replace("  nouveau: absent\n",
                                             "  nouveau: absent\n  nvidia_peermem: absent\n"))
    changed = pytester.runpytest_subprocess(".", root, "--benchmark-compare")
    assert changed.ret == pytest.ExitCode.OK, changed.stdout.str()
    documented_twice = documented_diff(pytester.path)  # four runs: the newest two
    assert documented_twice.returncode == 1, documented_twice.stderr
    assert "  sysctl[net.core.rmem_max]: 16777216 -> 33554432" in \
        documented_twice.stdout.splitlines()
    for compared, heading in (
            (same, "0001_09ee7161d5eb..._20261204_190531.json: same host state"),
            (changed, "0001_unversioned_20261204_190629.json: host state differs")):
        shown = heading.split(":", 1)[0]
        compared.stdout.fnmatch_lines([escape(line).replace(escape(shown), "0001_*.json")
                                       for line in block_with(documented, heading).splitlines()],
                                      consecutive=True)
