"""The host layer: every path stays under the root, writes never create, commands never use PATH."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import signal
import stat
import sys
from pathlib import Path

import pytest

from pytest_gpuhost.host import (
    HostError,
    Kmsg,
    LocalHost,
    Read,
    TargetLost,
    TargetTimeout,
    UnsafePath,
    agent,
    doing,
    remote,
)
from pytest_gpuhost.host.remote import AgentHost, agent_command
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import ended_within


@pytest.mark.parametrize("path", ["../etc/passwd", "proc/../../x", "/etc/passwd", "a\0b", "",
                                  ".", "./", "proc/sys/.."])
def test_paths_that_leave_the_root_are_refused(host: LocalHost, path: str) -> None:
    with pytest.raises(UnsafePath):
        host.read_text(path)
    with pytest.raises(UnsafePath):
        host.exists(path)


def test_redundant_separators_and_dots_stay_under_the_root(fake: FakeHost,
                                                            host: LocalHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    assert host.read_text("proc//sys/./vm/swappiness") == "60\n"
    assert host.exists("./proc/sys/vm/swappiness/")


def test_write_replaces_the_value_in_place(fake: FakeHost, host: LocalHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    host.write_text("proc/sys/vm/swappiness", "10\n")
    assert host.read_text("proc/sys/vm/swappiness") == "10\n"


def test_write_never_creates_a_file(fake: FakeHost, host: LocalHost) -> None:
    with pytest.raises(HostError, match="No such file or directory"):
        host.write_text("proc/sys/vm/not_a_sysctl", "1\n")
    assert not (fake.root / "proc/sys/vm/not_a_sysctl").exists()


def test_write_bytes_at_an_offset_keeps_the_rest(fake: FakeHost, host: LocalHost) -> None:
    fake.file("config", bytes(range(16)))
    host.write_bytes("config", b"\xaa\xbb", 8)
    assert host.read_bytes("config") == bytes(range(8)) + b"\xaa\xbb" + bytes(range(10, 16))


def test_write_errors_carry_the_errno_text(fake: FakeHost, host: LocalHost) -> None:
    target = fake.file("proc/sys/kernel/x", "1\n")
    target.chmod(0o444)
    if os.geteuid() == 0:
        pytest.skip("root writes read-only files")
    with pytest.raises(HostError, match="Permission denied"):
        host.write_text("proc/sys/kernel/x", "0\n")


def test_commands_resolve_under_the_root_only(fake: FakeHost, host: LocalHost) -> None:
    with pytest.raises(HostError, match=r"modprobe not found in .*usr/sbin, .*usr/bin, .*sbin, "
                                        r".*bin"):
        host.run(["modprobe", "nvidia"])
    fake.file("bin/hello", "#!/bin/sh\necho \"root=$GPUHOST_ROOT args=$*\"\necho oops >&2\n",
              mode=0o755)
    result = host.run(["hello", "a b", "c;d"])
    assert result.returncode == 0
    assert result.stdout.strip() == f"root={fake.root} args=a b c;d"  # no shell: one argv each
    assert result.stderr.strip() == "oops"


def test_a_command_gets_extra_variables_over_the_environment(
        fake: FakeHost, host: LocalHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    monkeypatch.setenv("KEPT", "yes")
    fake.file("bin/show", "#!/bin/sh\necho \"$CUDA_DEVICE_ORDER $KEPT\"\n", mode=0o755)
    assert host.run(["show"]).stdout.strip() == "FASTEST_FIRST yes"
    merged = host.run(["show"], env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert merged.stdout.strip() == "PCI_BUS_ID yes"


def test_command_names_with_a_slash_are_refused(host: LocalHost) -> None:
    with pytest.raises(UnsafePath):
        host.run(["../../bin/sh"])


def test_a_command_named_by_its_path_inside_the_root_runs_there(fake: FakeHost,
                                                                 tmp_path: Path) -> None:
    """nccl's tests_dir: a build directory of the target, run by its path inside the root (on
    this machine and through the agent); a link out of it resolves inside it, and a path that
    climbs out or starts at / is refused."""
    fake.file("opt/build/hello", "#!/bin/sh\necho built $1\n", mode=0o755)
    (fake.root / "opt/build/sh").symlink_to("/bin/sh")  # the root's own bin/sh: there is none
    outside = tmp_path / "outside"
    outside.write_text("#!/bin/sh\necho escaped\n")
    outside.chmod(0o755)
    for host in (LocalHost(fake.root), _agent(fake.root, 60.0)):
        try:
            assert host.run(["opt/build/hello", "x"]).stdout == "built x\n"
            with pytest.raises(HostError, match="opt/build/sh is not an executable file"):
                host.run(["opt/build/sh", "-c", "echo escaped"])
            for climbing in ("opt/../../outside", "/bin/sh", f"{outside}"):
                with pytest.raises(UnsafePath):
                    host.run([climbing])
        finally:
            if isinstance(host, AgentHost):
                host.close()


def test_first_command_directory_wins(fake: FakeHost, host: LocalHost) -> None:
    fake.file("usr/sbin/tool", "#!/bin/sh\necho usr-sbin\n", mode=0o755)
    fake.file("bin/tool", "#!/bin/sh\necho bin\n", mode=0o755)
    assert host.run(["tool"]).stdout.strip() == "usr-sbin"


def test_kmsg_from_a_plain_file(fake: FakeHost, host: LocalHost) -> None:
    fake.kmsg([(6, "hello"), (3, "oops")], continuation="SUBSYSTEM=pci")
    assert host.read_kmsg() == ["6,1,1001237,-;hello", " SUBSYSTEM=pci", "3,2,1002474,-;oops",
                                " SUBSYSTEM=pci"]


def test_listdir_is_sorted(fake: FakeHost, host: LocalHost) -> None:
    for name in ("b", "a", "c"):
        fake.file(f"d/{name}", "")
    assert host.listdir("d") == ["a", "b", "c"]


def test_the_real_root_is_recognized() -> None:
    assert LocalHost(Path("/")).is_real
    assert not LocalHost(Path("/tmp")).is_real


def _null_device(path: Path) -> None:
    """A character device 1:3 (what /dev/null is) at ``path``, or skip where mknod is denied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")


def test_kmsg_from_a_character_device_reads_until_the_end(
        fake: FakeHost, host: LocalHost, monkeypatch: pytest.MonkeyPatch) -> None:
    _null_device(fake.root / "dev/kmsg")
    monkeypatch.setattr(agent.kmsg, "KMSG_DEVICE", (1, 3))  # take the null device for the log
    assert host.read_kmsg() == []


def test_kmsg_refuses_a_character_device_that_is_not_the_kernel_log(
        fake: FakeHost, host: LocalHost) -> None:
    _null_device(fake.root / "dev/kmsg")
    with pytest.raises(HostError, match=r"character device 1:3, not the kernel log"):
        host.read_kmsg()


def test_the_agent_is_python_3_8_and_stdlib_only() -> None:
    """It runs on targets with only python3 3.8+: its syntax, and no import from the package
    (the source they run: the agent's modules joined)."""
    import ast

    from pytest_gpuhost.host.upload import joined

    tree = ast.parse(joined(), feature_version=(3, 8))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree))
    import sys

    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_readlink_gives_the_stored_target_and_none_for_a_file(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sys/devices/pci0000:00/0000:00:01.1").mkdir(parents=True)
    (root / "sys/bus/pci/devices").mkdir(parents=True)
    (root / "sys/bus/pci/devices/0000:00:01.1").symlink_to(
        "../../../devices/pci0000:00/0000:00:01.1")
    (root / "file").write_text("x")
    host = LocalHost(root)
    assert host.readlink("sys/bus/pci/devices/0000:00:01.1") == \
        "../../../devices/pci0000:00/0000:00:01.1"
    assert host.readlink("file") is None and host.readlink("missing") is None
    with pytest.raises(UnsafePath):
        host.readlink("../etc/passwd")


# -- an agent over a command's pipes: the time limit ----------------------------------------------
#
# No test here reads the wall clock: a wait that the limit must end is for something that would
# take far longer (a command of 600 s, a stub that never answers), and is bounded only by
# ended_within's generous bound, which a hang alone passes. What is left of a limit is set
# through ``spent`` (what an xdist worker is handed by its controller), so a loaded machine's
# slow connect never eats into the part under test.

HANG_BOUND = 60.0
"""Seconds a test waits for what must end at once or at a short limit: only a hang passes it."""


def _agent(root: Path, limit: float) -> AgentHost:
    """The agent run here with python3 (what ssh runs there), under a time limit."""
    argv = [sys.executable, *agent_command(str(root))[1:]]
    return AgentHost(f"test://{root.name}", argv, str(root), time_limit=limit, name="n1")


def _left(host: AgentHost, seconds: float) -> None:
    """Connect, then leave ``seconds`` of the host's time limit (the rest spent before)."""
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    assert host.time_limit is not None
    host.spent = host.time_limit - seconds


def test_a_target_that_hangs_in_a_command_is_lost_at_its_time_limit(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10).file("usr/bin/slow", "#!/bin/sh\nexec sleep 600\n",
                                          mode=0o755)
    host = _agent(fake.root, 300.0)
    _left(host, 1.5)
    with doing("applying a fix of module[x]"):  # what was left of the limit, not a new one
        hung = ended_within(HANG_BOUND, lambda: host.run(["slow"]), "the hung command")
    assert isinstance(hung, TargetTimeout)
    assert str(hung) == ("target n1 hung while applying a fix of module[x]: no answer "
                         "within --gpuhost-target-timeout=300 s, so the run went on "
                         "without it")
    assert hung.step == "applying a fix of module[x]"
    assert host.lost is hung and host.spent >= 300.0  # the wait ran to the limit
    with pytest.raises(TargetTimeout):  # at once, the same reason
        host.batch([Read("proc/sys/vm/swappiness")])
    host.close()


def test_a_connection_that_never_answers_is_lost_at_the_limit(tmp_path: Path) -> None:
    host = AgentHost("test://silent", [sys.executable, "-c", "import time; time.sleep(600)"],
                     "/", time_limit=1.0, name="silent")
    with doing("collecting facts"):
        lost = ended_within(HANG_BOUND, host.identity, "a connection that never answers")
    assert isinstance(lost, TargetTimeout)  # the limit ended it, not the connect timeout
    assert str(lost).startswith("target silent hung while connecting: no answer within "
                                "--gpuhost-target-timeout=1 s")
    assert host.spent >= 1.0
    assert host._process is not None and host._process.poll() is not None  # killed


def test_a_target_that_stops_reading_is_lost_at_the_limit_however_big_the_request(
        fake: FakeHost) -> None:
    """A frozen target (``lxc-freeze``, a vzdump backup in suspend mode, a SIGSTOP) stops
    reading its standard input: a request bigger than the pipe's buffer (a batch of thousands
    of sysctls, a file of megabytes) must not block the run in the write, past every time
    limit."""
    fake.sysctl("vm.swappiness", 10)
    host = _agent(fake.root, 300.0)
    _left(host, 1.5)
    assert host._process is not None
    os.kill(host._process.pid, signal.SIGSTOP)
    big = b"1" * (4 << 20)  # more than the pipe's 64 KiB and ssh's 2 MiB window
    try:
        lost = ended_within(HANG_BOUND, lambda: host.write_bytes("proc/sys/vm/swappiness", big),
                            "the write to a stopped target")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a blocked write ends now, if it did
            os.kill(host._process.pid, signal.SIGKILL)
    assert isinstance(lost, TargetTimeout)
    assert str(lost) == ("target n1 hung while waiting for it: no answer within "
                         "--gpuhost-target-timeout=300 s, so the run went on without it")
    assert host.lost is lost
    host.close()


def test_without_a_time_limit_a_stopped_reader_is_lost_at_the_operation_timeout(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(remote, "OPERATION_TIMEOUT_S", 1.0)
    fake.sysctl("vm.swappiness", 10)
    argv = [sys.executable, *agent_command(str(fake.root))[1:]]
    host = AgentHost("test://frozen", argv, str(fake.root), name="frozen")
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    assert host._process is not None
    os.kill(host._process.pid, signal.SIGSTOP)
    big = b"1" * (4 << 20)
    lost = ended_within(HANG_BOUND, lambda: host.write_bytes("proc/sys/vm/swappiness", big),
                        "the write to a stopped target")
    assert isinstance(lost, TargetLost)
    assert re.fullmatch(r"lost the connection to test://frozen: it stopped reading: \d+ of the "
                        r"\d+ bytes of 1 request\(s\) went in 1 s", str(lost)), str(lost)
    assert host._process.poll() is not None  # killed, not left stopped
    host.close()


def test_a_lock_wait_past_the_time_limit_says_it_was_the_lock(fake: FakeHost) -> None:
    """Another run holds the target's lock: when the time limit is shorter than the lock's
    wait, the target is lost at the limit, and the message says it waited for the lock (the
    target itself answered nothing because it was waiting, not because it hung)."""
    fake.sysctl("vm.swappiness", 10)
    lock = fake.root / "var/lib/pytest-gpuhost/fix.lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    host = _agent(fake.root, 300.0)
    _left(host, 1.0)
    with open(lock, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with doing("applying a fix of sysctl[vm.swappiness]"):
            lost = ended_within(HANG_BOUND, lambda: host.lock(
                "var/lib/pytest-gpuhost/fix.lock", 600.0, "test"), "the lock's wait")
    assert isinstance(lost, TargetTimeout)
    assert str(lost) == (
        "target n1 hung while applying a fix of sysctl[vm.swappiness]: no answer within "
        "--gpuhost-target-timeout=300 s (it was waiting for the lock "
        "var/lib/pytest-gpuhost/fix.lock, which another pytest-gpuhost run may hold, and "
        "--gpuhost-lock-timeout=600 s is longer), so the run went on without it")
    host.close()


def test_the_time_limit_counts_every_wait_together(fake: FakeHost) -> None:
    """Each wait on the target adds to ``spent`` (a nap cannot take less than it sleeps), and
    the limit bounds the sum: with half a second of it left, a command that would take ten
    minutes is cut off."""
    fake.sysctl("vm.swappiness", 10).file("usr/bin/nap", "#!/bin/sh\nexec sleep 0.2\n",
                                          mode=0o755)
    fake.file("usr/bin/slow", "#!/bin/sh\nexec sleep 600\n", mode=0o755)
    host = _agent(fake.root, 300.0)
    host.identity()
    before = host.spent
    host.run(["nap"])
    host.run(["nap"])
    assert host.spent - before >= 0.4  # both naps counted
    _left(host, 0.5)
    hung = ended_within(HANG_BOUND, lambda: host.run(["slow"]), "a command past the limit")
    assert isinstance(hung, TargetTimeout) and "hung while waiting for it" in str(hung)
    assert host.spent >= 300.0
    host.close()


HELLO = ("import json, sys, time\n"
         "head = sys.stdin.buffer.readline().split()\n"  # the source, then the code, as sent
         "sys.stdin.buffer.read(int(head[0]) + int(head[1]))\n"
         "hello = json.dumps({'hello': {'euid': 0, 'identity': {'root': '/'}}})\n"
         "sys.stdout.write('%d\\n%s' % (len(hello), hello)); sys.stdout.flush()\n")
"""A stand-in for the agent that takes its source as the bootstrap does (all of it: more than a
pipe holds), says hello, then answers its first request with ANSWER."""


@pytest.mark.parametrize(("hello", "answer"), [
    ("", "5\nxxxxx"),  # not JSON at all
    ("", "-5\n{}"),  # a length that is no length
    ("", "2\n[]"),  # JSON, but not one answer per request
    ("", "4\n[17]"),  # one answer, but not an answer
    ("", "12\n{\"value\": 1}"),  # not a list of answers
    ("", "A" * 100),  # no length line at all, and no line end to wait for
    ("5\nxxxxx", None),  # a hello that is not JSON
])
def test_an_answer_that_is_not_the_agents_loses_the_target(hello: str,
                                                           answer: str | None) -> None:
    """A target whose stream is not the agent's (a shell's startup file that prints, a
    wrapper, a corrupted stream) is lost with a message: the stream can no longer be trusted
    to pair answers with requests, and nothing raised past the host stops the whole run. At
    once: the stub would wait ten minutes more."""
    if answer is None:
        code = ("import sys, time\nsys.stdin.buffer.readline()\n"
                f"sys.stdout.write({hello!r}); sys.stdout.flush(); time.sleep(600)\n")
    else:
        code = HELLO + ("sys.stdin.buffer.readline()\n"
                        f"sys.stdout.write({answer!r}); sys.stdout.flush(); time.sleep(600)\n")
    host = AgentHost("test://garbled", [sys.executable, "-c", code], "/", name="garbled")
    lost = ended_within(HANG_BOUND, lambda: host.batch([Read("proc/sys/vm/swappiness")]),
                        "reading a garbled answer")
    assert isinstance(lost, HostError) and "not the agent's answer" in str(lost), lost
    assert host.lost is not None and str(host.lost) == str(lost)
    assert "test://garbled" in str(lost)
    with pytest.raises(HostError, match="not the agent's answer"):  # at once, the same reason
        host.batch([Read("proc/sys/vm/swappiness")])
    assert host._process is not None and host._process.poll() is not None  # ended, not left
    host.close()


def test_an_answer_larger_than_any_the_agent_sends_loses_the_target_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A length no answer has (a corrupted stream, or a number a shell startup file printed)
    is refused when it is read, not buffered until the operation's time is up (made longer
    here than the test waits)."""
    monkeypatch.setattr(remote, "OPERATION_TIMEOUT_S", 600.0)
    code = HELLO + ("import os\nsys.stdin.buffer.readline()\n"
                    "sys.stdout.write('%d\\n' % (1 << 40)); sys.stdout.flush()\n"
                    "chunk = b'A' * (1 << 16)\n"
                    "while True: os.write(1, chunk)\n")
    host = AgentHost("test://huge", [sys.executable, "-c", code], "/", name="huge")
    lost = ended_within(HANG_BOUND, lambda: host.batch([Read("proc/sys/vm/swappiness")]),
                        "reading an answer of a terabyte")
    assert isinstance(lost, HostError) and "not the agent's answer" in str(lost), lost
    assert "1099511627776 bytes" in str(lost)
    host.close()


def test_a_kernel_log_of_64_mib_comes_back_whole(fake: FakeHost) -> None:
    """The largest answer the agent sends (the kernel log, bounded at 64 MiB), taken in the
    pipe's 64 KiB pieces. (How fast is bench/'s to measure, not a test's.)"""
    record = "6,1,1,-;" + "x" * 120 + "\n"
    fake.file("dev/kmsg", record * (60 * 2**20 // len(record)))
    host = _agent(fake.root, 600.0)
    host.identity()
    [reply] = host.batch([Kmsg("dev/kmsg")])
    records = reply.lines()
    assert len(records) == 60 * 2**20 // len(record) and records[-1] == record.rstrip("\n")
    assert host.traffic.bytes_received > 60 * 2**20  # one answer, base64 and all
    host.close()


def test_replies_survive_the_way_to_another_process(fake: FakeHost, host: LocalHost) -> None:
    """What an xdist controller collected is handed to its workers as JSON: every kind of
    request and reply comes back equal."""
    import json

    from pytest_gpuhost.host import (
        Glob,
        Kmsg,
        Link,
        ListDir,
        Request,
        Stat,
        Which,
        reply_from_wire,
        reply_to_wire,
        request_from_wire,
    )

    fake.sysctl("vm.swappiness", 10).kmsg([(6, "hello")])
    fake.file("usr/bin/tool", "#!/bin/sh\n", mode=0o755)
    (fake.root / "link").symlink_to("proc/sys/vm/swappiness")
    requests: list[Request] = [Read("proc/sys/vm/swappiness"), Read("missing"), Stat("proc/sys/vm"),
                ListDir("proc/sys/vm"), Glob("proc/sys/vm/*"), Glob("proc/*", read=False),
                Glob("*", links=True), Kmsg(), Link("link"), Link("proc"), Which("tool"),
                Which("nothing")]
    replies = host.batch(requests)
    wired = json.loads(json.dumps(agent.encode(
        [[request.wire(), reply_to_wire(request, reply)] for request, reply in
         zip(requests, replies, strict=True)])))
    decoded = agent.decode(wired)
    assert isinstance(decoded, list)
    back = [(request_from_wire(wire), answer) for wire, answer in decoded]
    assert [request for request, _ in back] == requests
    for (request, answer), reply in zip(back, replies, strict=True):
        again = reply_from_wire(request, answer)
        assert (again.value, str(again.error), getattr(again.error, "errno", None)) == (
            reply.value, str(reply.error), getattr(reply.error, "errno", None))


def test_a_kept_error_is_raised_as_a_copy_that_holds_no_frames() -> None:
    """A cached reply's error is raised many times (each check that reads it): raising the kept
    object would attach a traceback to it, which would keep the raising frames for the session
    and grow at each raise."""
    import errno
    import traceback

    from pytest_gpuhost.host import CommandTimeout, Reply

    kept = CommandTimeout("modprobe ran past 60 s", ("modprobe", "nvidia"), 60.0)
    reply = Reply(error=kept)
    depths = []
    for _ in range(3):
        with pytest.raises(CommandTimeout) as caught:
            reply.get()
        assert caught.value is not kept and caught.value.errno == errno.ETIMEDOUT
        assert caught.value.argv == ("modprobe", "nvidia") and caught.value.timeout == 60.0
        assert str(caught.value) == "modprobe ran past 60 s"
        depths.append(len(traceback.extract_tb(caught.value.__traceback__)))
    assert kept.__traceback__ is None and len(set(depths)) == 1


class RacedLibc:
    """openat2 answering EAGAIN ``times`` times (a rename or mount raced its `..`), then as the
    kernel does; the rest of libc as it is."""

    def __init__(self, libc: ctypes.CDLL, times: int) -> None:
        self.libc = libc
        self.times = times
        self.calls = 0

    def syscall(self, number: int, *args: object) -> int:
        import errno

        self.calls += 1
        if self.calls <= self.times:
            ctypes.set_errno(errno.EAGAIN)
            return -1
        result: int = self.libc.syscall(number, *args)
        return result


@pytest.mark.parametrize("times", [3, 50])
def test_a_lookup_raced_by_a_mount_is_retried_then_walked(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
    """openat2(RESOLVE_IN_ROOT) answers EAGAIN when a rename or mount anywhere raced a lookup
    through `..` (sysfs device links have them): a busy node's containers make it happen. The
    read is retried, then walked; it never fails, and never drops a GPU from the inventory."""
    fake.gpu("0000:01:00.0")
    host = LocalHost(fake.root)
    if not host._root._openat2:
        pytest.skip("no openat2 here: the walk is all there is")
    libc = agent.containment._libc_openat2()
    assert libc is not None  # openat2 is used here
    raced = RacedLibc(libc, times)
    monkeypatch.setattr(agent.containment, "_openat2_state", [raced])
    assert host.read_text("sys/bus/pci/devices/0000:01:00.0/vendor").strip() == "0x10de"
    assert raced.calls == min(times + 1, agent.containment._OPENAT2_TRIES)
    assert host._root._openat2  # still used for the next lookups


def test_a_connection_used_from_two_threads_answers_each_its_own(fake: FakeHost) -> None:
    """A benchmark's envelope samples the GPUs from a background thread while the run's thread
    may ask the same target (a sample left behind in flight, then the host's half read at the
    end): one request and its answer at a time on the one connection, never one thread's answer
    read by the other or two requests' bytes interleaved on the pipe."""
    import threading

    fake.sysctl("vm.swappiness", 10).sysctl("vm.dirty_ratio", 40)
    host = _agent(fake.root, 600.0)
    start = threading.Barrier(2)
    wrong: list[str] = []

    def ask(key: str, value: bytes) -> None:
        start.wait()
        for _ in range(150):
            try:
                reply = host.batch([Read(f"proc/sys/vm/{key}")])[0]
            except HostError as exc:
                wrong.append(f"{key}: {exc}")
                return
            if reply.data() != value:
                wrong.append(f"{key}: {reply.data()!r}")

    threads = [threading.Thread(target=ask, args=("swappiness", b"10\n")),
               threading.Thread(target=ask, args=("dirty_ratio", b"40\n"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert host.lost is None and host.traffic.round_trips == 300
