"""A crashed xdist worker ends the waits on its checks within seconds (issue 9, case 11)."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

CRASHING_KIND = textwrap.dedent("""\
    import os
    from pytest_gpuhost.checks import Check, NoFix, Observation
    from pytest_gpuhost.hookspecs import hookimpl
    from pytest_gpuhost.spec.matchers import Auto, Exact
    from pytest_gpuhost.spec import EntryOptions

    class Crash(NoFix):
        def observe(self, host):
            os._exit(3)  # the worker dies mid-check, as a segfault in a driver call would

    class CrashKind:
        section = "crash"

        def parse(self, node, context):
            return node.where

        def expand(self, section, facts):
            return [Check("crash", None, Exact("1", Auto()), EntryOptions(where=section),
                          Crash())]

    @hookimpl
    def pytest_gpuhost_check_kinds():
        return [CrashKind()]
    """)


def test_a_dead_worker_ends_the_waits_and_its_check_is_an_error(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10).kmsg([(6, "hello")])
    pytester.makeconftest(CRASHING_KIND)
    pytester.makefile(".yaml", spec="version: 1\ncrash: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "dmesg: {}\n")
    pytester.makepyfile(test_bench="def test_benchmark():\n    pass\n")
    start = time.monotonic()
    result = pytester.runpytest_subprocess(
        "spec.yaml", "test_bench.py", f"--gpuhost-root={fake.root}", "-n", "2",
        "--gpuhost-gate", "--gpuhost-report=out.json", "-p", "no:cacheprovider",
        "--max-worker-restart=4", timeout=120)
    elapsed = time.monotonic() - start
    assert elapsed < 60  # not the 900 s wait
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert outcomes["crash"] == "error"
    messages = {check["id"]: check["message"] for check in report["checks"]}
    assert "never reported" in messages["crash"]
    if "went down" in messages["dmesg"]:  # it waited on another worker for the lost check
        assert "did not run: 1 check(s) it must follow never finished" in messages["dmesg"]
    assert outcomes["sysctl[vm.swappiness]"] == "passed"
    assert report["summary"]["error"] >= 1
    output = result.stdout.str()
    assert "crash" in output
    # the gated benchmark did not run on a host whose checks did not all finish
    assert "test_benchmark" in output and "PASSED test_bench" not in output


def test_the_log_of_a_worker_says_what_it_started(tmp_path: Path) -> None:
    from pytest_gpuhost.workers import DoneLog

    gw0, gw1 = DoneLog(tmp_path, "gw0"), DoneLog(tmp_path, "gw1")
    gw0.start(0)
    gw0.mark(0, "open passed a")
    gw0.start(1)
    gw1.start(2)
    (tmp_path / "down-gw0").write_text("worker gw0 crashed: exit 3")
    progress = gw1.read()
    assert progress.done == {0: "open passed a"}
    assert progress.lost([1, 2]) == [1]  # gw1's own check 2 is still running
    assert gw1.wait_for([0, 1], timeout=5) == [1]
