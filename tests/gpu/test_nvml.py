"""NVML facts: the Version domain, the checks against an injected fake NVML, the lazy real
wrapper (on a fake pynvml module), and whole-plugin runs with a conftest-injected fake."""

from __future__ import annotations

import ctypes
import sys
import threading
import types
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pytest_gpuhost.gpu.nvml import (
    NVML_TIMEOUT_S,
    RECORDED_NVML,
    FakeGpu,
    FakeNvml,
    NvmlHung,
    NvmlSource,
    NvmlUnavailable,
    PynvmlNvml,
    RecordedNvml,
    default_factory,
)
from pytest_gpuhost.host import HostError, LocalHost, Read, Reply, Request
from pytest_gpuhost.host.cache import CachedHost
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel.matchers import Range, Version
from pytest_gpuhost.testing.clock import FakeClock
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

from ..runner import run_spec

pytest_plugins = ["pytester"]

A, B = "0000:01:00.0", "0000:81:00.0"
SPEC = """\
version: 1
gpus:
  driver_version: {min: "580.0"}
  persistence_mode: enabled
  max_link_generation: {min: 5}
  p2p_status: ok
"""


@pytest.mark.parametrize(("observed", "ok"), [("580.95.05", True), ("580.0", True), ("580", True),
                                              ("575.57.08", False), ("1000.1", True),
                                              ("580.105.08", True)])
def test_version_compares_part_by_part(observed: str, ok: bool) -> None:
    assert Range("580.0", None, Version()).judge(observed).ok is ok


def test_version_orders_parts_numerically_not_as_text() -> None:
    version = Version()
    assert version.order_key("580.105") > version.order_key("580.95")
    assert version.equal("580.0.0", "580")
    with pytest.raises(ValueError, match="not a version"):
        version.validate("580.x")


def two_gpus(fake: FakeHost) -> FakeHost:
    return fake.gpu(A, numa_node=0).gpu(B, numa_node=1)


def fake_nvml(**overrides: Any) -> FakeNvml:
    values: dict[str, Any] = {"driver": "580.95.05",
                              "devices": {A: FakeGpu(True, 5), B: FakeGpu(True, 5)}}
    values.update(overrides)
    return FakeNvml(**values)


def test_nvml_checks_pass_on_a_good_host(fake: FakeHost) -> None:
    results = run_spec(SPEC, two_gpus(fake).root, nvml=fake_nvml())
    assert {i: r.outcome for i, r in results.items()} == {
        "gpus.nvml_inventory": Outcome.PASSED, "gpus.driver_version": Outcome.PASSED,
        f"gpus.max_link_generation[{A}]": Outcome.PASSED,
        f"gpus.max_link_generation[{B}]": Outcome.PASSED,
        "gpus.p2p_status": Outcome.PASSED,
        f"gpus.persistence_mode[{A}]": Outcome.PASSED,
        f"gpus.persistence_mode[{B}]": Outcome.PASSED}


def test_each_nvml_fact_fails_with_what_nvml_said(fake: FakeHost) -> None:
    nvml = fake_nvml(driver="575.57.08", devices={A: FakeGpu(False, 5), B: FakeGpu(True, 4)},
                     p2p={f"{A}->{B}": "the chipset does not support P2P"})
    results = run_spec(SPEC, two_gpus(fake).root, nvml=nvml)
    assert results["gpus.driver_version"].message == "575.57.08 < min 580.0"
    assert results[f"gpus.persistence_mode[{A}]"].message == \
        "'disabled' != 'enabled' (fixable: run with --fix)"
    assert results[f"gpus.max_link_generation[{B}]"].message == "4 < min 5"
    p2p = results["gpus.p2p_status"]
    assert p2p.outcome is Outcome.FAILED
    assert f"1 of 2 pairs not ok: {A}->{B}: the chipset does not support P2P" in p2p.message
    assert p2p.evidence[0]["source"] == f"NVML nvmlDeviceGetP2PStatus({A}->{B}, READ)"


def test_persistence_mode_is_fixed_through_nvml(fake: FakeHost) -> None:
    nvml = fake_nvml(devices={A: FakeGpu(False, 5), B: FakeGpu(True, 5)})
    result = run_spec(SPEC, two_gpus(fake).root, nvml=nvml, fix=True)[f"gpus.persistence_mode[{A}]"]
    assert (result.outcome, result.before, result.after) == (Outcome.FIXED, "disabled", "enabled")
    assert nvml.set_calls == [(A, True)]
    assert result.action == f"NVML nvmlDeviceSetPersistenceMode({A}, enabled)"


def test_persistence_fix_without_root_says_so(fake: FakeHost) -> None:
    nvml = fake_nvml(devices={A: FakeGpu(False, 5), B: FakeGpu(True, 5)}, setter_needs_root=True)
    result = run_spec(SPEC, two_gpus(fake).root, nvml=nvml, fix=True)[f"gpus.persistence_mode[{A}]"]
    assert result.outcome is Outcome.FIX_FAILED
    assert "needs root" in result.message


def test_nvml_and_sysfs_disagree_names_both_lists(fake: FakeHost) -> None:
    nvml = fake_nvml(devices={A: FakeGpu(True, 5), "0000:c1:00.0": FakeGpu(True, 5)})
    results = run_spec(SPEC, two_gpus(fake).root, nvml=nvml)
    message = results["gpus.nvml_inventory"].message
    assert message == (f"NVML and sysfs disagree (missing from NVML: {B}; not in sysfs: "
                       f"0000:c1:00.0): NVML sees 2 [{A}, 0000:c1:00.0], sysfs lists 2 [{A}, {B}]")
    assert "NVML does not see the GPU" in results[f"gpus.persistence_mode[{B}]"].message


def test_without_nvml_the_checks_skip_with_the_reason(fake: FakeHost) -> None:
    results = run_spec(SPEC, two_gpus(fake).root)  # a fake root with no recorded NVML
    assert {r.outcome for r in results.values()} == {Outcome.SKIPPED}
    assert "NVML unavailable: the host root" in results["gpus.driver_version"].message
    assert "has no recorded var/lib/pytest-gpuhost/nvml" in results["gpus.driver_version"].message


def test_recorded_nvml_in_a_fake_tree_is_read_and_written(fake: FakeHost) -> None:
    two_gpus(fake).nvml(fake_nvml(devices={A: FakeGpu(False, 5), B: FakeGpu(True, 5)},
                                  topologies={f"{A}->{B}": "SYS"}))
    recorded = default_factory(LocalHost(fake.root))()
    assert isinstance(recorded, RecordedNvml)
    assert recorded.gpus() == [A, B] and recorded.topology(B, A) == "SYS"
    results = run_spec(SPEC, fake.root, fix=True)
    assert results[f"gpus.persistence_mode[{A}]"].outcome is Outcome.FIXED
    assert (fake.root / f"var/lib/pytest-gpuhost/nvml/{A}/persistence_mode").read_text() == \
        "Enabled\n"


def test_recorded_nvml_after_a_change_reads_the_one_file_a_fact_needs(fake: FakeHost) -> None:
    """While a session's cache holds the directory's batch, every fact comes from it; once a
    change made the cache forget it, a fact reads its own file (the example host's --fix read
    the whole directory again for each of its NVML checks after each fix)."""
    two_gpus(fake).nvml(fake_nvml(devices={A: FakeGpu(False, 5), B: FakeGpu(True, 5)}))
    asked: list[Request] = []

    class Recording(CountingHost):
        def batch(self, requests: Sequence[Request]) -> list[Reply]:
            asked.extend(requests)
            return super().batch(requests)

    cache = CachedHost(Recording(LocalHost(fake.root)))
    recorded = RecordedNvml(cache)
    cache.prefetch(RecordedNvml.reads)
    asked.clear()
    assert recorded.gpus() == [A, B] and recorded.persistence_mode(B)
    assert asked == []  # from the prefetched batch
    recorded.set_persistence_mode(A, True)  # a change: the cache forgets everything
    asked.clear()
    assert recorded.persistence_mode(A) and recorded.gpus() == [A, B]
    assert asked == [Read(f"{RECORDED_NVML}/gpus"), Read(f"{RECORDED_NVML}/{A}/persistence_mode")]


def test_missing_pynvml_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with pytest.raises(NvmlUnavailable) as error:
        PynvmlNvml.open()
    assert str(error.value) == ("nvidia-ml-py is not installed: install nvidia-ml-py: pip install "
                                "'pytest-gpuhost[nvml]' (from a checkout: pip install '.[nvml]')")


class FakeNVMLError(Exception):
    pass


def p2p_status(a: str, b: str, cap: object) -> int:
    """Like the ctypes binding: a tuple where a c_uint belongs is a ctypes.ArgumentError."""
    if not isinstance(cap, int):
        raise ctypes.ArgumentError("argument 3: TypeError: wrong type")
    return 0 if cap == 0 and a == "h0" else 1


def fake_pynvml(init_fails: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    info = types.SimpleNamespace
    handles = {0: "h0", 1: "h1"}
    bus = {"h0": b"00000000:01:00.0", "h1": "00000000:81:00.0"}

    def init() -> None:
        if init_fails:
            raise FakeNVMLError("Driver Not Loaded")

    module.__dict__.update(
        NVMLError=FakeNVMLError, NVMLError_NoPermission=type("NoPerm", (FakeNVMLError,), {}),
        NVML_FEATURE_ENABLED=1, NVML_FEATURE_DISABLED=0,
        NVML_P2P_CAPS_INDEX_READ=(0,),  # as nvidia-ml-py 13.x spells it: `= 0,`
        nvmlInit=init, nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetPciInfo=lambda h: info(busId=bus[h]),
        nvmlSystemGetDriverVersion=lambda: "580.95.05",
        nvmlDeviceGetPersistenceMode=lambda h: 1 if h == "h0" else 0,
        nvmlDeviceGetMaxPcieLinkGeneration=lambda h: 5,
        nvmlDeviceGetP2PStatus=p2p_status,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: 50)
    return module


def test_the_pynvml_wrapper_normalizes_bus_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    nvml = PynvmlNvml.open()
    assert nvml.gpus() == [A, B]  # 00000000:01:00.0 (bytes or str) -> sysfs form
    assert nvml.driver_version() == "580.95.05"
    assert nvml.persistence_mode(A) and not nvml.persistence_mode(B)
    assert nvml.p2p_read_status(A, B) == "ok"
    assert nvml.p2p_read_status(B, A) == "the chipset does not support P2P"
    assert nvml.topology(A, B) == "SYS"


def test_a_binding_failure_that_is_not_an_nvml_error_names_the_function(
        monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml()

    def broken(handle: str) -> int:
        raise OSError("libnvidia-ml.so.1: undefined symbol")

    module.__dict__["nvmlDeviceGetMaxPcieLinkGeneration"] = broken
    module.__dict__["nvmlDeviceGetPersistenceMode"] = lambda h: int("x")  # a ValueError
    monkeypatch.setitem(sys.modules, "pynvml", module)
    nvml = PynvmlNvml.open()
    with pytest.raises(HostError, match=r"NVML nvmlDeviceGetMaxPcieLinkGeneration failed in "
                                        r"nvidia-ml-py: OSError: libnvidia-ml.so.1"):
        nvml.max_link_generation(A)
    with pytest.raises(HostError, match="nvmlDeviceGetPersistenceMode failed"):
        nvml.persistence_mode(A)


def test_a_binding_failure_fails_the_check_with_the_reason(fake: FakeHost,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml()
    module.__dict__["nvmlDeviceGetP2PStatus"] = lambda a, b, cap: p2p_status(a, b, (cap,))
    monkeypatch.setitem(sys.modules, "pynvml", module)
    result = run_spec(SPEC, two_gpus(fake).root, open_nvml=PynvmlNvml.open)["gpus.p2p_status"]
    assert result.outcome is Outcome.ERROR
    assert "nvmlDeviceGetP2PStatus failed in nvidia-ml-py: ArgumentError" in result.message


def test_driver_not_loaded_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    with pytest.raises(NvmlUnavailable, match=r"Driver Not Loaded.*driver is not loaded"):
        PynvmlNvml.open()


def hanging_pynvml(call: str, release: threading.Event, clock: FakeClock) -> types.ModuleType:
    """The fake binding, with ``call`` blocking until ``release`` is set (a GPU fallen off
    the bus holds NVML's calls in the kernel): the wait for it runs out on ``clock``."""
    module = fake_pynvml()
    function = module.__dict__[call]

    def blocked(*args: Any) -> Any:
        clock.stall()
        release.wait()
        return function(*args)

    module.__dict__[call] = blocked
    return module


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end, so a test's blocked NVML threads end with it."""
    event = threading.Event()
    yield event
    event.set()


def test_an_nvml_call_that_hangs_is_given_up_on_and_later_calls_fail_at_once(
        monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    clock = FakeClock()
    monkeypatch.setitem(sys.modules, "pynvml",
                        hanging_pynvml("nvmlDeviceGetPersistenceMode", release, clock))
    nvml = PynvmlNvml.open(clock=clock)
    opened = clock.now()
    with pytest.raises(NvmlHung) as hung:
        nvml.persistence_mode(A)
    assert clock.now() - opened == NVML_TIMEOUT_S  # it waited the time limit, no more
    assert str(hung.value) == (
        "NVML nvmlDeviceGetPersistenceMode did not return within 60 s: a GPU may have fallen "
        "off the bus or the driver is wedged (look for Xid 79 or \"fallen off the bus\" in the "
        "kernel log, or try nvidia-smi); NVML is given up on for the rest of this run")
    waits = len(clock.waits)
    with pytest.raises(NvmlHung, match="nvmlDeviceGetPersistenceMode did not return"):
        nvml.driver_version()  # would answer, but NVML is given up on: at once
    assert len(clock.waits) == waits and clock.now() - opened == NVML_TIMEOUT_S


def test_an_nvml_call_that_returns_in_time_waits_for_nothing_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    nvml = PynvmlNvml.open(clock=clock)
    assert nvml.driver_version() == "580.95.05"
    assert clock.now() == 1000.0  # no time passed on the clock: every call returned
    assert clock.waits and set(clock.waits) == {NVML_TIMEOUT_S}  # each call was bounded


def test_an_nvml_start_that_hangs_is_tried_once(monkeypatch: pytest.MonkeyPatch,
                                                release: threading.Event) -> None:
    clock = FakeClock()
    module = hanging_pynvml("nvmlInit", release, clock)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    opened: list[int] = []

    def opening() -> PynvmlNvml:
        opened.append(1)
        return PynvmlNvml.open(clock=clock)

    source = NvmlSource(opening)
    with pytest.raises(NvmlHung, match=r"NVML nvmlInit did not return within 60 s"):
        source.get()
    waits = len(clock.waits)
    with pytest.raises(NvmlHung, match=r"NVML nvmlInit did not return within 60 s"):
        source.get()
    assert opened == [1] and len(clock.waits) == waits  # at once: not tried, not waited for
    assert source.reads() == ()  # a prefetch asks too: nothing to read, no error there


def test_a_hung_nvml_makes_its_checks_errors_and_the_run_goes_on(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    clock = FakeClock()
    monkeypatch.setitem(sys.modules, "pynvml",
                        hanging_pynvml("nvmlSystemGetDriverVersion", release, clock))
    results = run_spec(SPEC, two_gpus(fake).root,
                       open_nvml=lambda: PynvmlNvml.open(clock=clock))
    assert clock.now() - 1000.0 == NVML_TIMEOUT_S  # one time limit, not one per check
    outcomes = {key: r.outcome.value for key, r in results.items()}
    assert outcomes.pop("gpus.nvml_inventory") == "passed"  # NVML listed both GPUs at its start
    assert outcomes == dict.fromkeys(outcomes, "error") and len(outcomes) == 6, outcomes
    assert all("nvmlSystemGetDriverVersion did not return within 60 s" in results[key].message
               for key in outcomes)


CONFTEST = f"""
from pytest_gpuhost.hookspecs import hookimpl
from pytest_gpuhost.gpu.nvml import FakeGpu, FakeNvml

@hookimpl
def pytest_gpuhost_nvml(host):
    return lambda: FakeNvml(driver="580.95.05",
                            devices={{"{A}": FakeGpu(False, 5), "{B}": FakeGpu(True, 5)}},
                            setter_needs_root=True)
"""


def test_a_conftest_injects_a_fake_nvml_into_a_whole_run(pytester: pytest.Pytester,
                                                         fake: FakeHost) -> None:
    two_gpus(fake)
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    outcomes = {k: v for k, v in result.parseoutcomes().items() if not k.startswith("warning")}
    assert outcomes == {"passed": 6, "failed": 1}
    result.stdout.fnmatch_lines(["*FIX_FAILED gpus.persistence_mode[[]0000:01:00.0[]]: apply "
                                 "failed: NVML refused (Insufficient Permissions): setting "
                                 "persistence mode needs root"])


def test_without_a_fake_a_run_on_a_fake_root_skips_nvml(pytester: pytest.Pytester,
                                                        fake: FakeHost) -> None:
    two_gpus(fake)
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-rs")
    result.assert_outcomes(skipped=7)
    result.stdout.fnmatch_lines(["*NVML unavailable: the host root * is not this machine*"])


def test_unavailable_nvml_is_said_again_without_keeping_the_first_frames() -> None:
    import traceback

    def absent() -> Any:
        raise NvmlUnavailable("libnvidia-ml.so.1 not found")

    source = NvmlSource(absent)
    depths = []
    for _ in range(3):
        with pytest.raises(NvmlUnavailable, match=r"libnvidia-ml\.so\.1 not found") as caught:
            source.get()
        depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
    assert len(set(depths)) == 1  # a fresh error each time: no traceback growing
