"""The verdict from a window's samples: every reason made to happen, and the same window valid
without it; a share under its limit stays valid (no zero tolerance)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from pytest_gpuhost.envelope.facts import (
    GPU_IDLE,
    HW_SLOWDOWN,
    SW_POWER_CAP,
    HostSide,
    HostWindow,
    Sample,
)
from pytest_gpuhost.envelope.verdict import judge, summary, xids
from pytest_gpuhost.specmodel.envelope import DEFAULTS

from .fakegpus import A, B, FakeGpus


def window(gpus: FakeGpus, count: int, *, every: float = 1.0, during: dict[int, dict[str, object]]
           | None = None, ours: frozenset[int] = frozenset({100})) -> list[Sample]:
    """``count`` samples ``every`` seconds apart; ``during[i]`` changes GPU A at sample i (and
    after it, as a counter does)."""
    samples = []
    for index in range(count):
        for key, value in (during or {}).get(index, {}).items():
            gpus.set(A, **{key: value})
        samples.append(Sample(1000.0 + index * every, gpus.sample(), ours=ours))
    return samples


def reasons(verdict: dict[str, Any]) -> list[str]:
    return [str(r["text"]) for r in verdict["reasons"]]


def test_a_quiet_window_is_valid_and_says_what_it_measured() -> None:
    verdict = judge(window(FakeGpus(A), 13), HostWindow(), DEFAULTS)
    assert verdict["valid"] is True and verdict["reasons"] == []
    assert (verdict["window_s"], verdict["samples"]) == (12.0, 13)
    assert verdict["during"][A]["sm_clock"] == {"min": 1980, "median": 1980, "max": 1980}
    assert verdict["during"][A]["HW slowdown"] == {"share": 0.0}
    assert verdict["before"]["gpus"][A]["pcie_replays"] == 0
    assert summary(verdict) == "valid (12 s, 13 samples)"


def test_hw_slowdown_for_a_third_of_the_run_is_named_with_the_gpu_and_its_share() -> None:
    gpus = FakeGpus(A, B)
    samples = window(gpus, 10, during={3: {"reasons": HW_SLOWDOWN}, 6: {"reasons": 0}})
    verdict = judge(samples, HostWindow(), DEFAULTS)
    assert verdict["valid"] is False
    assert reasons(verdict) == [f"{A}: HW slowdown 30% of 9 s (limit 1%)"]
    assert verdict["reasons"][0] == {"gpu": A, "what": "HW slowdown", "observed": 0.3,
                                     "limit": 0.01, "text": reasons(verdict)[0]}


def test_a_slowdown_under_the_limit_stays_valid() -> None:
    """0.5% of the samples in HW slowdown, under the 1% limit: valid; the share is kept."""
    samples = window(FakeGpus(A), 200, during={100: {"reasons": HW_SLOWDOWN},
                                               101: {"reasons": 0}})
    verdict = judge(samples, HostWindow(), DEFAULTS)
    assert verdict["valid"] is True, reasons(verdict)
    assert verdict["during"][A]["HW slowdown"] == {"share": 0.005}
    strict = judge(samples, HostWindow(), msgspec.structs.replace(DEFAULTS, slowdown=0.004))
    assert reasons(strict) == [f"{A}: HW slowdown 0.5% of 199 s (limit 0.4%)"]


@pytest.mark.parametrize(("thermal_ns", "valid"), [(int(0.005 * 100e9), True),
                                                   (int(0.34 * 100e9), False)])
def test_the_violation_time_is_a_share_of_the_wall_time(thermal_ns: int, valid: bool) -> None:
    """Before and after only (sample_every 0): the violation counters' difference over the
    window's."""
    gpus = FakeGpus(A)
    first = Sample(0.0, gpus.sample())
    gpus.set(A, violation_ns={"power": 0, "thermal": thermal_ns})
    verdict = judge([first, Sample(100.0, gpus.sample())], HostWindow(), DEFAULTS)
    assert verdict["valid"] is valid
    if not valid:
        assert reasons(verdict) == [f"{A}: thermal violation 34% of 100 s (limit 1%)"]


def test_a_power_cap_is_judged_by_its_own_limit() -> None:
    held = window(FakeGpus(A), 100, during={10: {"reasons": SW_POWER_CAP}, 14: {"reasons": 0}})
    assert judge(held, HostWindow(), DEFAULTS)["valid"] is True  # 4% < 5%
    longer = window(FakeGpus(A), 100, during={10: {"reasons": SW_POWER_CAP},
                                              20: {"reasons": 0}})
    assert reasons(judge(longer, HostWindow(), DEFAULTS)) == [
        f"{A}: SW power cap 10% of 99 s (limit 5%)"]


def test_a_low_median_clock_while_busy_is_named_and_idle_samples_do_not_count() -> None:
    slow = window(FakeGpus(A), 5, during={1: {"sm_clock": 1200}})
    assert reasons(judge(slow, HostWindow(), DEFAULTS)) == [
        f"{A}: median SM clock 1200 MHz, 60.6% of its max 1980 MHz (limit 90%)"]
    idle = window(FakeGpus(A), 5, during={1: {"sm_clock": 210, "reasons": GPU_IDLE}})
    assert judge(idle, HostWindow(), DEFAULTS)["valid"] is True


def test_another_process_on_a_gpu_is_named_with_its_pid_and_the_benchmarks_are_not() -> None:
    gpus = FakeGpus(A, B)
    gpus.set(B, processes={100: "python3", 48113: "python3"})
    verdict = judge(window(gpus, 3), HostWindow(), DEFAULTS)
    assert reasons(verdict) == [f"{B}: pid 48113 (python3) on the GPU, not the benchmark's"]
    gpus.set(B, processes={100: "python3"})
    assert judge(window(gpus, 3), HostWindow(), DEFAULTS)["valid"] is True
    gpus.set(B, processes={100: "python3", 48113: "python3"})
    allowed = msgspec.structs.replace(DEFAULTS, other_processes=1)
    assert judge(window(gpus, 3), HostWindow(), allowed)["valid"] is True


def test_new_ecc_errors_replays_and_a_pending_remap_are_counted_from_before_to_after() -> None:
    gpus = FakeGpus(A)
    gpus.set(A, ecc_uncorrected=3, pcie_replays=1000)  # before the window: not the run's
    quiet = window(gpus, 4)
    assert judge(quiet, HostWindow(), DEFAULTS)["valid"] is True
    burst = window(gpus, 4, during={2: {"ecc_uncorrected": 5, "pcie_replays": 1081,
                                        "remapped_pending": True}})
    assert reasons(judge(burst, HostWindow(), DEFAULTS)) == [
        f"{A}: 2 uncorrected ECC errors during the run (limit 0)",
        f"{A}: 81 PCIe replays during the run (limit 80)",
        f"{A}: a row remap is pending after the run (limit: none)"]
    gpus.set(A, remapped_pending=False)
    budget = window(gpus, 4, during={2: {"pcie_replays": 1161}})  # 80: DCGM's budget
    assert judge(budget, HostWindow(), DEFAULTS)["valid"] is True


XID_79 = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID_13 = "NVRM: Xid (PCI:0000:41:00): 13, pid=1234, name=python3, Graphics Exception"


def test_a_new_hardware_xid_makes_the_run_invalid_and_an_application_one_only_under_any() -> None:
    samples = window(FakeGpus(A), 3)
    assert xids([XID_79]) == [(A, 79, "GPU has fallen off the bus.")]
    hardware = judge(samples, HostWindow(kernel_log=(XID_79,)), DEFAULTS)
    assert reasons(hardware) == [f"{A}: Xid 79 during the run (hardware): GPU has fallen off "
                                 "the bus."]
    assert judge(samples, HostWindow(kernel_log=(XID_13,)), DEFAULTS)["valid"] is True
    every = msgspec.structs.replace(DEFAULTS, xid="any")
    assert judge(samples, HostWindow(kernel_log=(XID_13,)), every)["valid"] is False
    off = msgspec.structs.replace(DEFAULTS, xid="off")
    assert judge(samples, HostWindow(kernel_log=(XID_79,)), off)["valid"] is True


def test_aer_errors_past_the_budget_name_the_device() -> None:
    bridge = "0000:40:01.1"
    before = HostSide(aer={bridge: {"aer_dev_correctable": 10, "aer_dev_fatal": 0}})
    within = HostSide(aer={bridge: {"aer_dev_correctable": 490, "aer_dev_fatal": 0}})
    past = HostSide(aer={bridge: {"aer_dev_correctable": 491, "aer_dev_fatal": 1}})
    samples = window(FakeGpus(A), 2)
    assert judge(samples, HostWindow(before, within), DEFAULTS)["valid"] is True
    assert reasons(judge(samples, HostWindow(before, past), DEFAULTS)) == [
        f"{bridge}: 481 correctable AER errors during the run (limit 480)",
        f"{bridge}: 1 fatal AER errors during the run (limit 0)"]


def test_a_host_check_changed_during_the_run_names_the_check_and_both_values() -> None:
    before = HostSide(state={"sysctl[kernel.numa_balancing]": "0", "thp": "never"})
    after = HostSide(state={"sysctl[kernel.numa_balancing]": "1", "thp": "never"})
    samples = window(FakeGpus(A), 2)
    verdict = judge(samples, HostWindow(before, after), DEFAULTS)
    assert reasons(verdict) == ["sysctl[kernel.numa_balancing] changed during the run: 0 -> 1"]
    assert verdict["before"]["state"] != verdict["after"]["state"]
    assert judge(samples, HostWindow(before, before), DEFAULTS)["valid"] is True
    ignored = msgspec.structs.replace(DEFAULTS, state="ignored")
    assert judge(samples, HostWindow(before, after), ignored)["valid"] is True


def test_a_failed_sample_is_a_line_and_the_rest_are_judged() -> None:
    gpus = FakeGpus(A)
    samples = [*window(gpus, 2), Sample(1005.0, error="NVML: GPU is lost"),
               Sample(1006.0, gpus.sample())]
    verdict = judge(samples, HostWindow(), DEFAULTS)
    assert verdict["valid"] is True
    assert verdict["errors"] == ["sample at 5 s: NVML: GPU is lost"]


def test_only_the_gpus_the_benchmark_uses_are_judged() -> None:
    gpus = FakeGpus(A, B)
    gpus.set(B, reasons=HW_SLOWDOWN)
    samples = window(gpus, 3)
    assert judge(samples, HostWindow(), DEFAULTS)["valid"] is False
    assert judge(samples, HostWindow(), DEFAULTS, gpus=[A])["valid"] is True
