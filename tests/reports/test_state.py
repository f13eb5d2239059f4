"""The host state and its digest, comparing two, and ``python -m pytest_gpuhost.state diff``
(pytest-free: built from entries, read from files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.state import (
    LIMIT,
    MAX_FILE_BYTES,
    Entry,
    HostState,
    build,
    changes,
    diff_lines,
    entries_of,
    main,
    read_state,
    spec_digest,
)

SPEC = [spec_digest("node", b"version: 1\nname: node\n")]


def entry(check_id: str, observed: str | None, outcome: str = "passed", *,
          target: str = "local", measured: bool = False) -> Entry:
    return Entry(check_id, target, observed, outcome, measured)


BASE = [entry("sysctl[net.core.rmem_max]", "16777216"), entry("sysctl[vm.swappiness]", "10"),
        entry("p2p[0000:01:00.0->0000:21:00.0]", "52.1", measured=True),
        entry("cpufreq.epp", None, "skipped")]


def test_the_digest_is_over_ids_and_observed_values_only() -> None:
    state = build(BASE, SPEC)
    assert len(state["digest"]) == 64 and state["digest"] == state["targets"]["local"]["digest"]
    # Another order, other outcomes, another measurement, another spec: the same digest.
    again = build([
        entry("cpufreq.epp", None, "error"),
        entry("p2p[0000:01:00.0->0000:21:00.0]", "17.3", "failed", measured=True),
        entry("sysctl[vm.swappiness]", "10", "fixed"),
        entry("sysctl[net.core.rmem_max]", "16777216", "failed")],
        [spec_digest("other", b"version: 1\n")])
    assert again["digest"] == state["digest"]
    assert again["spec"] != state["spec"]
    # A value, an id, a check more or less: another digest.
    changed = [entry("sysctl[net.core.rmem_max]", "33554432"), *BASE[1:]]
    assert build(changed, SPEC)["digest"] != state["digest"]
    assert build(BASE[:-1], SPEC)["digest"] != state["digest"]
    assert build([*BASE, entry("module[nouveau]", "absent")], SPEC)["digest"] != \
        state["digest"]


def test_the_state_counts_outcomes_lists_failing_ids_and_keeps_measurements_beside() -> None:
    state = build([*BASE, entry("sysctl[vm.dirty_ratio]", "20", "failed"),
                   entry("p2p[0000:21:00.0->0000:01:00.0]", "17.0", "failed", measured=True)],
                  SPEC)
    local = state["targets"]["local"]
    assert local["checks"] == {"sysctl[net.core.rmem_max]": "16777216",
                               "sysctl[vm.swappiness]": "10", "cpufreq.epp": None,
                               "sysctl[vm.dirty_ratio]": "20"}
    assert local["measured"] == {"p2p[0000:01:00.0->0000:21:00.0]": "52.1",
                                 "p2p[0000:21:00.0->0000:01:00.0]": "17.0"}
    assert local["failing"] == ["sysctl[vm.dirty_ratio]", "p2p[0000:21:00.0->0000:01:00.0]"]
    assert (local["outcomes"]["passed"], local["outcomes"]["failed"],
            local["outcomes"]["skipped"]) == (3, 2, 1)
    assert state["spec"] == {"name": "node", "digest": SPEC[0].digest}
    assert state["version"] == 1


def test_one_target_has_its_own_digest_whatever_its_name_several_are_named() -> None:
    here = build(BASE, SPEC)
    there = build([Entry(e.id, "pve", e.observed, e.outcome, e.measured) for e in BASE], SPEC)
    assert here["digest"] == there["digest"]  # the same state, reached another way
    both = build([*BASE, *(Entry(e.id, "pve", e.observed, e.outcome) for e in BASE)], SPEC)
    swapped = build([*BASE, *(Entry(e.id, "gpu2", e.observed, e.outcome) for e in BASE)], SPEC)
    assert both["digest"] not in (here["digest"], swapped["digest"])
    lines = diff_lines(both, swapped, old_label="OLD", new_label="NEW")
    assert "  sysctl[vm.swappiness]@pve: only in OLD (10)" in lines
    assert "  sysctl[vm.swappiness]@gpu2: only in NEW (10)" in lines


def test_records_of_the_runs_own_work_are_no_part_of_the_state() -> None:
    def record(check_id: str, kind: str) -> CheckResult:
        return CheckResult(id=check_id, kind=kind, key=None, expected="", observed="x",
                           outcome=Outcome.PASSED, message="")

    kept = entries_of([record("sysctl[a]", "sysctl"), record("persist[etc/x]", "persist")])
    assert [e.id for e in kept] == ["sysctl[a]"]


def test_the_fixtures_mapping_is_read_only_and_its_copy_is_plain_json() -> None:
    state = HostState(build(BASE, SPEC))
    assert state.digest == state["digest"] and set(state) >= {"digest", "spec", "targets"}
    with pytest.raises(TypeError):
        state["digest"] = "0" * 64  # type: ignore[index]  # refused by mypy and at run time
    with pytest.raises(TypeError):
        state["targets"]["local"]["checks"]["sysctl[vm.swappiness]"] = "60"
    with pytest.raises(AttributeError):
        state["targets"]["local"]["failing"].append("x")
    copy = state.as_dict()
    copy["targets"]["local"]["checks"]["sysctl[vm.swappiness]"] = "60"  # a copy: free to edit
    assert state["targets"]["local"]["checks"]["sysctl[vm.swappiness]"] == "10"
    assert json.loads(json.dumps(state.as_dict())) == build(BASE, SPEC)


def test_changes_name_each_check_with_both_values_and_the_ones_on_one_side() -> None:
    old = build(BASE, SPEC)
    new = build([entry("sysctl[net.core.rmem_max]", "33554432"), BASE[1], BASE[2],
                 entry("module[nouveau]", "absent")], SPEC)
    lines = diff_lines(old, new, old_label="the compared result", new_label="this run")
    assert lines[0].startswith(f"host state differs ({old['digest'][:12]} in the compared "
                               f"result, {new['digest'][:12]} in this run): 3 checks changed")
    assert lines[1:] == ["  cpufreq.epp: only in the compared result ((nothing read))",
                         "  module[nouveau]: only in this run (absent)",
                         "  sysctl[net.core.rmem_max]: 16777216 -> 33554432"]
    assert diff_lines(old, build(list(reversed(BASE)), SPEC), old_label="a",
                      new_label="b") == [f"same host state ({old['digest'][:12]})"]


def test_at_most_twenty_changes_are_named_then_counted() -> None:
    old = build([entry(f"sysctl[k{n:02}]", "1") for n in range(25)], SPEC)
    new = build([entry(f"sysctl[k{n:02}]", "2") for n in range(25)], SPEC)
    lines = diff_lines(old, new, old_label="OLD", new_label="NEW")
    assert LIMIT == 20 and len(lines) == 1 + 20 + 1
    assert lines[1] == "  sysctl[k00]: 1 -> 2" and lines[20] == "  sysctl[k19]: 1 -> 2"
    assert lines[-1] == "  and 5 more"
    assert len(diff_lines(old, new, old_label="OLD", new_label="NEW", limit=None)) == 26


def test_host_values_are_printed_escaped() -> None:
    old = build([entry("sysctl[kernel.hostname]", "node")], SPEC)
    new = build([entry("sysctl[kernel.hostname]", "\x1b[2Jnode\nFAKE: line")], SPEC)
    line = diff_lines(old, new, old_label="OLD", new_label="NEW")[1]
    assert "\x1b" not in line and "\n" not in line
    assert line == "  sysctl[kernel.hostname]: node -> \\x1b[2Jnode\\nFAKE: line"


def test_a_changed_spec_is_said_beside_the_state() -> None:
    old = build(BASE, SPEC)
    new = build(BASE, [spec_digest("node", b"version: 1\nname: node\n# edited\n")])
    lines = diff_lines(old, new, old_label="OLD", new_label="NEW")
    assert lines[0].startswith("same host state")
    assert lines[1].startswith("spec: node (") and lines[1].endswith(") in NEW")


# -- files and the command -------------------------------------------------------------------


def report(state: dict[str, Any] | None) -> dict[str, Any]:
    return {"spec": "node.yaml", "tool": "pytest-gpuhost 0.1.0", "checks": [],
            "summary": {}, "state": state}


def benchmark_file(state: dict[str, Any] | None) -> dict[str, Any]:
    machine_info: dict[str, Any] = {"node": "box", "cpu": {"brand_raw": "x"}}
    if state is not None:
        machine_info["gpuhost"] = state
    return {"machine_info": machine_info, "commit_info": {}, "benchmarks": [],
            "datetime": "2026-12-03T07:03:50+00:00", "version": "5.3.1"}


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    old = build(BASE, SPEC)
    new = build([entry("sysctl[net.core.rmem_max]", "33554432"), *BASE[1:]], SPEC)
    return {
        "old.json": write(tmp_path / "old.json", report(old)),
        "new.json": write(tmp_path / "new.json", report(new)),
        "old-bench.json": write(tmp_path / "old-bench.json", benchmark_file(old)),
        "new-bench.json": write(tmp_path / "new-bench.json", benchmark_file(new)),
        "state.json": write(tmp_path / "state.json", old),
    }


@pytest.mark.parametrize(("old", "new"), [("old.json", "new.json"),
                                          ("old-bench.json", "new-bench.json"),
                                          ("old.json", "new-bench.json"),
                                          ("state.json", "new.json")])
def test_diff_exits_1_naming_what_changed(files: dict[str, Path], old: str, new: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(files[old]), str(files[new])]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[2].startswith("host state differs (") and out[2].endswith("1 check changed")
    assert out[3:] == ["  sysctl[net.core.rmem_max]: 16777216 -> 33554432"]


@pytest.mark.parametrize(("old", "new"), [("old.json", "old-bench.json"),
                                          ("old-bench.json", "state.json"),
                                          ("new.json", "new.json")])
def test_diff_exits_0_for_the_same_state(files: dict[str, Path], old: str, new: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(files[old]), str(files[new])]) == 0
    assert capsys.readouterr().out.splitlines()[2].startswith("same host state (")


def test_diff_names_every_change_with_all(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path / "a.json", report(build([entry(f"k{n}", "1") for n in range(30)],
                                                  SPEC)))
    new = write(tmp_path / "b.json", report(build([entry(f"k{n}", "2") for n in range(30)],
                                                  SPEC)))
    assert main(["diff", str(old), str(new)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "  and 10 more"
    assert main(["diff", "--all", str(old), str(new)]) == 1
    assert len(capsys.readouterr().out.splitlines()) == 3 + 30


def bad_inputs(tmp_path: Path, files: dict[str, Path]) -> dict[str, tuple[Path, str]]:
    """name -> (file, what the one line says)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as out:  # sparse: refused by its size, never read
        out.truncate(MAX_FILE_BYTES + 1)
    tampered = json.loads(files["new.json"].read_text())
    tampered["state"]["targets"]["local"]["checks"]["sysctl[net.core.rmem_max]"] = "16777216"
    unreadable = write(tmp_path / "unreadable.json", report(build(BASE, SPEC)))
    unreadable.chmod(0)
    xml = tmp_path / "junit.xml"
    xml.write_text("<testsuites/>\n")
    return {
        "missing": (tmp_path / "nope.json", "cannot read it: No such file or directory"),
        "a directory": (tmp_path, "not a regular file"),
        "a FIFO": (fifo, "not a regular file"),
        "huge": (huge, "more than a report or benchmark file holds"),
        "not JSON": (xml, "not JSON"),
        "foreign JSON": (write(tmp_path / "other.json", {"a": 1}),
                         "neither a pytest-gpuhost JSON report, a pytest-benchmark file nor"),
        "a benchmark file without a state": (
            write(tmp_path / "plain-bench.json", benchmark_file(None)),
            "a pytest-benchmark file without a gpuhost state"),
        "a report without a state": (write(tmp_path / "rollback.json", report(None)),
                                     "a pytest-gpuhost report without a state"),
        "an edited state": (write(tmp_path / "edited.json", tampered),
                            "does not match its checks on target local (edited?)"),
        "another version": (write(tmp_path / "v9.json", {**build(BASE, SPEC), "version": 9}),
                            "has version 9; this pytest-gpuhost reads 1"),
        "unreadable": (unreadable, "cannot read it: Permission denied"),
    }


def test_diff_exits_4_with_one_line_for_a_bad_file(tmp_path: Path, files: dict[str, Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    cases = bad_inputs(tmp_path, files)
    if os.geteuid() == 0:  # root reads a file whatever its mode
        del cases["unreadable"]
    for name, (path, said) in cases.items():
        for argv in (["diff", str(path), str(files["new.json"])],
                     ["diff", str(files["old.json"]), str(path)]):
            assert main(argv) == 4, name
            captured = capsys.readouterr()
            assert captured.out == "", name
            lines = captured.err.splitlines()
            assert len(lines) == 1 and said in lines[0], (name, lines)
            assert lines[0].startswith(f"python -m pytest_gpuhost.state: {path}: "), name


def test_a_usage_error_is_one_line_and_4(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["diff", "one.json"], ["merge", "a", "b"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 4
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and "usage: python -m pytest_gpuhost.state diff OLD NEW" in err[0]


def test_the_command_runs_as_a_module_without_a_traceback(files: dict[str, Path],
                                                          tmp_path: Path) -> None:
    def run(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "pytest_gpuhost.state", "diff",
                               *map(str, args)], capture_output=True, text=True, timeout=60)

    changed = run(files["old.json"], files["new-bench.json"])
    assert changed.returncode == 1, changed.stderr
    assert "  sysctl[net.core.rmem_max]: 16777216 -> 33554432" in changed.stdout.splitlines()
    assert run(files["old.json"], files["old-bench.json"]).returncode == 0
    missing = run(tmp_path / "gone.json", files["new.json"])
    assert missing.returncode == 4 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "Traceback" not in missing.stderr


def test_a_state_is_read_back_as_written(files: dict[str, Path]) -> None:
    assert read_state(files["old.json"]) == read_state(files["old-bench.json"]) == \
        json.loads(files["state.json"].read_text())
    assert [c.name for c in changes(read_state(files["old.json"]),
                                    read_state(files["new.json"]))] == \
        ["sysctl[net.core.rmem_max]"]


# -- a state that read nothing ---------------------------------------------------------------

UNREACHED = [entry("sysctl[net.core.rmem_max]", None, "error"),
             entry("sysctl[vm.swappiness]", None, "error")]
ALL_SKIPPED = [entry("sysctl[net.core.rmem_max]", None, "skipped"),
               entry("sysctl[vm.swappiness]", None, "skipped")]


def test_a_state_says_which_targets_read_nothing() -> None:
    assert build(BASE, SPEC)["unread"] == []
    assert build(BASE, SPEC)["targets"]["local"]["read"] == 2  # cpufreq.epp read nothing
    unreached = build(UNREACHED, SPEC)
    assert unreached["unread"] == ["local"] and unreached["targets"]["local"]["read"] == 0
    two = build([*BASE, *(Entry(e.id, "gpu2", None, "error") for e in BASE)], SPEC)
    assert two["unread"] == ["gpu2"]


def test_states_that_read_nothing_are_never_the_same() -> None:
    for nothing in (UNREACHED, ALL_SKIPPED):
        old, new = build(nothing, SPEC), build(nothing, SPEC)
        assert old["digest"] == new["digest"]  # the digest is of ids and values, as ever
        lines = diff_lines(old, new, old_label="OLD", new_label="NEW")
        assert not any(line.startswith("same host state") for line in lines)
        assert lines[0] == ("not comparable: nothing was read in OLD (its 2 checks: errors "
                            "or skipped) nor in NEW (its 2 checks: errors or skipped), so "
                            "nothing says the host is the same")
    read = build([*BASE, *(Entry(e.id, "gpu2", e.observed, e.outcome) for e in BASE)], SPEC)
    half = build([*BASE, *(Entry(e.id, "gpu2", None, "error") for e in BASE)], SPEC)
    lines = diff_lines(half, half, old_label="OLD", new_label="NEW")
    assert lines[0] == ("host state not the same: nothing was read on gpu2 in OLD (its 4 "
                        "checks: errors or skipped) nor in NEW (its 4 checks: errors or "
                        "skipped), so nothing says it is the same")
    lines = diff_lines(read, half, old_label="OLD", new_label="NEW")
    assert lines[0].startswith("host state not the same: nothing was read on gpu2 in NEW (its "
                               "4 checks: errors or skipped)")
    assert "  sysctl[vm.swappiness]@gpu2: 10 -> (nothing read)" in lines


def test_diff_of_states_that_read_nothing_exits_1_or_4_where_neither_read_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unreached = write(tmp_path / "unreached.json", report(build(UNREACHED, SPEC)))
    skipped = write(tmp_path / "skipped.json", report(build(ALL_SKIPPED, SPEC)))
    read = write(tmp_path / "read.json", report(build(BASE, SPEC)))
    for old, new in ((unreached, unreached), (unreached, skipped), (skipped, skipped)):
        assert main(["diff", str(old), str(new)]) == 4
        captured = capsys.readouterr()
        assert captured.out == ""
        [line] = captured.err.splitlines()
        assert line == ("python -m pytest_gpuhost.state: nothing was read in OLD (its 2 "
                        "checks: errors or skipped) nor in NEW (its 2 checks: errors or "
                        "skipped): no host state to compare; compare runs that reached their "
                        "hosts")
    for old, new in ((read, unreached), (skipped, read)):
        assert main(["diff", str(old), str(new)]) == 1
        out = capsys.readouterr().out.splitlines()
        assert out[2].startswith("host state not the same: nothing was read in ")
