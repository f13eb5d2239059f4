"""Over a real OpenSSH server on 127.0.0.1: a remote --fix interrupted while
the target runs its command (SIGTERM, SIGHUP, Ctrl-C) stops that command there at once instead
of waiting for it, journals the change ``unknown`` on the target and leaves the journal open;
when the controller dies outright (SIGKILL), its ssh closes, and the agent, seeing its input
end, kills the command's group before it exits and lets the target's lock go."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.fix.journal import read_journal
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..blocking import LIMIT_S, SIGNALS, Blocked, gone, journal_of, start_fix, until
from ..conftest import NEEDS_OPENSSH, counts

pytestmark = NEEDS_OPENSSH


@pytest.fixture
def blocked(fake: FakeHost) -> Iterator[Blocked]:
    made = Blocked(fake)
    yield made
    made.cleanup()


def over_ssh(server: SshServer, root: Path) -> list[str]:
    return [f"--gpuhost-target={server.url(root)}", f"--gpuhost-ssh-config={server.client_config}",
            "-p", "no:cacheprovider"]


def start_remote_fix(pytester: pytest.Pytester, server: SshServer, root: Path
                     ) -> subprocess.Popen[bytes]:
    return start_fix(pytester, *over_ssh(server, root))


@pytest.mark.parametrize("signum", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_during_a_remote_fix_stops_the_command_there(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, blocked: Blocked,
        signum: signal.Signals) -> None:
    run = start_remote_fix(pytester, sshd, fake.root)
    modprobe = blocked.started()
    run.send_signal(signum)
    out, err = run.communicate(timeout=LIMIT_S)  # not the command's 120 s, nor the read's 60 s
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    until(lambda: gone(modprobe) and gone(blocked.child()), "the remote modprobe's group ending")
    blocked.release()
    assert not blocked.loaded()
    contents = read_journal(journal_of(fake.root))
    [entry] = contents.entries
    assert entry.state == "unknown"  # written over the connection the cancel kept
    why = "KeyboardInterrupt" if signum == signal.SIGINT else f"{signum.name} received"
    assert entry.error is not None and entry.error.startswith(
        f"the run was interrupted ({why}) during run modprobe -- nvidia")
    assert not contents.rolled_back


def test_a_controller_killed_outright_leaves_no_command_running_on_the_target(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, blocked: Blocked) -> None:
    run = start_remote_fix(pytester, sshd, fake.root)
    modprobe = blocked.started()
    run.kill()  # nothing of the controller unwinds: its ssh's input closes
    run.communicate(timeout=LIMIT_S)
    until(lambda: gone(modprobe) and gone(blocked.child()),
          "the agent ending the modprobe's group once its connection closed")
    blocked.release()
    assert not blocked.loaded()
    contents = read_journal(journal_of(fake.root))
    assert [e.state for e in contents.entries] == ["pending"] and not contents.rolled_back
    rollback = pytester.runpytest_subprocess("--gpuhost-rollback", *over_ssh(sshd, fake.root))
    assert rollback.ret == pytest.ExitCode.OK, rollback.stdout.str()
    assert counts(rollback) == {"passed": 1}  # the lock was free: the module never loaded
    assert read_journal(journal_of(fake.root)).rolled_back


def test_a_signal_to_the_xdist_controller_alone_stops_the_command_on_the_target(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, blocked: Blocked) -> None:
    """Under -n 2 the target's agent session is its worker's: the SIGTERM the controller
    alone gets reaches that worker at once, whose agent stops the command on the target and
    journals the change ``unknown`` for that signal."""
    run = start_fix(pytester, *over_ssh(sshd, fake.root), "-n", "2",
                    "--gpuhost-report=out.json")
    modprobe = blocked.started()
    run.send_signal(signal.SIGTERM)  # the controller's pid, not its process group
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    until(lambda: gone(modprobe) and gone(blocked.child()), "the remote modprobe's group ending")
    blocked.release()
    assert not blocked.loaded()
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "unknown"
    assert entry.error is not None and entry.error.startswith(
        "the run was interrupted (SIGTERM received) during run modprobe -- nvidia"), entry.error
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert check["outcome"] == "error" and "interrupted" in check["message"], check
