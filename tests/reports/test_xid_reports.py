"""GPU events on the example host, through every report: an application's Xid leaves the gate
open with a warning in each, a hardware Xid closes it naming its action in each (the message,
JSON, Prometheus, JUnit, Allure, the NPD line and the Slurm drain reason), and an Xid before a
driver reload is set aside with a note."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_gpuhost.reports import npd, slurm
from pytest_gpuhost.reports.nodehealth import Health, health_of_report, healthy_line

from ..conftest import BLACKWELL8
from .test_reports import allure_results, attachment, tags_of

pytest_plugins = ["pytester"]

BENCH = "def test_bench_a():\n    pass\n\ndef test_bench_b():\n    pass\n"
APP = "NVRM: Xid (PCI:0000:41:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
FALLEN = "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus."
RELOAD = ("nvidia-uvm: Unloaded the UVM driver.",
          "nvidia-nvlink: Unregistered Nvlink Core, major device number 510",
          "nvidia-nvlink: Nvlink Core is being initialized, major device number 510",
          "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05")


def log(host: Path, *texts: str, prio: int = 3) -> None:
    """Records appended to the host's dev/kmsg, numbered after its last one."""
    kmsg = host / "dev" / "kmsg"
    last = [line for line in kmsg.read_text().splitlines() if line and not line[0].isspace()]
    seq = int(last[-1].split(",")[1]) if last else 0
    with kmsg.open("a") as out:
        for n, text in enumerate(texts, seq + 1):
            out.write(f"{prio},{n},{2_000_000_000 + n},-;{text}\n")


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    """The bundled spec's dmesg section (its Xid rule included) alone."""
    data = yaml.safe_load(BLACKWELL8.read_text())
    path = pytester.path / "gpu-events.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "name": "gpu-events",
                                    "dmesg": data["dmesg"]}))
    return path


class Reports:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        [self.record] = json.loads((directory / "r.json").read_text())["checks"]
        self.prom = (directory / "m.prom").read_text()
        [case] = [c for c in ET.parse(directory / "j.xml").iter("testcase")
                  if c.get("name") == "dmesg"]
        self.junit = case
        self.properties = [(p.get("name"), p.get("value")) for p in case.iter("property")]
        self.allure = allure_results(directory / "allure")["dmesg"]


def whole_run(pytester: pytest.Pytester, spec: Path, host: Path) -> tuple[
        pytest.RunResult, Reports, list[str], tuple[int, str]]:
    """The run with every report, then NPD's line and the Slurm drain reason of the run."""
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest(
        "test_bench.py", f"--gpuhost-spec={spec}", f"--gpuhost-root={host}", "--gpuhost-gate",
        "--gpuhost-report=r.json", "--gpuhost-prom=m.prom", "--junitxml=j.xml",
        "-o", "junit_family=xunit1", "--alluredir=allure", "-p", "no:cacheprovider")
    npd = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpuhost-npd",
                                        f"--gpuhost-spec={spec}", f"--gpuhost-root={host}")
    reason = slurm.verdict(pytester.path / "r.json", int(result.ret))
    return result, Reports(pytester.path), [str(npd.ret), *npd.outlines], reason


def sample(prom: str, name: str) -> list[str]:
    return [line for line in prom.splitlines() if line.startswith(name + "{")]


def test_an_application_xid_leaves_the_gate_open_with_a_warning_everywhere(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    log(example_host, APP, prio=4)
    result, reports, npd, reason = whole_run(pytester, spec, example_host)
    result.assert_outcomes(passed=3)  # the gate open: both benchmarks ran
    warning = ("GPU event(s) that leave the node open: 0000:41:00.0: Xid 13 (Graphics Engine "
               "Exception): restart the application")
    result.stdout.fnmatch_lines(["warnings: 1 *", f"  WARN dmesg: {warning}"])
    record = reports.record
    assert (record["outcome"], record["warnings"]) == ("passed", [warning])
    [event] = record["details"]["xid"]
    assert (event["code"], event["gpu"], event["pid"], event["name"], event["class"],
            event["action"], event["verdict"]) == (
        13, "0000:41:00.0", 4242, "python3", "application", "restart_app", "warn")
    assert sample(reports.prom, "gpuhost_xid_total") == [
        'gpuhost_xid_total{gpu="0000:41:00.0",code="13",class="application",'
        'action="restart_app",event="Xid"} 1']
    assert [line.rsplit(" ", 1)[1] for line in
            sample(reports.prom, "gpuhost_check_warnings")] == ["1"]
    assert ("warning", warning) in reports.properties
    assert ("xid", "0000:41:00.0 Xid 13 (Graphics Engine Exception) x1: application, "
            "restart_app, warn") in reports.properties
    assert reports.junit.find("failure") is None
    allure = reports.allure
    assert allure["status"] == "passed" and "warning" in tags_of(allure)
    assert f"warning: {warning}" in [step["name"] for step in allure["steps"]]
    assert npd == ["0", "gpuhost: 1 check ok, 1 warned: dmesg"]
    assert reason == (0, "gpuhost: 1 check ok, 1 warned: dmesg")


def test_a_hardware_xid_closes_the_gate_naming_its_action_everywhere(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    log(example_host, APP, FALLEN)
    result, reports, npd, reason = whole_run(pytester, spec, example_host)
    result.assert_outcomes(failed=1, errors=2)  # the gate closed: the benchmarks are errors
    said = "0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it repeats"
    result.stdout.fnmatch_lines([f"*{said}*"])
    record = reports.record
    assert record["outcome"] == "failed" and said in record["message"]
    assert record["details"]["xid_worst"]["action"] == "reboot"
    assert ('gpuhost_xid_total{gpu="0000:41:00.0",code="79",class="hardware",action="reboot",'
            'event="Xid"} 1') in sample(reports.prom, "gpuhost_xid_total")
    failure = reports.junit.find("failure")
    assert failure is not None and said in (failure.get("message") or "") + (failure.text or "")
    assert ("xid", "0000:41:00.0 Xid 79 (GPU has fallen off the bus) x1: hardware, reboot, "
            "fail") in reports.properties
    allure: Any = reports.allure
    assert allure["status"] == "failed" and said in allure["statusDetails"]["message"]
    assert "hardware, reboot -> fail" in attachment(pytester.path / "allure", allure,
                                                    "GPU events")
    assert npd == ["1", "gpuhost: 1 failed: reboot (Xid 79 0000:41:00.0): dmesg"]
    assert reason == (1, "gpuhost: reboot (Xid 79 0000:41:00.0): dmesg")


def test_an_xid_before_a_driver_reload_is_set_aside_with_a_note(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    log(example_host, FALLEN)
    log(example_host, *RELOAD, prio=6)
    result, reports, npd, reason = whole_run(pytester, spec, example_host)
    result.assert_outcomes(passed=3)
    record = reports.record
    assert record["details"]["xid_set_aside"] == [
        {"gpu": "0000:41:00.0", "count": 1, "why": "before the driver loaded (seq 14)"}]
    assert "1 GPU event(s) of 0000:41:00.0 set aside: before the driver loaded (seq 14)" in \
        [e["raw"] for e in record["evidence"]]
    assert record["warnings"] == [] and sample(reports.prom, "gpuhost_xid_total") == []
    assert npd == ["0", "gpuhost: 1 check ok"] and reason == (0, "gpuhost: 1 check ok")


def test_the_drain_reason_names_the_most_severe_action_of_every_failing_record() -> None:
    def check(name: str, outcome: str, **details: Any) -> dict[str, Any]:
        return {"id": name, "outcome": outcome, "message": "", "details": details}

    report = {"checks": [
        check("dmesg@a", "failed",
              xid_worst={"rank": 2, "short": "reset_gpu (Xid 48 0000:01:00.0)"}),
        check("dmesg@b", "failed", xid_worst={"rank": 3, "short": "reboot (Xid 79 0000:41:00.0)"}),
        check("sysctl[vm.swappiness]", "passed", xid_worst={"rank": 5, "short": "not failing"}),
        check("gpu_count", "failed")]}
    health = health_of_report(report)
    assert health.action == "reboot (Xid 79 0000:41:00.0)"
    assert slurm.reason(health) == "gpuhost: reboot (Xid 79 0000:41:00.0): dmesg@a (+2 more)"
    assert npd.answer(health).message == \
        "gpuhost: 3 failed: reboot (Xid 79 0000:41:00.0): dmesg@a +2"
    shy = Health(4, (), reverting=("sysctl[vm.swappiness]",), warned=("dmesg", "p2p[x]"))
    assert healthy_line(shy, 100) == ("gpuhost: 4 checks ok, 1 will revert at boot: "
                                      "sysctl[vm.swappiness], 2 warned: dmesg +1")
