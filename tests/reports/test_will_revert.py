"""A sysctl that is right now but that the boot configuration sets back (docs/fix-safety.md,
"Will revert"): passed, the exit status 0, and every report says WILL REVERT, naming the file
and line that sets it back (the docs promised it; the run only warned in the
terminal, and --gpuhost-npd said "checks ok")."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest

from pytest_gpuhost.reports import slurm
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import assert_valid_junit

REVERTS = "etc/sysctl.d/99-tune.conf:1 sets '60' on the next boot or `sysctl --system`"


@pytest.fixture
def reverting(pytester: pytest.Pytester, fake: FakeHost) -> list[str]:
    """A host whose swappiness is 10 now and 60 after its next boot; dirty_ratio is right now
    and at boot. The run's arguments."""
    fake.sysctl("vm.swappiness", 10).sysctl("vm.dirty_ratio", 5)
    fake.file("etc/sysctl.d/99-tune.conf", "vm.swappiness = 60\n")
    fake.file("etc/sysctl.d/50-ok.conf", "vm.dirty_ratio = 5\n")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "  vm.dirty_ratio: 5\n")
    return ["--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}", "-p", "no:cacheprovider"]


def test_every_report_says_will_revert_and_the_run_passes(pytester: pytest.Pytester,
                                                          reverting: list[str]) -> None:
    result = pytester.runpytest(*reverting, "--gpuhost-report=r.json", "--junitxml=x1.xml",
                                "-o", "junit_family=xunit1", "--gpuhost-prom=g.prom",
                                "--alluredir=allure")
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["will revert: 1 check right now that the boot configuration "
                                 "sets back (passed: *",
                                 f"  WILL REVERT sysctl[vm.swappiness]: {REVERTS}"])
    assert "WILL REVERT sysctl[vm.dirty_ratio]" not in result.stdout.str()
    assert "warnings:" not in result.stdout.str()  # said once, as what it is

    records = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert records["sysctl[vm.swappiness]"]["outcome"] == "passed"
    assert records["sysctl[vm.swappiness]"]["warnings"] == [f"will revert: {REVERTS}"]
    assert records["sysctl[vm.dirty_ratio]"]["warnings"] == []

    cases = {c.get("name"): c for c in ET.parse(pytester.path / "x1.xml").iter("testcase")}
    warned = [p.get("value") for p in cases["sysctl[vm.swappiness]"].iter("property")
              if p.get("name") == "warning"]
    assert warned == [f"will revert: {REVERTS}"]
    assert not [p for p in cases["sysctl[vm.dirty_ratio]"].iter("property")
                if p.get("name") == "warning"]

    prom = (pytester.path / "g.prom").read_text()
    samples = re.findall(r"^gpuhost_check_will_revert(\{.*\}) (\d+)$", prom, re.M)
    assert samples == [('{spec="spec",spec_file="spec.yaml",kind="sysctl",key="vm.swappiness"}',
                        "1")]
    assert "# TYPE gpuhost_check_will_revert gauge" in prom

    allure = {t["name"]: t for t in (json.loads(p.read_text()) for p in
                                     (pytester.path / "allure").glob("*-result.json"))}
    swappiness, dirty = allure["sysctl[vm.swappiness]"], allure["sysctl[vm.dirty_ratio]"]
    assert {"name": "tag", "value": "will_revert"} in swappiness["labels"]
    assert {"name": "tag", "value": "will_revert"} not in dirty["labels"]
    assert f"will revert: {REVERTS}" in [step["name"] for step in swappiness["steps"]]
    assert swappiness["status"] == "passed"
    config = json.loads((pytester.path / "allure" / "allurerc.json").read_text())
    [category] = [c for c in config["categories"]["rules"] if c["id"] == "gpuhost-will-revert"]
    assert category["matchers"] == {"statuses": ["passed"], "labels": {"tag": "^will_revert$"}}

    assert slurm.verdict(pytester.path / "r.json", 0) == (
        slurm.HEALTHY, "gpuhost: 2 checks ok, 1 will revert at boot: sysctl[vm.swappiness]")


def test_xunit2_junit_carries_the_warning_as_a_fact_line(pytester: pytest.Pytester,
                                                         reverting: list[str]) -> None:
    result = pytester.runpytest(*reverting, "--junitxml=x2.xml",
                                "-o", "junit_logging=system-out")
    assert result.ret == pytest.ExitCode.OK
    assert_valid_junit(pytester.path / "x2.xml")
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "x2.xml").iter("testcase")}
    out = "".join(e.text or "" for e in cases["sysctl[vm.swappiness]"].iter("system-out"))
    assert f"gpuhost.warning: will revert: {REVERTS}\n" in out


def test_npd_keeps_the_node_healthy_and_names_the_check(pytester: pytest.Pytester,
                                                         reverting: list[str]) -> None:
    result = pytester.runpytest_subprocess(*reverting, "--gpuhost-npd")
    assert (result.ret, result.outlines) == (
        0, ["gpuhost: 2 checks ok, 1 will revert at boot: sysctl[vm.swappiness]"])


def test_the_node_health_line_fits_npd_and_names_the_first_of_many() -> None:
    from pytest_gpuhost.reports.nodehealth import Health, healthy_line

    many = Health(250, (), reverting=tuple(f"sysctl[net.ipv4.conf.eth{n}/100.rp_filter]"
                                          for n in range(12)))
    line = healthy_line(many, 80)
    assert len(line) <= 80
    assert line.startswith("gpuhost: 250 checks ok, 12 will revert at boot: sysctl[net.ipv4")
    assert line.endswith(" +11")
    assert healthy_line(Health(1, ()), 80) == "gpuhost: 1 check ok"


def test_a_will_revert_fixed_check_is_fixed_and_still_said(pytester: pytest.Pytester,
                                                           fake: FakeHost) -> None:
    """--fix sets it now; the boot configuration still sets it back: fixed, WILL REVERT."""
    fake.sysctl("vm.swappiness", 60).file("etc/sysctl.d/99-tune.conf", "vm.swappiness = 60\n")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                                "--fix", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"  WILL REVERT sysctl[vm.swappiness]: {REVERTS}"])


def test_reports_of_a_run_without_it_say_nothing_of_it(pytester: pytest.Pytester,
                                                       fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                                "--gpuhost-prom=g.prom", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert "will revert" not in result.stdout.str().lower()
    assert not re.search(r"^gpuhost_check_will_revert\{", (pytester.path / "g.prom").read_text(),
                         re.M)
