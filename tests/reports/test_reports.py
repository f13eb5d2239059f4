"""Reports from one run: JUnit properties, the Prometheus textfile and the Allure results."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.reports import RunInfo
from pytest_gpuhost.reports.prometheus import PrometheusTextfile, escape_label, textfile
from pytest_gpuhost.result import OUTCOMES, CheckResult, Outcome
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, EXAMPLE_HOST, assert_valid_junit

pytest_plugins = ["pytester"]


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


def test_junit_properties_per_check_under_xunit1(pytester: pytest.Pytester, spec: Path,
                                                example_host: Path) -> None:
    """junit_family=xunit1 (or legacy): each check's facts as <property>s of its test case,
    the persistence files' too (they once had none)."""
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--fix-persist", "--junitxml=junit.xml",
                                "-o", "junit_family=xunit1")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cases = {case.get("name", ""): case for case in ET.parse(pytester.path / "junit.xml").iter(
        "testcase")}
    assert len(cases) == 246 + 6

    def props(name: str) -> dict[str, str]:
        return {p.get("name", ""): p.get("value", "") for p in cases[name].iter("property")}

    assert props("sysctl[vm.swappiness]") == {
        "kind": "sysctl", "key": "vm.swappiness", "expected": "10", "observed": "10",
        "outcome": "fixed", "before": "60", "after": "10", "severity": "normal"}
    peermem = props("module[nvidia_peermem]")
    assert (peermem["outcome"], peermem["observed"]) == ("fix_failed", "absent")
    assert props("gpu_count") == {"kind": "gpu_count", "expected": "8", "observed": "8",
                                  "outcome": "passed", "severity": "normal"}
    assert cases["module[nvidia_peermem]"].find("failure") is not None
    assert props("persist[etc/sysctl.d/90-gpuhost-blackwell8.conf]") == {
        "kind": "persist", "key": "etc/sysctl.d/90-gpuhost-blackwell8.conf",
        "expected": "current", "observed": "current", "outcome": "fixed", "before": "absent",
        "after": "current", "severity": "normal"}
    assert all(props(name)["kind"] == "persist" for name in cases
               if str(name).startswith("persist["))


def test_junit_is_valid_xunit2_by_default(pytester: pytest.Pytester, spec: Path,
                                          example_host: Path) -> None:
    """pytest's default junit_family is xunit2, whose schema (Jenkins' xUnit
    plugin's junit-10.xsd) has no <properties> in a test case; the plugin skipped the file.
    Now no test case carries them, the file validates, and with junit_logging=system-out the
    facts are in each test case's <system-out>."""
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
                       "--fix-persist", "--junitxml=plain.xml")
    assert_valid_junit(pytester.path / "plain.xml")
    plain = ET.parse(pytester.path / "plain.xml")
    assert len(list(plain.iter("testcase"))) == 246 + 6
    assert not [case for case in plain.iter("testcase") if case.find("properties") is not None]
    shutil.rmtree(example_host)
    shutil.copytree(EXAMPLE_HOST, example_host,
                    symlinks=True)
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
                       "--junitxml=out.xml", "-o", "junit_logging=system-out")
    assert_valid_junit(pytester.path / "out.xml")
    cases = {case.get("name"): case for case in ET.parse(pytester.path / "out.xml").iter(
        "testcase")}
    [out] = cases["sysctl[vm.swappiness]"].iter("system-out")
    assert [line for line in str(out.text).splitlines() if line.startswith("gpuhost.")] == [
        "gpuhost.kind: sysctl", "gpuhost.key: vm.swappiness", "gpuhost.expected: 10",
        "gpuhost.observed: 10", "gpuhost.outcome: fixed", "gpuhost.before: 60",
        "gpuhost.after: 10", "gpuhost.severity: normal"]


def test_a_keyboard_interrupt_in_a_test_makes_pytests_own_nameless_testcase(
        pytester: pytest.Pytester) -> None:
    """Why ``assert_valid_junit(..., interrupted=True)`` leaves out one element: pytest itself,
    without this plugin, writes the test a KeyboardInterrupt cut short as a test case with no
    name, which junit-10.xsd refuses."""
    pytester.makepyfile(test_k="def test_a():\n    pass\n\n"
                               "def test_b():\n    raise KeyboardInterrupt\n")
    pytester.runpytest_subprocess("-p", "no:gpuhost", "--junitxml=k.xml")
    cases = [case.attrib for case in ET.parse(pytester.path / "k.xml").iter("testcase")]
    assert cases[-1].keys() == {"time"}
    with pytest.raises(AssertionError, match="missing required attribute 'name'"):
        assert_valid_junit(pytester.path / "k.xml")
    assert_valid_junit(pytester.path / "k.xml", interrupted=True)


def test_junit_facts_under_xdist(pytester: pytest.Pytester, spec: Path,
                                 example_host: Path) -> None:
    pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                  "-n", "2", "--junitxml=junit.xml", "-p", "no:cacheprovider",
                                  "-o", "junit_logging=system-out")
    assert_valid_junit(pytester.path / "junit.xml")
    outcomes = [line.split(": ", 1)[1] for out in
                ET.parse(pytester.path / "junit.xml").iter("system-out")
                for line in str(out.text).splitlines() if line.startswith("gpuhost.outcome: ")]
    assert sorted(outcomes) == sorted(["passed"] * 129 + ["failed"] * 115 + ["skipped"] * 2)


SAMPLE = re.compile(r'(?P<name>[a-z_]+)\{(?P<labels>(?:[a-z_]+="(?:[^"\\]|\\.)*",?)*)\} '
                    r'(?P<value>-?[0-9.e+]+)\Z')
LABEL = re.compile(r'([a-z_]+)="((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """A strict reader of the text format as node_exporter needs it: HELP and TYPE before each
    metric's samples, every sample line well formed, no timestamps."""
    metrics: dict[str, list[tuple[dict[str, str], float]]] = {}
    typed: set[str] = set()
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in metrics, f"HELP for {name} after its samples"
            metrics[name] = []
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind == "gauge" and name in metrics
            typed.add(name)
        else:
            match = SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            assert match["name"] in typed
            labels = {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                      for k, v in LABEL.findall(match["labels"])}
            metrics[match["name"]].append((labels, float(match["value"])))
    return metrics


def test_prometheus_textfile_from_a_run(pytester: pytest.Pytester, spec: Path,
                                        example_host: Path) -> None:
    (pytester.path / "textfile").mkdir()
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--gpuhost-prom=textfile/gpuhost.prom")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert [p.name for p in (pytester.path / "textfile").iterdir()] == ["gpuhost.prom"]
    metrics = parse_exposition((pytester.path / "textfile/gpuhost.prom").read_text())
    ok = {(labels["kind"], labels["key"]): value for labels, value in metrics["gpuhost_check_ok"]}
    assert len(ok) == 246
    assert ok[("sysctl", "vm.swappiness")] == 1
    assert ok[("module", "nvidia_peermem")] == 0
    assert ok[("dmesg", "")] == 0
    outcome = {(labels["key"], labels["outcome"]): value
               for labels, value in metrics["gpuhost_check_outcome"] if labels["kind"] == "module"}
    assert outcome[("nvidia_peermem", "fix_failed")] == 1
    assert sum(v for (key, _), v in outcome.items() if key == "nvidia_peermem") == 1
    counts = {labels["outcome"]: value for labels, value in metrics["gpuhost_checks"]}
    assert counts == {"passed": 185, "failed": 14, "fixed": 45, "fix_failed": 1, "skipped": 1,
                      "error": 0, "would_fix": 0, "reboot_required": 0}
    observed = {labels["key"]: value for labels, value in metrics["gpuhost_check_observed"]
                if labels["kind"] == "pcie.max_read_request"}
    assert set(observed.values()) == {4096}
    [(labels, stamp)] = metrics["gpuhost_last_run_timestamp_seconds"]
    assert labels == {"spec": "blackwell8", "spec_file": "blackwell8.yaml"} and stamp > 1.7e9


def test_prometheus_label_values_are_escaped() -> None:
    assert escape_label('a"b\\c\nd') == 'a\\"b\\\\c\\nd'
    odd = CheckResult('sysctl[x"y]', "sysctl", 'x"y\\z\n', "1", "2", Outcome.FAILED, "m")
    metrics = parse_exposition(textfile([odd], specs=["s.yaml"], timestamp=1.0))
    [(labels, value)] = metrics["gpuhost_check_ok"]
    assert labels["key"] == 'x"y\\z\n' and value == 0
    assert len(metrics["gpuhost_check_outcome"]) == len(OUTCOMES)


def test_a_lone_surrogate_in_a_label_value_is_written_as_utf8(tmp_path: Path) -> None:
    """A target's JSON can carry a lone surrogate (``\\udcff``) into an observed value: the
    textfile, written as UTF-8, was not written at all (every target's checks lost)."""
    odd = CheckResult("gpus.driver_version", "gpus.driver_version", None, ">= 580.0",
                      "580\udcff", Outcome.FAILED, "m", location="s.yaml:3")
    PrometheusTextfile(tmp_path / "out.prom").write([odd], RunInfo((("s.yaml", "s"),), "/", None))
    metrics = parse_exposition((tmp_path / "out.prom").read_text(encoding="utf-8"))
    [(labels, _)] = metrics["gpuhost_observed_info"]
    assert labels["value"].startswith("580\ufffd")


def test_a_lone_surrogate_in_the_runs_facts_leaves_allures_environment_written(
        tmp_path: Path) -> None:
    """The same lone surrogate in a target's driver version, which Allure's overview shows:
    its environment file is written, valid UTF-8, as every report file is (``files.utf8``)."""
    from pytest_gpuhost.reports.allure import AllureSessionFiles

    info = RunInfo((("s.yaml", "s"),), "/", "gpu-a", driver="580\udcff")
    AllureSessionFiles(tmp_path).write([], info)
    text = (tmp_path / "environment.properties").read_text(encoding="utf-8")
    assert "driver=580\ufffd" in text


def allure_results(directory: Path) -> dict[str, Any]:
    """Each Allure result file by its test's name (JSON: its shape is what the tests assert)."""
    results = [json.loads(p.read_text()) for p in directory.glob("*-result.json")]
    return {r["name"]: r for r in results}


def labels_of(result: Any) -> dict[str, str]:
    return {label["name"]: label["value"] for label in result["labels"]}


def tags_of(result: Any) -> list[str]:
    return [label["value"] for label in result["labels"]
            if label["name"] == "tag"]


def attachment(directory: Path, item: Any, name: str) -> str:
    [found] = [a for a in item["attachments"] if a["name"] == name]
    return (directory / str(found["source"])).read_text()


def test_allure_results_of_a_fix_run(pytester: pytest.Pytester, spec: Path,
                                     example_host: Path) -> None:
    spec.write_text(spec.read_text().replace(
        'nvidia: {state: loaded, why: "the NVIDIA kernel driver"}',
        'nvidia: {state: loaded, severity: blocker, why: "the NVIDIA kernel driver"}'))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--alluredir=allure-results")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = pytester.path / "allure-results"
    tests = allure_results(out)
    assert len(tests) == 246
    assert len({t["historyId"] for t in tests.values()}) == 246  # one history per check
    swap = tests["sysctl[vm.swappiness]"]
    assert swap["status"] == "passed"
    assert labels_of(swap)["feature"] == "sysctl"
    assert labels_of(swap)["story"] == "vm.swappiness"
    assert labels_of(swap)["severity"] == "normal"
    assert swap["description"] == ("keep model weights and KV-cache host buffers in RAM "
                                   "rather than swap")
    params = {p["name"]: p for p in swap["parameters"]}
    assert params["observed"]["value"] == "'10'" and params["observed"]["excluded"] is True
    assert "excluded" not in params["host"] and params["key"]["value"] == "'vm.swappiness'"
    assert [s["name"] for s in swap["steps"]] == [
        "observe: 60", "apply: write '10' to proc/sys/vm/swappiness", "read back: 10",
        "assert: 10 is 10"]
    assert attachment(out, swap, "what was read") == (
        "before: proc/sys/vm/swappiness: 60\nproc/sys/vm/swappiness: 10\n")
    assert "expected: 10\nobserved: 10\nbefore:   60\nafter:    10\n" in attachment(
        out, swap, "expected vs observed")
    mrrs = tests["pcie.max_read_request[0000:81:00.0]"]
    gpu = {p["name"]: p["value"] for p in mrrs["parameters"]}["gpu"]
    assert gpu == "'0000:81:00.0'"
    peermem = tests["module[nvidia_peermem]"]
    assert peermem["status"] == "failed"
    steps = {s["name"]: s for s in peermem["steps"]}
    assert steps["apply: modprobe -- nvidia_peermem"]["status"] == "failed"
    assert "Invalid argument" in attachment(out, steps["apply: modprobe -- nvidia_peermem"],
                                            "command and output")
    assert labels_of(tests["module[nvidia]"])["severity"] == "blocker"
    env = (out / "environment.properties").read_text()
    assert "gpu.count=8\n" in env and "spec=blackwell8\n" in env
    assert "gpu.model=NVIDIA 10de\\:" not in env  # values are not key-escaped
    assert re.search(r"^kernel=\S+$", env, re.M)
    categories = json.loads((out / "categories.json").read_text())
    assert [c["name"] for c in categories] == ["Fix failed", "Hardware fault",
                                               "Reboot required", "Would fix",
                                               "Not on this kernel", "Mis-tuned",
                                               "Not applicable"]
    # a fixed check is passed to pytest, so to Allure: its label and tag tell it apart
    assert labels_of(swap)["gpuhost_outcome"] == "fixed"
    assert set(tags_of(swap)) == {"fixed", "gpuhost"}  # allure-pytest tags each marker too
    gpus = tests["gpu_count"]
    assert labels_of(gpus)["gpuhost_outcome"] == "passed" and tags_of(gpus) == ["gpuhost"]
    assert set(tags_of(peermem)) == {"fix_failed", "gpuhost"}
    config = json.loads((out / "allurerc.json").read_text())  # Allure 3's categories
    assert [c["name"] for c in config["categories"]["rules"]] == [
        "Fix failed", "Hardware fault", "Reboot required", "Would fix", "Not on this kernel",
        "Mis-tuned", "Host not read", "Not applicable", "Will revert at boot", "Fixed by --fix",
        "Passed with a warning"]


def category_of(categories: list[dict[str, Any]], status: str, message: str,
                trace: str) -> str | None:
    for category in categories:
        if status not in category["matchedStatuses"]:
            continue
        if "messageRegex" in category and not re.fullmatch(
                category["messageRegex"], message):
            continue
        if "traceRegex" in category and not re.fullmatch(
                category["traceRegex"], trace):
            continue
        return str(category["name"])
    return None


def test_categories_sort_the_checks(pytester: pytest.Pytester, spec: Path,
                                    example_host: Path) -> None:
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                       "--fix", "--fix-persist", "--alluredir=allure-results")
    out = pytester.path / "allure-results"
    categories = json.loads((out / "categories.json").read_text())
    found = {}
    for name, test in allure_results(out).items():
        details = test.get("statusDetails") or {}
        found[name] = category_of(categories, str(test["status"]),
                                  details.get("message", ""), details.get("trace", ""))
    assert found["module[nvidia_peermem]"] == "Fix failed"
    assert found["dmesg"] == "Hardware fault"
    assert found["cpufreq.driver"] == "Reboot required"
    assert found["kernel.release"] == "Mis-tuned"
    assert found["sysctl[vm.swappiness]"] is None  # fixed: passed
    shutil.rmtree(out)
    verify = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--alluredir=allure-results")
    assert verify.ret == pytest.ExitCode.TESTS_FAILED
    test = allure_results(out)["sysctl[kernel.numa_balancing]"]
    assert test["status"] == "passed"  # already fixed by the first run
    shutil.rmtree(example_host / "sys/class/infiniband")
    shutil.rmtree(out)
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                       "--alluredir=allure-results")
    skipped = allure_results(out)["module[nvidia_peermem]"]
    details = skipped["statusDetails"]
    assert category_of(categories, "skipped", details["message"], details.get("trace", "")) \
        == "Not applicable"


def test_would_fix_category(pytester: pytest.Pytester, example_host: Path) -> None:
    """A dry run's would_fix had no category of its own (it fell into Mis-tuned)."""
    pytester.makefile(".yaml", s="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.runpytest("--gpuhost-spec=s.yaml", f"--gpuhost-root={example_host}", "--fix",
                       "--gpuhost-dry-run", "--alluredir=out")
    [test] = allure_results(pytester.path / "out").values()
    categories = json.loads((pytester.path / "out/categories.json").read_text())
    details = test["statusDetails"]
    assert category_of(categories, "failed", details["message"], details["trace"]) == \
        "Would fix"
    assert labels_of(test)["gpuhost_outcome"] == "would_fix"
    assert set(tags_of(test)) == {"would_fix", "gpuhost"}


PERSIST_CONFTEST = """\
from pytest_gpuhost.reports.allure import AllureEvidence
from pytest_gpuhost.result import CheckResult, Outcome

RECORD = CheckResult(
    id="persist[etc/sysctl.d/90-gpuhost-s.conf]", kind="persist",
    key="etc/sysctl.d/90-gpuhost-s.conf", expected="current", observed="current",
    outcome=Outcome.FIXED, message="absent -> current", before="absent", after="current",
    why="makes the runtime tuning survive a reboot", location="s.yaml:1",
    action="create etc/sysctl.d/90-gpuhost-s.conf",
    evidence=({"source": "before: etc/sysctl.d/90-gpuhost-s.conf", "raw": "absent"},
              {"source": "etc/sysctl.d/90-gpuhost-s.conf", "raw": "sha256:0011, 2 lines"}),
    plan=({"change": "create etc/sysctl.d/90-gpuhost-s.conf (2 lines)", "type": "replace_file",
           "path": "etc/sysctl.d/90-gpuhost-s.conf", "old": None,
           "new": "# Written by pytest-gpuhost\\nvm.swappiness = 10\\n"},))


def pytest_configure(config):
    config.pluginmanager.register(AllureEvidence(lambda target: "gpu-node-07", config),
                                  "gpuhost-allure")
"""


def test_a_persistence_record_as_an_allure_test(pytester: pytest.Pytester) -> None:
    """The reporter's side of the --fix-persist records that once went missing: a test whose
    record is a persistence file's gets its labels, the fixed tag, the steps of the write and
    the file it wrote (the records become pytest items of their own in the plugin's glue)."""
    pytester.makeconftest(PERSIST_CONFTEST)
    pytester.makepyfile(test_p="def test_persist(request):\n    from conftest import RECORD\n"
                               "    request.node.result = RECORD\n")
    result = pytester.runpytest("--alluredir=out", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    [test] = allure_results(pytester.path / "out").values()
    labels = labels_of(test)
    assert (labels["feature"], labels["story"]) == ("persist", "etc/sysctl.d/90-gpuhost-s.conf")
    assert labels["gpuhost_outcome"] == "fixed" and tags_of(test) == ["fixed"]
    assert [label["value"] for label in test["labels"] if label["name"] == "host"] == [
        "gpu-node-07"]
    assert [s["name"] for s in test["steps"]] == [
        "observe: absent", "apply: create etc/sysctl.d/90-gpuhost-s.conf",
        "read back: current", "assert: current is current"]
    assert attachment(pytester.path / "out", test, "etc/sysctl.d/90-gpuhost-s.conf (written)") \
        == "# Written by pytest-gpuhost\nvm.swappiness = 10\n"


def test_the_persistence_records_are_in_allure(pytester: pytest.Pytester, spec: Path,
                                               example_host: Path) -> None:
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
                       "--fix-persist", "--alluredir=out")
    persisted = [name for name in allure_results(pytester.path / "out")
                 if name.startswith("persist[")]
    assert len(persisted) == 6


def test_mis_tuned_category(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", s="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.runpytest("--gpuhost-spec=s.yaml", f"--gpuhost-root={example_host}",
                       "--alluredir=out")
    [test] = allure_results(pytester.path / "out").values()
    categories = json.loads((pytester.path / "out/categories.json").read_text())
    details = test["statusDetails"]
    assert test["status"] == "failed"
    assert category_of(categories, "failed", details["message"], details["trace"]) == \
        "Mis-tuned"


def test_a_sysctl_the_kernel_does_not_have_is_failed_and_not_mis_tuned(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """The host was read and the key is not there: ``failed`` (not ``error``, which is a host
    that could not be read), with a did-you-mean, and neither "run with --fix" (a fix never
    creates a sysctl) nor Allure's Mis-tuned: a category of its own, in both generations."""
    pytester.makefile(".yaml", s="version: 1\nsysctl:\n  vm.swapiness: 10\n")
    result = pytester.runpytest("--gpuhost-spec=s.yaml", f"--gpuhost-root={example_host}",
                                "--alluredir=out", "--fix")
    result.assert_outcomes(failed=1)
    [test] = allure_results(pytester.path / "out").values()
    details = test["statusDetails"]
    assert test["status"] == "failed" and labels_of(test)["gpuhost_outcome"] == "failed"
    assert "did you mean vm.swappiness?" in details["message"]
    assert "--fix" not in details["message"]
    categories = json.loads((pytester.path / "out/categories.json").read_text())
    assert category_of(categories, "failed", details["message"], details["trace"]) == \
        "Not on this kernel"
    rules = json.loads((pytester.path / "out/allurerc.json").read_text())["categories"]["rules"]
    [rule] = [r for r in rules if r["name"] == "Not on this kernel"]
    assert rules.index(rule) < [r["name"] for r in rules].index("Mis-tuned")
    assert rule["matchers"]["message"] in details["message"]


def test_allure_under_xdist_writes_the_session_files_once(pytester: pytest.Pytester, spec: Path,
                                                          example_host: Path) -> None:
    pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                  "-n", "2", "--alluredir=allure-results", "-p",
                                  "no:cacheprovider")
    out = pytester.path / "allure-results"
    assert len(allure_results(out)) == 246
    assert "gpu.count=8\n" in (out / "environment.properties").read_text()
    assert (out / "categories.json").is_file()
    assert not list(out.glob(".*"))  # no temporary files left


def test_without_alluredir_nothing_of_allure_runs(pytester: pytest.Pytester,
                                                  example_host: Path) -> None:
    pytester.makefile(".yaml", s="version: 1\nsysctl:\n  vm.swappiness: 60\n")
    pytester.makepyfile(test_probe="""
        def test_probe(pytestconfig):
            assert pytestconfig.pluginmanager.get_plugin("gpuhost-allure") is None
    """)
    before = {p.name for p in pytester.path.iterdir()}
    # pytest-benchmark (a test dependency) makes its storage directory in every run it is in
    result = pytester.runpytest("test_probe.py", "--gpuhost-spec=s.yaml",
                                f"--gpuhost-root={example_host}", "-p", "no:cacheprovider",
                                "-p", "no:benchmark")
    result.assert_outcomes(passed=2)
    # __pycache__: Python's own (the test module's bytecode) where PYTHONDONTWRITEBYTECODE is unset
    assert {p.name for p in pytester.path.iterdir()} - {"__pycache__"} == before


def test_two_specs_make_distinct_series_and_readable_files(pytester: pytest.Pytester,
                                                           fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", a="version: 1\nsysctl:\n  vm.swappiness: 10\n",
                      b="version: 1\nsysctl:\n  vm.swappiness: {max: 20}\n")
    result = pytester.runpytest("a.yaml", "b.yaml", f"--gpuhost-root={fake.root}",
                                "--gpuhost-prom=out.prom", "--gpuhost-report=out.json")
    assert result.ret == pytest.ExitCode.OK
    text = (pytester.path / "out.prom").read_text()
    ok = [line for line in text.splitlines() if line.startswith("gpuhost_check_ok{")]
    assert sorted(ok) == [
        'gpuhost_check_ok{spec="a",spec_file="a.yaml",kind="sysctl",key="vm.swappiness"} 1',
        'gpuhost_check_ok{spec="b",spec_file="b.yaml",kind="sysctl",key="vm.swappiness"} 1']
    for name in ("out.prom", "out.json"):
        assert (pytester.path / name).stat().st_mode & 0o777 == 0o644


# -- every report holds every check, whatever pytest did around it --------------------------------

AROUND_THE_CHECK = """
    import os

    import pytest

    def pytest_collection_modifyitems(items):
        for item in items:
            if os.environ.get("SKIP_CHECK") and os.environ["SKIP_CHECK"] in item.name:
                item.add_marker(pytest.mark.skip(reason="kmsg is noisy on this cluster"))

    def pytest_runtest_setup(item):
        if os.environ.get("SETUP_FAIL") and os.environ["SETUP_FAIL"] in item.name:
            raise RuntimeError("setup broke for " + item.name)

    def pytest_runtest_teardown(item):
        if os.environ.get("TEARDOWN_FAIL") and os.environ["TEARDOWN_FAIL"] in item.name:
            raise RuntimeError("teardown broke for " + item.name)

    def pytest_runtest_call(item):
        if os.environ.get("INTERRUPT") and os.environ["INTERRUPT"] in item.name:
            raise KeyboardInterrupt
    """
AROUND_SPEC = ("version: 1\nsysctl:\n  vm.dirty_ratio: 20\n  vm.swappiness: 10\n"
               "modules:\n  nvidia: loaded\ndmesg: {}\n")
AROUND_IDS = ["sysctl[vm.dirty_ratio]", "sysctl[vm.swappiness]", "module[nvidia]", "dmesg"]


def run_around(pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch,
               env: dict[str, str], *args: str) -> tuple[pytest.RunResult, Any, int,
                                                         list[str]]:
    """A passing spec with a conftest that skips, breaks set-up or teardown of, or interrupts
    a check named in ``env``: pytest's run, the JSON report, and NPD's answer to the same run."""
    fake.sysctl("vm.dirty_ratio", 20).sysctl("vm.swappiness", 10).module("nvidia")
    fake.kmsg([(6, "hello")])
    pytester.makeconftest(AROUND_THE_CHECK)
    pytester.makefile(".yaml", spec=AROUND_SPEC)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    common = ("spec.yaml", f"--gpuhost-root={fake.root}", "-p", "no:cacheprovider", *args)
    result = pytester.runpytest_subprocess(*common, "--gpuhost-report=out.json",
                                           "--gpuhost-prom=out.prom")
    report = json.loads((pytester.path / "out.json").read_text())
    npd = pytester.runpytest_subprocess(*common, "--gpuhost-npd")
    return result, report, npd.ret, npd.outlines


def outcomes_of(report: Any) -> dict[str, tuple[str, str]]:
    return {c["id"]: (c["outcome"], c["message"]) for c in report["checks"]}


def prom_outcomes(pytester: pytest.Pytester) -> dict[str, str]:
    text = (pytester.path / "out.prom").read_text()
    found = {}
    for labels, value in parse_exposition(text)["gpuhost_check_outcome"]:
        if value == 1:
            found[labels["key"] or labels["kind"]] = labels["outcome"]
    return found


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_check_skipped_by_a_skip_mark_is_skipped_in_every_report(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch,
        xdist: tuple[str, ...]) -> None:
    """pytest skips it (a user's skip mark, at set-up): skipped, with the mark's reason, in
    every report, and the run still exits 0 (it was an error that made the exit 1)."""
    result, report, npd_ret, npd_out = run_around(pytester, fake, monkeypatch,
                                                  {"SKIP_CHECK": "dmesg"}, *xdist)
    result.assert_outcomes(passed=3, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    assert outcomes_of(report)["dmesg"] == ("skipped", "kmsg is noisy on this cluster")
    assert report["summary"]["skipped"] == 1 and report["summary"]["error"] == 0
    assert [c["id"] for c in report["checks"]] == AROUND_IDS
    assert prom_outcomes(pytester)["dmesg"] == "skipped"
    assert (npd_ret, npd_out) == (0, ["gpuhost: 4 checks ok"])


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_check_whose_setup_fails_is_an_error_saying_so(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch,
        xdist: tuple[str, ...]) -> None:
    """An error at set-up (another plugin's): the record says what broke, in its place, not
    that an xdist worker went down (there may be none)."""
    result, report, npd_ret, _ = run_around(pytester, fake, monkeypatch,
                                            {"SETUP_FAIL": "swappiness"}, *xdist)
    result.assert_outcomes(passed=3, errors=1)
    outcome, message = outcomes_of(report)["sysctl[vm.swappiness]"]
    assert outcome == "error"
    assert "setup broke for sysctl[vm.swappiness]" in message and "xdist" not in message
    [record] = [c for c in report["checks"] if c["id"] == "sysctl[vm.swappiness]"]
    assert record["expected"] == "10" and record["location"] == "spec.yaml:4"
    assert [c["id"] for c in report["checks"]] == AROUND_IDS
    assert npd_ret == 1


def test_a_check_whose_setup_fails_under_x_is_that_error_not_unrun(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    result, report, _, _ = run_around(pytester, fake, monkeypatch,
                                      {"SETUP_FAIL": "swappiness"}, "-x")
    result.assert_outcomes(passed=1, errors=1)
    outcomes = outcomes_of(report)
    assert "setup broke" in outcomes["sysctl[vm.swappiness]"][1]
    assert outcomes["module[nvidia]"][1].startswith("not run: the run stopped before it")


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_check_whose_teardown_fails_is_not_reported_as_passed(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch,
        xdist: tuple[str, ...]) -> None:
    """pytest counts an error at teardown and exits 1: the reports must not say that every
    check passed (NPD answered 'ok' with exit 0)."""
    result, report, npd_ret, npd_out = run_around(pytester, fake, monkeypatch,
                                                  {"TEARDOWN_FAIL": "swappiness"}, *xdist)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    outcome, message = outcomes_of(report)["sysctl[vm.swappiness]"]
    assert outcome == "error"
    assert "teardown broke for sysctl[vm.swappiness]" in message and "passed" in message
    assert report["summary"]["error"] >= 1
    assert prom_outcomes(pytester)["vm.swappiness"] == "error"
    assert npd_ret == 1 and npd_out[0].startswith("gpuhost: ")


def test_an_interrupted_run_says_its_checks_did_not_run(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in a run without xdist: the checks after it were not run, and the reports say
    so, not that a worker went down."""
    result, report, npd_ret, _ = run_around(pytester, fake, monkeypatch,
                                            {"INTERRUPT": "nvidia"})
    assert result.ret == pytest.ExitCode.INTERRUPTED
    outcomes = outcomes_of(report)
    assert outcomes["sysctl[vm.swappiness]"][0] == "passed"
    for check in ("module[nvidia]", "dmesg"):
        outcome, message = outcomes[check]
        assert outcome == "error" and message.startswith("not run: the run was interrupted")
    assert npd_ret == 2


def test_a_bundled_specs_series_keep_their_identity_wherever_it_is_installed(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """spec_file was the bundled spec's absolute install path, so rebuilding the venv
    changed every series; now it is the stable name the check ids use."""
    pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                       "--gpuhost-prom=out.prom")
    metrics = parse_exposition((pytester.path / "out.prom").read_text())
    files = {labels["spec_file"] for samples in metrics.values() for labels, _ in samples}
    assert files == {"blackwell8.yaml"}
    assert str(BLACKWELL8.parent) not in (pytester.path / "out.prom").read_text()


def test_a_bundled_spec_beside_a_copy_of_it_keeps_its_path() -> None:
    """Run beside a copy at the top of the rootdir (shown as blackwell8.yaml), the bundled one
    is shown by its path, as its ids are: two specs are never one series."""
    bundled, copy = str(BLACKWELL8), "blackwell8.yaml"
    records = [CheckResult("gpu_count", "gpu_count", None, "8", "8", Outcome.PASSED, "",
                           location=f"{where}:3") for where in (bundled, copy)]
    metrics = parse_exposition(textfile(records, specs=[bundled, copy], timestamp=1.0))
    assert sorted(labels["spec_file"] for labels, _ in metrics["gpuhost_check_ok"]) == sorted(
        [bundled, copy])
    alone = parse_exposition(textfile(records[:1], specs=[bundled], timestamp=1.0))
    assert [labels["spec_file"] for labels, _ in alone["gpuhost_check_ok"]] == [copy]
    empty = parse_exposition(textfile([], specs=[bundled], timestamp=1.0))
    assert {labels["spec_file"] for labels, _ in empty["gpuhost_checks"]} == {copy}


def test_the_per_target_tables_cells_never_run_together() -> None:
    """A target's outcomes of one kind are one cell (commas inside it), two spaces part the
    cells: the total row of a container and its host reads as two cells."""
    from pytest_gpuhost.reports.terminal import target_matrix

    def record(n: int, outcome: Outcome, target: str) -> CheckResult:
        return CheckResult(f"sysctl[k{n}]", "sysctl", f"k{n}", "1", "1", outcome, "",
                           target=target)

    records = [*(record(n, Outcome.PASSED, "lxc-101") for n in range(3)),
               record(3, Outcome.SKIPPED, "local"), record(4, Outcome.FIXED, "local"),
               record(5, Outcome.FAILED, "local"), record(6, Outcome.PASSED, "local")]
    lines = target_matrix(records)
    assert lines[-1] == "total   3 passed  1 skipped, 1 fixed, 1 failed, 1 passed"
    assert [re.split(r"  +", line) for line in lines][-1] == [
        "total", "3 passed", "1 skipped, 1 fixed, 1 failed, 1 passed"]
