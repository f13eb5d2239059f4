"""Reports from one run: JUnit properties, the Prometheus textfile and the Allure results."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_gpuhost.reports.prometheus import escape_label, textfile
from pytest_gpuhost.result import OUTCOMES, CheckResult, Outcome
from pytest_gpuhost.testing.fakehost import FakeHost

from .conftest import BLACKWELL8

pytest_plugins = ["pytester"]


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


def test_junit_properties_per_check(pytester: pytest.Pytester, spec: Path,
                                    example_host: Path) -> None:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--junitxml=junit.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    cases = {case.get("name"): case for case in ET.parse(pytester.path / "junit.xml").iter(
        "testcase")}
    assert len(cases) == 198

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


def test_junit_properties_under_xdist(pytester: pytest.Pytester, spec: Path,
                                      example_host: Path) -> None:
    pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                  "-n", "2", "--junitxml=junit.xml", "-p", "no:cacheprovider")
    outcomes = [p.get("value") for p in ET.parse(pytester.path / "junit.xml").iter("property")
                if p.get("name") == "outcome"]
    assert sorted(outcomes) == sorted(["passed"] * 81 + ["failed"] * 115 + ["skipped"] * 2)


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
    assert len(ok) == 198
    assert ok[("sysctl", "vm.swappiness")] == 1
    assert ok[("module", "nvidia_peermem")] == 0
    assert ok[("dmesg", "")] == 0
    outcome = {(labels["key"], labels["outcome"]): value
               for labels, value in metrics["gpuhost_check_outcome"] if labels["kind"] == "module"}
    assert outcome[("nvidia_peermem", "fix_failed")] == 1
    assert sum(v for (key, _), v in outcome.items() if key == "nvidia_peermem") == 1
    counts = {labels["outcome"]: value for labels, value in metrics["gpuhost_checks"]}
    assert counts == {"passed": 137, "failed": 14, "fixed": 45, "fix_failed": 1, "skipped": 1,
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


def allure_results(directory: Path) -> dict[str, dict[str, object]]:
    results = [json.loads(p.read_text()) for p in directory.glob("*-result.json")]
    return {r["name"]: r for r in results}


def labels_of(result: dict[str, object]) -> dict[str, str]:
    return {label["name"]: label["value"] for label in result["labels"]}  # type: ignore[attr-defined]


def attachment(directory: Path, item: dict[str, object], name: str) -> str:
    [found] = [a for a in item["attachments"] if a["name"] == name]  # type: ignore[attr-defined]
    return (directory / found["source"]).read_text()


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
    assert len(tests) == 198
    assert len({t["historyId"] for t in tests.values()}) == 198  # one history per check
    swap = tests["sysctl[vm.swappiness]"]
    assert swap["status"] == "passed"
    assert labels_of(swap)["feature"] == "sysctl"
    assert labels_of(swap)["story"] == "vm.swappiness"
    assert labels_of(swap)["severity"] == "normal"
    assert swap["description"] == ("keep model weights and KV-cache host buffers in RAM "
                                   "rather than swap")
    params = {p["name"]: p for p in swap["parameters"]}  # type: ignore[attr-defined]
    assert params["observed"]["value"] == "'10'" and params["observed"]["excluded"] is True
    assert "excluded" not in params["host"] and params["key"]["value"] == "'vm.swappiness'"
    assert [s["name"] for s in swap["steps"]] == [  # type: ignore[attr-defined]
        "observe: 60", "apply: write '10' to proc/sys/vm/swappiness", "read back: 10",
        "assert: 10 is 10"]
    assert attachment(out, swap, "what was read") == (
        "before: proc/sys/vm/swappiness: 60\nproc/sys/vm/swappiness: 10\n")
    assert "expected: 10\nobserved: 10\nbefore:   60\nafter:    10\n" in attachment(
        out, swap, "expected vs observed")
    mrrs = tests["pcie.max_read_request[0000:81:00.0]"]
    gpu = {p["name"]: p["value"] for p in mrrs["parameters"]}["gpu"]  # type: ignore[attr-defined]
    assert gpu == "'0000:81:00.0'"
    peermem = tests["module[nvidia_peermem]"]
    assert peermem["status"] == "failed"
    steps = {s["name"]: s for s in peermem["steps"]}  # type: ignore[attr-defined]
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
                                               "Reboot required", "Mis-tuned", "Not applicable"]


def category_of(categories: list[dict[str, object]], status: str, message: str,
                trace: str) -> str | None:
    for category in categories:
        if status not in category["matchedStatuses"]:  # type: ignore[operator]
            continue
        if "messageRegex" in category and not re.fullmatch(
                category["messageRegex"], message):  # type: ignore[arg-type]
            continue
        if "traceRegex" in category and not re.fullmatch(
                category["traceRegex"], trace):  # type: ignore[arg-type]
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
        found[name] = category_of(categories, str(test["status"]),  # type: ignore[union-attr]
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
        == "Not applicable"  # type: ignore[index]


def test_mis_tuned_category(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", s="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.runpytest("--gpuhost-spec=s.yaml", f"--gpuhost-root={example_host}",
                       "--alluredir=out")
    [test] = allure_results(pytester.path / "out").values()
    categories = json.loads((pytester.path / "out/categories.json").read_text())
    details = test["statusDetails"]
    assert test["status"] == "failed"
    assert category_of(categories, "failed", details["message"], details["trace"]) == \
        "Mis-tuned"  # type: ignore[index]


def test_allure_under_xdist_writes_the_session_files_once(pytester: pytest.Pytester, spec: Path,
                                                          example_host: Path) -> None:
    pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                  "-n", "2", "--alluredir=allure-results", "-p",
                                  "no:cacheprovider")
    out = pytester.path / "allure-results"
    assert len(allure_results(out)) == 198
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
    result = pytester.runpytest("test_probe.py", "--gpuhost-spec=s.yaml",
                                f"--gpuhost-root={example_host}", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    assert {p.name for p in pytester.path.iterdir()} == before


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
