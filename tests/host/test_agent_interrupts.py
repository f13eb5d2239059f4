"""At the agent: a command keeps the target's lock until it has ended, and
whatever ends the agent's wait (its connection closing, a cancel, the agent killed) ends the
command's whole process group first. The agent runs here over pipes, as ssh runs it there."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.host import HostError, Read
from pytest_gpuhost.host.remote import AgentHost, agent_command
from pytest_gpuhost.testing.fakehost import FakeHost

from ..blocking import LIMIT_S, Blocked, gone, until

LOCK = "var/lib/pytest-gpuhost/run.lock"


@pytest.fixture
def blocked(fake: FakeHost) -> Iterator[Blocked]:
    made = Blocked(fake)
    yield made
    made.cleanup()


def agent(root: Path) -> AgentHost:
    return AgentHost(f"test://{root.name}", [sys.executable, *agent_command(str(root))[1:]],
                     str(root), name="t1")


def in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """``call()`` in a daemon thread; what it returned or raised lands in the list."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def held(path: Path) -> bool:
    """Whether another process holds the flock on ``path``."""
    with open(path, "rb") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file, fcntl.LOCK_UN)
        return False


def opened(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        return any(os.readlink(fds / fd) == str(path) for fd in os.listdir(fds))
    return False


def test_a_command_keeps_the_lock_it_started_under_after_its_agent_is_killed(
        fake: FakeHost, blocked: Blocked) -> None:
    host = agent(fake.root)
    host.lock(LOCK, 5.0, "test")
    thread, outcome = in_thread(lambda: host.run(["modprobe", "--", "nvidia"]))
    modprobe = blocked.started()
    assert host._process is not None
    os.kill(host._process.pid, signal.SIGKILL)  # the agent, killed outright (the OOM killer)
    thread.join(LIMIT_S)
    assert isinstance(outcome[0], HostError)  # the target is lost
    assert not gone(modprobe)
    assert held(fake.root / LOCK)  # by the modprobe: a rollback must wait for it
    blocked.release()
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe ending")
    assert blocked.loaded()
    until(lambda: not held(fake.root / LOCK), "the lock going with the command")
    host.close()


def test_an_agent_whose_input_closes_ends_its_command_before_it_exits(
        fake: FakeHost, blocked: Blocked) -> None:
    host = agent(fake.root)
    host.lock(LOCK, 5.0, "test")
    thread, _ = in_thread(lambda: host.run(["modprobe", "--", "nvidia"]))
    modprobe = blocked.started()
    process = host._process
    assert process is not None and process.stdin is not None
    process.stdin.close()  # what the agent sees when the controller or its ssh dies
    process.wait(LIMIT_S)
    assert gone(modprobe)  # reaped by the agent before it exited
    until(lambda: gone(blocked.child()), "the modprobe's child ending with its group")
    assert not held(fake.root / LOCK)
    blocked.release()
    assert not blocked.loaded()
    thread.join(LIMIT_S)
    host.close()


def test_a_lock_wait_ends_when_the_agent_s_input_closes(fake: FakeHost) -> None:
    fake.file(LOCK, "")
    host = agent(fake.root)
    host.identity()  # connected
    with open(fake.root / LOCK, "rb") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # another run holds it
        thread, _ = in_thread(lambda: host.lock(LOCK, 3600.0, "test"))
        process = host._process
        assert process is not None and process.stdin is not None
        until(lambda: opened(process.pid, fake.root / LOCK), "the agent waiting for the lock")
        with contextlib.suppress(OSError):
            process.stdin.close()
        process.wait(LIMIT_S)  # not the hour it would have waited for the lock
    thread.join(LIMIT_S)
    host.close()


def test_an_interrupt_cancels_the_command_and_keeps_the_connection(
        fake: FakeHost, blocked: Blocked) -> None:
    fake.sysctl("vm.swappiness", 10)
    host = agent(fake.root)
    main = threading.get_ident()

    def interrupt() -> None:
        blocked.started()
        signal.pthread_kill(main, signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        host.run(["modprobe", "--", "nvidia"])
    modprobe = int((fake.root / "modprobe.pid").read_text())
    until(lambda: gone(modprobe) and gone(blocked.child()), "the cancelled modprobe ending")
    assert host.lost is None  # the agent answered the cancel: the connection goes on
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    blocked.release()
    assert not blocked.loaded()
    host.close()


FLOOD = """\
import os, sys
chunk = b"x" * (1 << 20)
for _ in range(64):  # 64 MiB to stderr without a newline, then the agent serves
    os.write(2, chunk)
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


def test_stderr_without_a_newline_is_kept_to_its_last_few_kib(fake: FakeHost,
                                                              tmp_path: Path) -> None:
    """A target writing megabytes to stderr without a newline grew the
    controller without bound (a line was read whole before being kept)."""
    from pytest_gpuhost.host.pipes import STDERR_KEPT

    fake.sysctl("vm.swappiness", 10)
    flood = tmp_path / "flood.py"
    flood.write_text(FLOOD)
    argv = [sys.executable, str(flood), *agent_command(str(fake.root))[1:]]
    host = AgentHost("test://flood", argv, str(fake.root), name="flood")
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    assert host._drainer is not None
    process = host._process
    assert process is not None
    host.close()  # the agent exits; the drain reads to the end of its stderr
    host._drainer.join(LIMIT_S)
    assert not host._drainer.is_alive()
    assert len(host._stderr) <= STDERR_KEPT
    assert bytes(host._stderr).endswith(b"x" * 100)


def test_the_read_limit_names_the_step_it_cut_short(fake: FakeHost,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The 60 s limit of a read said "waiting for 1 request(s)"."""
    from pytest_gpuhost.host import TargetLost, doing, remote

    monkeypatch.setattr(remote, "OPERATION_TIMEOUT_S", 1.0)
    fake.sysctl("vm.swappiness", 10)
    host = agent(fake.root)
    host.identity()
    assert host._process is not None
    os.kill(host._process.pid, signal.SIGSTOP)  # a frozen target: it answers nothing
    try:
        with doing("collecting facts"), pytest.raises(TargetLost) as lost:
            host.batch([Read("proc/sys/vm/swappiness")])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(host._process.pid, signal.SIGKILL)
    assert str(lost.value) == ("lost the connection to test://host: no answer within 1 s while "
                               "collecting facts (waiting for the answer to 1 request(s))")
    host.close()


class Jumps:
    """A monotonic clock that moves ``step`` seconds at every reading: the agent's deadlines
    pass without the test waiting for them."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_the_agent_s_deadlines_read_its_injected_clock(fake: FakeHost) -> None:
    """The agent takes a monotonic clock, so its limits are tested without waiting
    for them: a command past its timeout is killed with its group, a lock wait past its own
    ends naming the holder."""
    from pytest_gpuhost.host.agent import OpError, Root

    fake.file("usr/bin/forever", "#!/bin/sh\nsleep 600 &\necho $! > \"$GPUHOST_ROOT/bg.pid\"\n"
              "exec sleep 600\n", mode=0o755)
    fake.file(LOCK, "pytest-gpuhost lock: pid 1 on elsewhere\n")
    root = Root(str(fake.root), clock=Jumps(50.0))
    with pytest.raises(OpError) as late:
        root.run(["forever"], timeout=120.0)
    assert "forever did not finish in 120 s; its process group was killed" in str(late.value)
    until(lambda: gone(int((fake.root / "bg.pid").read_text())), "the command's group ending")
    with open(fake.root / LOCK, "rb") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(OpError, match="held by pid 1 on elsewhere"):
            root.lock(LOCK, 3600.0, "test")
    root.close()


def test_a_signal_while_the_command_starts_still_ends_it(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM that arrives while ``subprocess.Popen`` is starting the command (the child
    already forked) is delivered once the command can be killed: its group ends and the
    interrupt reaches the caller. Before, the handler's exception left Popen with the command
    running and nobody to end it (a CI run's SIGHUP test, under load)."""
    from pytest_gpuhost.host import agent

    fake.file("usr/bin/forever", "#!/bin/sh\nsleep 600 &\necho $! > \"$GPUHOST_ROOT/bg.pid\"\n"
              "exec sleep 600\n", mode=0o755)
    real_popen = subprocess.Popen

    def popen_then_signal(*args: object, **kwargs: object) -> object:
        process = real_popen(*args, **kwargs)  # type: ignore[call-overload]  # Popen's overloads
        until(lambda: (fake.root / "bg.pid").is_file(), "the command starting")
        os.kill(os.getpid(), signal.SIGTERM)  # lands here, still inside "Popen"
        return process

    class Stopped(Exception):
        pass

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)  # the agent's is this module
    previous = signal.signal(signal.SIGTERM, stop)
    try:
        root = agent.Root(str(fake.root))
        with pytest.raises(Stopped):
            root.run(["forever"], timeout=600.0)
    finally:
        signal.signal(signal.SIGTERM, previous)
    until(lambda: gone(int((fake.root / "bg.pid").read_text())), "the command's group ending")
    root.close()
