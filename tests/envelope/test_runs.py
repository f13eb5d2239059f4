"""Envelopes in whole runs (pytester): a pytest-benchmark run saves each benchmark's envelope;
throttling for 30% of a run makes it invalid naming the GPU and the share while 0.5% stays
valid; a sysctl changed mid-run names the check with both values; a second process on a GPU is
named with its pid; --gpuhost-envelope=strict makes an invalid one an error of its test; the
fixture's verdict lands in the JSON report. The GPUs are a conftest's fake sampler
(``pytest_gpuhost_envelope_sampler``), whose thermal violation time grows at the share of wall
time the test asks for, so the share does not depend on how fast the machine is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_gpuhost.gpu.nvml import FakeGpu
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import NvmlCounters, compiler, nvml_library

pytest_plugins = ["pytester"]

SPEC = """\
version: 1
envelope:
  sample_every: 0
sysctl:
  kernel.numa_balancing: 0
"""
CONFTEST = """\
import os
import time

import pytest

from pytest_gpuhost.envelope.facts import GpuFacts


class Gpus:
    def __init__(self):
        self.throttled = 0.0
        self.processes = {}
        self.since = None

    def describe(self):
        return "the conftest's GPUs"

    def sample(self):
        now = time.monotonic()
        if self.since is None:
            self.since = now
        ns = int(self.throttled * (now - self.since) * 1e9)
        processes = {os.getpid(): "python3", **self.processes}
        return {"0000:41:00.0": GpuFacts(violation_ns={"thermal": ns}, processes=processes),
                "0000:c1:00.0": GpuFacts(violation_ns={"thermal": 0}, processes={})}


GPUS = Gpus()


def pytest_gpuhost_envelope_sampler(host):
    GPUS.since, GPUS.throttled, GPUS.processes = None, 0.0, {}  # each envelope starts quiet
    return GPUS


@pytest.fixture
def gpus():
    return GPUS
"""
BENCH = """\
import os
import time

import pytest

pytestmark = pytest.mark.gpuhost  # after the host checks passed


def spin():
    deadline = time.monotonic() + 0.02
    while time.monotonic() < deadline:
        pass


def test_a_daemon_sets_it_back():  # not a benchmark: after the host checks, before the first
    if os.environ.get("EARLY"):
        with open(os.environ["EARLY"], "w") as f:
            f.write("1\\n")


def test_decode(benchmark, gpus):
    gpus.throttled = float(os.environ.get("THROTTLED", "0"))
    if os.environ.get("STRAY"):
        gpus.processes = {48113: "python3"}
    benchmark.pedantic(spin, rounds=2, iterations=1)
    if os.environ.get("SYSCTL"):
        with open(os.environ["SYSCTL"], "w") as f:
            f.write("1\\n")


def test_prefill(benchmark):
    benchmark.pedantic(spin, rounds=1, iterations=1)
"""


@pytest.fixture
def node(pytester: pytest.Pytester, fake: FakeHost) -> FakeHost:
    fake.sysctl("kernel.numa_balancing", 0)
    pytester.makefile(".yaml", node=SPEC)
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_bench=BENCH)
    return fake


def run(pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch,
        *args: str, **env: str) -> pytest.RunResult:
    for name in ("THROTTLED", "STRAY", "SYSCTL", "EARLY"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return pytester.runpytest_subprocess("test_bench.py", "node.yaml",
                                         f"--gpuhost-root={node.root}", "-p",
                                         "no:cacheprovider", "--benchmark-json=b.json", *args)


def envelopes(pytester: pytest.Pytester) -> dict[str, dict[str, Any]]:
    saved = json.loads((pytester.path / "b.json").read_text())
    return {bench["name"]: bench["extra_info"]["gpuhost_envelope"]
            for bench in saved["benchmarks"]}


def texts(envelope: dict[str, Any]) -> list[str]:
    return [reason["text"] for reason in envelope["reasons"]]


def test_each_saved_benchmark_carries_a_valid_envelope(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, node, monkeypatch, "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    found = envelopes(pytester)
    assert set(found) == {"test_decode", "test_prefill"}
    assert all(envelope["valid"] for envelope in found.values())
    assert found["test_decode"]["sampler"] == "the conftest's GPUs"
    assert found["test_decode"]["before"]["state"] == found["test_decode"]["after"]["state"]
    result.stdout.fnmatch_lines(["gpuhost: 2 benchmarks, every envelope valid"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert [(b["name"], b["envelope"]["valid"]) for b in report["benchmarks"]] == [
        ("test_decode", True), ("test_prefill", True)]


@pytest.mark.parametrize(("throttled", "valid"), [("0.3", False), ("0.005", True)])
def test_throttling_for_a_share_of_the_run_past_the_limit_makes_it_invalid(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch,
        throttled: str, valid: bool) -> None:
    result = run(pytester, node, monkeypatch, THROTTLED=throttled)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()  # a benchmark that ran
    decode = envelopes(pytester)["test_decode"]
    assert decode["valid"] is valid, texts(decode)
    share = decode["during"]["0000:41:00.0"]["thermal violation"]["share"]
    assert share == pytest.approx(float(throttled), rel=0.01)
    if not valid:
        [reason] = decode["reasons"]
        assert (reason["gpu"], reason["what"], reason["limit"]) == (
            "0000:41:00.0", "thermal violation", 0.01)
        assert reason["text"].startswith("0000:41:00.0: thermal violation 30% of ")
        result.stdout.fnmatch_lines(["gpuhost: 1 of 2 benchmarks invalid: test_decode: "
                                     "0000:41:00.0: thermal violation 30% of * (limit 1%)"])


def test_a_sysctl_changed_mid_run_and_a_stray_process_are_named(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    sysctl = node.root / "proc/sys/kernel/numa_balancing"
    result = run(pytester, node, monkeypatch, SYSCTL=str(sysctl), STRAY="1")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    decode = envelopes(pytester)["test_decode"]
    assert texts(decode) == [
        "0000:41:00.0: pid 48113 (python3) on the GPU, not the benchmark's",
        "sysctl[kernel.numa_balancing] changed during the run: 0 -> 1"]
    assert decode["before"]["state"] != decode["after"]["state"]
    # the next benchmark starts from the host as this one left it: nothing changed during it
    assert envelopes(pytester)["test_prefill"]["valid"]


def test_a_setting_put_back_after_the_gate_is_named_by_the_next_benchmark(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """The envelope's start is the value the run's check read (not read again): a daemon that
    puts the setting back between the gate and the benchmark is named."""
    sysctl = node.root / "proc/sys/kernel/numa_balancing"
    result = run(pytester, node, monkeypatch, EARLY=str(sysctl))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    found = envelopes(pytester)
    assert texts(found["test_decode"]) == [
        "sysctl[kernel.numa_balancing] changed during the run: 0 -> 1"]
    assert found["test_prefill"]["valid"], texts(found["test_prefill"])


def test_strict_makes_an_invalid_envelope_an_error_of_its_test(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run(pytester, node, monkeypatch, "--gpuhost-envelope=strict", THROTTLED="0.3")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcomes = result.parseoutcomes()
    assert outcomes["errors"] == 1 and outcomes["passed"] >= 2
    result.stdout.fnmatch_lines(["*ERROR at teardown of test_decode*",
                                 "*--gpuhost-envelope=strict: test_decode: invalid: "
                                 "0000:41:00.0: thermal violation 30% of *"])
    off = run(pytester, node, monkeypatch, "--gpuhost-envelope=off", THROTTLED="0.3")
    assert off.ret == pytest.ExitCode.OK
    assert "gpuhost_envelope" not in json.loads((pytester.path / "b.json").read_text())[
        "benchmarks"][0]["extra_info"]


FIXTURE_TEST = """\
import os


def test_serving(gpuhost_envelope, gpus):
    with gpuhost_envelope(name="serving") as envelope:
        gpus.processes = {48113: "python3"}
    assert not envelope.valid
    assert envelope.reasons == ["0000:41:00.0: pid 48113 (python3) on the GPU, not the "
                                "benchmark's"]
"""


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["alone", "xdist"])
def test_the_fixture_is_a_context_manager_whose_verdict_lands_in_the_json_report(
        pytester: pytest.Pytester, node: FakeHost, xdist: tuple[str, ...]) -> None:
    """Under xdist the verdict crosses to the controller on the test's report."""
    if xdist:
        pytest.importorskip("xdist", reason="needs the [xdist] extra: pip install '.[xdist]'")
    pytester.makepyfile(test_fixture=FIXTURE_TEST)
    result = pytester.runpytest_subprocess("test_fixture.py", "node.yaml",
                                           f"--gpuhost-root={node.root}", "-p",
                                           "no:cacheprovider", "--gpuhost-report=r.json",
                                           *xdist)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    [one] = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    assert (one["test"], one["name"], one["envelope"]["valid"]) == (
        "test_fixture.py::test_serving", "serving", False)
    result.stdout.fnmatch_lines(["gpuhost: 1 of 1 benchmark invalid: serving: 0000:41:00.0: "
                                 "pid 48113 (python3) on the GPU, not the benchmark's"])


def test_without_a_spec_the_fixture_says_what_to_pass(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fixture=FIXTURE_TEST.replace(", gpus", ""))
    result = pytester.runpytest_subprocess("test_fixture.py", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*gpuhost_envelope: no gpuhost run takes envelopes here: "
                                 "pass --gpuhost-spec=FILE*"])


LIBRARY_BENCH = """\
import os
import time

import pytest

from pytest_gpuhost.testing.fakenvml import NvmlCounters

pytestmark = pytest.mark.gpuhost


def test_decode(benchmark):
    counters = NvmlCounters(__import__("pathlib").Path(os.environ["NVML_STATE"]))
    start = counters.get("0000:01:00.0", "reference_time")
    counters.set("0000:01:00.0", "reference_time", start + 10_000_000)  # 10 s, the driver's
    counters.add("0000:01:00.0", "violation.thermal", int(os.environ["THERMAL_NS"]))
    benchmark.pedantic(time.sleep, args=(0.001,), rounds=1, iterations=1)
"""


@pytest.mark.skipif(compiler() is None, reason="no C compiler to build the fake library with")
@pytest.mark.parametrize(("thermal_ns", "valid"), [("3000000000", False), ("50000000", True)])
def test_the_fake_library_throttled_for_30_percent_is_invalid_and_half_a_percent_valid(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch,
        thermal_ns: str, valid: bool) -> None:
    fake.sysctl("kernel.numa_balancing", 0)
    fake.gpu("0000:01:00.0", audio=False)
    fake.kmsg([(6, "Linux version 6.8.0")])
    state = nvml_library(fake, {"0000:01:00.0": FakeGpu(clocks_event_reasons=0)})
    NvmlCounters(state).set("0000:01:00.0", "reference_time", 1_000_000)
    pytester.makefile(".yaml", node=SPEC)
    pytester.makepyfile(test_bench=LIBRARY_BENCH)
    monkeypatch.setenv("NVML_STATE", str(state))
    monkeypatch.setenv("THERMAL_NS", thermal_ns)
    result = pytester.runpytest_subprocess("test_bench.py", "node.yaml",
                                           f"--gpuhost-root={fake.root}", "-p",
                                           "no:cacheprovider", "--benchmark-json=b.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    decode = envelopes(pytester)["test_decode"]
    assert "libnvidia-ml.so.1" in decode["sampler"]
    assert decode["valid"] is valid, texts(decode)
    if not valid:
        assert texts(decode) == ["0000:01:00.0: thermal violation 30% of 10 s (limit 1%)"]
        result.stdout.fnmatch_lines(["gpuhost: 1 of 1 benchmark invalid: test_decode: "
                                     "0000:01:00.0: thermal violation 30% of 10 s (limit 1%)"])


def test_a_compared_result_saved_under_an_invalid_envelope_is_named(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    first = run(pytester, node, monkeypatch, "--benchmark-autosave", THROTTLED="0.3")
    assert first.ret == pytest.ExitCode.OK, first.stdout.str()
    second = run(pytester, node, monkeypatch, "--benchmark-compare=0001")
    assert second.ret == pytest.ExitCode.OK, second.stdout.str()
    second.stdout.fnmatch_lines(["*= gpuhost: host state of the compared benchmark =*",
                                 "test_decode in 0001: taken under an invalid envelope: "
                                 "0000:41:00.0: thermal violation 30% of * (limit 1%)"])


def test_each_envelope_is_an_allure_attachment_of_its_test(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    pytest.importorskip("allure", reason="needs allure-pytest")
    pytester.makepyfile(test_fixture=FIXTURE_TEST)
    result = pytester.runpytest_subprocess("test_fixture.py", "node.yaml",
                                           f"--gpuhost-root={node.root}", "-p",
                                           "no:cacheprovider", "--alluredir=allure")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    [test] = [json.loads(path.read_text()) for path in (pytester.path / "allure").glob(
        "*-result.json") if json.loads(path.read_text())["name"] == "test_serving"]
    [attached] = [a for a in test.get("attachments", [])
                  if a["name"] == "gpuhost envelope: serving"]
    envelope = json.loads((pytester.path / "allure" / attached["source"]).read_text())
    assert envelope["valid"] is False and envelope["reasons"][0]["what"] == "process"


def test_the_summary_says_which_half_an_envelope_lacks(pytester: pytest.Pytester,
                                                       node: FakeHost) -> None:
    """No conftest sampler and no driver in the tree: the host half alone, and said."""
    pytester.makepyfile(test_fixture="def test_serving(gpuhost_envelope):\n"
                                     "    with gpuhost_envelope(name='serving'):\n"
                                     "        pass\n")
    (pytester.path / "conftest.py").unlink()
    result = pytester.runpytest_subprocess("test_fixture.py", "node.yaml",
                                           f"--gpuhost-root={node.root}", "-p",
                                           "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["gpuhost: 1 benchmark, every envelope valid (1 without the "
                                 "GPU half (*))"])


def test_an_envelope_that_cannot_be_opened_is_a_warning_not_a_failed_benchmark(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST.replace(
        "    GPUS.since, GPUS.throttled, GPUS.processes = None, 0.0, {}",
        "    raise RuntimeError('the sampler plugin is broken')"))
    result = run(pytester, node, monkeypatch)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert result.parseoutcomes()["passed"] == 4
    result.stdout.fnmatch_lines(["*PytestWarning: gpuhost: no envelope for test_decode: the "
                                 "sampler plugin is broken*"])
