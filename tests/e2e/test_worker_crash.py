"""A crashed xdist worker ends the waits on its checks within seconds."""

from __future__ import annotations

import json
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import assert_valid_junit, crash_worker_at

CRASHING_KIND = textwrap.dedent("""\
    import os
    from pytest_gpuhost.checks import Check, NoFix, Observation
    from pytest_gpuhost.hookspecs import hookimpl
    from pytest_gpuhost.specmodel.matchers import Auto, Exact
    from pytest_gpuhost.specmodel import EntryOptions

    class Crash(NoFix):
        def observe(self, host):
            os._exit(3)  # the worker dies mid-check, as a segfault in a driver call would

    class CrashKind:
        section = "crash"

        def parse(self, node, context):
            return node.where

        def expand(self, section, facts):
            return [Check("crash", None, Exact("1", Auto()), EntryOptions(where=section),
                          Crash())]

    @hookimpl
    def pytest_gpuhost_check_kinds():
        return [CrashKind()]
    """)


def test_a_dead_worker_ends_the_waits_and_its_check_is_an_error(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10).kmsg([(6, "hello")])
    pytester.makeconftest(CRASHING_KIND)
    pytester.makefile(".yaml", spec="version: 1\ncrash: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "dmesg: {}\n")
    pytester.makepyfile(test_bench="def test_benchmark():\n    pass\n")
    result = pytester.runpytest_subprocess(  # the timeout: far short of the 900 s wait
        "spec.yaml", "test_bench.py", f"--gpuhost-root={fake.root}", "-n", "2",
        "--gpuhost-gate", "--gpuhost-report=out.json", "-p", "no:cacheprovider",
        "--max-worker-restart=4", timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert outcomes["crash"] == "error"
    messages = {check["id"]: check["message"] for check in report["checks"]}
    assert "never reported" in messages["crash"]
    if "went down" in messages["dmesg"]:  # it waited on another worker for the lost check
        assert "did not run: 1 check(s) it must follow never finished" in messages["dmesg"]
    assert outcomes["sysctl[vm.swappiness]"] == "passed"
    assert report["summary"]["error"] >= 1
    output = result.stdout.str()
    assert "crash" in output
    # the gated benchmark did not run on a host whose checks did not all finish
    assert "test_benchmark" in output and "PASSED test_bench" not in output


def test_the_log_of_a_worker_says_what_it_started(tmp_path: Path) -> None:
    from pytest_gpuhost.plugin.workers import DoneLog

    gw0, gw1 = DoneLog(tmp_path, "gw0"), DoneLog(tmp_path, "gw1")
    gw0.start(0)
    gw0.mark(0, "open passed a")
    gw0.start(1)
    gw1.start(2)
    (tmp_path / "down-gw0").write_text("worker gw0 crashed: exit 3")
    progress = gw1.read()
    assert progress.done == {0: "open passed a"}
    assert progress.lost([1, 2]) == [1]  # gw1's own check 2 is still running
    assert gw1.wait_for([0, 1], timeout=5) == [1]


DIES = "        os._exit(3)  # the worker dies mid-check, as a segfault in a driver call would\n"
DIES_ONCE = textwrap.indent(textwrap.dedent("""\
    flag = Path(__file__).with_name("crashed")
    try:  # once, in one worker: the replacement worker's run of it passes
        os.close(os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return Observation("1")
    os._exit(3)
    """), " " * 8)
ONE_TREE_PER_TARGET = textwrap.dedent("""
    from pytest_gpuhost.host import LocalHost

    @hookimpl(tryfirst=True)
    def pytest_gpuhost_make_host(url, settings):
        # ssh://fake/NAME: the fake tree NAME next to this file, as if reached over ssh
        if url.startswith("ssh://fake/"):
            return LocalHost(Path(__file__).parent / url.split("/")[3].split("?")[0])
        return None
    """)
assert DIES in CRASHING_KIND
CRASHING_ONCE = "from pathlib import Path\n" + CRASHING_KIND.replace(DIES, DIES_ONCE) + \
    ONE_TREE_PER_TARGET


def test_a_check_that_crashed_its_worker_is_an_error_and_is_not_run_again(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """With targets, xdist schedules each target's checks as one scope and runs a crashed
    worker's unfinished checks on its replacement, but not the one it crashed on (it ran it
    again, and a check that crashes every time killed each replacement in turn): that one is
    an error in every report, which said every check passed (NPD: exit 0) when its run on the
    new worker passed."""
    for name in ("a", "b"):
        FakeHost(pytester.path / name).sysctl("vm.swappiness", 10).kmsg([(6, "hello")])
    pytester.makeconftest(CRASHING_ONCE)
    pytester.makefile(".yaml", spec="version: 1\ncrash: 1\nsysctl:\n  vm.swappiness: 10\n")
    targets = ["--gpuhost-target=ssh://fake/a?name=a", "--gpuhost-target=ssh://fake/b?name=b"]
    result = pytester.runpytest_subprocess(
        "spec.yaml", *targets, "-n", "2", "--gpuhost-report=out.json", "-p",
        "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*worker 'gw*' crashed while running 'spec.yaml::crash@*'*"])
    report = json.loads((pytester.path / "out.json").read_text())
    crashed = [c for c in report["checks"] if c["outcome"] != "passed"]
    assert [c["id"] for c in crashed] == ["crash"], report["checks"]
    assert crashed[0]["outcome"] == "error"
    assert "crashed while running" in crashed[0]["message"]
    assert "never reported" in crashed[0]["message"]  # not run again on the new worker
    (pytester.path / "crashed").unlink()
    # NPD speaks for this node: its crash, on this machine's tree (remote targets alone are
    # refused, as they are not this node)
    npd = pytester.runpytest_subprocess("spec.yaml", "--gpuhost-root=a", "-n", "2",
                                        "--gpuhost-npd", "-p", "no:cacheprovider", timeout=120)
    assert npd.ret == 1 and npd.outlines == ["gpuhost: 1 failed: crash"]


def test_a_worker_that_dies_before_its_check_starts_ends_the_waits_too(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """A worker dies in another plugin's setup hook, before the check says it started: xdist
    reports the check as crashed and sends the dead worker's other checks to the live workers,
    behind the last-ranked checks already waiting there for them. Waiting on would end only at
    the 900 s timeout; the waiters stop at once, say why, and the re-queued checks still run."""
    fake.sysctls({f"kernel.k{n}": n for n in range(40)}).kmsg([(6, "hello")])
    crasher = crash_worker_at(pytester, "spec.yaml::sysctl[kernel.k3]", "pytest_runtest_setup")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" +
                      "".join(f"  kernel.k{n}: {n}\n" for n in range(40)) + "dmesg: {}\n")
    result = pytester.runpytest_subprocess(  # the timeout: far short of the 900 s wait
        *crasher, "spec.yaml", f"--gpuhost-root={fake.root}", "-n", "2",
        "--gpuhost-report=out.json", "-p", "no:cacheprovider", "--max-worker-restart=4",
        timeout=240)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert len(outcomes) == 41
    assert outcomes.pop("sysctl[kernel.k3]") == "error"
    dmesg = outcomes.pop("dmesg")
    assert set(outcomes.values()) == {"passed"}  # every other check ran, before or after
    if dmesg == "error":  # it was waiting when the worker died
        [message] = [c["message"] for c in report["checks"] if c["id"] == "dmesg"]
        assert "because an xdist worker went down (worker gw" in message
        assert "sysctl[kernel.k3]" in message


def test_checks_xdist_never_gave_out_say_they_did_not_run_and_why(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """With --max-worker-restart=0 xdist stops giving out checks after the first crash: those
    checks did not run, which their records say (not 'went down while it ran'), naming the
    check the worker crashed on."""
    fake.sysctls({f"kernel.k{n}": n for n in range(40)}).kmsg([(6, "hello")])
    crasher = crash_worker_at(pytester, "spec.yaml::sysctl[kernel.k3]")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" +
                      "".join(f"  kernel.k{n}: {n}\n" for n in range(40)))
    result = pytester.runpytest_subprocess(
        *crasher, "spec.yaml", f"--gpuhost-root={fake.root}", "-n", "2",
        "--gpuhost-report=out.json", "-p", "no:cacheprovider", "--max-worker-restart=0",
        "--junitxml=junit.xml", "-o", "junit_logging=system-out", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out.json").read_text())
    records = {check["id"]: check for check in report["checks"]}
    assert len(records) == 40
    assert "crashed while running 'spec.yaml::sysctl[kernel.k3]'" in \
        records["sysctl[kernel.k3]"]["message"]
    not_run = [r for r in records.values() if r["message"].startswith("not run: ")]
    assert not_run and {r["outcome"] for r in not_run} == {"error"}
    assert all("no xdist worker started it after worker gw" in r["message"] and
               "--max-worker-restart" in r["message"] and
               "see spec.yaml::sysctl[kernel.k3], then run again" in r["message"]
               for r in not_run), not_run[0]["message"]
    assert not any("went down while it ran" in r["message"] for r in records.values())
    assert {r["outcome"] for r in records.values()} <= {"passed", "error"}
    # JUnit too: every check a test case, once; those never run an <error> that says why,
    # with the check's facts (the one xdist reported crashing its worker is xdist's own)
    assert_valid_junit(pytester.path / "junit.xml")
    cases = {case.get("name"): case for case in ET.parse(pytester.path / "junit.xml").iter(
        "testcase")}
    assert len(cases) == 40 and set(cases) == {f"sysctl[kernel.k{n}]" for n in range(40)}
    for record in not_run:
        [error] = cases[record["id"]].findall("error")
        assert "no xdist worker started it" in (error.text or "")
        assert "gpuhost.outcome: error" in (cases[record["id"]].findtext("system-out") or "")
    assert cases["sysctl[kernel.k3]"].findall("failure") + cases["sysctl[kernel.k3]"].findall(
        "error")


DIES_COLLECTING = textwrap.dedent("""\
    import os
    from pathlib import Path

    from pytest_gpuhost.hookspecs import hookimpl
    from pytest_gpuhost.host import LocalHost

    @hookimpl(tryfirst=True)
    def pytest_gpuhost_make_host(url, settings):
        # ssh://fake/NAME: the fake tree NAME next to this file, as if reached over ssh
        if url.startswith("ssh://fake/"):
            return LocalHost(Path(__file__).parent / url.split("/")[3].split("?")[0])
        return None

    def pytest_collection_modifyitems(items):
        # the worker that collects target b dies before it sends its collection
        if "PYTEST_XDIST_WORKER" in os.environ and any(i.nodeid.endswith("@b")
                                                       for i in items):
            os._exit(3)
    """)


def two_targets_run(pytester: pytest.Pytester, conftest: str, *args: str) -> pytest.RunResult:
    """A run of two remote targets, a and b (fake trees, as if over ssh), at -n 2, with
    ``conftest`` deciding how their workers fare."""
    for name in ("a", "b"):
        FakeHost(pytester.path / name).sysctl("vm.swappiness", 10)
    pytester.makeconftest(conftest)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    targets = ["--gpuhost-target=ssh://fake/a?name=a", "--gpuhost-target=ssh://fake/b?name=b"]
    return pytester.runpytest_subprocess(
        "spec.yaml", *targets, "-n", "2", "--gpuhost-report=out.json", "-p",
        "no:cacheprovider", *args, timeout=120)


@pytest.mark.parametrize("restarts", ["0", "2"])
def test_a_target_whose_worker_died_collecting_it_is_an_error_not_left_out(
        pytester: pytest.Pytester, restarts: str) -> None:
    """Under the target scheduler each worker collects its own targets: one that dies while
    it collects (every replacement dying the same way, until xdist gives up) never sends
    its collection, so no process ever collected that target's checks. They are errors in
    every report and the run fails; the reports had left the target out, and a run whose
    other target passed exited 0."""
    result = two_targets_run(pytester, DIES_COLLECTING, f"--max-worker-restart={restarts}",
                             "--junitxml=junit.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["kind    a*b", "sysctl  *1 error"])
    report = json.loads((pytester.path / "out.json").read_text())
    of_b = [c for c in report["checks"] if c["target"] == "b"]
    assert [(c["id"], c["outcome"]) for c in of_b] == [("sysctl", "error")], report["checks"]
    assert of_b[0]["message"].startswith("not run: no xdist worker collected the checks of "
                                         "b: worker gw"), of_b[0]["message"]
    assert report["summary"]["error"] >= 1
    assert_valid_junit(pytester.path / "junit.xml")
    cases = {case.get("name"): case for case in ET.parse(pytester.path / "junit.xml").iter(
        "testcase")}
    [error] = cases["sysctl@b"].findall("error")
    assert "no xdist worker collected the checks of b" in (error.text or "")
    assert len(cases) == 2
    assert "crashed" in of_b[0]["message"]
    if "sysctl@a" in cases:  # xdist ended the run before a's worker sent its collection
        [error] = cases["sysctl@a"].findall("error")
        assert "no xdist worker collected the checks of a: xdist ended worker gw" in \
            (error.text or "")
        assert "before it took its collection" in (error.text or "")
    else:
        [of_a] = [case for name, case in cases.items()
                  if (name or "").startswith("sysctl[vm.swappiness]")]
        assert not of_a.findall("error")


SLOW_TO_COLLECT = DIES_COLLECTING + textwrap.dedent("""\
    import time

    def pytest_testnodedown(node, error):
        # the controller: a worker crashed (written before xdist acts on the crash)
        if error is not None:
            (Path(__file__).parent / "crashed").touch()

    dies_collecting_b = pytest_collection_modifyitems

    def pytest_collection_modifyitems(items):
        # the worker that collects target a sends its collection only once the controller
        # has heard of the other worker's crash (bounded: the test's own timeout is longer)
        dies_collecting_b(items)
        if "PYTEST_XDIST_WORKER" in os.environ and any(i.nodeid.endswith("@a")
                                                       for i in items):
            deadline = time.monotonic() + 60
            while not (Path(__file__).parent / "crashed").exists() and \\
                    time.monotonic() < deadline:
                time.sleep(0.01)
    """)


def test_a_target_whose_collection_xdist_never_took_says_so(pytester: pytest.Pytester) -> None:
    """With restarts off, xdist ends the run at the first crash and takes no collection that
    comes in after it: the other target's worker did not crash, and its record says what
    happened to it, not the other worker's crash."""
    result = two_targets_run(pytester, SLOW_TO_COLLECT, "--max-worker-restart=0")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    report = json.loads((pytester.path / "out.json").read_text())
    messages = {check["target"]: check["message"] for check in report["checks"]}
    assert messages["b"].startswith("not run: no xdist worker collected the checks of b: "
                                    "worker gw"), messages["b"]
    assert "crashed" in messages["b"]
    assert messages["a"].startswith("not run: no xdist worker collected the checks of a: "
                                    "xdist ended worker gw"), messages["a"]
    assert "before it took its collection" in messages["a"]


def test_a_check_that_kills_its_worker_is_not_given_to_the_next_one(
        pytester: pytest.Pytester) -> None:
    """A check that kills every worker that runs it (a driver call that segfaults each time),
    on remote targets: it was given again to each replacement worker, which died on it too,
    until xdist stopped replacing them (9 crashes: JUnit held the check 9 times, the targets'
    other checks were never run and Allure lost them). Now each target's crashing check is
    its error record, once, and every other check runs: every report holds every check once,
    Allure included."""
    for name in ("a", "b"):
        FakeHost(pytester.path / name).sysctl("vm.swappiness", 10).sysctl("vm.dirty_ratio", 10)
    pytester.makeconftest("from pathlib import Path\n" + CRASHING_KIND + ONE_TREE_PER_TARGET)
    pytester.makefile(".yaml", spec="version: 1\ncrash: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "  vm.dirty_ratio: 10\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", "--gpuhost-target=ssh://fake/a?name=a",
        "--gpuhost-target=ssh://fake/b?name=b", "-n", "2", "--gpuhost-report=out.json",
        "--junitxml=junit.xml", "--alluredir=allure", "-p", "no:cacheprovider", timeout=240)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    crashes = [line for line in result.stdout.lines if line.startswith("worker 'gw")]
    assert len(crashes) == 2, out  # once a target
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = sorted((c["target"], c["id"], c["outcome"]) for c in report["checks"])
    assert outcomes == [(target, check, "error" if check == "crash" else "passed")
                        for target in ("a", "b") for check in
                        ("crash", "sysctl[vm.dirty_ratio]", "sysctl[vm.swappiness]")], outcomes
    for check in report["checks"]:
        if check["id"] == "crash":
            assert "crashed while running 'spec.yaml::crash@" in check["message"], check
    assert_valid_junit(pytester.path / "junit.xml")
    cases = [case.get("name") for case in ET.parse(pytester.path / "junit.xml").iter("testcase")]
    assert len(cases) == len(set(cases)) == 6, cases  # each check once
    assert {"crash@a", "crash@b"} <= set(cases), cases
    allure = [json.loads(path.read_text())
              for path in (pytester.path / "allure").glob("*-result.json")]
    names = sorted(result["name"] for result in allure)
    assert len(names) == len(set(names)) == 6, names
    assert [r["status"] for r in allure if r["name"].startswith("crash")] == ["broken"] * 2


def test_a_check_that_crashed_its_worker_on_this_machine_is_in_allure(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """allure-pytest writes a test's result in its worker: one that died on the check wrote
    none, and Allure lost the check every other report counts as an error."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makeconftest(CRASHING_KIND)
    pytester.makefile(".yaml", spec="version: 1\ncrash: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", f"--gpuhost-root={fake.root}", "-n", "2", "--alluredir=allure",
        "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    allure = {json.loads(path.read_text())["name"]: json.loads(path.read_text())
              for path in (pytester.path / "allure").glob("*-result.json")}
    assert sorted(allure) == ["crash", "sysctl[vm.swappiness]"], sorted(allure)
    assert allure["crash"]["status"] == "broken"
    assert "crashed while running 'spec.yaml::crash'" in \
        allure["crash"]["statusDetails"]["message"]
    assert {"name": "gpuhost_outcome", "value": "error"} in allure["crash"]["labels"]
