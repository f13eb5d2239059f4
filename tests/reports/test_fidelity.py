"""Every reporter of one run tells the same checks with the same outcomes: the JSON report, the
terminal summary (gpuhost's table and pytest's own line), JUnit's testcases and properties, the
Prometheus textfile, Allure's results, the NFD feature file, NPD's line, the Slurm reason, the
fleet page, all enabled together, in each shape a run can take (serial, xdist, a crashed
worker, -x, an interrupt, --fix with a fix that fails, odd characters, two targets)."""

from __future__ import annotations

import ast
import json
import os
import re
import textwrap
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.reports import slurm
from pytest_gpuhost.result import OUTCOMES
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH, assert_valid_junit, crash_worker_at
from ..e2e.test_ssh import ssh_args
from .test_reports import parse_exposition

pytest_plugins = ["pytester"]

GOOD = {"passed", "fixed", "skipped"}
ODD_KEY = 'q"b\\s]{c}--x\u00e9'
"""A key with what each format must quote: a quote, a backslash, ``]``, braces, an XML
comment's ``--`` and non-ASCII."""
ODD_VALUE = 'line one\nline "two" \\ --> \u00fc'
"""An observed value (and so a failure message) of two lines, with quotes and ``-->``."""

ODD_KIND = textwrap.dedent("""\
    import os
    from pathlib import Path
    import pytest
    from pytest_gpuhost.checks import Check, NoFix, Observation
    from pytest_gpuhost.hookspecs import hookimpl
    from pytest_gpuhost.host import LocalHost
    from pytest_gpuhost.specmodel.matchers import Auto, Exact
    from pytest_gpuhost.specmodel import EntryOptions

    class Value(NoFix):
        def __init__(self, value):
            self.value = value

        def observe(self, host):
            return Observation(self.value)

    class OddKind:
        section = "odd"

        def parse(self, node, context):
            return node.where

        def expand(self, section, facts):
            return [Check("odd", {key!r}, Exact("1", Auto()), EntryOptions(where=section),
                          Value("1")),
                    Check("odd", "bad", Exact("1", Auto()), EntryOptions(where=section),
                          Value({value!r}))]

    @hookimpl
    def pytest_gpuhost_check_kinds():
        return [OddKind()]

    @hookimpl(tryfirst=True)
    def pytest_gpuhost_make_host(url, settings):
        # ssh://fake/NAME: the fake tree NAME next to this file, as if reached over ssh
        if url.startswith("ssh://fake/"):
            return LocalHost(Path(__file__).parent / url.split("/")[3].split("?")[0])
        return None

    def pytest_runtest_call(item):
        if os.environ.get("INTERRUPT") and os.environ["INTERRUPT"] == item.name:
            raise KeyboardInterrupt

    def pytest_runtest_setup(item):
        if os.environ.get("SETUP_FAIL") and os.environ["SETUP_FAIL"] == item.name:
            raise RuntimeError("setup broke")

    @pytest.hookimpl(trylast=True)  # after pytest's own teardown, which must still run
    def pytest_runtest_teardown(item):
        if os.environ.get("TEARDOWN_FAIL") and os.environ["TEARDOWN_FAIL"] == item.name:
            raise RuntimeError("teardown broke")
    """).format(key=ODD_KEY, value=ODD_VALUE)

SPEC = ("version: 1\nsysctl:\n  vm.dirty_ratio: 20\n  vm.swappiness: 10\n"
        "modules:\n  nvidia: loaded\nodd: {}\ndmesg: {}\n")
ALL_REPORTS = ("--gpuhost-report=out.json", "--junitxml=junit.xml", "-o",
               "junit_logging=system-out", "--gpuhost-prom=out.prom",
               "--alluredir=allure", "--gpuhost-nfd=out.nfd", "--gpuhost-fleet-html=fleet.html",
               "--gpuhost-npd", "-p", "no:cacheprovider", "-rA")
ALLURE_STATUS = {"passed": "passed", "fixed": "passed", "failed": "failed",
                 "fix_failed": "failed", "reboot_required": "failed", "would_fix": "failed",
                 "error": "broken", "skipped": "skipped"}


def host(root: Path, swappiness: int = 10) -> FakeHost:
    fake = FakeHost(root).sysctl("vm.dirty_ratio", 20).sysctl("vm.swappiness", swappiness)
    return fake.module("nvidia").kmsg([(6, "hello")])


@dataclass
class Run:
    result: pytest.RunResult
    report: dict[str, Any]
    records: dict[tuple[str, str], dict[str, Any]]
    """(target or '', id) -> the JSON report's record."""
    node_health: bool = True
    """Whether NFD and NPD were asked for (a target on this node: ``on_this_node``)."""


NODE_HEALTH = ("--gpuhost-nfd=out.nfd", "--gpuhost-npd")
"""They speak for the node the run runs on: refused in a run of remote targets alone."""


def on_this_node(args: Sequence[str]) -> bool:
    """Whether a run of ``args`` checks this machine (no --gpuhost-target, or ``local``)."""
    targets = [a.split("=", 1)[1] for a in args if a.startswith("--gpuhost-target=")]
    return not targets or "local" in targets


def reports_for(args: Sequence[str]) -> list[str]:
    return [a for a in ALL_REPORTS if on_this_node(args) or a not in NODE_HEALTH]


def run_all(pytester: pytest.Pytester, *args: str, env: dict[str, str] | None = None,
            spec: str = SPEC) -> Run:
    pytester.makeconftest(ODD_KIND)
    pytester.makefile(".yaml", spec=spec)
    for name, value in (env or {}).items():
        os.environ[name] = value
    try:
        result = pytester.runpytest_subprocess("spec.yaml", *reports_for(args), *args,
                                               timeout=180)
    finally:
        for name in env or {}:
            del os.environ[name]
    report = json.loads((pytester.path / "out.json").read_text(encoding="utf-8"))
    records: dict[tuple[str, str], dict[str, Any]] = {}
    for record in report["checks"]:
        key = (record["target"] or "", record["id"])
        assert key not in records, f"{key} twice in the JSON report"
        records[key] = record
    return Run(result, report, records, on_this_node(args))


def outcomes(run: Run) -> dict[tuple[str, str], str]:
    return {key: record["outcome"] for key, record in run.records.items()}


def junit_facts(case: ET.Element) -> dict[str, str]:
    """A test case's gpuhost facts: its <property>s (xunit1), else the ``gpuhost.NAME: VALUE``
    lines of its <system-out> (xunit2 with junit_logging=system-out)."""
    props = {str(p.get("name")): str(p.get("value")) for p in case.iter("property")}
    if props:
        return props
    out = "".join(element.text or "" for element in case.iter("system-out"))
    return {name.removeprefix("gpuhost."): value for name, _, value in
            (line.partition(": ") for line in out.splitlines()) if name.startswith("gpuhost.")}


def junit_cases(pytester: pytest.Pytester, *, interrupted: bool = False
                ) -> dict[tuple[str, str], ET.Element]:
    assert_valid_junit(pytester.path / "junit.xml", interrupted=interrupted)
    cases: dict[tuple[str, str], ET.Element] = {}
    for case in ET.parse(pytester.path / "junit.xml").iter("testcase"):
        name = case.get("name", "")
        if not name:  # pytest's own for the test a KeyboardInterrupt cut short: no report
            continue
        props = junit_facts(case)
        target = props.get("target") or ""
        check = name
        if target:  # named as its test id: "sysctl[x]@a"
            assert name.endswith(f"@{target}"), name
            check = name.removesuffix(f"@{target}")
        key = (target, check)
        assert key not in cases, f"{key} twice in JUnit"
        cases[key] = case
    return cases


def terminal_counts(text: str) -> dict[str, int]:
    """gpuhost's summary table: its header and its ``total`` row, as counts per outcome."""
    lines = text.splitlines()
    [header] = [line for line in lines if line.startswith("kind ") and " checks " in line]
    total = next(line for line in lines if line.startswith("total "))  # then a target matrix
    columns = header.split()[2:]
    cells = total.split()[2:]
    return {column: int(cell) if cell != "-" else 0 for column, cell in
            zip(columns, cells, strict=True)}


def pytest_line_counts(text: str) -> dict[str, int]:
    """pytest's own last line (``1 failed, 5 passed, 1 fixed in 0.5s``)."""
    [line] = [line for line in text.splitlines()[-3:] if re.search(r" in [\d.]+s", line)]
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", line)}


def assert_consistent(pytester: pytest.Pytester, run: Run, *, complete: bool = True,
                      cut_short: tuple[str, str] | None = None) -> None:
    """Every reporter agrees with the JSON report: the same checks, the same outcomes.
    ``complete``: every check reported to pytest (so JUnit and pytest's line hold them all).
    ``cut_short``: the check a KeyboardInterrupt stopped, which allure-pytest writes with the
    status of its set-up (passed): its own, left as it is."""
    expected = outcomes(run)
    summary = run.report["summary"]
    assert summary == {o: sum(v == o for v in expected.values()) for o in OUTCOMES}
    _terminal_agrees(run, expected, complete)
    _junit_agrees(pytester, expected, complete, cut_short)
    _prometheus_agrees(pytester, expected, summary)
    _allure_agrees(pytester, expected, complete, cut_short)
    _node_health_agrees(pytester, run, expected)
    _fleet_page_agrees(pytester, expected)


Outcomes = dict[tuple[str, str], str]


def _terminal_agrees(run: Run, expected: Outcomes, complete: bool) -> None:
    """The terminal summary's table, and pytest's own line where every check reported."""
    summary = run.report["summary"]
    # NPD sends pytest's terminal to stderr
    terminal = (run.result.stderr if run.node_health else run.result.stdout).str()
    table = terminal_counts(terminal)
    assert table == {outcome: summary[outcome] for outcome in table}
    assert all(summary[outcome] == 0 for outcome in summary if outcome not in table)
    if complete:
        line = pytest_line_counts(terminal)
        pytest_names = {"passed": "passed", "failed": "failed", "fixed": "fixed",
                        "fix_failed": "failed", "skipped": "skipped", "error": "errors",
                        "reboot_required": "reboot_required", "would_fix": "would_fix"}
        wanted: Counter[str] = Counter()
        for outcome in expected.values():
            wanted[pytest_names[outcome]] += 1
        assert line == {k: v for k, v in wanted.items() if v}, line


def _junit_agrees(pytester: pytest.Pytester, expected: Outcomes, complete: bool,
                  cut_short: tuple[str, str] | None) -> None:
    """JUnit (valid xunit2): one testcase per record with its outcome in its <system-out> (an
    error is a <failure>)."""
    cases = junit_cases(pytester, interrupted=cut_short is not None)
    if complete:
        assert set(cases) == set(expected)
    else:
        assert set(cases) <= set(expected)
    for key, case in cases.items():
        props = junit_facts(case)
        failure = case.find("error")
        if not props and failure is not None and "crashed while running" in str(
                failure.get("message")):  # xdist's report of the crash: no teardown, no record
            assert expected[key] == "error"
            continue
        assert props.get("outcome") == expected[key], (key, props)
        bad = case.find("failure") is not None or case.find("error") is not None
        assert bad == (expected[key] not in GOOD), key


def _prometheus_agrees(pytester: pytest.Pytester, expected: Outcomes,
                       summary: dict[str, int]) -> None:
    """Prometheus: one outcome per check."""
    metrics = parse_exposition((pytester.path / "out.prom").read_text(encoding="utf-8"))
    prom: dict[tuple[str, str], str] = {}
    for labels, value in metrics["gpuhost_check_outcome"]:
        if value == 1:
            check = labels["kind"] if not labels["key"] else f"{labels['kind']}[{labels['key']}]"
            key = (labels.get("target", ""), check)
            assert key not in prom, f"{key} twice in Prometheus"
            prom[key] = labels["outcome"]
    assert prom == expected
    counts = Counter[str]()
    for labels, value in metrics["gpuhost_checks"]:
        counts[labels["outcome"]] += int(value)
    assert {o: counts[o] for o in OUTCOMES} == summary


def _allure_agrees(pytester: pytest.Pytester, expected: Outcomes, complete: bool,
                   cut_short: tuple[str, str] | None) -> None:
    """Allure: one result per check that reported, its status and its record's outcome."""
    allure_dir = pytester.path / "allure"
    found: dict[tuple[str, str], str] = {}
    for path in allure_dir.glob("*-result.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        labels = {p["name"]: p["value"] for p in data.get("parameters", [])}
        target = ast.literal_eval(labels["target"]) if "target" in labels else ""  # repr()
        name = data["name"]
        check = name.rpartition("@")[0] if target else name
        assert (target, check) not in found, f"{(target, check)} twice in Allure"
        found[(target, check)] = data["status"]
    if complete:
        assert set(found) == set(expected)
    for key, status in found.items():
        if key == cut_short:
            continue
        assert status == ALLURE_STATUS[expected[key]], (key, status, expected[key])
    assert (allure_dir / "environment.properties").is_file()


def _node_health_agrees(pytester: pytest.Pytester, run: Run, expected: Outcomes) -> None:
    """NFD and NPD: the number of checks not ok; Slurm's reason, from the JSON report. In a
    run of remote targets alone, none of them is this node: Slurm's helper says so."""
    failing = [key for key, outcome in expected.items() if outcome not in GOOD]
    if not run.node_health:
        assert all(target for target, _ in expected)
        assert not (pytester.path / "out.nfd").exists()
        assert slurm.verdict(pytester.path / "out.json", 1)[1].startswith(
            "gpuhost: checks could not run: no target of the report is this node")
        return
    nfd = (pytester.path / "out.nfd").read_text()
    assert f"gpuhost.failed={len(failing)}\n" in nfd
    assert f"gpuhost.tuned={'false' if failing else 'true'}\n" in nfd
    npd = run.result.outlines
    assert len(npd) == 1, npd
    if failing:
        assert run.result.ret == 1 and " failed: " in npd[0]
        ran = [k for k in failing if not run.records[k]["message"].startswith("not run: ")]
        assert npd[0].startswith(f"gpuhost: {len(ran)} failed: ")
    drained, reason = slurm.verdict(pytester.path / "out.json", 1 if failing else 0)
    assert drained == (slurm.FAILED if failing else slurm.HEALTHY)
    if len(failing) > 1:
        assert reason.endswith(f"(+{len(failing) - 1} more)")


def _fleet_page_agrees(pytester: pytest.Pytester, expected: Outcomes) -> None:
    """The fleet page: every record of every target, with its outcome."""
    page = (pytester.path / "fleet.html").read_text(encoding="utf-8")
    blob = re.search(r'<script type="application/json" id="fleet-data">(.*?)</script>', page,
                     re.S)
    assert blob is not None
    data = json.loads(blob.group(1).replace("<\\/", "</"))
    strings, checks = data["strings"], data["checks"]
    shown: dict[tuple[str, str], str] = {}
    for name, _, _, results in data["targets"]:
        for i in range(0, len(results), 7):  # check, outcome, ..., a P2P record's top cause
            check = strings[checks[results[i]][1]]
            key = (name if len(data["targets"]) > 1 else "", check)
            assert key not in shown, f"{key} twice on the fleet page"
            shown[key] = data["outcomes"][results[i + 1]]
    assert shown == expected


def test_serial(pytester: pytest.Pytester) -> None:
    host(pytester.path / "root", swappiness=60)
    run = run_all(pytester, "--gpuhost-root=root")
    assert outcomes(run)[("", "sysctl[vm.swappiness]")] == "failed"
    assert outcomes(run)[("", f"odd[{ODD_KEY}]")] == "passed"
    assert outcomes(run)[("", "odd[bad]")] == "failed"
    assert ODD_VALUE in run.records[("", "odd[bad]")]["observed"]
    assert_consistent(pytester, run)


def test_xdist(pytester: pytest.Pytester) -> None:
    host(pytester.path / "root", swappiness=60)
    run = run_all(pytester, "--gpuhost-root=root", "-n", "2")
    assert outcomes(run)[("", "odd[bad]")] == "failed"
    assert_consistent(pytester, run)


def test_fix_with_a_fix_that_fails(pytester: pytest.Pytester) -> None:
    fake = host(pytester.path / "root", swappiness=60)
    fake.file("usr/sbin/modprobe", "#!/bin/sh\necho refused >&2\nexit 1\n", mode=0o755)
    run = run_all(pytester, "--gpuhost-root=root", "--fix", "-n", "2",
                  spec=SPEC.replace("nvidia: loaded", "nvidia: loaded\n  nvidia_peermem: loaded"))
    assert outcomes(run)[("", "sysctl[vm.swappiness]")] == "fixed"
    assert outcomes(run)[("", "module[nvidia_peermem]")] == "fix_failed"
    assert_consistent(pytester, run)


@pytest.mark.parametrize("stop", ["-x", "--maxfail=2"])
def test_a_run_stopped_early(pytester: pytest.Pytester, stop: str) -> None:
    host(pytester.path / "root", swappiness=60)
    pytester.path.joinpath("root/proc/sys/vm/dirty_ratio").write_text("5\n")
    run = run_all(pytester, "--gpuhost-root=root", stop)
    found = outcomes(run)
    assert found[("", "sysctl[vm.dirty_ratio]")] == "failed"
    assert found[("", "dmesg")] == "error"
    assert run.records[("", "dmesg")]["message"].startswith("not run: ")
    assert_consistent(pytester, run, complete=False)


def test_a_keyboard_interrupt_in_a_check(pytester: pytest.Pytester) -> None:
    host(pytester.path / "root", swappiness=60)
    run = run_all(pytester, "--gpuhost-root=root", env={"INTERRUPT": "module[nvidia]"})
    found = outcomes(run)
    assert run.records[("", "dmesg")]["message"] == "not run: the run was interrupted before it"
    assert found[("", "sysctl[vm.swappiness]")] == "failed"
    assert found[("", "dmesg")] == "error"
    assert_consistent(pytester, run, complete=False, cut_short=("", "module[nvidia]"))


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_another_plugins_error_at_setup_and_teardown(pytester: pytest.Pytester,
                                                     xdist: tuple[str, ...]) -> None:
    host(pytester.path / "root")
    run = run_all(pytester, "--gpuhost-root=root", *xdist,
                  env={"SETUP_FAIL": "sysctl[vm.swappiness]", "TEARDOWN_FAIL": "module[nvidia]"})
    found = outcomes(run)
    assert found[("", "sysctl[vm.swappiness]")] == "error"
    assert found[("", "module[nvidia]")] == "error"
    assert_consistent(pytester, run, complete=False)


def test_a_worker_crash(pytester: pytest.Pytester) -> None:
    host(pytester.path / "root", swappiness=60)
    crasher = crash_worker_at(pytester, "spec.yaml::module[nvidia]")
    run = run_all(pytester, "--gpuhost-root=root", "-n", "2", *crasher)
    found = outcomes(run)
    assert found[("", "module[nvidia]")] == "error"
    assert_consistent(pytester, run, complete=False)


def test_two_targets_with_the_same_checks(pytester: pytest.Pytester) -> None:
    host(pytester.path / "a", swappiness=60)
    host(pytester.path / "b")
    run = run_all(pytester, "--gpuhost-target=ssh://fake/a?name=a",
                  "--gpuhost-target=ssh://fake/b?name=b")
    found = outcomes(run)
    assert found[("a", "sysctl[vm.swappiness]")] == "failed"
    assert found[("b", "sysctl[vm.swappiness]")] == "passed"
    assert len(found) == 12
    assert_consistent(pytester, run)


@NEEDS_OPENSSH
def test_a_remote_target_lost_mid_run(pytester: pytest.Pytester, sshd: SshServer) -> None:
    """Over a real sshd on 127.0.0.1: the agent is killed while it runs a fix (its host went
    away), and a second target goes on; every reporter tells both targets' checks."""
    lost = FakeHost(pytester.path / "lost").sysctl("vm.dirty_ratio", 20)
    lost.sysctl("vm.swappiness", 60).kmsg([(6, "hello")])  # nvidia is not loaded: a fix runs
    lost.file("usr/sbin/modprobe", "#!/bin/sh\nkill -9 $PPID\n", mode=0o755)
    host(pytester.path / "fine")
    run = run_all(pytester, *ssh_args(sshd, pytester.path / "lost", pytester.path / "fine",
                                      names=("lost", "fine")), "--fix")
    found = outcomes(run)
    assert found[("lost", "sysctl[vm.swappiness]")] == "fixed"
    assert found[("lost", "module[nvidia]")] in ("fix_failed", "error")
    assert found[("fine", "module[nvidia]")] == "passed"
    assert_consistent(pytester, run)


OUTPUTS = {"--gpuhost-report": "out.json", "--gpuhost-prom": "out.prom",
           "--gpuhost-nfd": "out.nfd", "--gpuhost-fleet-html": "fleet.html",
           "--alluredir": "allure/environment.properties", "--junitxml": "junit.xml"}


@pytest.mark.parametrize("option", [option for option in OUTPUTS if option != "--junitxml"])
def test_a_report_that_cannot_be_written_leaves_the_others_written(
        pytester: pytest.Pytester, option: str) -> None:
    """One report's path cannot be written when the run ends (a FIFO without a reader, which
    even root cannot write; not JUnit's, which pytest writes and would wait on): every other
    report is still written, and the run fails saying
    which one was not."""
    host(pytester.path / "root")
    pytester.makeconftest(ODD_KIND)
    pytester.makefile(".yaml", spec=SPEC.replace("odd: {}\n", ""))
    broken = pytester.path / OUTPUTS[option]
    broken.parent.mkdir(exist_ok=True)
    os.mkfifo(broken)
    result = pytester.runpytest_subprocess(
        "spec.yaml", "--gpuhost-root=root", *[a for a in ALL_REPORTS if a != "--gpuhost-npd"],
        timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines([f"*{broken.name}*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    for other, path in OUTPUTS.items():
        if other != option:
            assert (pytester.path / path).is_file(), f"{other} was not written"
    assert_valid_junit(pytester.path / "junit.xml")
