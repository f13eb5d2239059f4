"""gpus.driver_match on a container target: the container's NVML library against the
host's kernel module, without NVML in this process: the library's file name holds its version."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..e2e.test_ssh import fake_lxc_attach

MODULE_LINE = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release "
               "Build  (dvs-builder@U16-I3-B03-4-3)  Thu Sep 25 2025\n")


def container(root: Path, library: str) -> FakeHost:
    host = FakeHost(root)
    host.file("proc/driver/nvidia/version", MODULE_LINE)  # the host's module, seen inside
    libdir = root / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True, exist_ok=True)
    (libdir / f"libnvidia-ml.so.{library}").write_bytes(b"\x7fELF")
    (libdir / "libnvidia-ml.so.1").symlink_to(f"libnvidia-ml.so.{library}")
    return host


@pytest.mark.parametrize(("library", "outcome", "observed"), [
    ("580.95.05", "passed", "match"),
    ("570.124.06", "failed", "library 570.124.06, kernel module 580.95.05"),
])
def test_driver_match_in_an_lxc_container_reads_the_containers_library(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        library: str, outcome: str, observed: str) -> None:
    tools = fake_lxc_attach(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    ct = container(tmp_path / "ct101", library)
    spec = pytester.makefile(".yaml", spec="version: 1\ngpus:\n  driver_match: true\n")
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target=lxc://101{ct.root}",
                       "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    [check] = [c for c in json.loads((pytester.path / "r.json").read_text())["checks"]
               if c["id"] == "gpus.driver_match"]
    assert (check["id"], check["outcome"], check["observed"]) == (
        "gpus.driver_match", outcome, observed)
    assert {e["source"] for e in check["evidence"]} >= {
        "proc/driver/nvidia/version", f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{library}"}


def test_driver_match_without_nvml_or_a_library_is_skipped_saying_where_it_looked(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "h")
    host.file("proc/driver/nvidia/version", MODULE_LINE)
    spec = pytester.makefile(".yaml", spec="version: 1\ngpus:\n  driver_match: true\n")
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                       "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    [check] = [c for c in json.loads((pytester.path / "r.json").read_text())["checks"]
               if c["id"] == "gpus.driver_match"]
    assert check["outcome"] == "skipped"
    assert "no libnvidia-ml.so.VERSION under usr/lib/x86_64-linux-gnu" in check["message"]
