"""examples/slurm/gpuhost-healthcheck.sh judged by Slurm itself: Debian's
slurm-wlm daemons and munge as a one-node cluster on 127.0.0.1 (free ports, key, socket, state
and logs under tmp_path; ``pytest_gpuhost.testing.slurm``), the node's ``HealthCheckProgram``
the example, run by slurmd every 5 s on a copy of the example host.

slurmd gives a health check program no environment but ``SLURMD_NODENAME``, so the program is
a wrapper that sets the example's settings, as the example's header tells a site to do. Every
wait polls sinfo for the event, under a deadline that only catches a hang. Skipped, saying so,
where the packages are not installed (``.ci/run`` installs them) or not as root.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.testing.slurm import (
    NODE,
    SlurmCluster,
    health_check_wrapper,
    missing_tools,
    start_slurm,
)

from ..conftest import EXAMPLE_HOST, REPO

HEALTHCHECK = REPO / "examples" / "slurm" / "gpuhost-healthcheck.sh"
SPEC = "version: 1\nname: node\nsysctl:\n  vm.swappiness: 10\n  kernel.nmi_watchdog: 0\n"
"""The example host holds 60 and 1: both fail until the test sets them."""

pytestmark = [
    pytest.mark.skipif(bool(missing_tools()), reason="needs Debian's slurm-wlm and munge "
                       f"(missing {', '.join(missing_tools())}): .ci/run installs them"),
    pytest.mark.skipif(os.geteuid() != 0, reason="slurmd runs its health check as root: "
                       "needs root"),
]


class Runs:
    """The health check's completed runs, from the lines its wrapper appends."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def started(self) -> int:
        return sum(line.startswith("start ") for line in self.lines())

    def statuses(self) -> list[int]:
        return [int(line.split()[2]) for line in self.lines() if line.startswith("end ")]

    def wait_for_new(self, cluster: SlurmCluster, count: int, status: int, *,
                     deadline: float = 600) -> None:
        """Wait until ``count`` runs that started after now have ended with ``status`` (every
        run that had started before now may end first, so those are counted out; a run the
        script's timeout cut short on a busy machine ends 1, and is waited past)."""
        before = self.started()
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.statuses()[before:].count(status) >= count:
                return
            cluster.wait(None, what="slurmctld", check=bool)  # a daemon that died says so
            time.sleep(0.2)
        raise TimeoutError(f"{count} health checks did not end {status} within {deadline:.0f} s:"
                           f"\n{self.path.with_suffix('.log').read_text(errors='replace')[-3000:]}")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[SlurmCluster, Path, Runs]]:
    """The cluster, the node's host root (a copy of the example host) and its health checks."""
    root = tmp_path / "host"
    shutil.copytree(EXAMPLE_HOST, root, symlinks=True)
    spec = tmp_path / "node.yaml"
    spec.write_text(SPEC)
    runs = Runs(tmp_path / "runs")
    slurm = tmp_path / "slurm"
    slurm.mkdir()
    program = health_check_wrapper(tmp_path / "gpuhost-healthcheck-wrapper", HEALTHCHECK, {
        "SLURM_CONF": str(slurm / "slurm.conf"),
        "GPUHOST_SPEC": str(spec),
        "GPUHOST_PYTEST": str(Path(sys.executable).parent / "pytest"),
        "GPUHOST_PYTHON": sys.executable,
        "GPUHOST_REPORT": str(tmp_path / "report/healthcheck.json"),
        "GPUHOST_ARGS": f"--gpuhost-root={root}",
        "GPUHOST_TIMEOUT": "50",  # the most under slurmd's 60 s: a busy machine is slow
    }, runs.path)
    cluster = start_slurm(slurm, program, interval=5)
    try:
        yield cluster, root, runs
    finally:
        cluster.stop()


def set_sysctls(root: Path, swappiness: int, nmi_watchdog: int) -> None:
    (root / "proc/sys/vm/swappiness").write_text(f"{swappiness}\n")
    (root / "proc/sys/kernel/nmi_watchdog").write_text(f"{nmi_watchdog}\n")


def test_slurm_drains_resumes_and_never_lifts_an_admins_drain(
        node: tuple[SlurmCluster, Path, Runs]) -> None:
    cluster, root, runs = node
    # a check fails: slurmctld drains the node with gpuhost's reason
    cluster.wait("drain gpuhost: sysctl[kernel.nmi_watchdog] (+1 more)",
                 what="the drain with gpuhost's reason")
    set_by_scontrol = "update_node: node {} reason set to: gpuhost: sysctl[kernel.nmi_watchdog]"
    assert set_by_scontrol.format(NODE) + " (+1 more)" in cluster.log("slurmctld")

    # fixed: the next health check resumes it
    set_sysctls(root, 10, 0)
    cluster.wait("idle none", what="the resume of gpuhost's drain")

    # an admin drains the node: a healthy node stays drained, with the admin's reason
    admin = "admin: DIMM B3 replaced, burn-in"
    cluster.scontrol("update", f"NodeName={NODE}", "State=DRAIN", f"Reason={admin}")
    runs.wait_for_new(cluster, 2, 0)
    assert cluster.state() == f"drain {admin}"

    # ... and a failing one too: the admin's reason is never reworded
    set_sysctls(root, 60, 0)
    runs.wait_for_new(cluster, 2, 1)
    assert cluster.state() == f"drain {admin}"

    # the admin resumes it while it fails: drained again, by gpuhost, saying why
    cluster.scontrol("update", f"NodeName={NODE}", "State=RESUME")
    cluster.wait("drain gpuhost: sysctl[vm.swappiness]", what="gpuhost's drain after the admin's")
    log = runs.path.with_suffix(".log").read_text()
    assert f"{NODE} stays drained: not by gpuhost ({admin})" in log
    assert f"{NODE} is drained already, not by gpuhost ({admin}): its reason is kept" in log
