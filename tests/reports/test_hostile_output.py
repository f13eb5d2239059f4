"""A run's reports survive what a run or a host throws at them: a run that crashed is
never reported as clean (item 3), a report writer that fails takes no other report down with it
(item 5), host values reach the terminal escaped (item 10), and many failing checks cost time
and output in proportion (item 8)."""

from __future__ import annotations

import json

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import counts

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


def test_a_5000_digit_value_leaves_every_report_written(pytester: pytest.Pytester,
                                                       fake: FakeHost) -> None:
    """Item 5: Python's 4300-digit int() limit crashed the Prometheus writer at session end,
    and with it JUnit's file and --gpuhost-npd's line."""
    fake.sysctls({"vm.swappiness": "1" * 5000, "vm.dirty_ratio": 5})
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "  vm.dirty_ratio: 5\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", f"--gpuhost-root={fake.root}", "--gpuhost-prom=out.prom",
        "--junitxml=j.xml", "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    prom = (pytester.path / "out.prom").read_text()
    assert 'gpuhost_check_observed{spec="spec",spec_file="spec.yaml",kind="sysctl",' \
           'key="vm.dirty_ratio"} 5' in prom
    assert f'value="{"1" * 5000}"' in prom  # a number too long for a sample is a value
    assert (pytester.path / "j.xml").exists() and (pytester.path / "r.json").exists()
    npd = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}",
                                        "--gpuhost-npd", "-p", "no:cacheprovider")
    assert npd.ret == 1
    assert npd.stdout.lines == ["gpuhost: 1 failed: sysctl[vm.swappiness]"]


def test_a_report_writer_that_breaks_takes_no_other_report_down(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gpuhost.reports.prometheus import PrometheusTextfile

    def broken(self: object, records: object, info: object) -> None:
        raise RuntimeError("a writer's bug")

    monkeypatch.setattr(PrometheusTextfile, "write", broken)
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}",
                                "--gpuhost-prom=out.prom", "--gpuhost-report=r.json",
                                "--junitxml=j.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["PrometheusTextfile: not written: RuntimeError: a writer's bug"])
    assert (pytester.path / "r.json").exists() and (pytester.path / "j.xml").exists()
    assert not (pytester.path / "out.prom").exists()


TERMINAL_ATTACK = "\x1b]0;pwned\x07\x1b[2J\rok"


def test_host_values_reach_the_terminal_escaped(pytester: pytest.Pytester,
                                                fake: FakeHost) -> None:
    """Item 10: an observed value that sets the terminal's title, clears the screen and
    overwrites the line is shown as its escapes, in pytest's failure text, its short summary
    and the gpuhost summary, with and without --fix."""
    fake.sysctl("kernel.domainname", TERMINAL_ATTACK)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  kernel.domainname: "
                                    "{value: lab, fix: false}\n")
    for extra in ([], ["--fix"]):
        result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}",
                                               "--color=no", "-p", "no:cacheprovider", *extra)
        out = result.stdout.str() + result.stderr.str()
        assert result.ret == pytest.ExitCode.TESTS_FAILED, out
        for raw in ("\x1b", "\x07", "\r"):
            assert raw not in out
        assert out.count("\\x1b]0;pwned\\x07\\x1b[2J\\rok") >= 2, out


def test_the_fleet_cli_prints_host_values_escaped(pytester: pytest.Pytester) -> None:
    import subprocess
    import sys

    for name, value in (("node01", "lab"), ("node02", TERMINAL_ATTACK)):
        (pytester.path / f"{name}.json").write_text(json.dumps({"host": name, "checks": [
            {"id": "sysctl[kernel.domainname]", "kind": "sysctl", "key": "kernel.domainname",
             "expected": "lab", "observed": value, "location": "spec.yaml:3",
             "outcome": "passed" if value == "lab" else "failed"}]}))
    done = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet", "node01.json",
                           "node02.json", "--drift-limit=0"], cwd=pytester.path,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "\x1b" not in done.stdout and "\r" not in done.stdout
    assert "\\x1b]0;pwned" in done.stdout, done.stdout


def many_failing(fake: FakeHost, pytester: pytest.Pytester, count: int) -> None:
    keys = [f"bench.f{i:03d}" for i in range(count)]
    for key in keys:
        fake.file(f"proc/sys/{key.replace('.', '/')}", "0\n")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" +
                      "".join(f"  {key}: 1\n" for key in keys))


def test_failing_checks_are_written_once_each_and_folded_past_20(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 8: pytest's failure section looked through every report of the run for each
    failure (quadratic: 5,000 failing sysctls took 45 s); the checks' failures are written in
    one pass, the first 20 in full, and every one keeps its line in the short summary.
    bench/failures.py measures the time; here, that pytest's per-failure scan is never run."""
    from _pytest.terminal import TerminalReporter

    scans: list[str] = []
    monkeypatch.setattr(TerminalReporter, "_handle_teardown_sections",
                        lambda self, nodeid: scans.append(nodeid))
    many_failing(fake, pytester, 25)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert scans == []
    assert "FAILURES of gpuhost checks (25)" in out and "= FAILURES =" not in out
    assert out.count("_ gpuhost check sysctl[bench.f") == 20
    assert "... and 5 more failing checks, folded: each has its line in the short test " \
           "summary below" in out
    assert len([line for line in result.stdout.lines if line.startswith("FAILED spec.yaml::")]) \
        == 25
    assert counts(result) == {"failed": 25}


@pytest.mark.parametrize(("flags", "shown"), [(["-vv"], 25), (["--tb=no"], 0)])
def test_every_failure_with_vv_and_none_with_tb_no(pytester: pytest.Pytester, fake: FakeHost,
                                                  flags: list[str], shown: int) -> None:
    many_failing(fake, pytester, 25)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", *flags)
    assert result.stdout.str().count("_ gpuhost check sysctl[bench.f") == shown
