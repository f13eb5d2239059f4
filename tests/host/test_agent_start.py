"""How the agent starts on a target: ``python3 -I -S`` runs the bootstrap, which takes the
agent's compiled code where its Python has this machine's bytecode magic number and compiles
the source otherwise; nothing of the target's working directory or environment comes into its
module path; and what the target says before it has the whole agent loses it at once."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from pytest_gpuhost.host import HostError, Read, TargetLost
from pytest_gpuhost.host.agent.wire import decode
from pytest_gpuhost.host.answers import take_message
from pytest_gpuhost.host.remote import AgentHost, agent_command, agent_upload
from pytest_gpuhost.host.upload import agent_source
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import ended_within

HANG_BOUND = 60.0


def hello_of(root: Path, upload: bytes, *, cwd: Path | None = None,
             env: dict[str, str] | None = None) -> object:
    """The first message of the agent started as a target starts it (this machine's python3
    in place of the target's) after ``upload``; its stdin then closes, so it ends."""
    process = subprocess.run([sys.executable, *agent_command(str(root))[1:]], input=upload,
                             capture_output=True, timeout=HANG_BOUND, cwd=cwd, env=env)
    whole, message = take_message(bytearray(process.stdout))
    assert whole, (process.stdout[:200], process.stderr[-2000:])
    return message


def upload(source: bytes, code: bytes, magic: str) -> bytes:
    return b"%d %d %s\n" % (len(source), len(code), magic.encode()) + source + code


def parts() -> tuple[bytes, bytes, str]:
    """The source, the compiled code and the magic number of what the run sends."""
    sent = agent_upload()
    head, rest = sent.split(b"\n", 1)
    sizes = head.split()
    source_size = int(sizes[0])
    assert rest[:source_size] == agent_source()  # the agent's modules, joined
    assert len(rest) == source_size + int(sizes[1])
    return rest[:source_size], rest[source_size:], sizes[2].decode()


def test_the_run_sends_the_source_and_the_code_of_its_own_python(fake: FakeHost) -> None:
    _, code, magic = parts()
    assert magic == importlib.util.MAGIC_NUMBER.hex()
    assert code  # marshal.dumps of the compiled agent
    hello = hello_of(fake.root, agent_upload())
    assert isinstance(hello, dict) and hello["hello"]["identity"]["root"] == str(fake.root)


def test_a_target_with_the_same_magic_number_runs_the_compiled_code(fake: FakeHost) -> None:
    """Proved by a source that would not start: the compiled code is what ran."""
    _, code, magic = parts()
    broken = b"raise SystemExit('the source was compiled')\n"
    hello = hello_of(fake.root, upload(broken, code, magic))
    assert isinstance(hello, dict) and hello["hello"]["identity"]["root"] == str(fake.root)


def test_a_target_with_another_python_compiles_the_source(fake: FakeHost) -> None:
    """Another magic number (another Python version there): the code, which that Python could
    not load, is not touched (here: bytes that are no code at all) and the source runs."""
    source, _, magic = parts()
    other = f"{(int(magic, 16) ^ 0xFFFF):0{len(magic)}x}"
    hello = hello_of(fake.root, upload(source, b"\x00not marshal data", other))
    assert isinstance(hello, dict) and hello["hello"]["identity"]["root"] == str(fake.root)
    hello = hello_of(fake.root, upload(source, b"", magic))  # no code sent: the source
    assert isinstance(hello, dict) and hello["hello"]["identity"]["root"] == str(fake.root)


def test_nothing_of_the_targets_directory_or_environment_reaches_the_agents_imports(
        fake: FakeHost, tmp_path: Path) -> None:
    """``python3 -c`` puts its working directory first in the module path, and PYTHONPATH
    before the standard library: a ``json.py`` in root's home on the target (where ssh's
    command starts) would run inside the agent, as root. ``-I -S``: neither is looked at."""
    planted = tmp_path / "planted"
    planted.mkdir()
    canary = tmp_path / "canary"
    for name in ("json", "base64", "selectors", "fnmatch"):
        (planted / f"{name}.py").write_text(
            f"open({str(canary)!r}, 'a').write({name!r} + '\\n')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(planted), "PYTHONSTARTUP": str(planted)}
    hello = hello_of(fake.root, agent_upload(), cwd=planted, env=env)
    assert isinstance(hello, dict) and hello["hello"]["identity"]["root"] == str(fake.root)
    assert not canary.exists(), canary.read_text()


def test_a_target_that_speaks_before_it_has_the_agent_is_lost_at_once(fake: FakeHost) -> None:
    """A forced command, a banner or a shell's startup file that prints, then no reading: the
    agent is bigger than the pipe holds, so the send would wait its whole timeout; what came
    back first ends it at once, said as it is."""
    fake.sysctl("vm.swappiness", 10)
    banner = [sys.executable, "-c", "import sys, time\nsys.stdout.write('Welcome to pve1\\n')\n"
              "sys.stdout.flush()\ntime.sleep(600)\n"]
    host = AgentHost("test://banner", banner, str(fake.root), connect_timeout=600.0,
                     name="banner")
    lost = ended_within(HANG_BOUND, lambda: host.batch([Read("proc/sys/vm/swappiness")]),
                        "a target that speaks first")
    assert isinstance(lost, TargetLost), lost
    assert str(lost).startswith("cannot reach test://banner: the target sent something that "
                                "is not the agent's answer: b'Welcome to pve1\\n'"), str(lost)
    assert "shell startup file" in str(lost)  # what to do about it
    assert host._process is not None and host._process.poll() is not None  # ended, not left
    assert isinstance(host.lost, HostError)
    host.close()


def test_a_session_let_go_ends_on_its_own_and_the_next_close_reaps_it(fake: FakeHost) -> None:
    """``let_go`` closes the agent's input and returns: the agent exits by itself (so many
    sessions end together), the next read connects again, and ``close`` waits for every
    process let go."""
    fake.sysctl("vm.swappiness", 10)
    host = AgentHost(f"test://{fake.root.name}",
                     [sys.executable, *agent_command(str(fake.root))[1:]], str(fake.root))
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    first = host._process
    assert first is not None
    host.let_go()
    assert host._process is None and host._closing == [first]
    assert first.wait(timeout=HANG_BOUND) == 0  # its input closed: it ended, cleanly
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    assert host.traffic.connections == 2
    second = host._process
    assert second is not None and second is not first
    host.close()
    assert host._closing == [] and second.returncode == 0


def test_a_python_too_old_for_the_agents_flags_is_said_as_such(fake: FakeHost,
                                                              tmp_path: Path) -> None:
    """An old inventory's ``ansible_python_interpreter=/usr/bin/python`` (Python 2.7 on a
    CentOS 7 host) refuses ``-I`` before the bootstrap could say which version it needs: the
    message says the interpreter is too old, not only Python's usage line."""
    old = tmp_path / "python2.7"
    old.write_text("#!/bin/sh\necho 'Unknown option: -I' >&2\n"
                   "echo 'usage: /usr/bin/python [option] ... [-c cmd | -m mod | file | -] "
                   "[arg] ...' >&2\necho \"Try \\`python -h' for more information.\" >&2\n"
                   "exit 2\n")
    old.chmod(0o755)
    host = AgentHost("test://old", agent_command(str(fake.root), str(old)), str(fake.root),
                     name="old")
    lost = ended_within(HANG_BOUND, lambda: host.batch([Read("proc/sys/vm/swappiness")]),
                        "a python without -I")
    assert isinstance(lost, HostError)
    assert str(lost).startswith("cannot reach test://old: the target's python is too old to "
                                "start the agent (it has no -I: pytest-gpuhost needs python3 "
                                "3.8+ there): Unknown option: -I"), str(lost)
    host.close()


HOLD_UNTIL_FIRST_REQUEST = """\
import subprocess, sys, threading
given = sys.stdin.buffer
head = given.readline()
agent = given.read(sum(int(size) for size in head.split()[:2]))
length = given.readline()
request = given.read(int(length))  # the agent starts only once the first request is here
process = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE)
process.stdin.write(head + agent + length + request)
process.stdin.flush()


def relay():
    for chunk in iter(lambda: given.read1(65536), b""):
        process.stdin.write(chunk)
        process.stdin.flush()
    process.stdin.close()


threading.Thread(target=relay, daemon=True).start()
sys.exit(process.wait())
"""
"""A target that starts the agent only once it holds the agent and the first request: a run
that waited for the agent's hello before it sent its first batch would wait there forever."""


def test_a_connections_first_batch_goes_out_behind_the_agent_before_its_hello(
        fake: FakeHost, tmp_path: Path) -> None:
    """Connecting is one round trip less: the first batch (reads only) is sent right behind
    the agent, and the agent reads it once it has started and said its hello."""
    fake.sysctl("vm.swappiness", 10)
    holder = tmp_path / "hold.py"
    holder.write_text(HOLD_UNTIL_FIRST_REQUEST)
    argv = [sys.executable, str(holder), sys.executable, *agent_command(str(fake.root))[1:]]
    host = AgentHost("test://held", argv, str(fake.root), connect_timeout=1.0, name="held")
    replies = ended_within(HANG_BOUND, lambda: host.batch([Read("proc/sys/vm/swappiness")]),
                           "a first batch held back until the hello")
    assert isinstance(replies, list), replies
    assert replies[0].data() == b"10\n"
    assert host.identity().root == str(fake.root)  # the hello, taken before the answer
    assert (host.traffic.connections, host.traffic.round_trips) == (1, 1)
    assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"  # the next:
    assert host.traffic.round_trips == 2  # its own round trip over the same connection
    host.close()


def test_an_agent_that_refuses_its_root_says_why_with_a_first_batch_behind_it(
        tmp_path: Path) -> None:
    """The agent answers a root it cannot open with a hello that says so, and exits: the
    batch sent behind it (bigger than a pipe holds) stops when the agent speaks, or finds the
    pipe closed, and the hello's words are what the run says, as they were before a batch
    came with the agent."""
    missing = tmp_path / "no-such-root"
    host = AgentHost("test://missing", [sys.executable, *agent_command(str(missing))[1:]],
                     str(missing), name="missing")
    many = [Read(f"proc/sys/{'x' * 100}/{index}") for index in range(1000)]  # more than a
    # pipe holds: the send still waits when the agent exits, and fails
    lost = ended_within(HANG_BOUND, lambda: host.batch(many), "an agent that refused its root")
    assert isinstance(lost, TargetLost), lost
    assert f"the host root {missing} cannot be opened" in str(lost), str(lost)
    host.close()


def test_the_bootstrap_leaves_what_follows_the_agent_to_the_agent(fake: FakeHost) -> None:
    """The agent and a request in one write, as a pipe may deliver them: the bootstrap reads
    exactly the agent's bytes (a buffered reader would read on into the request, which the
    agent, reading its input itself, would then never see) and the request is answered."""
    fake.sysctl("vm.swappiness", 10)
    request = json.dumps([Read("proc/sys/vm/swappiness").wire()]).encode()
    process = subprocess.run([sys.executable, *agent_command(str(fake.root))[1:]],
                             input=agent_upload() + b"%d\n" % len(request) + request,
                             capture_output=True, timeout=HANG_BOUND)
    said = bytearray(process.stdout)
    whole, hello = take_message(said)
    assert whole and isinstance(hello, dict) and hello["hello"] is not None, process.stderr
    whole, answer = take_message(said)
    assert whole, (bytes(said[:200]), process.stderr[-2000:])
    assert decode(answer) == [{"value": b"10\n"}], answer


def test_a_first_batch_bigger_than_a_pipe_goes_out_whole_around_the_hello(
        fake: FakeHost) -> None:
    """A first batch bigger than the pipe holds is still going out when the agent says its
    hello (it reads the batch only after): the send stops for the hello and the rest follows,
    or the agent would wait for it as the run waits for the answer."""
    fake.sysctl("vm.swappiness", 10)
    many = [Read("proc/sys/vm/swappiness"),
            *(Read(f"proc/sys/{'x' * 100}/{index}") for index in range(1000))]
    host = AgentHost("test://big", [sys.executable, *agent_command(str(fake.root))[1:]],
                     str(fake.root), name="big")
    replies = ended_within(HANG_BOUND, lambda: host.batch(many), "a big first batch")
    assert isinstance(replies, list), replies
    assert replies[0].data() == b"10\n" and len(replies) == len(many)
    assert (host.traffic.connections, host.traffic.round_trips) == (1, 1)
    host.close()


def test_a_target_that_speaks_after_the_agent_and_stops_reading_is_lost_at_once(
        fake: FakeHost) -> None:
    """A target that takes the agent, then prints what is not its hello and reads no more:
    the first batch behind the agent (bigger than the pipe holds) stops going out when the
    target speaks, and what it said loses it at once, not when the send's time is up."""
    reads_then_talks = [sys.executable, "-c", (
        "import sys, time\ni = sys.stdin.buffer\nh = i.readline().split()\n"
        "i.read(int(h[0]) + int(h[1]))\nsys.stdout.write('Welcome to pve1\\n')\n"
        "sys.stdout.flush()\ntime.sleep(600)\n")]
    host = AgentHost("test://talks", reads_then_talks, str(fake.root), connect_timeout=600.0,
                     name="talks")
    many = [Read(f"proc/sys/{'x' * 100}/{index}") for index in range(1000)]
    lost = ended_within(HANG_BOUND, lambda: host.batch(many), "a target that speaks late")
    assert isinstance(lost, TargetLost), lost
    assert str(lost).startswith("cannot reach test://talks: the target sent something that "
                                "is not the agent's answer: b'Welcome to pve1"), str(lost)
    host.close()
