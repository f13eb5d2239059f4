"""The health facts of ``gpus:``: one check per GPU and fact, each bad value named per GPU with
what it means for the card, from the fake NVML library (the agent's ctypes path), from the fake
nvidia-smi, from a recorded snapshot and over the tests' sshd; none has a fixer, a fact the GPU
does not support is skipped, and capture writes them as the host shows them, warning where one
is already bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from pytest_gpuhost.gpu.nvml import FakeGpu, FakeNvml
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel.specfile import SpecError
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import NvmlCounters, compiler, nvidia_smi, nvml_library
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH
from ..runner import run_spec

A, B = "0000:01:00.0", "0000:21:00.0"
SPEC = """\
version: 1
gpus:
  ecc_errors: {uncorrected_volatile: 0, uncorrected_aggregate: 0, corrected_volatile: {max: 1000}}
  remapped_rows: {pending: false, failure: false}
  retired_pages: {pending: false}
  temperature: {max: 85}
  clocks_event_reasons: {not: [hw_slowdown, hw_thermal_slowdown, hw_power_brake_slowdown]}
  model: "NVIDIA RTX PRO 6000 Blackwell Server Edition"
"""
SICK = FakeGpu(name="NVIDIA H100 80GB HBM3", temperature=91, clocks_event_reasons=0x48,
               ecc_errors={"corrected_volatile": 1200, "uncorrected_volatile": 2},
               remapped_rows=(3, 1, True, True), retired_pages_pending=True)
GPUS = {A: SICK, B: FakeGpu(unsupported=("retired_pages_pending",))}
MEANINGS = {
    "gpus.ecc_errors": ["2 uncorrected volatile (max 0): uncorrected ECC errors since the "
                        "driver loaded: data in this GPU's memory was lost",
                        "1200 corrected volatile (max 1000): corrected ECC errors"],
    "gpus.remapped_rows": ["a row remap is pending: reset the GPU",
                           "a row remap failed: the memory bank has no spare row left; drain "
                           "the node and service the card"],
    "gpus.retired_pages": ["a page retirement is pending: reset the GPU"],
    "gpus.temperature": ["91 C, above 85 C: the GPU slows its clocks to cool down"],
    "gpus.clocks_event_reasons": ["hw_slowdown is active: the board cuts the clocks",
                                  "hw_thermal_slowdown is active: the GPU is too hot"],
    "gpus.model": ["this GPU is an 'NVIDIA H100 80GB HBM3', not the 'NVIDIA RTX PRO 6000 "
                   "Blackwell Server Edition'"],
}
NEEDS_CC = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc) on this machine to "
                              "build the fake libnvidia-ml.so.1 with")


def tree(root: Path) -> FakeHost:
    host = FakeHost(root)
    for address in GPUS:
        host.gpu(address)
    return host


def assert_judged(outcomes: dict[str, tuple[str, str]]) -> None:
    """The sick GPU fails every fact with each meaning; the healthy one passes, its page
    retirement (not supported) skipped."""
    for kind, meanings in MEANINGS.items():
        outcome, message = outcomes[f"{kind}[{A}]"]
        assert outcome == "failed", (kind, message)
        for meaning in meanings:
            assert meaning in message, (kind, message)
        outcome, message = outcomes[f"{kind}[{B}]"]
        wanted = "skipped" if kind == "gpus.retired_pages" else "passed"
        assert outcome == wanted, (kind, message)
    assert "does not report retired pages (not supported" in outcomes[
        f"gpus.retired_pages[{B}]"][1]
    assert len(outcomes) == 2 * len(MEANINGS)


def run(pytester: pytest.Pytester, *args: str) -> dict[str, tuple[str, str]]:
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-report=r.json",
                                "-p", "no:cacheprovider", *args)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["checks"], result.stdout.str()[-2000:]
    return {c["id"]: (c["outcome"], c["message"]) for c in report["checks"]}


@NEEDS_CC
def test_each_fact_from_the_library_is_judged_per_gpu_with_its_meaning(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    nvml_library(host, GPUS)
    assert_judged(run(pytester, f"--gpuhost-root={host.root}"))


def test_each_fact_from_nvidia_smi_is_judged_per_gpu_with_its_meaning(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    nvidia_smi(host, GPUS)
    assert_judged(run(pytester, f"--gpuhost-root={host.root}"))


@NEEDS_OPENSSH
@NEEDS_CC
def test_each_fact_over_ssh_comes_from_the_targets_own_library(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    host = tree(tmp_path / "pve")
    nvml_library(host, GPUS)
    assert_judged(run(pytester, f"--gpuhost-target={sshd.url(host.root)}",
                      f"--gpuhost-ssh-config={sshd.client_config}"))


@NEEDS_OPENSSH
def test_each_fact_over_ssh_comes_from_the_targets_nvidia_smi(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    host = tree(tmp_path / "pve")
    nvidia_smi(host, GPUS)
    assert_judged(run(pytester, f"--gpuhost-target={sshd.url(host.root)}",
                      f"--gpuhost-ssh-config={sshd.client_config}"))


@NEEDS_CC
def test_a_card_that_heals_passes_and_fix_changes_nothing(pytester: pytest.Pytester,
                                                         tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    state = nvml_library(host, GPUS)
    before = state.read_text()
    outcomes = run(pytester, f"--gpuhost-root={host.root}", "--fix")
    assert outcomes[f"gpus.remapped_rows[{A}]"][0] == "failed"  # no fixer: said, not fixed
    assert "no fixer" in outcomes[f"gpus.remapped_rows[{A}]"][1]
    assert state.read_text() == before
    counters = NvmlCounters(state)
    counters.set(A, "remapped.pending", 0)  # the GPU was reset: the remap is applied
    counters.set(A, "remapped.failure", 0)
    assert run(pytester, f"--gpuhost-root={host.root}")[f"gpus.remapped_rows[{A}]"][0] == \
        "passed"


def test_a_recorded_snapshot_answers_them_too(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    host.nvml(FakeNvml(devices=dict(GPUS)))
    records = run_spec(SPEC, host.root)
    assert_judged({check_id: (r.outcome.value, r.message) for check_id, r in records.items()})


def test_capture_writes_them_as_the_host_shows_them_and_warns_where_one_is_bad(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    host.nvml(FakeNvml(devices={A: FakeGpu(remapped_rows=(0, 0, True, False), temperature=52),
                                B: FakeGpu(temperature=47)}))
    run_spec(SPEC, host.root, workdir=tmp_path, capture="captured.yaml")
    text = (tmp_path / "captured.yaml").read_text()
    gpus = yaml.safe_load(text)["gpus"]
    assert gpus["temperature"] == {"max": 85}  # passing everywhere: the spec's own limit
    assert gpus["ecc_errors"] == {"uncorrected_volatile": 0, "uncorrected_aggregate": 0,
                                  "corrected_volatile": 1000}
    assert "remapped_rows" not in gpus  # pending on one GPU only: no one value says it
    assert ("# WARNING: gpus.remapped_rows: already bad on 0000:01:00.0: a row remap is "
            "pending: reset the GPU") in text
    assert gpus["model"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    again = run_spec(tmp_path / "captured.yaml", host.root, workdir=tmp_path)
    assert {r.outcome for r in again.values()} == {Outcome.PASSED}


@pytest.mark.parametrize(("entry", "error"), [
    ("temperature: 85", "gpus temperature needs a mapping of max"),
    ("clocks_event_reasons: {not: [hw_slowdwn]}", "hw_slowdwn is not a reason"),
    ("ecc_errors: {uncorrected_volatile: -1}", "not a count"),
    ("remapped_rows: {pending: maybe}", "pending"),
    ("retired_pages: {failure: false}", "failure"),
])
def test_a_health_key_written_wrong_says_where_and_what(tmp_path: Path, entry: str,
                                                        error: str) -> None:
    host = tree(tmp_path / "box")
    host.nvml(FakeNvml(devices=dict(GPUS)))
    with pytest.raises(SpecError, match=error):
        run_spec(f"version: 1\ngpus:\n  {entry}\n", host.root)


def test_capture_writes_a_bad_fact_every_gpu_shows_the_same_with_its_warning(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    hot = FakeGpu(temperature=88, clocks_event_reasons=0x40)
    host.nvml(FakeNvml(devices={A: hot, B: FakeGpu(temperature=90)}))
    run_spec(SPEC, host.root, workdir=tmp_path, capture="captured.yaml")
    text = (tmp_path / "captured.yaml").read_text()
    gpus = yaml.safe_load(text)["gpus"]
    assert gpus["temperature"] == {"max": 90}
    assert gpus["clocks_event_reasons"] == {"not": ["hw_slowdown", "hw_power_brake_slowdown"]}
    assert "# WARNING: gpus.temperature: already bad on 0000:21:00.0: 90 C, above 85 C" in text
    assert ("# WARNING: gpus.clocks_event_reasons: already bad on 0000:01:00.0: "
            "hw_thermal_slowdown is active: the GPU is too hot") in text
    assert "left out: WARNING" not in text
    again = run_spec(tmp_path / "captured.yaml", host.root, workdir=tmp_path)
    assert {r.outcome for r in again.values()} == {Outcome.PASSED}


def test_a_catalog_capture_judges_them_by_the_catalogs_limits(tmp_path: Path) -> None:
    """A catalog run passes whatever it reads: the capture still warns of a bad fact, judged
    by the catalog's own entry, and writes what passes on this host."""
    host = tree(tmp_path / "box")
    host.nvml(FakeNvml(devices={A: FakeGpu(temperature=90), B: FakeGpu()}))
    run_spec(None, host.root, workdir=tmp_path, capture="captured.yaml")
    text = (tmp_path / "captured.yaml").read_text()
    assert "# WARNING: gpus.temperature: already bad on 0000:01:00.0: 90 C, above 85 C" in text
    gpus = yaml.safe_load(text)["gpus"]
    assert gpus["temperature"] == {"max": 90}
    assert gpus["remapped_rows"]["pending"] is False and gpus["remapped_rows"]["why"]
    again = run_spec(tmp_path / "captured.yaml", host.root, workdir=tmp_path)
    health = {k: r.outcome for k, r in again.items() if k.startswith("gpus.temperature")}
    assert set(health.values()) == {Outcome.PASSED} and len(health) == 2
