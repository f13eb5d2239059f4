"""--benchmark-compare's words of the envelopes: a compared result taken under an invalid
envelope is named, and a benchmark slower than the one it is compared with says what differed
between the two envelopes (pure: pytest-benchmark's session stands in)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pytest_gpuhost.benchmark import envelope_lines
from pytest_gpuhost.envelope.compare import differences

A = "0000:41:00.0"
QUIET: dict[str, Any] = {"valid": True, "reasons": [],
                         "during": {A: {"HW slowdown": {"share": 0.0},
                                        "sm_clock": {"min": 1980, "median": 1980, "max": 1980}}}}
THROTTLED: dict[str, Any] = {
    "valid": False,
    "reasons": [{"gpu": A, "what": "HW slowdown", "observed": 0.34, "limit": 0.01,
                 "text": f"{A}: HW slowdown 34% of 12.1 s (limit 1%)"}],
    "during": {A: {"HW slowdown": {"share": 0.34},
                   "sm_clock": {"min": 1200, "median": 1410, "max": 1980}}}}


def config(compared: dict[str, Any], now: dict[str, Any], *, mean: float, was: float) -> Any:
    saved = {"name": "test_decode", "fullname": "t.py::test_decode",
             "stats": {"mean": was}, "extra_info": {"gpuhost_envelope": compared}}
    current = SimpleNamespace(fullname="t.py::test_decode", stats=SimpleNamespace(mean=mean),
                              extra_info={"gpuhost_envelope": now})
    session = SimpleNamespace(
        compared_mapping={"/x/.benchmarks/Linux/0003_abc_20261204.json":
                          {"t.py::test_decode": saved}},
        benchmarks=[current])
    return SimpleNamespace(_benchmarksession=session)


def test_a_slower_benchmark_says_what_differed_in_its_envelope() -> None:
    lines = envelope_lines(config(QUIET, THROTTLED, mean=1.182, was=1.0))
    assert lines == [f"test_decode: +18.2% slower than in 0003: {A} HW slowdown 34% (0% in "
                     f"0003); {A} median SM clock 1410 MHz (1980 MHz in 0003); now: {A}: HW "
                     "slowdown 34% of 12.1 s (limit 1%)"]
    assert envelope_lines(config(QUIET, THROTTLED, mean=0.9, was=1.0)) == []  # not slower
    assert envelope_lines(config(QUIET, QUIET, mean=1.2, was=1.0)) == [
        "test_decode: +20.0% slower than in 0003: nothing of the envelopes differs"]


def test_a_compared_result_taken_under_an_invalid_envelope_is_named() -> None:
    lines = envelope_lines(config(THROTTLED, QUIET, mean=0.9, was=1.0))
    assert lines == [f"test_decode in 0003: taken under an invalid envelope: {A}: HW slowdown "
                     "34% of 12.1 s (limit 1%)"]


def test_a_share_that_moved_less_than_a_percent_is_the_same() -> None:
    close = {**QUIET, "during": {A: {"HW slowdown": {"share": 0.005},
                                     "sm_clock": {"median": 1950}}}}
    assert differences(close, QUIET, "0003") == []
