"""The bundled example host is exactly what the generator writes, so the two never drift."""

from __future__ import annotations

import os
from pathlib import Path

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
