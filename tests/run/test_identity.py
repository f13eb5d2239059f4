"""Every report holds every check: a check's identity is its spec file plus its id, ids always
name the spec, and what a report says is what the run did."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, assert_valid_junit


def _report(pytester: pytest.Pytester, name: str = "out.json") -> dict[str, Any]:
    """The JSON report as loaded: JSON values, so a dict of Any."""
    data: dict[str, Any] = json.loads((pytester.path / name).read_text())
    return data


def test_two_specs_checking_one_key_are_two_records(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 30)
    pytester.makefile(".yaml", a="version: 1\nsysctl:\n  vm.swappiness: 30\n",
                      b="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("a.yaml", "b.yaml", f"--gpuhost-root={fake.root}",
                                "--gpuhost-report=out.json", "--gpuhost-prom=out.prom")
    result.assert_outcomes(passed=1, failed=1)
    checks = _report(pytester)["checks"]
    assert isinstance(checks, list)
    assert sorted((c["location"].split(":")[0], c["outcome"]) for c in checks) == [
        ("a.yaml", "passed"), ("b.yaml", "failed")]
    result.stdout.fnmatch_lines(["sysctl*2*1*1*"])
    ok = [line for line in (pytester.path / "out.prom").read_text().splitlines()
          if line.startswith("gpuhost_check_ok{")]
    assert len(ok) == 2


def test_two_same_stem_specs_in_two_folders_are_two_records(pytester: pytest.Pytester,
                                                            fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 30)
    for folder, value in (("one", 30), ("two", 10)):
        (pytester.path / folder).mkdir()
        (pytester.path / folder / "tuning.yaml").write_text(
            f"version: 1\nsysctl:\n  vm.swappiness: {value}\n")
    result = pytester.runpytest("one/tuning.yaml", "two/tuning.yaml",
                                f"--gpuhost-root={fake.root}", "--gpuhost-report=out.json",
                                "--gpuhost-prom=out.prom")
    result.assert_outcomes(passed=1, failed=1)
    report = _report(pytester)
    assert report["summary"] == {"passed": 1, "failed": 1, "fixed": 0, "fix_failed": 0,
                                 "skipped": 0, "error": 0, "would_fix": 0,
                                 "reboot_required": 0}
    text = (pytester.path / "out.prom").read_text()
    assert 'spec_file="one/tuning.yaml"' in text and 'spec_file="two/tuning.yaml"' in text


def test_a_spec_outside_the_rootdir_still_names_itself(pytester: pytest.Pytester,
                                                       fake: FakeHost, tmp_path: Path) -> None:
    fake.sysctl("vm.swappiness", 10)
    spec = tmp_path / "elsewhere" / "tuning.yaml"
    spec.parent.mkdir()
    spec.write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={fake.root}", "-v",
                                "--junitxml=junit.xml")
    result.stdout.fnmatch_lines([f"{spec}::sysctl[[]vm.swappiness] PASSED*"])
    [case] = ET.parse(pytester.path / "junit.xml").iter("testcase")
    assert case.get("classname")
    assert_valid_junit(pytester.path / "junit.xml")


def test_without_a_json_report_the_summary_does_not_point_at_one(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    keys = [f"kernel.k{n}" for n in range(14)]  # more warnings than the summary lists
    fake.sysctls(dict.fromkeys(keys, 0))
    fake.file("etc/sysctl.d/10-other.conf", "".join(f"{key} = 1\n" for key in keys))
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" + "".join(
        f"  {key}: 0\n" for key in keys))
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert "in the JSON report" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*... and 2 more (--gpuhost-report=FILE lists them all)"])
    with_report = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}",
                                     "--gpuhost-report=out.json")
    with_report.stdout.fnmatch_lines(["*... and 2 more in the JSON report"])


def test_a_kernel_without_module_support_plans_no_modprobe(pytester: pytest.Pytester,
                                                           fake: FakeHost) -> None:
    (fake.root / "proc/modules").unlink()
    pytester.makefile(".yaml", spec="version: 1\nmodules:\n  nvidia: loaded\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    result.stdout.fnmatch_lines(["*not fixable: this kernel has no loadable module support*"])
    dry = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                             "--gpuhost-dry-run")
    assert "WOULD_FIX" not in dry.stdout.str()
    dry.assert_outcomes(failed=1)


def test_allure_environment_names_the_driver_nvml_reports(pytester: pytest.Pytester,
                                                          example_host: Path) -> None:
    pytest.importorskip("allure")
    pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={example_host}",
                       "--alluredir=allure", "-p", "no:cacheprovider")
    text = (pytester.path / "allure" / "environment.properties").read_text()
    assert "driver=580.95.05" in text


def test_a_root_that_is_a_file_says_so(pytester: pytest.Pytester, tmp_path: Path) -> None:
    (tmp_path / "hostname").write_text("node\n")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={tmp_path / 'hostname'}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpuhost-root=*hostname: not a directory;*"])


def test_the_host_name_in_reports_is_the_targets_own(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10).sysctl("kernel.hostname", "gpu-node-07")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--gpuhost-report=out.json")
    report = _report(pytester)
    assert report["host"] == "gpu-node-07"
    assert report["kernel"] == "6.8.0-49-generic"


def test_persistence_files_count_in_pytests_own_line_and_junit(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """D9: the table, pytest's line, JUnit and JSON hold the same checks."""
    result = pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={example_host}",
                                "--fix", "--fix-persist", "--junitxml=junit.xml",
                                "--gpuhost-report=out.json", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    total = sum(v for k, v in outcomes.items() if k not in ("warnings", "warning"))
    result.stdout.fnmatch_lines(["persist * 6 *", f"total * {total} *"])
    cases = list(ET.parse(pytester.path / "junit.xml").iter("testcase"))
    assert len(cases) == total
    assert sum(1 for case in cases if case.get("name", "").startswith("persist[")) == 6
    assert len(_report(pytester)["checks"]) == total
    assert_valid_junit(pytester.path / "junit.xml")
