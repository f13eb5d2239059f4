"""Reports by name (goss's outputers map): a report is one module and one line of
``reports.REPORTS``, or, from a plugin, of its ``pytest_gpuhost_reports`` hook."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.reports import REPORTS
from pytest_gpuhost.testing.fakehost import FakeHost

pytest_plugins = ["pytester"]

TALLY = """
    from collections import Counter


    class Tally:
        \"\"\"One line per outcome: a report in one module.\"\"\"

        def __init__(self, path):
            self.path = path

        def write(self, records, info):
            counts = Counter(record.outcome.value for record in records)
            text = "".join(f"{outcome} {n}\\n" for outcome, n in sorted(counts.items()))
            self.path.write_text(f"{info.hostname}\\n{text}")
"""
PLUGIN = """
    from pytest_gpuhost.reports import Report


    def pytest_addoption(parser):
        parser.addoption("--tally", type=lambda text: __import__("pathlib").Path(text))


    def pytest_gpuhost_reports():
        return {"tally": Report("tally", "tally:Tally")}  # the one line
"""


def test_a_plugin_adds_a_report_with_one_module_and_one_line(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10).sysctl("vm.overcommit_memory", 1)
    fake.sysctl("kernel.hostname", "node7")
    pytester.makepyfile(tally=textwrap.dedent(TALLY))
    pytester.makeconftest(textwrap.dedent(PLUGIN))
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "  vm.overcommit_memory: 0\n")
    result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}",
                                           "--tally=tally.txt", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert (pytester.path / "tally.txt").read_text() == "node7\nfailed 1\npassed 1\n"
    assert (pytester.path / "r.json").exists()  # the built-in ones still write theirs
    (pytester.path / "tally.txt").unlink()
    unasked = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}")
    assert unasked.ret == pytest.ExitCode.TESTS_FAILED
    assert not (pytester.path / "tally.txt").exists()  # made only when its option is given


def test_two_reports_may_not_claim_one_name(pytester: pytest.Pytester, fake: FakeHost) -> None:
    pytester.makeconftest("""
        from pytest_gpuhost.reports import Report

        def pytest_gpuhost_reports():
            return {"json": Report("report", "mine:Json")}
    """)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: two gpuhost reports claim the name 'json': "
                                 "pytest_gpuhost.reports.jsonfile:JsonReport and mine:Json"])


def test_every_built_in_report_names_a_setting_and_a_maker_that_exist() -> None:
    import importlib

    from pytest_gpuhost.config.settings import Settings

    fields = set(Settings.__struct_fields__)
    for name, report in REPORTS.items():
        assert report.asked in fields, name
        module, _, maker = report.factory.partition(":")
        assert callable(getattr(importlib.import_module(module), maker)), name


def test_a_run_imports_only_the_reports_it_asks_for(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    """The registry names its reports' modules: none is imported unless asked."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makeconftest("""
        import sys

        def pytest_unconfigure(config):
            with open("loaded.txt", "w") as out:
                out.write("\\n".join(sorted(m for m in sys.modules
                                           if m.startswith("pytest_gpuhost.reports."))))
    """)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}",
                                           "--gpuhost-prom=m.prom")
    assert result.ret == pytest.ExitCode.OK
    loaded = set(Path(pytester.path / "loaded.txt").read_text().split())
    assert "pytest_gpuhost.reports.prometheus" in loaded
    assert not {"pytest_gpuhost.reports.jsonfile", "pytest_gpuhost.reports.nfd",
                "pytest_gpuhost.reports.fleethtml", "pytest_gpuhost.reports.allure"} & loaded
