"""Issue 25: a run's reports survive what a run or a host throws at them: a run that crashed is
never reported as clean (item 3), a report writer that fails takes no other report down with it
(item 5)."""

from __future__ import annotations

import json

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

CRASHING = """\
def pytest_runtest_logfinish(nodeid, location):
    if "vm.dirty_ratio" in nodeid:
        raise RuntimeError("a plugin's bug")
"""


def test_a_run_that_crashed_never_reports_as_clean(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    fake.sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5})
    pytester.makepyfile(crashing=CRASHING)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.dirty_ratio: 5\n"
                                    "  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}",
                                           "-p", "crashing", "--gpuhost-report=r.json",
                                           "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.INTERNAL_ERROR
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["complete"] is False
    assert report["stopped"].startswith("an internal error")
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert len(outcomes) == 2 and "error" in outcomes.values()
    assert report["summary"]["error"] >= 1


def test_a_run_to_its_end_is_complete(pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK
    report = json.loads((pytester.path / "r.json").read_text())
    assert (report["complete"], report["stopped"]) == (True, None)
