"""``python -m pytest_gpuhost.envelope -- CMD``: the command's output passed through, its exit
status kept, the envelope as JSON with the host state, one verdict line on stderr; 4 with one
line when the envelope cannot be taken; ``--help`` writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pytest_gpuhost.testing.fakehost import FakeHost

SPEC = """\
version: 1
envelope:
  sample_every: 0
sysctl:
  kernel.numa_balancing: 0
"""
PLUGIN = """\
import os

from pytest_gpuhost.envelope.facts import GpuFacts
from pytest_gpuhost.hookspecs import hookimpl


class Gpus:
    def describe(self):
        return "a file's GPUs"

    def sample(self):
        pids = {int(p): "python3" for p in os.environ.get("ON_GPU", "").split()}
        return {"0000:c1:00.0": GpuFacts(processes=pids)}


@hookimpl
def pytest_gpuhost_envelope_sampler(host):
    return Gpus()
"""


def envelope(tmp_path: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fakegpus_plugin.py").write_text(PLUGIN)
    return subprocess.run([sys.executable, "-m", "pytest_gpuhost.envelope", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path), **(env or {})})


def test_a_shell_command_runs_inside_and_its_status_is_the_exit_status(
        tmp_path: Path, fake: FakeHost) -> None:
    fake.sysctl("kernel.numa_balancing", 0)
    (tmp_path / "spec.yaml").write_text(SPEC)
    sysctl = fake.root / "proc/sys/kernel/numa_balancing"
    done = envelope(tmp_path, "--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                    "--out", "e.json", "-p", "fakegpus_plugin", "--",
                    "sh", "-c", f"echo served 200; echo 1 > {sysctl}; exit 3",
                    env={"ON_GPU": "48113"})
    assert done.returncode == 3, done.stderr
    assert done.stdout == "served 200\n"
    written = json.loads((tmp_path / "e.json").read_text())
    assert written["status"] == 3 and written["state"]["spec"]["name"] == "spec"
    reasons = [reason["text"] for reason in written["envelope"]["reasons"]]
    assert reasons == ["0000:c1:00.0: pid 48113 (python3) on the GPU, not the benchmark's",
                       "sysctl[kernel.numa_balancing] changed during the run: 0 -> 1"]
    assert done.stderr == "gpuhost envelope: invalid: " + "; ".join(reasons) + "\n"

    sysctl.write_text("0\n")
    quiet = envelope(tmp_path, "--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                     "-p", "fakegpus_plugin", "--", "sh", "-c", "exit 0")
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr.startswith("gpuhost envelope: valid (")


def test_the_commands_own_processes_are_the_benchmarks(tmp_path: Path, fake: FakeHost) -> None:
    """The fake reports the command's own pid on the GPU (it reads $$ from the command's
    environment): that is the benchmark, not a stray."""
    plugin = PLUGIN.replace('os.environ.get("ON_GPU", "")', 'open("pid").read()')
    (tmp_path / "ownpid_plugin.py").write_text(plugin)
    done = envelope(tmp_path, f"--gpuhost-root={fake.root}", "-p", "ownpid_plugin", "--",
                    "sh", "-c", "echo $$ > pid; exec sleep 0")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("gpuhost envelope: valid ("), done.stderr


def test_an_envelope_that_cannot_be_taken_is_status_4_and_one_line(tmp_path: Path) -> None:
    done = envelope(tmp_path, "--gpuhost-spec=missing.yaml", "--", "true")
    assert done.returncode == 4
    assert done.stderr == "gpuhost envelope: cannot take the envelope: missing.yaml: spec " \
                          "file not found\n"
    bare = envelope(tmp_path)
    assert bare.returncode == 4 and "no command to run: give it after --" in bare.stderr


def test_help_answers_usage_and_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "fakegpus_plugin.py").write_text(PLUGIN)
    before = sorted(p.name for p in tmp_path.iterdir())
    done = envelope(tmp_path, "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m "
                                                            "pytest_gpuhost.envelope")
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_the_examples_command_runs_the_serving_standin_inside_an_envelope(
        tmp_path: Path, example_host: Path) -> None:
    from ..conftest import REPO
    from ..test_docs import block_with

    example = REPO / "examples" / "benchmark"
    command = block_with(example / "README.md", "python -m pytest_gpuhost.envelope")
    args = command.split()[3:]
    args = [arg.replace("/tmp/gpuhost-bench", str(example_host)) for arg in args]
    for name in ("inference-node.yaml", "serving_standin.py"):
        (tmp_path / name).write_text((example / name).read_text())
    done = envelope(tmp_path, *[sys.executable if arg == "python" else arg for arg in args])
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("output tokens/s over 200 prompts\n")
    written = json.loads((tmp_path / "envelope.json").read_text())
    assert written["envelope"]["valid"] is True
    assert written["state"]["spec"]["name"] == "inference-node"
    aer = written["envelope"]["before"]["aer"]
    assert "0000:01:00.0" in aer and "0000:00:01.1" in aer  # a GPU and the bridge above it
    assert done.stderr.startswith("gpuhost envelope: valid (")
