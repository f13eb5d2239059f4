"""NVML facts from the machine that has the GPUs: a host that is not this machine
answers from its own NVIDIA driver, asked by its agent: its libnvidia-ml.so.1 through ctypes (a
fake library built here with the system's cc), or ``nvidia-smi --query-gpu`` where no library
loads (a fake nvidia-smi); fixes of persistence mode and the power limit are made there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.gpu.agentnvml import AgentNvml
from pytest_gpuhost.gpu.nvml import NvmlPermissionError, NvmlUnavailable, default_factory
from pytest_gpuhost.gpu.nvmlrecorded import FakeGpu
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import compiler, nvidia_smi, nvml_library, nvml_state

NEEDS_CC = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc) on this machine to "
                              "build the fake libnvidia-ml.so.1 with")
GPUS = {"0000:01:00.0": FakeGpu(power_limit=450_000),
        "0000:21:00.0": FakeGpu(persistence_mode=True)}
SPEC = ("version: 1\ngpus:\n  persistence_mode: enabled\n  power_limit: {min: 600}\n"
        "  ecc: enabled\n")


def tree(root: Path) -> FakeHost:
    host = FakeHost(root)
    for address in GPUS:
        host.gpu(address)
    return host


@NEEDS_CC
def test_the_agent_reads_and_sets_through_the_targets_own_library(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    state = nvml_library(host, GPUS)
    nvml = default_factory(LocalHost(host.root))()
    assert isinstance(nvml, AgentNvml)
    assert (nvml.driver_version(), nvml.gpus()) == ("580.95.05", list(GPUS))
    assert [nvml.persistence_mode(a) for a in GPUS] == [False, True]
    assert nvml.power_limit("0000:01:00.0") == 450_000
    assert nvml.power_limit_range("0000:01:00.0") == (150_000, 600_000)
    nvml.set_persistence_mode("0000:01:00.0", True)
    nvml.set_power_limit("0000:01:00.0", 600_000)
    assert nvml_state(state)["0000:01:00.0"]["persistence_mode"] == 1
    assert nvml_state(state)["0000:01:00.0"]["power_limit"] == 600_000
    assert nvml.persistence_mode("0000:01:00.0") is True  # read back live


@NEEDS_CC
def test_a_driver_that_refuses_says_it_needs_root(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    nvml_library(host, GPUS, refuse=True)
    nvml = default_factory(LocalHost(host.root))()
    with pytest.raises(NvmlPermissionError, match="needs root"):
        nvml.set_persistence_mode("0000:01:00.0", True)


def test_without_a_library_nvidia_smi_answers_and_fixes(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    state = nvidia_smi(host, GPUS)
    nvml = default_factory(LocalHost(host.root))()
    assert [nvml.persistence_mode(a) for a in GPUS] == [False, True]
    assert nvml.ecc_mode("0000:21:00.0") == (True, True)
    nvml.set_power_limit("0000:01:00.0", 600_000)
    gpu = json.loads(state.read_text())["gpus"]["0000:01:00.0"]
    assert gpu["enforced.power.limit"] == "600.00"
    assert nvml.power_limit("0000:01:00.0") == 600_000


def test_a_host_with_neither_says_where_it_looked(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    with pytest.raises(NvmlUnavailable, match=r"no libnvidia-ml.so.1 in .*and no nvidia-smi in"):
        default_factory(LocalHost(host.root))()


@NEEDS_CC
def test_fix_makes_the_nvml_settings_on_the_target_and_rollback_restores_them(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    state = nvml_library(host, GPUS)
    before = state.read_text()
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--fix", "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    outcomes = {c["id"]: c["outcome"] for c in
                json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert outcomes == {"gpus.nvml_inventory": "passed",
                        "gpus.persistence_mode[0000:01:00.0]": "fixed",
                        "gpus.persistence_mode[0000:21:00.0]": "passed",
                        "gpus.power_limit[0000:01:00.0]": "fixed",
                        "gpus.power_limit[0000:21:00.0]": "passed",
                        "gpus.ecc[0000:01:00.0]": "passed",
                        "gpus.ecc[0000:21:00.0]": "passed"}, result.stdout.str()[-2000:]
    assert nvml_state(state)["0000:01:00.0"]["power_limit"] == 600_000
    back = pytester.runpytest(f"--gpuhost-root={host.root}", "--gpuhost-rollback",
                              "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()[-2000:]
    assert state.read_text() == before
