"""Issue 25, item 1: a --fix run interrupted while its command runs (SIGTERM from ``timeout``,
systemd, Slurm or CI; SIGHUP from a closed terminal; Ctrl-C) kills that command's process group,
journals the change ``unknown`` and leaves the journal open; a rollback judges nothing while a
command a run started may still be making its change (it waits for the target's lock, which the
command holds until it ends)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.fix.journal import read_journal
from pytest_gpuhost.testing.fakehost import FakeHost

from ..blocking import LIMIT_S, SIGNALS, Blocked, gone, journal_of, start_fix, until
from ..conftest import counts


@pytest.fixture
def blocked(fake: FakeHost) -> Iterator[Blocked]:
    made = Blocked(fake)
    yield made
    made.cleanup()


def start_local_fix(pytester: pytest.Pytester, root: Path) -> subprocess.Popen[bytes]:
    return start_fix(pytester, f"--gpuhost-root={root}", "--gpuhost-report=out.json")


@pytest.mark.parametrize("signum", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_during_a_fix_kills_its_command_and_leaves_the_change_unknown(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked,
        signum: signal.Signals) -> None:
    run = start_local_fix(pytester, fake.root)
    modprobe = blocked.started()
    run.send_signal(signum)
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe's group ending")
    blocked.release()  # a modprobe still running would load the module now: none does
    assert not blocked.loaded()
    contents = read_journal(journal_of(fake.root))
    [entry] = contents.entries
    assert entry.state == "unknown"
    why = "KeyboardInterrupt" if signum == signal.SIGINT else f"{signum.name} received"
    assert entry.error is not None and entry.error.startswith(
        f"the run was interrupted ({why}) during run modprobe -- nvidia (absent -> loaded); "
        "what it did is unknown")
    assert not contents.rolled_back
    assert f"(undo: --gpuhost-rollback={journal_of(fake.root)} --gpuhost-root={fake.root})" \
        in said
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("module[nvidia]", "error")
    assert "interrupted" in check["message"]


def test_a_rollback_judges_nothing_while_a_killed_run_s_command_still_runs(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked) -> None:
    """SIGKILL (the OOM killer, systemd's last word) unwinds nothing: the run's modprobe goes
    on. It holds the run lock it inherited, so a rollback waits for it instead of judging the
    change "never made" and closing the journal before the module loads."""
    run = start_local_fix(pytester, fake.root)
    modprobe = blocked.started()
    run.kill()
    run.communicate(timeout=LIMIT_S)
    assert not gone(modprobe)  # still loading, its run gone
    early = pytester.runpytest_subprocess(f"--gpuhost-root={fake.root}", "--gpuhost-rollback",
                                          "--gpuhost-lock-timeout=0.5", "-p", "no:cacheprovider")
    assert early.ret == pytest.ExitCode.INTERRUPTED
    assert "--gpuhost-rollback: another pytest-gpuhost run holds the run lock" in \
        early.stderr.str()
    assert "keeps it until that command ends" in early.stderr.str()
    contents = read_journal(journal_of(fake.root))
    assert not contents.rolled_back and [e.state for e in contents.entries] == ["pending"]
    blocked.release()
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe ending")
    assert blocked.loaded()  # the change landed after its run was gone
    rollback = pytester.runpytest(f"--gpuhost-root={fake.root}", "--gpuhost-rollback",
                                  "-p", "no:cacheprovider")
    assert rollback.ret == pytest.ExitCode.OK
    assert counts(rollback) == {"fixed": 1}
    assert not blocked.loaded()
    assert read_journal(journal_of(fake.root)).rolled_back
