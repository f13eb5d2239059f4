"""The Slurm health check: the reason helper as a unit, and examples/slurm/gpuhost-healthcheck.sh
run with fake sinfo and scontrol on PATH that record their calls."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_gpuhost.reports import slurm
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, EXAMPLE_HOST, REPO

WRAPPER = REPO / "examples" / "slurm" / "gpuhost-healthcheck.sh"
PYTEST = Path(sys.executable).parent / "pytest"
GOOD_SPEC = "version: 1\nname: good\nsysctl:\n  vm.swappiness: 10\n"


# -- the reason helper -------------------------------------------------------------------------

def write_report(path: Path, outcomes: list[tuple[str, str]]) -> Path:
    path.write_text(json.dumps({"checks": [{"id": i, "outcome": o} for i, o in outcomes]}))
    return path


def test_reason_names_the_first_failing_check_and_counts_the_rest(tmp_path: Path) -> None:
    report = write_report(tmp_path / "r.json", [
        ("sysctl[a]", "passed"), ("pcie.max_read_request[0000:81:00.0]", "failed"),
        ("module[x]", "fix_failed"), ("dmesg", "error"), ("cpuidle[C2]", "skipped")])
    assert slurm.verdict(report, 1) == (
        1, "gpuhost: pcie.max_read_request[0000:81:00.0] (+2 more)")
    write_report(report, [("dmesg", "failed")])
    assert slurm.verdict(report, 1) == (1, "gpuhost: dmesg")
    write_report(report, [("sysctl[a]", "passed"), ("cpuidle[C2]", "fixed")])
    assert slurm.verdict(report, 0) == (0, "gpuhost: 2 checks ok")


def test_reason_is_safe_and_bounded(tmp_path: Path) -> None:
    hostile = 'sysctl[x" State=RESUME\n$(reboot)' + "y" * 300 + "]"
    report = write_report(tmp_path / "r.json", [(hostile, "failed"), ("b", "failed")])
    status, line = slurm.verdict(report, 1)
    assert status == 1 and len(line) <= slurm.REASON_WIDTH
    assert not set(line) & set("\"'`$\\\n")
    assert line.startswith("gpuhost: sysctl[x State=RESUME (reboot)yyy") and "..." in line


@pytest.mark.parametrize(("exit_status", "expected"), [
    (124, "gpuhost: checks could not run: timed out after 40 s"),
    (137, "gpuhost: checks could not run: timed out after 40 s"),
    (4, "gpuhost: checks could not run: bad spec, root or options (exit 4)"),
    (3, "gpuhost: checks could not run: pytest internal error (exit 3)"),
    (5, "gpuhost: checks could not run: no gpuhost checks collected (exit 5)"),
    (139, "gpuhost: checks could not run: pytest failed (exit 139)"),
])
def test_checks_that_could_not_run(tmp_path: Path, exit_status: int, expected: str) -> None:
    report = write_report(tmp_path / "r.json", [("a", "passed")])  # never read: pytest failed
    assert slurm.verdict(report, exit_status, timeout=40) == (2, expected)


def test_a_missing_or_contradicting_report_could_not_run(tmp_path: Path) -> None:
    assert slurm.verdict(tmp_path / "none.json", 0) == (
        2, "gpuhost: checks could not run: no report (No such file or directory; pytest exit 0)")
    (tmp_path / "text.json").write_text("not json")
    status, line = slurm.verdict(tmp_path / "text.json", 1)
    assert status == 2 and line.startswith("gpuhost: checks could not run: not a gpuhost report")
    report = write_report(tmp_path / "r.json", [("a", "passed")])
    assert slurm.verdict(report, 1) == (
        2, "gpuhost: checks could not run: pytest exited 1 but no check failed in the report")
    write_report(report, [])
    assert slurm.verdict(report, 0) == (2, "gpuhost: checks could not run: the report lists "
                                           "no checks")


def test_the_helper_as_a_command(tmp_path: Path) -> None:
    report = write_report(tmp_path / "r.json", [("dmesg", "failed")])
    done = subprocess.run([sys.executable, "-m", "pytest_gpuhost.reports.slurm", str(report),
                           "--pytest-exit=1"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (1, "gpuhost: dmesg\n")


# -- the wrapper -------------------------------------------------------------------------------

@dataclass
class Node:
    """A fake Slurm around the wrapper: what sinfo says, and every scontrol/sinfo call."""

    tmp: Path
    sinfo_line: str = "idle none"
    sinfo_status: int = 0

    def run(self, spec: Path, root: Path | None, *, pytest_path: Path = PYTEST,
            timeout: int = 40) -> subprocess.CompletedProcess[str]:
        bin_dir = self.tmp / "bin"
        bin_dir.mkdir(exist_ok=True)
        calls = self.tmp / "calls"
        record = ('{ printf %s "$(basename "$0")"; for a in "$@"; do printf "\\t%s" "$a"; done; '
                  f'printf "\\n"; }} >> {calls}\n')
        fake(bin_dir / "scontrol", record)
        fake(bin_dir / "sinfo", record + (f"printf '%s\\n' '{self.sinfo_line}'\n"
                                          if self.sinfo_line else "")
             + f"exit {self.sinfo_status}\n")
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "GPUHOST_SPEC": str(spec),
               "GPUHOST_PYTEST": str(pytest_path), "GPUHOST_PYTHON": sys.executable,
               "GPUHOST_TIMEOUT": str(timeout), "GPUHOST_REPORT": str(self.tmp / "run/r.json"),
               "GPUHOST_ARGS": f"--gpuhost-root={root}" if root else "",
               "GPUHOST_NODE": "gpu07"}
        return subprocess.run(["/bin/sh", str(WRAPPER)], env=env, cwd=self.tmp, text=True,
                              capture_output=True, timeout=120, check=False)

    def calls(self, command: str = "scontrol") -> list[list[str]]:
        path = self.tmp / "calls"
        lines = path.read_text().splitlines() if path.exists() else []
        return [line.split("\t")[1:] for line in lines if line.split("\t")[0] == command]


def fake(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


@pytest.fixture
def good(tmp_path: Path, fake: FakeHost) -> tuple[Path, Path]:
    fake.sysctl("vm.swappiness", 10)
    spec = tmp_path / "good.yaml"
    spec.write_text(GOOD_SPEC)
    return spec, fake.root


DRAIN_REASON = "gpuhost: sysctl[kernel.nmi_watchdog] (+58 more)"
FAILING = [("sysctl[kernel.nmi_watchdog]", "failed"), ("dmesg", "failed"), ("gpu_count", "passed")]
PASSING = [("sysctl[vm.swappiness]", "passed"), ("cpuidle[C2]", "skipped")]


def canned(tmp_path: Path, outcomes: list[tuple[str, str]], status: int) -> Path:
    """A stand-in for pytest that writes a report of these outcomes where it is told to: for
    the cases about Slurm's state, which the checks themselves do not change."""
    report = write_report(tmp_path / f"canned-{status}.json", outcomes)
    script = tmp_path / f"canned-pytest-{status}"
    fake(script, 'for a in "$@"; do case "$a" in --gpuhost-report=*) out=${a#*=} ;; esac; done\n'
                 f'cp {report} "$out"\nexit {status}\n')
    return script


# real pytest runs, on the bundled example host (verify only: it is never written)

def test_failure_drains_with_the_first_failing_check(node: Node) -> None:
    done = node.run(BLACKWELL8, EXAMPLE_HOST)
    assert done.returncode == 1, done.stderr
    assert node.calls("sinfo") == [["-h", "-n", "gpu07", "-o", "%t %E"]]
    assert node.calls() == [["update", "NodeName=gpu07", "State=DRAIN",
                             f"Reason={DRAIN_REASON}"]]
    assert "56 deselected" in done.stderr  # the fast subset: no p2p


def test_success_resumes_a_gpuhost_drain(node: Node, good: tuple[Path, Path]) -> None:
    node.sinfo_line = "drain gpuhost: sysctl[vm.swappiness]"
    done = node.run(*good)
    assert done.returncode == 0, done.stderr
    assert node.calls() == [["update", "NodeName=gpu07", "State=RESUME"]]


def test_a_bad_spec_drains_too(node: Node, tmp_path: Path, good: tuple[Path, Path]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nsysctl: {vm.swappiness: [1}\n")
    assert node.run(bad, good[1]).returncode == 1
    assert node.calls() == [["update", "NodeName=gpu07", "State=DRAIN", "Reason=gpuhost: "
                             "checks could not run: bad spec, root or options (exit 4)"]]


# Slurm's side, with a stand-in pytest

@pytest.mark.parametrize("line", ["drain admin: DIMM B3 replaced, burn-in",
                                  "drng NHC: check_fs_mount: /scratch not mounted",
                                  "drain none", "idle none", "alloc none", "mix none"])
def test_success_leaves_others_drains_and_healthy_nodes_alone(node: Node, tmp_path: Path,
                                                              line: str) -> None:
    node.sinfo_line = line
    assert node.run(BLACKWELL8, None, pytest_path=canned(tmp_path, PASSING, 0)).returncode == 0
    assert node.calls() == []


def test_failure_keeps_anothers_drain_reason(node: Node, tmp_path: Path) -> None:
    node.sinfo_line = "drain NHC: check_hw_eth: eth0 missing"
    assert node.run(BLACKWELL8, None, pytest_path=canned(tmp_path, FAILING, 1)).returncode == 1
    assert node.calls() == []


def test_failure_rewords_only_its_own_changed_reason(node: Node, tmp_path: Path) -> None:
    failing = canned(tmp_path, FAILING, 1)
    node.sinfo_line = "drain gpuhost: module[nvidia]"
    node.run(BLACKWELL8, None, pytest_path=failing)
    reason = "Reason=gpuhost: sysctl[kernel.nmi_watchdog] (+1 more)"
    assert node.calls() == [["update", "NodeName=gpu07", "State=DRAIN", reason]]
    (node.tmp / "calls").unlink()
    node.sinfo_line = "drain " + reason.removeprefix("Reason=")
    node.run(BLACKWELL8, None, pytest_path=failing)
    assert node.calls() == []  # the same reason: nothing to say


@pytest.mark.parametrize(("line", "status"), [
    ("", 0),                       # slurmctld does not know the node yet
    ("", 1),                       # sinfo cannot reach slurmctld
    ("unk* none", 0), ("idle* none", 0), ("futr none", 0), ("boot none", 0),
    ("drain* gpuhost: dmesg", 0),  # not responding: even its own drain waits
    ("down* Not responding", 0), ("idle~ none", 0), ("mix@ Reboot ASAP", 0),
])
def test_no_scontrol_while_slurmd_is_not_registered(node: Node, tmp_path: Path, line: str,
                                                    status: int) -> None:
    node.sinfo_line, node.sinfo_status = line, status
    assert node.run(BLACKWELL8, None, pytest_path=canned(tmp_path, FAILING, 1)).returncode == 1
    assert node.run(BLACKWELL8, None, pytest_path=canned(tmp_path, PASSING, 0)).returncode == 0
    assert node.calls() == []
    assert len(node.calls("sinfo")) == 2


def test_a_pytest_crash_drains_saying_the_checks_could_not_run(node: Node,
                                                               tmp_path: Path) -> None:
    crash = tmp_path / "crashing-pytest"
    fake(crash, 'echo "Fatal Python error: Segmentation fault" >&2\nkill -SEGV $$\n')
    assert node.run(BLACKWELL8, None, pytest_path=crash).returncode == 1
    assert node.calls() == [["update", "NodeName=gpu07", "State=DRAIN",
                             "Reason=gpuhost: checks could not run: pytest failed (exit 139)"]]


def test_a_hung_run_is_killed_and_drains_saying_so(node: Node, tmp_path: Path) -> None:
    hung = tmp_path / "hung-pytest"
    fake(hung, "exec sleep 60\n")
    done = node.run(BLACKWELL8, None, pytest_path=hung, timeout=1)
    assert done.returncode == 1
    assert node.calls() == [["update", "NodeName=gpu07", "State=DRAIN",
                             "Reason=gpuhost: checks could not run: timed out after 1 s"]]
    node.sinfo_line = "drain gpuhost: checks could not run: timed out after 1 s"
    (node.tmp / "calls").unlink()
    passing = canned(tmp_path, PASSING, 0)
    assert node.run(BLACKWELL8, None, pytest_path=passing).returncode == 0  # the next lifts it
    assert node.calls() == [["update", "NodeName=gpu07", "State=RESUME"]]


def test_a_stale_report_never_vouches(node: Node, tmp_path: Path) -> None:
    node.run(BLACKWELL8, None, pytest_path=canned(tmp_path, PASSING, 0))
    assert (node.tmp / "run/r.json").exists()
    quiet = tmp_path / "quiet-pytest"
    fake(quiet, "exit 0\n")  # claims success, writes no report
    node.sinfo_line = "drain gpuhost: dmesg"
    assert node.run(BLACKWELL8, None, pytest_path=quiet).returncode == 1
    assert node.calls()[-1][2:] == ["State=DRAIN", "Reason=gpuhost: checks could not run: "
                                    "no report (No such file or directory; pytest exit 0)"]


def test_the_wrapper_is_posix_sh_and_executable() -> None:
    assert os.access(WRAPPER, os.X_OK)
    assert WRAPPER.read_text().startswith("#!/bin/sh\n")
    if shutil.which("dash"):
        subprocess.run(["dash", "-n", str(WRAPPER)], check=True)
