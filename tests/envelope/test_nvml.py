"""The envelope's GPU half through the built-in sampler: the host's agent asks the fake
libnvidia-ml.so.1 (the real ctypes path) or the fake nvidia-smi, and a test moves the driver's
counters between the envelope's samples: throttling, a stray process, an ECC error, a replay
burst; each made to happen, and the same window valid without it. The violation share is over
the driver's own timestamps, so it does not depend on how fast the machine is."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.envelope.window import Envelope
from pytest_gpuhost.gpu.nvml import FakeGpu
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.specmodel.envelope import Limits
from pytest_gpuhost.testing.clock import FakeClock
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import NvmlCounters, compiler, nvidia_smi, nvml_library

NEEDS_CC = pytest.mark.skipif(compiler() is None, reason="no C compiler (cc) on this machine to "
                              "build the fake libnvidia-ml.so.1 with")
A, B = "0000:01:00.0", "0000:21:00.0"
BUSY = FakeGpu(clocks_event_reasons=0)
BEFORE_AFTER = Limits(sample_every=0)


def gpus_host(root: Path) -> FakeHost:
    host = FakeHost(root)
    for address in (A, B):
        host.gpu(address, audio=False)
    host.kmsg([(6, "Linux version 6.8.0")])
    return host


def window(host: FakeHost, move: object = None) -> Envelope:
    local = LocalHost(host.root)
    sampler = builtin.pytest_gpuhost_envelope_sampler(local)
    assert not isinstance(sampler, str), sampler
    with Envelope(local, limits=BEFORE_AFTER, sampler=sampler, clock=FakeClock()) as envelope:
        if callable(move):
            move()
    return envelope


@NEEDS_CC
@pytest.mark.parametrize(("thermal_ns", "valid"), [(3_000_000_000, False), (50_000_000, True)])
def test_thermal_violation_over_the_drivers_time_is_judged_as_a_share(
        tmp_path: Path, thermal_ns: int, valid: bool) -> None:
    host = gpus_host(tmp_path / "box")
    counters = NvmlCounters(nvml_library(host, {A: BUSY, B: BUSY}))
    counters.set(A, "reference_time", 1_000_000)

    def throttle() -> None:
        counters.set(A, "reference_time", 11_000_000)  # 10 s on the driver's clock
        counters.add(A, "violation.thermal", thermal_ns)

    envelope = window(host, throttle)
    assert envelope.valid is valid, envelope.reasons
    if not valid:
        assert envelope.reasons == [f"{A}: thermal violation 30% of 10 s (limit 1%)"]
    assert "libnvidia-ml.so.1" in envelope.close()["sampler"]


@NEEDS_CC
def test_a_stray_process_an_ecc_error_and_a_replay_burst_are_named(tmp_path: Path) -> None:
    host = gpus_host(tmp_path / "box")
    counters = NvmlCounters(nvml_library(host, {A: BUSY, B: BUSY}))
    host.file("proc/48113/comm", "python3\n")
    assert window(host).valid  # the same window without them

    def trouble() -> None:
        counters.process(B, 48113)
        counters.add(A, "ecc.uncorrected_volatile", 1)
        counters.add(A, "replays", 81)

    assert window(host, trouble).reasons == [
        f"{A}: 1 uncorrected ECC errors during the run (limit 0)",
        f"{A}: 81 PCIe replays during the run (limit 80)",
        f"{B}: pid 48113 (python3) on the GPU, not the benchmark's"]


def test_nvidia_smi_answers_where_no_library_loads(tmp_path: Path) -> None:
    host = gpus_host(tmp_path / "box")
    smi = nvidia_smi(host, {A: BUSY, B: BUSY})
    envelope = window(host)
    assert envelope.valid, envelope.reasons
    verdict = envelope.close()
    assert verdict["sampler"].startswith("nvidia-smi") and verdict["missing"] == []
    assert sorted(verdict["before"]["gpus"]) == [A, B]
    del smi


def test_without_a_driver_the_gpu_half_is_missing_once_and_the_host_half_holds(
        tmp_path: Path) -> None:
    host = gpus_host(tmp_path / "box")
    envelope = window(host)
    verdict = envelope.close()
    assert verdict["valid"] is True and verdict["errors"] == []
    [missing] = verdict["missing"]
    assert missing.startswith("the GPU half (")
