"""The host state of a run, as whole runs see it: the JSON report's ``state``, the
``gpuhost_state`` fixture (alone, under -p no:benchmark, under -n 2), pytest-benchmark's saved
``machine_info["gpuhost"]`` and ``--benchmark-compare``, --fix, JUnit and Allure."""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, FIXTURES

pytest_plugins = ["pytester"]

SPEC = """version: 1
name: node
sysctl:
  vm.swappiness: 10
  net.core.rmem_max: {min: 16777216}
  net.core.wmem_max: {min: 16777216}
"""

BENCH = """
import pytest

pytestmark = pytest.mark.gpuhost

def test_sum(benchmark, gpuhost_state):
    benchmark.pedantic(sum, args=(range(100),), rounds=3, iterations=1)
    with open("fixture-digest.txt", "w") as out:
        out.write(gpuhost_state["digest"])
"""

PLAIN_BENCH = """
def test_plain_sum(benchmark):
    benchmark.pedantic(sum, args=(range(100),), rounds=3, iterations=1)
"""

STATE_TEST = """
import json, os

def test_state(gpuhost_state):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"state-{{worker}}-{{os.getpid()}}.json", "w") as out:
        json.dump(gpuhost_state.as_dict(), out)
{more}"""

DIFFERENT = "machine_info is different"


@pytest.fixture
def node(pytester: pytest.Pytester, fake: FakeHost) -> FakeHost:
    fake.sysctls({"vm.swappiness": 10, "net.core.rmem_max": 16777216,
                  "net.core.wmem_max": 16777216})
    pytester.makefile(".yaml", node=SPEC)
    return fake


def state_of(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(path.read_text())["state"]
    return state


def saved(pytester: pytest.Pytester) -> list[dict[str, Any]]:
    """pytest-benchmark's saved files (--benchmark-autosave), oldest first."""
    files = sorted((pytester.path / ".benchmarks").glob("*/*.json"))
    return [json.loads(path.read_text()) for path in files]


def output(result: pytest.RunResult) -> str:
    return "\n".join([*result.outlines, *result.errlines])


def test_a_gated_benchmark_saves_the_state_and_a_comparison_names_what_changed(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    pytester.makepyfile(test_bench=BENCH, test_plain_bench=PLAIN_BENCH)
    args = ("test_bench.py", "node.yaml", f"--gpuhost-root={node.root}", "-p", "no:cacheprovider")
    first = pytester.runpytest_subprocess(*args, "--benchmark-autosave",
                                          "--benchmark-json=b1.json", "--gpuhost-report=r1.json")
    assert first.ret == pytest.ExitCode.OK, output(first)
    digest = state_of(pytester.path / "r1.json")["digest"]
    assert len(digest) == 64
    [one] = saved(pytester)
    assert one["machine_info"]["gpuhost"]["digest"] == digest
    assert json.loads((pytester.path / "b1.json").read_text())["machine_info"]["gpuhost"] == \
        one["machine_info"]["gpuhost"] == state_of(pytester.path / "r1.json")
    assert (pytester.path / "fixture-digest.txt").read_text() == digest

    same = pytester.runpytest_subprocess(*args, "--benchmark-autosave", "--benchmark-compare",
                                         "--gpuhost-report=r2.json")
    assert same.ret == pytest.ExitCode.OK, output(same)
    assert state_of(pytester.path / "r2.json")["digest"] == digest
    same.stdout.fnmatch_lines(["*= gpuhost: host state of the compared benchmark =*",
                               f"0001_*.json: same host state ({digest[:12]})"])
    assert DIFFERENT not in output(same)

    node.sysctl("net.core.rmem_max", 33554432)  # still passing its spec
    changed = pytester.runpytest_subprocess(*args, "--benchmark-compare=0002",
                                            "--gpuhost-report=r3.json")
    assert changed.ret == pytest.ExitCode.OK, output(changed)  # a change is not a failure
    new = state_of(pytester.path / "r3.json")["digest"]
    assert new != digest
    changed.stdout.fnmatch_lines([
        "*= gpuhost: host state of the compared benchmark =*",
        f"0002_*.json: host state differs ({digest[:12]} in the compared result, {new[:12]} "
        "in this run): 1 check changed",
        "  sysctl[net.core.rmem_max]: 16777216 -> 33554432",
        "=*"])
    assert DIFFERENT not in output(changed)
    # Without pytest-gpuhost, pytest-benchmark does warn about that very field: the check
    # above could fail.
    bare = pytester.runpytest_subprocess("test_plain_bench.py", "-p", "no:gpuhost",
                                         "-p", "no:cacheprovider", "--benchmark-compare=0001")
    assert DIFFERENT in output(bare) and '"gpuhost": {"digest"' in output(bare)


def test_a_run_without_host_checks_compares_without_the_warning_and_says_so(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    pytester.makepyfile(test_bench=BENCH, test_plain_bench=PLAIN_BENCH)
    first = pytester.runpytest_subprocess("test_bench.py", "node.yaml",
                                          f"--gpuhost-root={node.root}", "--benchmark-autosave")
    assert first.ret == pytest.ExitCode.OK, output(first)
    digest = saved(pytester)[0]["machine_info"]["gpuhost"]["digest"]
    plain = pytester.runpytest_subprocess("test_plain_bench.py", "--benchmark-compare",
                                          "--benchmark-autosave")
    assert plain.ret == pytest.ExitCode.OK, output(plain)
    assert DIFFERENT not in output(plain)
    plain.stdout.fnmatch_lines([f"0001_*.json: taken under host state {digest[:12]}; this run "
                                "checked no host (no gpuhost spec, or no host check selected),"
                                " so nothing says the host is the same"])
    assert "gpuhost" not in saved(pytester)[1]["machine_info"]  # nothing to vouch for
    gated = pytester.runpytest_subprocess("test_bench.py", "node.yaml",
                                          f"--gpuhost-root={node.root}",
                                          "--benchmark-compare=0002")
    assert gated.ret == pytest.ExitCode.OK, output(gated)
    assert DIFFERENT not in output(gated)
    gated.stdout.fnmatch_lines([f"0002_*.json: saved without a gpuhost host state (by a run "
                                f"without host checks); this run's is {digest[:12]}"])


def test_a_comparison_names_twenty_changes_then_counts_and_says_one_sided_checks(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    keys = [f"net.ipv4.conf.eth{n:02}.rp_filter" for n in range(25)]
    fake.sysctls(dict.fromkeys(keys, 1))
    pytester.makefile(".yaml", node="version: 1\nname: node\nsysctl:\n" +
                      "".join(f"  {key}: {{max: 2}}\n" for key in keys))
    pytester.makepyfile(test_bench=BENCH)
    args = ("test_bench.py", "node.yaml", f"--gpuhost-root={fake.root}")
    assert pytester.runpytest_subprocess(*args, "--benchmark-autosave").ret == 0
    fake.sysctls(dict.fromkeys(keys, 2)).sysctl("vm.swappiness", 10)
    spec = pytester.path / "node.yaml"
    spec.write_text(spec.read_text().rstrip("\n") + "\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(*args, "--benchmark-compare")
    assert result.ret == pytest.ExitCode.OK, output(result)
    lines = result.stdout.lines
    start = next(i for i, line in enumerate(lines) if "host state differs" in line)
    assert lines[start].endswith("26 checks changed")
    assert lines[start + 1:start + 22] == [
        *(f"  sysctl[{key}]: 1 -> 2" for key in keys[:20]), "  and 6 more"]
    assert lines[start + 22].startswith("spec: node (")  # the spec changed too


def test_fix_in_the_same_run_gives_the_state_of_an_already_fixed_host(
        pytester: pytest.Pytester, example_host: Path, tmp_path: Path) -> None:
    untouched = tmp_path / "untouched"
    shutil.copytree(example_host, untouched, symlinks=True)
    pytester.makepyfile(test_state=STATE_TEST.format(more=""))
    args = ("test_state.py", "--gpuhost-spec=blackwell8", "-p", "no:cacheprovider")
    before = pytester.runpytest(*args, f"--gpuhost-root={untouched}", "--gpuhost-report=0.json")
    assert before.ret == pytest.ExitCode.TESTS_FAILED
    fixing = pytester.runpytest(*args, f"--gpuhost-root={example_host}", "--fix",
                                "--gpuhost-report=1.json")
    assert fixing.parseoutcomes()["fixed"] == 45
    [written] = pytester.path.glob("state-main-*.json")
    in_the_fix_run = json.loads(written.read_text())  # the fixture's, before a later run's
    fixed = pytester.runpytest(*args, f"--gpuhost-root={example_host}",
                               "--gpuhost-report=2.json")
    assert "fixed" not in fixed.parseoutcomes()  # the host was fixed already
    states = [state_of(pytester.path / f"{n}.json") for n in range(3)]
    assert states[1]["digest"] == states[2]["digest"] == in_the_fix_run["digest"]
    assert states[0]["digest"] != states[1]["digest"]
    # What a fix set is in it, and its outcomes are counted as they were.
    checks = states[1]["targets"]["local"]["checks"]
    assert checks["pcie.max_read_request[0000:01:00.0]"] == "4096"
    assert states[0]["targets"]["local"]["checks"]["pcie.max_read_request[0000:01:00.0]"] == \
        "512"
    assert states[1]["targets"]["local"]["outcomes"]["fixed"] == 45
    assert states[2]["targets"]["local"]["outcomes"]["fixed"] == 0
    # The bandwidths were measured after the fixes: beside the digest, never in it.
    measured = states[1]["targets"]["local"]["measured"]
    assert len([key for key in measured if key.startswith("p2p[")]) == 56
    assert not [key for key in checks if key.startswith(("p2p", "dmesg", "pcie.aer"))]
    assert "module[nvidia_peermem]" in states[1]["targets"]["local"]["failing"]


def test_the_fixture_without_pytest_benchmark(pytester: pytest.Pytester,
                                              node: FakeHost) -> None:
    pytester.makepyfile(test_state=STATE_TEST.format(more=""))
    result = pytester.runpytest_subprocess("test_state.py", "node.yaml",
                                           f"--gpuhost-root={node.root}", "-p", "no:benchmark",
                                           "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK, output(result)
    [written] = pytester.path.glob("state-main-*.json")
    state = json.loads(written.read_text())
    assert state == state_of(pytester.path / "r.json")
    assert state["spec"]["name"] == "node"
    assert state["targets"]["local"]["checks"] == {
        "sysctl[net.core.rmem_max]": "16777216", "sysctl[net.core.wmem_max]": "16777216",
        "sysctl[vm.swappiness]": "10"}


def test_the_fixture_under_xdist_waits_for_every_workers_checks(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    keys = [f"net.ipv4.conf.eth{n:02}.rp_filter" for n in range(30)]
    fake.sysctls(dict.fromkeys(keys, 1))
    pytester.makefile(".yaml", node="version: 1\nname: node\nsysctl:\n" +
                      "".join(f"  {key}: 1\n" for key in keys))
    more = "".join(f"\ndef test_state_{n}(gpuhost_state):\n    test_state(gpuhost_state)\n"
                   for n in range(3))
    pytester.makepyfile(test_state=STATE_TEST.format(more=more))
    result = pytester.runpytest_subprocess("test_state.py", "node.yaml",
                                           f"--gpuhost-root={fake.root}", "-n", "2", "-v",
                                           "-p", "no:cacheprovider", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK, output(result)
    ran_checks = {line.split("]", 1)[0] for line in result.stdout.lines
                  if line.startswith("[gw") and "node.yaml::" in line}
    assert ran_checks == {"[gw0", "[gw1"}  # the host checks were shared out
    expected = state_of(pytester.path / "r.json")
    assert len(expected["targets"]["local"]["checks"]) == 30
    written = list(pytester.path.glob("state-gw*.json"))
    assert {path.name.split("-")[1] for path in written} == {"gw0", "gw1"}
    for path in written:  # one per worker (session scope): each holds every worker's checks
        assert json.loads(path.read_text()) == expected


def test_the_fixture_without_a_spec_is_an_error_saying_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_state=STATE_TEST.format(more=""))
    result = pytester.runpytest("test_state.py")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gpuhost_state: no host was checked in this run: pass "
                                 "--gpuhost-spec=FILE*"])


def test_the_fixture_without_a_selected_host_check_is_an_error(pytester: pytest.Pytester,
                                                               node: FakeHost) -> None:
    pytester.makepyfile(test_state=STATE_TEST.format(more=""))
    result = pytester.runpytest("test_state.py", "node.yaml", f"--gpuhost-root={node.root}",
                                "-k", "test_state")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*gpuhost_state: no host check was selected*"])


def test_the_fixture_waits_for_the_checks_and_does_not_gate(pytester: pytest.Pytester,
                                                             node: FakeHost) -> None:
    """Named before the spec, the test still runs after every host check; on a host that
    fails its spec it runs (the gate is the marker's or --gpuhost-gate's) and the state says
    what failed."""
    node.sysctl("vm.swappiness", 60)
    pytester.makepyfile(test_state=STATE_TEST.format(more=""))
    result = pytester.runpytest("test_state.py", "node.yaml", f"--gpuhost-root={node.root}",
                                "-v")
    result.assert_outcomes(passed=3, failed=1)
    order = [line for line in result.stdout.lines if "::" in line and "%]" in line]
    assert "test_state.py::test_state" in order[-1]
    [written] = pytester.path.glob("state-main-*.json")
    local = json.loads(written.read_text())["targets"]["local"]
    assert local["failing"] == ["sysctl[vm.swappiness]"]
    assert local["checks"]["sysctl[vm.swappiness]"] == "60"


def test_junit_suite_properties_hold_the_spec_and_the_digest_where_xunit2_allows(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    xmlschema = pytest.importorskip("xmlschema")
    result = pytester.runpytest("node.yaml", f"--gpuhost-root={node.root}",
                                "--junitxml=junit.xml", "-o", "junit_family=xunit2",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK
    state = state_of(pytester.path / "r.json")
    tree = ET.parse(pytester.path / "junit.xml")
    suite = tree.getroot().find("testsuite")
    assert suite is not None
    properties = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert properties == {"gpuhost.spec": "node", "gpuhost.spec.digest": state["spec"]["digest"],
                          "gpuhost.state.digest": state["digest"]}
    # The suite's <properties> is where the schema allows them; a test case's (the checks'
    # own, pytest's record_property) it does not allow, and they are left out of this proof.
    for case in suite.findall("testcase"):
        for element in case.findall("properties"):
            case.remove(element)
    schema = xmlschema.XMLSchema(FIXTURES / "junit-10.xsd")
    schema.validate(ET.tostring(tree.getroot(), encoding="unicode"))


def test_allure_environment_holds_the_spec_and_the_state_digest(pytester: pytest.Pytester,
                                                                 node: FakeHost) -> None:
    result = pytester.runpytest("node.yaml", f"--gpuhost-root={node.root}", "--alluredir=al",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK
    state = state_of(pytester.path / "r.json")
    lines = (pytester.path / "al" / "environment.properties").read_text().splitlines()
    assert f"state.digest={state['digest']}" in lines
    assert f"spec.digest={state['spec']['digest']}" in lines
    assert "spec=node" in lines


def test_a_report_of_a_run_without_a_state_says_null(pytester: pytest.Pytester,
                                                     node: FakeHost) -> None:
    result = pytester.runpytest("node.yaml", f"--gpuhost-root={node.root}", "-k", "nothing",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert json.loads((pytester.path / "r.json").read_text())["state"] is None


def test_the_bundled_spec_digest_is_its_files(pytester: pytest.Pytester,
                                              example_host: Path) -> None:
    import hashlib

    result = pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                                "-k", "sysctl", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert state_of(pytester.path / "r.json")["spec"] == {
        "name": "blackwell8", "digest": hashlib.sha256(BLACKWELL8.read_bytes()).hexdigest()}


TIMER = """
import os

_now = 0.0


def tick():
    '''A clock that advances TICK seconds a reading: a benchmark's time is set, not measured.'''
    global _now
    _now += float(os.environ["TICK"])
    return _now
"""


def test_a_performance_regression_still_says_whether_the_host_changed(
        pytester: pytest.Pytester, node: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_bench=BENCH, faketimer=TIMER)
    args = ("test_bench.py", "node.yaml", f"--gpuhost-root={node.root}",
            "--benchmark-timer=faketimer.tick")
    monkeypatch.setenv("TICK", "0.001")
    assert pytester.runpytest_subprocess(*args, "--benchmark-autosave").ret == 0
    node.sysctl("net.core.wmem_max", 33554432)
    monkeypatch.setenv("TICK", "0.01")  # ten times slower
    result = pytester.runpytest_subprocess(*args, "--benchmark-compare",
                                           "--benchmark-compare-fail=min:5%")
    assert "Performance has regressed" in output(result)
    assert result.ret != pytest.ExitCode.OK  # pytest-benchmark's verdict, not ours
    result.stdout.fnmatch_lines(["*= gpuhost: host state of the compared benchmark =*",
                                 "0001_*.json: host state differs (* 1 check changed",
                                 "  sysctl[net.core.wmem_max]: 16777216 -> 33554432"])


EDITS_THE_SPEC = """
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpuhost


def test_edit_the_spec_then_read_the_state(benchmark, gpuhost_state):
    benchmark.pedantic(sum, args=(range(10),), rounds=1, iterations=1)
    spec = Path("node.yaml")
    spec.write_text(spec.read_text() + "  vm.dirty_ratio: 5\\n")  # edited while the run goes on
    Path("fixture-spec.json").write_text(json.dumps(dict(gpuhost_state["spec"])))
"""


def test_the_spec_digest_is_of_the_spec_that_ran_not_the_file_at_the_end(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    import hashlib

    loaded = hashlib.sha256((pytester.path / "node.yaml").read_bytes()).hexdigest()
    pytester.makepyfile(test_edit=EDITS_THE_SPEC)
    result = pytester.runpytest_subprocess("node.yaml", "test_edit.py",
                                           f"--gpuhost-root={node.root}", "-p",
                                           "no:cacheprovider", "--benchmark-json=b.json",
                                           "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK, output(result)
    assert "vm.dirty_ratio" in (pytester.path / "node.yaml").read_text()  # it was edited
    spec = {"name": "node", "digest": loaded}
    assert json.loads((pytester.path / "fixture-spec.json").read_text()) == spec
    assert state_of(pytester.path / "r.json")["spec"] == spec
    benchmark = json.loads((pytester.path / "b.json").read_text())
    assert benchmark["machine_info"]["gpuhost"]["spec"] == spec


def test_runs_that_reached_no_host_or_skipped_every_check_never_compare_the_same(
        pytester: pytest.Pytester, node: FakeHost, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two machines neither of which was reached, and a run whose checks were all skipped:
    each state says it read nothing, and ``state diff`` never calls two of them the same."""
    from pytest_gpuhost.state import main

    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host port 22: No route to "
                               "host' >&2\nexit 255\n")
    (tools / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    for name in ("gpu1", "gpu2"):
        result = pytester.runpytest("node.yaml", f"--gpuhost-target=ssh://root@{name}",
                                    f"--gpuhost-report={name}.json", "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.TESTS_FAILED
        state = state_of(pytester.path / f"{name}.json")
        assert state["unread"] == [name] and state["targets"][name]["read"] == 0
    pytester.makefile(".yaml", skipped="version: 1\nname: node\nsysctl:\n"
                      "  vm.swappiness: {value: 10, when: container}\n")
    skipped = pytester.runpytest("skipped.yaml", f"--gpuhost-root={node.root}",
                                 "--gpuhost-report=skipped.json", "-p", "no:cacheprovider")
    assert skipped.ret == pytest.ExitCode.OK  # a skip is no failure, and vouches for nothing
    assert state_of(pytester.path / "skipped.json")["unread"] == ["local"]
    read = pytester.runpytest("node.yaml", f"--gpuhost-root={node.root}",
                              "--gpuhost-report=read.json", "-p", "no:cacheprovider")
    assert read.ret == pytest.ExitCode.OK
    assert state_of(pytester.path / "read.json")["unread"] == []

    def diff(old: str, new: str) -> int:
        return main(["diff", str(pytester.path / old), str(pytester.path / new)])

    assert diff("gpu1.json", "gpu2.json") == 4
    assert diff("gpu1.json", "skipped.json") == 4
    assert diff("skipped.json", "skipped.json") == 4
    assert diff("read.json", "gpu2.json") == 1
    assert diff("skipped.json", "read.json") == 1
    assert diff("read.json", "read.json") == 0


def test_a_comparison_under_xdist_warns_of_no_worker_s_machine_info_for_the_state_alone(
        pytester: pytest.Pytester, node: FakeHost) -> None:
    """Each xdist worker configures pytest-benchmark and compares ``machine_info`` itself: the
    ``gpuhost`` field is taken out of its comparison too, with a spec and without one."""
    pytester.makepyfile(test_bench=BENCH, test_plain_bench=PLAIN_BENCH)
    args = ("test_bench.py", "node.yaml", f"--gpuhost-root={node.root}", "-p", "no:cacheprovider")
    first = pytester.runpytest_subprocess(*args, "--benchmark-autosave")
    assert first.ret == pytest.ExitCode.OK, output(first)
    assert "gpuhost" in saved(pytester)[0]["machine_info"]
    gated = pytester.runpytest_subprocess(*args, "-n", "2", "--benchmark-compare")
    assert gated.ret == pytest.ExitCode.OK, output(gated)
    assert DIFFERENT not in output(gated)
    plain = pytester.runpytest_subprocess("test_plain_bench.py", "-n", "2", "-p",
                                          "no:cacheprovider", "--benchmark-compare")
    assert plain.ret == pytest.ExitCode.OK, output(plain)
    assert DIFFERENT not in output(plain)
    # the check can fail: a field of its own in the saved file is still warned of by each
    data = pytester.path / ".benchmarks"
    [path] = data.glob("*/*.json")
    changed = json.loads(path.read_text())
    changed["machine_info"]["node"] = "elsewhere"
    path.write_text(json.dumps(changed))
    other = pytester.runpytest_subprocess(*args, "-n", "2", "--benchmark-compare")
    assert DIFFERENT in output(other)
