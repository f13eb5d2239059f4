"""A fix that failed is not retried by the next --fix (fix/history.py), unless --fix-retry."""

from __future__ import annotations

import json
import shutil
from glob import escape
from pathlib import Path

import pytest

from pytest_gpuhost.checks import Check
from pytest_gpuhost.checks.changes import Change, Command, WriteText
from pytest_gpuhost.checks.modules import ModuleProbe, ModuleState
from pytest_gpuhost.engine import RunOptions, run_check
from pytest_gpuhost.fix.fixer import Fixer
from pytest_gpuhost.fix.history import FixHistory
from pytest_gpuhost.fix.journal import Journal
from pytest_gpuhost.fix.state import JOURNAL_DIR, StateFile, StateStore
from pytest_gpuhost.host import HostIdentity, LocalHost
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Exact
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8

pytest_plugins = ["pytester"]

PEERMEM = "module[nvidia_peermem]"
LOAD = Command(("modprobe", "--", "nvidia_peermem"), ("modprobe", "-r", "--", "nvidia_peermem"),
               "absent", "loaded")
ERROR = ("modprobe -- nvidia_peermem exited 1: modprobe: ERROR: could not insert "
         "'nvidia_peermem': Invalid argument")


def count_modprobe_calls(root: Path, log: Path) -> None:
    """Put a wrapper before the tree's fake modprobe that logs each call to ``log``."""
    modprobe = root / "usr/sbin/modprobe"
    modprobe.rename(modprobe.with_name("modprobe.real"))  # it finds its root from its own path
    modprobe.write_text(f"#!/bin/sh\necho \"$*\" >> '{log}'\nexec '{modprobe}.real' \"$@\"\n")
    modprobe.chmod(0o755)


def records(path: Path) -> dict[str, dict[str, object]]:
    return {c["id"]: c for c in json.loads(path.read_text())["checks"]}


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


def test_a_second_fix_does_not_retry_a_failed_modprobe(pytester: pytest.Pytester, spec: Path,
                                                       example_host: Path,
                                                       tmp_path: Path) -> None:
    """nvidia_peermem fails on the example host (no RDMA device): each load adds two kernel log
    records. The second --fix runs no modprobe, so the dmesg count stays as the first left it."""
    calls = tmp_path / "modprobe.calls"
    count_modprobe_calls(example_host, calls)
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
            "-m", "not gpuhost_slow"]
    pytester.runpytest(*args, "--gpuhost-report=first.json")
    assert calls.read_text().splitlines() == ["-- nvidia_peermem", "-- nvidia_uvm"]
    first = records(pytester.path / "first.json")
    assert first[PEERMEM]["outcome"] == "fix_failed" and first["dmesg"]["observed"] == "2"
    [journal] = (example_host / JOURNAL_DIR).glob("*.jsonl")
    line = next(number for number, text in enumerate(journal.read_text().splitlines(), 1)
                if '"event": "change"' in text and "nvidia_peermem" in text)

    second = pytester.runpytest(*args, "--gpuhost-report=second.json")
    assert calls.read_text().splitlines() == ["-- nvidia_peermem", "-- nvidia_uvm"]  # no more
    again = records(pytester.path / "second.json")
    assert again[PEERMEM]["outcome"] == "fix_failed"
    assert str(again[PEERMEM]["message"]).startswith("failed at ")
    assert str(again[PEERMEM]["message"]).endswith(
        f" in {journal}:{line}: {ERROR}; not retried: pass --fix-retry to try again")
    assert again[PEERMEM]["action"] is None and again[PEERMEM]["before"] is None
    assert again["dmesg"]["observed"] == "2"
    second.stdout.fnmatch_lines(["--fix: 0 of 1 fix applied",
                                 escape(f"  FIX_FAILED {PEERMEM}: failed at ") + "*" +
                                 escape(f"Z in {journal}:{line}: {ERROR}; not retried: pass "
                                        "--fix-retry to try again")])
    assert len(list((example_host / JOURNAL_DIR).glob("*.jsonl"))) == 1  # nothing was changed

    retried = pytester.runpytest(*args, "--fix-retry", "--gpuhost-report=third.json")
    assert calls.read_text().splitlines()[-1] == "-- nvidia_peermem"
    third = records(pytester.path / "third.json")
    assert third[PEERMEM]["message"] == f"apply failed: {ERROR}"
    assert third["dmesg"]["observed"] == "4"  # what a retry costs: two more records
    # its journal holds the refused modprobe alone: named, with nothing to undo
    retried.stdout.fnmatch_lines(["journal: *.jsonl (nothing to undo: the host refused every "
                                  "change)"])
    assert "undo: --gpuhost-rollback" not in retried.stdout.str()


def test_a_dry_run_says_fix_would_not_retry_it(pytester: pytest.Pytester, spec: Path,
                                               example_host: Path) -> None:
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
            "-m", "not gpuhost_slow", "-k", "module or dmesg"]
    pytester.runpytest(*args)
    plan = pytester.runpytest(*args, "--gpuhost-dry-run", "--gpuhost-report=plan.json")
    record = records(pytester.path / "plan.json")[PEERMEM]
    assert record["outcome"] == "failed" and record["plan"] == []
    assert str(record["message"]).startswith("'absent' != 'loaded'; --fix would not retry it "
                                             "(failed at ")
    assert str(record["message"]).endswith(f"{ERROR}): pass --fix-retry to try again")
    plan.stdout.fnmatch_lines(["--gpuhost-dry-run: 0 fixes planned (0 changes); nothing was "
                               "written", escape(f"  NOT FIXED  {PEERMEM}: 'absent' != 'loaded'; "
                                                 "--fix would not retry it (failed at ") + "*"])
    retry = pytester.runpytest(*args, "--gpuhost-dry-run", "--fix-retry")
    retry.stdout.fnmatch_lines([escape(f"  WOULD_FIX  {PEERMEM}: ") + "* would modprobe -- "
                                "nvidia_peermem*"])


# --- which earlier attempt counts ----------------------------------------------------------------


def journal_with(root: Path, name: str, change: Change, outcome: str | None,
                 boot_id: str | None = None) -> None:
    journal = Journal(root / JOURNAL_DIR / name, "spec", HostIdentity(str(root), boot_id=boot_id))
    entry = journal.record(PEERMEM, "module", "nvidia_peermem", change)
    if outcome == "failed":
        journal.outcome(entry, ERROR)
    elif outcome == "unknown":
        journal.outcome(entry, "timed out", unknown=True)
    elif outcome == "applied":
        journal.outcome(entry, None)


@pytest.fixture
def root(fake: FakeHost) -> Path:
    (fake.root / JOURNAL_DIR).mkdir(parents=True)
    return fake.root


def test_the_last_failure_of_the_same_change_stops_the_fix(root: Path) -> None:
    journal_with(root, "20260101T000000Z-spec-1.jsonl", LOAD, "failed")
    earlier = FixHistory(LocalHost(root), None).failed_before(PEERMEM, [LOAD])
    assert earlier is not None
    assert earlier.message() == (f"failed at {earlier.time} in {root}/{JOURNAL_DIR}/"
                                 f"20260101T000000Z-spec-1.jsonl:2: {ERROR}; not retried: pass "
                                 "--fix-retry to try again")


@pytest.mark.parametrize("later", ["applied", "unknown", None], ids=["applied", "unknown",
                                                                      "pending"])
def test_a_later_attempt_that_did_not_fail_is_the_one_that_counts(root: Path,
                                                                  later: str | None) -> None:
    journal_with(root, "20260101T000000Z-spec-1.jsonl", LOAD, "failed")
    journal_with(root, "20260102T000000Z-spec-2.jsonl", LOAD, later)
    assert FixHistory(LocalHost(root), None).failed_before(PEERMEM, [LOAD]) is None


def test_another_change_is_tried(root: Path) -> None:
    """The host changed since (another original) or the spec did (another value)."""
    journal_with(root, "20260101T000000Z-spec-1.jsonl",
                 WriteText("proc/sys/vm/swappiness", "60\n", "10\n"), "failed")
    history = FixHistory(LocalHost(root), None)
    assert history.failed_before(PEERMEM, [WriteText("proc/sys/vm/swappiness", "30\n",
                                                     "10\n")]) is None
    assert history.failed_before(PEERMEM, [WriteText("proc/sys/vm/swappiness", "60\n",
                                                     "1\n")]) is None
    assert history.failed_before(PEERMEM, [WriteText("proc/sys/vm/swappiness", "60\n",
                                                     "10\n")]) is not None


def test_a_reboot_since_the_failure_tries_again(root: Path) -> None:
    journal_with(root, "20260101T000000Z-spec-1.jsonl", LOAD, "failed", boot_id="boot-1")

    class Rebooted(LocalHost):
        def identity(self) -> HostIdentity:
            return HostIdentity(str(self.root), boot_id="boot-2")

    class SameBoot(LocalHost):
        def identity(self) -> HostIdentity:
            return HostIdentity(str(self.root), boot_id="boot-1")

    assert FixHistory(Rebooted(root), None).failed_before(PEERMEM, [LOAD]) is None
    assert FixHistory(SameBoot(root), None).failed_before(PEERMEM, [LOAD]) is not None


def test_the_run_s_own_journal_and_damaged_ones_are_not_history(root: Path) -> None:
    journal_with(root, "20260101T000000Z-spec-1.jsonl", LOAD, "failed")
    (root / JOURNAL_DIR / "20260102T000000Z-spec-2.jsonl").write_text("[1, 2]\n{}\n")
    host = LocalHost(root)
    assert FixHistory(host, None).failed_before(PEERMEM, [LOAD]) is not None  # damaged: passed
    mine = StateStore.of(host).file(f"{JOURNAL_DIR}/20260101T000000Z-spec-1.jsonl")
    assert FixHistory(host, mine).failed_before(PEERMEM, [LOAD]) is None
    as_a_worker_sees_it = StateFile.local(root / JOURNAL_DIR / "20260101T000000Z-spec-1.jsonl")
    assert FixHistory(host, as_a_worker_sees_it).failed_before(PEERMEM, [LOAD]) is None


def test_the_engine_runs_nothing_for_a_fix_that_failed_before(fake: FakeHost) -> None:
    fake.file("usr/sbin/modprobe", "#!/bin/sh\necho ran >> \"$0.calls\"\nexit 1\n", mode=0o755)
    (fake.root / JOURNAL_DIR).mkdir(parents=True)
    journal_with(fake.root, "20260101T000000Z-spec-1.jsonl", LOAD, "failed")
    check = Check("module", "nvidia_peermem", Exact("loaded", ModuleState()),
                  EntryOptions(where="spec.yaml:3"), ModuleProbe("nvidia_peermem"))
    host = LocalHost(fake.root)
    fixer = Fixer(host, None, run_lock=None, apply_lock=None, lock_timeout=1)
    result = run_check(check, host, {}, RunOptions(fix=True), fixer, FixHistory(host, None))
    assert result.outcome is Outcome.FIX_FAILED and result.message.endswith("try again")
    assert not (fake.root / "usr/sbin/modprobe.calls").exists()
    retried = run_check(check, host, {}, RunOptions(fix=True), fixer, None)
    assert retried.message.startswith("apply failed: modprobe -- nvidia_peermem exited 1")
    assert (fake.root / "usr/sbin/modprobe.calls").read_text() == "ran\n"


@pytest.mark.parametrize(("args", "line"), [
    (["--fix-retry"], "ERROR: --fix-retry only makes sense with --fix"),
    (["--gpuhost-rollback", "--fix-retry"], "ERROR: --fix-retry does not go with "
                                            "--gpuhost-rollback*"),
])
def test_fix_retry_needs_fix(pytester: pytest.Pytester, spec: Path, fake: FakeHost,
                             args: list[str], line: str) -> None:
    given = args if "--gpuhost-rollback" in args else [f"--gpuhost-spec={spec}", *args]
    result = pytester.runpytest(*given, f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
