"""Every report names a check of a named target as its test id says,
``sysctl[vm.swappiness]@local``: pytest 9.2 reads a node id's parameters from its first ``[``
to its end, so it named these ``sysctl[vm.swappiness]@local]`` in JUnit, and in the short
summary of a run under xdist."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

from ..conftest import assert_valid_junit

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n  net.ipv4.tcp_rmem: \"4096 87380 6291456\"\n"
IDS = {"sysctl[vm.swappiness]@local", "sysctl[net.ipv4.tcp_rmem]@lxc-101"}


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["one process", "-n 2"])
@pytest.mark.parametrize("family", ["xunit1", "xunit2"])
def test_junit_and_the_short_summary_name_each_check_as_its_id(
        pytester: pytest.Pytester, tmp_path: Path, xdist: tuple[str, ...], family: str) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60,
                                               "net.ipv4.tcp_rmem": "4096 131072 6291456"})
    lxc_container(host, "101")
    pytester.makefile(".yaml", spec=SPEC)
    pytester.makeini(f"[pytest]\njunit_family = {family}\n")
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--junitxml=junit.xml", "-rA",
                                "-p", "no:cacheprovider", *xdist)
    summary = result.stdout.str().partition("short test summary info")[2]
    for check in IDS:
        assert f"FAILED spec.yaml::{check} - " in summary, summary
    assert "]@local]" not in result.stdout.str() and "]@lxc-101]" not in result.stdout.str()
    cases = list(ET.parse(pytester.path / "junit.xml").iter("testcase"))
    assert {case.get("name") for case in cases} == IDS
    assert {case.get("classname") for case in cases} == {"spec.yaml"}
    if family == "xunit2":
        assert_valid_junit(pytester.path / "junit.xml")


def test_a_check_that_never_reported_is_named_as_its_id_in_junit(
        pytester: pytest.Pytester) -> None:
    """The test case JUnit gets for a check no report told of (its xdist worker died first)."""
    from _pytest.junitxml import LogXML, xml_key

    from pytest_gpuhost.plugin.controller import junit_test_cases
    from pytest_gpuhost.result import CheckResult, Outcome

    config = pytester.parseconfig()
    xml = LogXML(str(pytester.path / "junit.xml"), None, family="xunit2")
    config.stash[xml_key] = xml
    xml.pytest_sessionstart()
    record = CheckResult("sysctl[vm.swappiness]", "sysctl", "vm.swappiness", "10", None,
                         Outcome.ERROR, "not run: its xdist worker died", target="pve")
    junit_test_cases(config, {"spec.yaml::sysctl[vm.swappiness]@pve": record})
    xml.pytest_sessionfinish()
    assert_valid_junit(pytester.path / "junit.xml")
    [case] = ET.parse(pytester.path / "junit.xml").iter("testcase")
    assert case.get("name") == "sysctl[vm.swappiness]@pve"
    assert "its xdist worker died" in (case.findtext("error") or "")
