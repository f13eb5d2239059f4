"""Report paths are checked before anything changes, and never replace what is not a file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ..conftest import BLACKWELL8, snapshot


@pytest.mark.parametrize("option", ["--gpuhost-report", "--gpuhost-prom"])
def test_a_report_path_that_is_a_directory_stops_the_run_before_any_fix(
        pytester: pytest.Pytester, example_host: Path, option: str) -> None:
    (pytester.path / "out").mkdir()
    before = snapshot(example_host)
    result = pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={example_host}",
                                "--fix", f"{option}=out")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}=out: *out is a directory; name a file in it*"])
    assert snapshot(example_host) == before
    assert "Traceback" not in result.stderr.str()


def test_a_report_path_under_a_file_stops_the_run_before_any_fix(
        pytester: pytest.Pytester, example_host: Path) -> None:
    (pytester.path / "file").write_text("x")
    before = snapshot(example_host)
    result = pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={example_host}",
                                "--fix", "--gpuhost-report=file/out.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*file is not a directory, so *out.json cannot be created*"])
    assert snapshot(example_host) == before


def _spec(pytester: pytest.Pytester, root: Path) -> list[str]:
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/swappiness").write_text("10\n")
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    return [f"--gpuhost-spec={spec}", f"--gpuhost-root={root}"]


def test_a_report_at_a_symlink_replaces_the_file_it_names_and_keeps_the_link(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    target = tmp_path / "reports" / "gpuhost.json"
    target.parent.mkdir()
    target.write_text("old")
    (pytester.path / "link.json").symlink_to(target)
    result = pytester.runpytest(*_spec(pytester, tmp_path / "host"),
                                "--gpuhost-report=link.json")
    assert result.ret == pytest.ExitCode.OK
    assert (pytester.path / "link.json").is_symlink()
    assert json.loads(target.read_text())["summary"]["passed"] == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="making a link owned by another user needs root")
@pytest.mark.parametrize("option", ["--gpuhost-report", "--gpuhost-prom"])
def test_another_users_link_in_a_shared_directory_is_not_followed(
        pytester: pytest.Pytester, tmp_path: Path, option: str) -> None:
    """As root, ``--gpuhost-report=/tmp/x.json`` where another user put a link to /etc/passwd
    in /tmp: the kernel's fs.protected_symlinks would refuse to follow it, and so do we."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    passwd = tmp_path / "etc" / "passwd"  # the canary: a stand-in for the real one
    passwd.parent.mkdir()
    passwd.write_text("root:x:0:0:root:/root:/bin/bash\n")
    link = shared / "gpuhost.json"
    link.symlink_to(passwd)
    os.lchown(link, 65534, 65534)  # nobody's
    result = pytester.runpytest(*_spec(pytester, tmp_path / "host"), f"{option}={link}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{option}={link}: {link} is a symbolic link owned by uid "
                                 f"65534 in the shared directory {shared}; it is not followed*"])
    assert passwd.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    assert link.is_symlink()
    os.lchown(link, 0, 0)  # our own link in the same place is followed, as before
    ours = pytester.runpytest(*_spec(pytester, tmp_path / "host2"), f"{option}={link}")
    assert ours.ret == pytest.ExitCode.OK
    assert passwd.read_text() != "root:x:0:0:root:/root:/bin/bash\n"


def test_a_report_at_a_character_device_is_written_in_place(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    result = pytester.runpytest(*_spec(pytester, tmp_path / "host"),
                                f"--gpuhost-report={device}", f"--gpuhost-prom={device}")
    assert result.ret == pytest.ExitCode.OK
    assert stat.S_ISCHR(device.stat().st_mode)  # still the device, not a file in its place


def test_a_report_at_a_fifo_without_a_reader_is_reported_not_a_hang(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    result = pytester.runpytest(*_spec(pytester, tmp_path / "host"), f"--gpuhost-report={fifo}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*cannot write *fifo: it is a FIFO with no reader*"])
    result.stdout.fnmatch_lines(["total*1*1*"])  # the summary was still printed
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_block_device_is_refused(pytester: pytest.Pytester, tmp_path: Path) -> None:
    device = tmp_path / "disk"
    try:
        os.mknod(device, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    result = pytester.runpytest(*_spec(pytester, tmp_path / "host"), f"--gpuhost-report={device}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*disk is a block device*"])
