"""A GPU's health facts and one sample of every GPU, through the real ctypes path of the agent
against the fake libnvidia-ml.so.1 built here (the NVML headers' structures and calls), through
nvidia-smi's own field names where no library loads, and over the tests' sshd in one round trip:
a call the driver does not support costs that fact only, and a test moves the driver's state
between two samples."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from pytest_gpuhost.envelope.facts import GpuFacts
from pytest_gpuhost.gpu.agentnvml import AgentNvml
from pytest_gpuhost.gpu.nvml import (
    ECC_COUNTS,
    NVML_TIMEOUT_S,
    FakeGpu,
    FakeNvml,
    Nvml,
    NvmlHung,
    NvmlNotSupported,
    RecordedNvml,
    RemappedRows,
    default_factory,
)
from pytest_gpuhost.gpu.nvmlcodes import event_reasons
from pytest_gpuhost.gpu.nvmlsample import POLICIES, take_sample
from pytest_gpuhost.host import HostError, LocalHost
from pytest_gpuhost.host.cache import CachedHost
from pytest_gpuhost.host.remote import AgentHost, agent_command
from pytest_gpuhost.host.ssh import ssh_argv
from pytest_gpuhost.testing.clock import FakeClock
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import (
    NvmlCounters,
    SmiFields,
    compiler,
    nvidia_smi,
    nvml_library,
    nvml_state,
)
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH

NEEDS_CC = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc) on this machine to "
                              "build the fake libnvidia-ml.so.1 with")
A, B = "0000:01:00.0", "0000:21:00.0"
SICK = FakeGpu(name="NVIDIA H100 80GB HBM3", temperature=91, clocks_event_reasons=0x48,
               ecc_errors={"corrected_volatile": 7, "uncorrected_aggregate": 2},
               remapped_rows=(3, 1, True, False), retired_pages_pending=True)
GPUS = {A: SICK, B: FakeGpu(unsupported=("retired_pages_pending", "ecc_errors"))}


def tree(root: Path) -> FakeHost:
    host = FakeHost(root)
    for address in GPUS:
        host.gpu(address)
    return host


def health(nvml: Nvml, address: str) -> dict[str, object]:
    """Every health fact of one GPU, a fact not supported as the word."""
    def count(name: str) -> Callable[[], object]:
        return lambda: nvml.ecc_errors(address, name)

    reads: dict[str, Callable[[], object]] = {
        "name": lambda: nvml.name(address), "temperature": lambda: nvml.temperature(address),
        "reasons": lambda: event_reasons(nvml.clocks_event_reasons(address)),
        "remapped": lambda: nvml.remapped_rows(address),
        "retired": lambda: nvml.retired_pages_pending(address),
        **{name: count(name) for name in ECC_COUNTS}}
    facts: dict[str, object] = {}
    for key, read in reads.items():
        try:
            facts[key] = read()
        except NvmlNotSupported:
            facts[key] = "not supported"
    return facts


EXPECTED = {A: {"name": "NVIDIA H100 80GB HBM3", "temperature": 91,
                "reasons": ["hw_slowdown", "hw_thermal_slowdown"],
                "remapped": RemappedRows(3, 1, True, False), "retired": True,
                "corrected_volatile": 7, "corrected_aggregate": 0, "uncorrected_volatile": 0,
                "uncorrected_aggregate": 2},
            B: {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "temperature": 40,
                "reasons": ["gpu_idle"], "remapped": RemappedRows(0, 0, False, False),
                "retired": "not supported", **dict.fromkeys(ECC_COUNTS, "not supported")}}


@NEEDS_CC
def test_health_facts_come_through_the_library_and_an_unsupported_call_costs_that_fact_only(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    nvml_library(host, GPUS)
    nvml = default_factory(LocalHost(host.root))()
    assert isinstance(nvml, AgentNvml)
    assert {address: health(nvml, address) for address in GPUS} == EXPECTED


def test_health_facts_come_from_nvidia_smi_where_no_library_loads(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    nvidia_smi(host, GPUS)
    nvml = default_factory(LocalHost(host.root))()
    assert {address: health(nvml, address) for address in GPUS} == EXPECTED


def test_an_older_nvidia_smi_answers_the_event_reasons_by_their_older_name(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    fields = SmiFields(nvidia_smi(host, GPUS))
    fields.unknown("clocks_event_reasons.active")  # a driver before 535 refuses the query
    fields.set(A, "clocks_throttle_reasons.active", "0x0000000000000004")
    nvml = default_factory(LocalHost(host.root))()
    assert event_reasons(nvml.clocks_event_reasons(A)) == ["sw_power_cap"]
    assert nvml.temperature(A) == 91  # the rest of the health query still answers


def test_an_nvidia_smi_without_a_health_field_still_answers_the_settings(tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    SmiFields(nvidia_smi(host, GPUS)).unknown("remapped_rows.pending")  # before driver 460
    nvml = default_factory(LocalHost(host.root))()
    assert nvml.power_limit(A) == 600_000 and nvml.ecc_mode(A) == (True, True)
    with pytest.raises(HostError, match=r'Field "remapped_rows\.pending" is not a valid field'):
        nvml.temperature(A)


def test_the_fake_and_a_recorded_snapshot_answer_the_same(tmp_path: Path) -> None:
    fake = FakeNvml(devices=dict(GPUS))
    host = tree(tmp_path / "box")
    host.nvml(fake)
    recorded = RecordedNvml(LocalHost(host.root))
    assert {a: health(fake, a) for a in GPUS} == {a: health(recorded, a) for a in GPUS} \
        == EXPECTED


@NEEDS_CC
def test_a_library_without_the_newer_calls_falls_back_to_the_older_ones(tmp_path: Path) -> None:
    """No nvmlDeviceGetCurrentClocksEventReasons (before 535: ...ThrottleReasons), no _v3 nor
    _v2 of the compute processes (the v1 structure, 16 bytes a process), no remapped rows."""
    host = tree(tmp_path / "box")
    counters = NvmlCounters(nvml_library(host, GPUS, omit=(
        "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetRemappedRows")))
    for pid in (4242, 4343, 4444):
        counters.process(A, pid, pid * 2**20)
    sample = take_sample(LocalHost(host.root))
    gpu = sample.gpus[A]
    assert event_reasons(gpu.reasons or 0) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert gpu.process_memory == {4242: 4242 * 2**20, 4343: 4343 * 2**20, 4444: 4444 * 2**20}
    assert list(gpu.processes or {}) == [4242, 4343, 4444]
    assert (gpu.remapped_pending, gpu.remapped_corrected) == (None, None)
    assert gpu.missing["remapped_rows"].startswith("not supported")
    assert gpu.temperature == 91  # the others are still read


@NEEDS_CC
def test_many_processes_are_read_whole(tmp_path: Path) -> None:
    """More processes than the first buffer holds (NVML_ERROR_INSUFFICIENT_SIZE, then again)."""
    host = tree(tmp_path / "box")
    counters = NvmlCounters(nvml_library(host, GPUS))
    for pid in range(1000, 1030):
        counters.process(B, pid)
    assert list(take_sample(LocalHost(host.root)).gpus[B].processes or {}) == \
        list(range(1000, 1030))


@NEEDS_CC
def test_a_sample_is_read_fresh_each_time_and_a_test_moves_the_driver_between_two(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    state = nvml_library(host, GPUS)
    counters = NvmlCounters(state)
    cached = CachedHost(LocalHost(host.root))  # a phase's cache never serves a sample
    before = take_sample(cached)
    counters.set(A, "reference_time", 2_000_000)
    counters.add(A, "violation.thermal", 340_000_000)
    counters.set(A, "reasons", 0x8)
    counters.process(A, 48113)
    counters.add(A, "ecc.uncorrected_volatile", 1)
    counters.add(A, "replays", 120)
    counters.set(A, "remapped.pending", 1)
    counters.set(A, "link_width", 8)
    after = take_sample(cached)
    assert after.monotonic >= before.monotonic
    old, new = before.gpus[A], after.gpus[A]
    assert isinstance(new, GpuFacts)  # the one model: what a sampler plugin builds
    assert new.monotonic is not None and new.monotonic >= after.monotonic
    assert set(new.violation_ns) == set(POLICIES) and not new.missing
    assert new.violation_ns["thermal"] - old.violation_ns["thermal"] == 340_000_000
    assert new.violation_at_us == 2_000_000
    assert (old.reasons, new.reasons) == (0x48, 0x8)
    assert (list(old.processes or {}), list(new.processes or {})) == ([], [48113])
    assert (old.ecc_corrected, old.ecc_uncorrected, new.ecc_corrected,
            new.ecc_uncorrected) == (7, 0, 7, 1)
    assert (old.pcie_replays, new.pcie_replays) == (0, 120)
    assert (new.remapped_corrected, new.remapped_uncorrected, new.remapped_pending,
            new.remapped_failure) == (3, 1, True, False)
    assert (new.retired_pages_pending, after.gpus[B].retired_pages_pending) == (True, None)
    assert (old.link_generation, old.link_width, new.link_width) == (5, 16, 8)
    assert (new.sm_clock, new.sm_max, new.temperature, new.power_mw,
            new.power_limit_mw) == (2430, 2430, 91, 85_000, 600_000)
    # not supported there: said, not lost
    assert (after.gpus[B].ecc_corrected, after.gpus[B].ecc_uncorrected) == (None, None)
    assert after.gpus[B].missing["retired_pages_pending"].startswith("not supported")
    assert after.gpus[B].missing["ecc_errors.uncorrected_volatile"].startswith("not supported")
    assert nvml_state(state)[A]["power_limit"] == 600_000  # the old state lines still hold


@NEEDS_CC
def test_a_call_the_driver_stops_supporting_is_missing_from_the_next_sample(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    counters = NvmlCounters(nvml_library(host, GPUS))
    counters.unsupported(A, ["nvmlDeviceGetViolationStatus", "nvmlDeviceGetPowerUsage"])
    gpu = take_sample(LocalHost(host.root)).gpus[A]
    assert gpu.violation_ns == {} and gpu.violation_at_us is None and gpu.power_mw is None
    assert sorted(gpu.missing) == ["power_usage", *sorted(f"violations.{p}" for p in POLICIES)]
    assert "Not Supported" in gpu.missing["power_usage"]
    assert gpu.temperature == 91


def test_a_sample_from_nvidia_smi_names_its_processes_and_what_it_cannot_say(
        tmp_path: Path) -> None:
    host = tree(tmp_path / "box")
    fields = SmiFields(nvidia_smi(host, GPUS))
    fields.process(B, 48113, "python3", 2048)
    fields.set(A, "clocks.sm", "1410")
    fields.set(A, "power.draw", "412.50")
    sample = take_sample(LocalHost(host.root))
    assert sample.source == "nvidia-smi --query-gpu"
    a, b = sample.gpus[A], sample.gpus[B]
    assert (a.sm_clock, a.sm_max, a.power_mw, a.power_limit_mw, a.temperature) == \
        (1410, 2430, 412_500, 600_000, 91)
    assert event_reasons(a.reasons or 0) == ["hw_slowdown", "hw_thermal_slowdown"]
    assert (a.remapped_corrected, a.remapped_uncorrected, a.remapped_pending,
            a.remapped_failure) == (3, 1, True, False)
    assert (a.retired_pages_pending, b.retired_pages_pending) == (True, None)
    assert (a.ecc_corrected, a.ecc_uncorrected) == (7, 0)
    assert (b.processes, b.process_memory) == ({48113: "python3"}, {48113: 2048 * 2**20})
    assert a.processes == {}
    assert a.violation_ns == {} and a.pcie_replays is None
    assert a.missing["pcie_replays"].startswith("not supported")
    assert (a.link_generation, a.link_width) == (5, 16)


@NEEDS_OPENSSH
@NEEDS_CC
def test_over_ssh_a_sample_of_every_gpu_is_one_round_trip(sshd: SshServer,
                                                          tmp_path: Path) -> None:
    host = tree(tmp_path / "pve")
    counters = NvmlCounters(nvml_library(host, GPUS))
    argv = ssh_argv(sshd.alias, port=None, user=None, config=sshd.client_config,
                    connect_timeout=10, inner=agent_command(str(host.root)))
    target = AgentHost(sshd.url(host.root), argv, str(host.root), name="pve")
    try:
        nvml = default_factory(target)()
        assert {address: health(nvml, address) for address in GPUS} == EXPECTED
        first = take_sample(target)
        counters.add(A, "violation.power", 5_000)
        trips = target.traffic.round_trips
        second = take_sample(target)
        assert target.traffic.round_trips == trips + 1
        assert sorted(second.gpus) == [A, B]
        assert (second.gpus[A].violation_ns["power"]
                - first.gpus[A].violation_ns["power"]) == 5_000
    finally:
        target.close()


class HungDriver(LocalHost):
    """A host whose driver never answers a sample (a GPU fallen off the bus) until released."""

    def __init__(self, root: Path, clock: FakeClock, release: threading.Event) -> None:
        super().__init__(root)
        self.fake_clock, self.release = clock, release

    def sample_gpus(self) -> Mapping[str, object]:
        self.fake_clock.stall()
        self.release.wait(60)  # a bound only: a sample that is not given up on comes back late
        return {"source": "late", "monotonic": 0.0, "gpus": {}}


def test_a_sample_the_driver_never_answers_is_given_up_on_in_time(tmp_path: Path) -> None:
    clock, release = FakeClock(), threading.Event()
    try:
        started = clock.now()
        with pytest.raises(NvmlHung, match="did not return within 60 s: a GPU may have fallen"):
            take_sample(HungDriver(tree(tmp_path / "box").root, clock, release), clock=clock)
        assert clock.now() - started == NVML_TIMEOUT_S
    finally:
        release.set()
