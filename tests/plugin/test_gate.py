"""The pre-benchmark gate and naming the plugin in pytest_plugins, as whole runs with pytester."""

from __future__ import annotations

import json
import shutil
from glob import escape
from pathlib import Path

import pytest
import yaml

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, assert_valid_junit, counts

pytest_plugins = ["pytester"]

BENCH = """
import pytest

def test_bench_a():
    pass

def test_bench_b():
    pass
"""

GOOD = "version: 1\nname: good\nsysctl:\n  vm.swappiness: 60\nmodules:\n  nvidia: loaded\n"


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


def test_a_failing_host_check_turns_gated_tests_into_errors(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("test_bench.py", f"--gpuhost-spec={spec}",
                                f"--gpuhost-root={example_host}", "--gpuhost-gate", "-v")
    result.assert_outcomes(passed=129, failed=115, skipped=2, errors=2)
    lines = [line for line in result.stdout.lines if "::" in line and line.endswith("]")]
    # Every host check ran before the benchmarks.
    assert [i for i, line in enumerate(lines) if "test_bench" in line] == [246, 247]
    result.stdout.fnmatch_lines([
        "*_ ERROR at setup of test_bench_a _*",
        escape("gpuhost gate closed: 115 of 246 host checks failed: sysctl[kernel.nmi_watchdog] "
               "(failed), ") + "*" + escape(", and 103 more"),
        "*_ ERROR at setup of test_bench_b _*",
    ])
    result.stdout.fnmatch_lines(["ERROR test_bench.py::test_bench_a - Failed: gpuhost gate "
                                 "closed: 115 of 246*"])
    assert "cpuidle[C2]" in result.stdout.str()  # named in the summary table


def runtime_only(spec: Path) -> Path:
    """The bundled spec less what only a boot fixes (kernel, cpufreq driver, IOMMU groups,
    module parameters): what one --fix run can make all right."""
    data = yaml.safe_load(spec.read_text())
    for section in ("kernel", "iommu"):
        del data[section]
    del data["cpufreq"]["driver"]
    del data["modules"]["nvidia_uvm"]["parameters"]
    spec.write_text(yaml.safe_dump(data))
    return spec


def test_fixed_checks_open_the_gate(pytester: pytest.Pytester, spec: Path,
                                    example_host: Path) -> None:
    shutil.rmtree(example_host / "sys/class/infiniband")  # peermem is then not applicable
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("test_bench.py", f"--gpuhost-spec={runtime_only(spec)}",
                                f"--gpuhost-root={example_host}", "--gpuhost-gate", "--fix")
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert (outcomes["passed"], outcomes["fixed"], outcomes["skipped"]) == (185 + 2, 45, 2)


REBOOT_SPEC = """version: 1
name: boot
kernel:
  cmdline: {has: [iommu=pt], why: "passthrough IOMMU"}
"""


def test_reboot_required_is_its_own_status_and_closes_the_gate(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The running command line lacks iommu=pt, the GRUB drop-in already has it: the check is
    REBOOT_REQUIRED (letter R), the run exits 1 and the gated benchmarks do not run."""
    fake.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet")
    fake.grub(dropins={"50-local.cfg": 'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT '
                                       'iommu=pt"\n'})
    pytester.makefile(".yaml", boot=REBOOT_SPEC)
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=boot.yaml",
                                f"--gpuhost-root={fake.root}", "--gpuhost-gate", "-v",
                                "--gpuhost-report=out.json", "--gpuhost-prom=out.prom",
                                "--junitxml=junit.xml", "-o", "junit_logging=system-out")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"reboot_required": 1, "errors": 2}
    result.stdout.fnmatch_lines([
        escape("boot.yaml::kernel.cmdline[iommu=pt] REBOOT_REQUIRED") + "*",
        "*" + escape("gpuhost gate closed: 1 of 1 host check failed: kernel.cmdline[iommu=pt] "
                     "(reboot_required)"),
    ])
    result.stdout.fnmatch_lines([
        "kind * checks  passed  failed  fixed  fix_failed  skipped  reboot_required",
        "kernel.cmdline * 1 * - * - * - * - * - * 1",
        "reboot required: 1 check wrong now, set right for the next boot",
        escape("  REBOOT_REQUIRED kernel.cmdline[iommu=pt]: ") + "* " + escape(
            "etc/default/grub.d/50-local.cfg:1 sets 'iommu=pt' for the next boot: run "
            "`update-grub`, then reboot"),
    ])
    quiet = pytester.runpytest("--gpuhost-spec=boot.yaml", f"--gpuhost-root={fake.root}")
    progress = next(line for line in quiet.stdout.lines if line.startswith("boot.yaml "))
    assert progress.startswith("boot.yaml R")  # its own letter
    assert_valid_junit(pytester.path / "junit.xml")
    data = json.loads((pytester.path / "out.json").read_text())
    assert data["summary"]["reboot_required"] == 1
    assert data["checks"][0]["outcome"] == "reboot_required"
    prom = (pytester.path / "out.prom").read_text()
    labels = 'spec="boot",spec_file="boot.yaml",kind="kernel.cmdline",key="iommu=pt"'
    assert f"gpuhost_check_ok{{{labels}}} 0" in prom
    assert f'gpuhost_check_outcome{{{labels},outcome="reboot_required"}} 1' in prom
    assert "gpuhost.outcome: reboot_required" in (pytester.path / "junit.xml").read_text()


def test_the_marker_gates_one_test(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", bad="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.makepyfile(test_bench="""
        import pytest

        @pytest.mark.gpuhost
        def test_needs_a_tuned_host():
            pass

        def test_does_not_care():
            pass
    """)
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=bad.yaml",
                                f"--gpuhost-root={example_host}")
    result.assert_outcomes(passed=1, failed=1, errors=1)
    result.stdout.fnmatch_lines(["*_ ERROR at setup of test_needs_a_tuned_host _*",
                                 escape("gpuhost gate closed: 1 of 1 host check failed: "
                                        "sysctl[vm.swappiness] (failed)")])


def test_a_gated_test_runs_when_every_check_passed(pytester: pytest.Pytester,
                                                   example_host: Path) -> None:
    pytester.makefile(".yaml", good=GOOD)
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=good.yaml",
                                f"--gpuhost-root={example_host}", "--gpuhost-gate")
    result.assert_outcomes(passed=4)


def test_a_marked_test_without_a_spec_is_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_bench="""
        import pytest

        @pytest.mark.gpuhost
        def test_needs_a_tuned_host():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*is marked gpuhost (it needs the host checks to pass) but no "
                                 "gpuhost spec was given*"])


def test_a_gate_with_no_host_check_selected_stays_closed(pytester: pytest.Pytester,
                                                         example_host: Path) -> None:
    pytester.makefile(".yaml", good=GOOD)
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=good.yaml",
                                f"--gpuhost-root={example_host}", "--gpuhost-gate", "-k", "bench")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*gpuhost gate: no host check was selected*"])


def test_gate_under_xdist_waits_for_every_worker(pytester: pytest.Pytester, spec: Path,
                                                 example_host: Path) -> None:
    pytester.makepyfile(test_bench=BENCH)
    result = pytester.runpytest_subprocess("test_bench.py",
                                           f"--gpuhost-spec={runtime_only(spec)}",
                                           f"--gpuhost-root={example_host}", "--gpuhost-gate",
                                           "--fix", "-n", "2", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert (outcomes["errors"], outcomes["fixed"], outcomes["failed"]) == (2, 45, 2)
    # The peermem fix and the dmesg check ran on some worker; both gated tests saw them.
    for name in ("test_bench_a", "test_bench_b"):
        result.stdout.fnmatch_lines([f"*_ ERROR at setup of {name} _*", escape(
            "gpuhost gate closed: 2 of 232 host checks failed: module[nvidia_peermem] "
            "(fix_failed), dmesg (failed)")])


def test_gate_without_a_spec_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gpuhost-gate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuhost-gate needs a spec*"])


@pytest.mark.parametrize("autoload", [True, False], ids=["with-entry-point", "without"])
def test_pytest_plugins_names_the_package_once(pytester: pytest.Pytester, example_host: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               autoload: bool) -> None:
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest('pytest_plugins = ["pytest_gpuhost"]\n')
    pytester.makefile(".yaml", good=GOOD)
    pytester.makepyfile(test_plugins="""
        import pytest_gpuhost.plugin

        def test_registered_once(pytestconfig):
            manager = pytestconfig.pluginmanager
            assert manager.get_plugin("gpuhost") is pytest_gpuhost.plugin
            names = [name for name, plugin in manager.list_name_plugin()
                     if plugin is pytest_gpuhost.plugin]
            assert names == ["gpuhost"]
    """)
    result = pytester.runpytest_subprocess("test_plugins.py", "--gpuhost-spec=good.yaml",
                                           f"--gpuhost-root={example_host}", "-W", "error")
    result.assert_outcomes(passed=3)
    assert result.stdout.str().count("= gpuhost: good on") == 1


def test_no_gpuhost_still_wins_over_pytest_plugins(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["pytest_gpuhost"]\n')
    pytester.makepyfile(test_plain="""
        def test_plain(pytestconfig):
            assert not pytestconfig.pluginmanager.has_plugin("gpuhost")
    """)
    result = pytester.runpytest_subprocess("-p", "no:gpuhost")
    result.assert_outcomes(passed=1)


SLOW_KIND = """
from dataclasses import dataclass

from pytest_gpuhost.checks import Check, Evidence, NoFix, Observation
from pytest_gpuhost.hookspecs import hookimpl
from pytest_gpuhost.specmodel.matchers import Integer
from pytest_gpuhost.progress import report_progress
from pytest_gpuhost.specmodel import parse_expectation


@dataclass(frozen=True)
class PairsProbe(NoFix):
    def observe(self, host):
        for pair in range(1, 4):
            report_progress(f"measuring pair {pair} of 3")
        return Observation("3", (Evidence("measured", "3"),))


class PairsKind:
    section = "pairs"

    def parse(self, node, context):
        return parse_expectation(node, context, Integer(), what="pairs")

    def expand(self, section, facts):
        expect, options = section
        return [Check("pairs", None, expect, options, PairsProbe())]


@hookimpl
def pytest_gpuhost_check_kinds():
    return [PairsKind()]
"""


def test_a_long_check_shows_its_progress(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makeconftest(SLOW_KIND)
    pytester.makefile(".yaml", spec="version: 1\npairs: 3\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={example_host}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"  pairs: measuring pair {n} of 3" for n in (1, 2, 3)],
                                consecutive=True)
