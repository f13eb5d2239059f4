"""Machine identity on fake roots: a target is known by its machine-id, boot id, hostname and
root once reached, not by its URL (``session/machines.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container, rootfs_of

RUN = ("-p", "no:cacheprovider")
SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"


def identified(host: FakeHost, machine_id: str = "0123456789abcdef0123456789abcdef",
               boot_id: str = "6a1c3d4e-0000-4000-8000-000000000001",
               hostname: str = "pve") -> FakeHost:
    host.file("etc/machine-id", f"{machine_id}\n")
    host.file("proc/sys/kernel/random/boot_id", f"{boot_id}\n")
    host.file("proc/sys/kernel/hostname", f"{hostname}\n")
    return host


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.suffix != ".lock"}


@pytest.mark.parametrize("fix", [(), ("--fix",)])
def test_a_container_that_is_its_host_under_another_name_is_refused(
        pytester: pytest.Pytester, tmp_path: Path, fix: tuple[str, ...]) -> None:
    """``lxc://101`` whose lxc-attach enters the host's own root: one machine and root under
    two names (``local`` and ``lxc-101``), refused before anything changes."""
    host = identified(FakeHost(tmp_path / "pve").sysctl("vm.swappiness", 60))
    lxc_container(host, "101")
    rootfs = host.root / rootfs_of("101")
    import shutil

    shutil.rmtree(rootfs)
    rootfs.symlink_to(host.root)
    pytester.makefile(".yaml", spec=SPEC)
    before = tree(host.root)
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=local", "--gpuhost-target=lxc://101", *fix,
                                *RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "*local* and lxc://101* are the same target (one machine and root: the same "
        f"machine-id, boot id and hostname, root {host.root}), under two names: give it once*"])
    assert tree(host.root) == before


def test_a_container_whose_boot_id_is_not_its_hosts_is_refused(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = identified(FakeHost(tmp_path / "pve").sysctl("vm.swappiness", 60))
    container = lxc_container(host, "101")
    boot = container.root / "proc/sys/kernel/random/boot_id"
    boot.unlink()  # a hard link to the host's: the same kernel
    boot.write_text("6a1c3d4e-0000-4000-8000-0000000000ff\n")
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--fix", *RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*lxc://101* runs on another kernel than local*, where its "
                                 "kernel checks would go (their boot ids differ)*"])
    assert (host.root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_a_container_and_its_host_that_share_a_kernel_run(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = identified(FakeHost(tmp_path / "pve").sysctl("vm.swappiness", 60))
    identified(lxc_container(host, "101"), machine_id="fedcba9876543210fedcba9876543210",
               hostname="ct101")
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--fix", *RUN)
    assert result.ret == pytest.ExitCode.OK
    assert (host.root / "proc/sys/vm/swappiness").read_text() == "10\n"
