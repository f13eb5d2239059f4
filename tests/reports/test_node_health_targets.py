"""NFD's labels, NPD's condition and a Slurm drain speak for the node the run runs on: never for
another machine (an ssh target's checks are not this node's), and where a container and its
host both have a check, they say which side failed."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.reports import slurm
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH, snapshot

pytest_plugins = ["pytester"]

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"
OLD_LABELS = "feature.node.kubernetes.io/gpuhost.tuned=true\n"
RUN = ("-p", "no:cacheprovider")


def host_tree(root: Path, swappiness: int) -> Path:
    FakeHost(root).sysctl("vm.swappiness", swappiness)
    return root


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "spec.yaml"
    path.write_text(SPEC)
    return path


def node07(sshd: SshServer, tmp_path: Path) -> tuple[str, Path]:
    """An ssh target named node07 whose check fails, and its tree."""
    root = host_tree(tmp_path / "node07", 60)
    return sshd.url(root, query="?name=node07"), root


@NEEDS_OPENSSH
@pytest.mark.parametrize(("asked", "status"), [
    (("--gpuhost-nfd=features.txt",), pytest.ExitCode.USAGE_ERROR),
    (("--gpuhost-npd",), 2),  # NPD's 'could not run'
])
def test_node_health_of_a_run_that_checks_only_another_machine_is_refused(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, spec: Path,
        asked: tuple[str, ...], status: int) -> None:
    url, root = node07(sshd, tmp_path)
    features = pytester.path / "features.txt"
    features.write_text(OLD_LABELS)
    before = snapshot(root)
    result = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-target={url}",
                                           f"--gpuhost-ssh-config={sshd.client_config}",
                                           "--fix", *asked, *RUN)
    assert result.ret == status, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines([f"*{asked[0].split('=')[0]}: no target is this node (node07): "
                                 "they speak for the node the run runs on (this machine, a "
                                 "container on it): add --gpuhost-target=local, or run it on "
                                 "that machine*"])
    if "--gpuhost-npd" in asked:
        assert len(result.outlines) == 1
        assert result.outlines[0].startswith("gpuhost: could not run: --gpuhost-npd: no target "
                                              "is this node (node07)")
    assert features.read_text() == OLD_LABELS
    assert snapshot(root) == before  # nothing fixed over there


@NEEDS_OPENSSH
def test_node_health_judges_this_machines_checks_and_not_another_targets(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, spec: Path) -> None:
    url, _ = node07(sshd, tmp_path)
    here = host_tree(tmp_path / "here", 10)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={here}",
                                "--gpuhost-target=local", f"--gpuhost-target={url}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-nfd=features.txt", "--gpuhost-npd",
                                "--gpuhost-report=report.json", *RUN)
    assert result.ret == 0, result.stderr.str()[-2000:]
    assert result.outlines == ["gpuhost: 1 check ok"]
    features = (pytester.path / "features.txt").read_text()
    assert "feature.node.kubernetes.io/gpuhost.tuned=true\n" in features
    assert "feature.node.kubernetes.io/gpuhost.failed=0\n" in features
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["node_targets"] == ["local"]
    assert {c["target"]: c["outcome"] for c in report["checks"]} == {"local": "passed",
                                                                     "node07": "failed"}
    assert slurm.verdict(pytester.path / "report.json", 1) == (slurm.HEALTHY,
                                                               "gpuhost: 1 check ok")


@NEEDS_OPENSSH
def test_the_slurm_reason_never_drains_this_node_for_another_machines_check(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, spec: Path) -> None:
    url, _ = node07(sshd, tmp_path)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target={url}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-report=report.json", *RUN)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert slurm.verdict(pytester.path / "report.json", int(result.ret)) == (
        slurm.CANNOT_RUN, "gpuhost: checks could not run: no target of the report is this node "
                          "(node07)")


def test_the_npd_line_and_the_slurm_reason_say_which_side_of_a_container_pair_failed(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60,
                                               "net.ipv4.tcp_rmem": "4096 87380 268435456"})
    lxc_container(host, "101")
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
          net.ipv4.tcp_rmem: "4096 87380 268435456"
        """))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--gpuhost-npd",
                                "--gpuhost-report=report.json", *RUN)
    assert result.ret == 1, result.stderr.str()[-2000:]
    assert result.outlines == ["gpuhost: 1 failed: sysctl[vm.swappiness]@local"]
    assert slurm.verdict(pytester.path / "report.json", 1) == (
        slurm.FAILED, "gpuhost: sysctl[vm.swappiness]@local")


NO_SPACE = """\
import errno

import pytest_gpuhost.files as files

_real = files.write_atomically


def _full(path, text, **kwargs):
    if path.name == "gpuhost":
        raise OSError(errno.ENOSPC, "No space left on device")
    return _real(path, text, **kwargs)


def pytest_configure(config):
    files.write_atomically = _full
"""


def test_an_nfd_file_that_cannot_be_written_is_no_healthy_answer_and_its_old_labels_go(
        pytester: pytest.Pytester, tmp_path: Path, spec: Path) -> None:
    """The file system is full when the labels are written (a conftest of the inner run, in a
    process of its own): NPD's answer is not OK, and the earlier run's tuned=true is removed."""
    root = host_tree(tmp_path / "host", 10)
    features = pytester.path / "features.d"
    features.mkdir()
    (features / "gpuhost").write_text(OLD_LABELS)
    pytester.makeconftest(NO_SPACE)
    result = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                           "--gpuhost-nfd=features.d/gpuhost", "--gpuhost-npd",
                                           *RUN)
    assert result.ret == 2, result.stderr.str()[-2000:]
    assert result.outlines == ["gpuhost: could not run: the nfd report not written (see the "
                               "log)"]
    result.stderr.fnmatch_lines(["*--gpuhost-nfd: cannot write *gpuhost: No space left on "
                                 "device; the earlier labels in it were removed*"])
    assert list(features.iterdir()) == []
