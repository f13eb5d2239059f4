"""The tests' runner (``tests/runner.py``) is the run the plugin makes: on the example host, a
verify run and a ``--fix --fix-persist`` run give, record for record, what a whole pytest run
writes to its JSON report, and leave the host as that run leaves it."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.result import CheckResult
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, EXAMPLE_HOST, snapshot
from ..runner import Runner, open_run, run_spec

KMSG_TIME = re.compile(r"\[ *\d+\.\d{6}\]")
KMSG_USEC = re.compile(rb"^(\d+,\d+),\d+,", re.M)
STATE = "var/lib/pytest-gpuhost"
"""The journals and locks of a fix, whose names carry the time and the process."""


def reported(pytester: pytest.Pytester, root: Path, *args: str) -> list[dict[str, Any]]:
    result = pytester.runpytest(f"--gpuhost-spec={BLACKWELL8}", f"--gpuhost-root={root}",
                                "--gpuhost-report=r.json", *args)
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), result.stdout.str()
    records: list[dict[str, Any]] = json.loads((pytester.path / "r.json").read_text())["checks"]
    return records


def as_reported(records: list[CheckResult]) -> list[dict[str, Any]]:
    shown: list[dict[str, Any]] = json.loads(json.dumps([r.as_dict() for r in records]))
    return shown


def tree(root: Path) -> dict[str, bytes]:
    """Every file of the host but the fix's journals and locks, the kernel log's times left out
    (``prio,seq,usec,flags;text``)."""
    return {path: KMSG_USEC.sub(rb"\1,usec,", data) if path == "dev/kmsg" else data
            for path, (data, _) in snapshot(root).items() if not path.startswith(STATE)}


def by_id(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each record by its id, with the kernel log's timestamps left out: the fake modprobe of
    a fix logs its failure at the time it runs."""
    untimed: list[dict[str, Any]] = json.loads(KMSG_TIME.sub("[time]", json.dumps(records)))
    return {record["id"]: record for record in untimed}


def test_a_verify_run_records_what_the_plugin_reports(pytester: pytest.Pytester,
                                                      example_host: Path) -> None:
    expected = reported(pytester, example_host)
    done = run_spec(BLACKWELL8, example_host, workdir=pytester.path)
    assert by_id(as_reported(done.records)) == by_id(expected)
    assert len(done) == len(expected) > 100


def test_a_fix_persist_run_records_and_changes_what_the_plugin_does(
        pytester: pytest.Pytester, example_host: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(example_host, other, symlinks=True)
    expected = reported(pytester, other, "--fix", "--fix-persist")
    done = run_spec(BLACKWELL8, example_host, workdir=pytester.path, fix=True, persist=True)
    assert by_id(as_reported(done.records)) == by_id(expected)
    assert any(r.section == "persist" for r in done.values())  # the files, after the checks
    assert tree(example_host) == tree(other)
    assert tree(example_host) != tree(EXAMPLE_HOST)  # the fix did change the host


def test_the_fixture_runs_on_the_fake_host_and_a_check_sees_the_host_as_it_is_when_it_runs(
        fake: FakeHost, runner: Runner) -> None:
    fake.sysctl("vm.swappiness", 60)
    spec = "version: 1\nsysctl:\n  vm.swappiness: 10\n"
    assert runner(spec)["sysctl[vm.swappiness]"].observed == "60"
    with runner.open(spec) as running:
        fake.sysctl("vm.swappiness", 10)  # after collection, before the check
        [check] = running.checks
        assert running.run(check).outcome.value == "passed"
    with open_run(spec, fake.root, fix=True) as running:
        fake.sysctl("vm.swappiness", 30)
        [record] = [running.run(check) for check in running.checks]
    assert (record.outcome.value, record.before) == ("fixed", "30")
