"""The bundled example host is exactly what the generator writes, so the two never drift."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import blackwell8_untuned

from .conftest import EXAMPLE_HOST


def tree(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {str(p.relative_to(root)): (p.read_bytes(), os.access(p, os.X_OK))
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_committed_example_host_matches_the_generator(tmp_path: Path) -> None:
    blackwell8_untuned(tmp_path / "fresh")
    committed, fresh = tree(EXAMPLE_HOST), tree(tmp_path / "fresh")
    assert sorted(committed) == sorted(fresh), (
        "examples/hosts/blackwell8-untuned is stale: regenerate it with "
        "`python -m pytest_gpuhost.fakehost examples/hosts/blackwell8-untuned` (after removing it)")
    stale = [path for path in fresh if committed[path] != fresh[path]]
    assert not stale, f"stale files in the example host: {stale[:5]}"


def test_example_host_is_the_untuned_box() -> None:
    devices = sorted(os.listdir(EXAMPLE_HOST / "sys/bus/pci/devices"))
    # 8 GPUs with their audio functions and root ports, a NIC and its root port
    assert len(devices) == 26
    assert os.readlink(EXAMPLE_HOST / "sys/bus/pci/devices/0000:81:00.0") == \
        "../../../devices/pci0000:80/0000:80:01.1/0000:81:00.0"
    assert (EXAMPLE_HOST / "proc/sys/kernel/numa_balancing").read_text() == "1\n"
    assert (EXAMPLE_HOST / "sys/class/infiniband/mlx5_0").is_dir()
    assert os.access(EXAMPLE_HOST / "usr/sbin/modprobe", os.X_OK)


PROXMOX_HOST = EXAMPLE_HOST.parent / "pve-lxc"


def test_committed_proxmox_example_matches_the_generator(tmp_path: Path) -> None:
    from pytest_gpuhost.testing.example import proxmox_lxc

    proxmox_lxc(tmp_path / "fresh")
    committed, fresh = tree(PROXMOX_HOST), tree(tmp_path / "fresh")
    assert sorted(committed) == sorted(fresh), (
        "examples/hosts/pve-lxc is stale: regenerate it with `python -m "
        "pytest_gpuhost.fakehost --proxmox examples/hosts/pve-lxc` (after removing it)")
    stale = [path for path in fresh if committed[path] != fresh[path]]
    assert not stale, f"stale files in the Proxmox example host: {stale[:5]}"


def test_the_proxmox_example_splits_the_spec_between_host_and_container(
        pytester: pytest.Pytester) -> None:
    """The README's story: ``lxc://101`` of the Proxmox-like example: every kernel check ran
    on the host (``local``, the tree at --gpuhost-root), the P2P measurement in the container,
    each check once; nothing of the example is written."""
    import json

    before = tree(PROXMOX_HOST)
    pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={PROXMOX_HOST}",
                       "--gpuhost-target=lxc://101", "--gpuhost-report=r.json",
                       "-p", "no:cacheprovider")
    checks = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert len({c["id"] for c in checks}) == len(checks) == 246
    where = {c["id"].split("[")[0]: c["target"] for c in checks}
    assert where["p2p"] == where["gpus.nvml_inventory"] == "lxc-101"
    assert {where[k] for k in ("sysctl", "pcie.max_read_request", "gpus.persistence_mode",
                               "module", "dmesg", "kernel.cmdline")} == {"local"}
    assert tree(PROXMOX_HOST) == before
