"""A host reached through a command: over one OpenSSH session, or into an LXC container.

Nothing is installed on the target. The connection's command starts ``python3`` there with a
two-line bootstrap that reads the agent's source (``agent.py``) from standard input and runs it;
from then on each ``batch`` is one message each way, one round trip. The connection is made at
the first call and kept for the run; if it cannot be made, or is lost, every later call fails at
once with the same reason (ssh's own words), and nothing waits past its timeout.

A time limit (--gpuhost-target-timeout) bounds the sum of this process's waits on the target:
connecting, and every answer after. A wait that would pass it is cut short: the connection is
killed at once (ssh, and a ProxyCommand with it) and the target is lost with a ``TargetTimeout``
naming the step the run was in (``host.doing``), so the run goes on without it.

ssh is run with the user's configuration (``-F FILE`` when given: Host aliases, ProxyJump,
identities, ControlMaster all apply), ``BatchMode=yes`` (never a prompt: a host key that the
configuration does not accept, a password, a passphrase end the connection with ssh's message)
and keep-alives, so a dead peer is noticed.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import selectors
import shlex
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import msgspec

from . import (
    COMMAND_TIMEOUT_S,
    BatchReads,
    CommandResult,
    CommandTimeout,
    HostError,
    HostIdentity,
    Reply,
    Request,
    TargetLost,
    TargetTimeout,
    checked_command,
    checked_relative,
    current_step,
    doing,
    reply_from_wire,
)
from .agent import decode, encode

AGENT_SOURCE = Path(__file__).with_name("agent.py")
MINIMUM_PYTHON = (3, 8)
HOST_KEY_REFUSED = "Host key verification failed"
"""What ssh says when it refuses a target's host key (unknown under strict checking, or
changed)."""
MAX_MESSAGE = 256 * 2**20
"""The largest answer taken from the target: more than any batch of bounded reads (a kernel
log's 64 MiB of records the largest), so a length beyond it is a stream gone wrong."""
HEADER_LIMIT = 32
"""A length line is a number of at most this many bytes."""
OPERATION_TIMEOUT_S = 60.0
"""The longest a read, write or listing may take on the target before the host is lost."""
BOOTSTRAP = (
    "import sys\n"
    f"if sys.version_info < {MINIMUM_PYTHON}: sys.exit('pytest-gpuhost needs python3 "
    f"{'.'.join(map(str, MINIMUM_PYTHON))} or later on the target; it has ' + "
    "sys.version.split()[0])\n"
    "n = int(sys.stdin.buffer.readline())\n"
    "exec(compile(sys.stdin.buffer.read(n), 'pytest-gpuhost-agent', 'exec'))\n"
)
"""What the target runs: it reads the agent's source from standard input and runs it with the
root as its argument; the agent then serves on the same pipes. Nothing is written there."""


class Traffic(msgspec.Struct):
    """What a connection cost: the JSON report records it per target."""

    round_trips: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    connect_seconds: float | None = None
    connections: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"round_trips": self.round_trips, "connections": self.connections,
                "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received,
                "connect_seconds": round(self.connect_seconds, 4)
                if self.connect_seconds is not None else None}


class AgentHost(BatchReads):
    """A machine whose agent answers on the pipes of ``argv`` (ssh, lxc-attach)."""

    def __init__(self, url: str, argv: Sequence[str], root: str, *,
                 connect_timeout: float = 10.0, time_limit: float | None = None,
                 name: str | None = None, refused_key_hint: str = "") -> None:
        self.url = url
        self.refused_key_hint = refused_key_hint
        """Said after ssh's own words when it refuses the target's host key (what to do)."""
        self.argv = list(argv)
        self.root = root
        self.connect_timeout = connect_timeout
        self.time_limit = time_limit
        """Seconds this process may wait on the target in all (None: no limit)."""
        self.spent = 0.0
        """Seconds waited on it so far."""
        self.name = name or url
        self.traffic = Traffic()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=20)
        self._buffer = bytearray()  # appended to in place: a long answer is copied once
        self._hello: dict[str, object] = {}
        self._lost: HostError | None = None

    # -- the connection ---------------------------------------------------------------------

    @property
    def lost(self) -> HostError | None:
        """Why the target cannot be used any more (None while it can)."""
        return self._lost

    def _connect(self) -> None:
        if self._lost is not None:
            raise self._lost
        if self._process is not None:
            return
        with doing("connecting"):
            self._start()

    def _start(self) -> None:
        start = time.monotonic()
        try:
            process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            self._lost = TargetLost(f"cannot reach {self.url}: cannot run {self.argv[0]}: "
                                   f"{exc.strerror}", exc.errno)
            raise self._lost from None
        self._process = process
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)  # writes wait in _send_raw, bounded
        threading.Thread(target=self._drain_stderr, args=(process,), daemon=True).start()
        source = AGENT_SOURCE.read_bytes()
        try:
            self._send_raw(b"%d\n" % len(source) + source, self.connect_timeout + 5.0,
                           "the agent's source")
            hello = self._wait(self.connect_timeout + 5.0, "the agent to start")
        except TargetTimeout as exc:
            self._lost = exc
            self._close_process(kill=True)
            raise
        except HostError as exc:
            hint = " (a shell startup file there that prints on a non-interactive login, such " \
                "as an echo in ~/.bashrc, comes before the agent: make it print only in an " \
                "interactive shell)" if exc.errno == errno.EPROTO else ""
            if HOST_KEY_REFUSED in str(exc):
                hint = self.refused_key_hint
            self._lost = TargetLost(f"cannot reach {self.url}: {exc}{hint}", exc.errno)
            self._close_process(kill=exc.errno in (errno.EPROTO, errno.ETIMEDOUT))
            raise self._lost from None
        self.traffic.connect_seconds = (self.traffic.connect_seconds or 0.0) + \
            time.monotonic() - start
        self.traffic.connections += 1
        if not isinstance(hello, dict) or not isinstance(hello.get("hello"), dict):
            reason = hello.get("error") if isinstance(hello, dict) else hello
            self._lost = TargetLost(f"cannot use {self.url}: {reason}")
            self._close_process()
            raise self._lost
        self._hello = hello["hello"]

    def _drain_stderr(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self._stderr.append(line.decode("utf-8", "replace").rstrip())

    def _said(self) -> str:
        """What ssh (or python3 there) last said, for a message."""
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=0.5)  # let the last words reach the drain thread
        time.sleep(0.05)
        lines = [line for line in self._stderr if line.strip()]
        return " / ".join(lines[-3:])

    @contextlib.contextmanager
    def _waiting(self, timeout: float) -> Iterator[tuple[float, bool]]:
        """One wait on the target (a send, an answer): its deadline, ``timeout`` seconds from
        now or what is left of the time limit if that is sooner (``bounded``: the limit is
        what ends it), and its time counted in the limit whatever happens."""
        start = time.monotonic()
        left = None if self.time_limit is None else self.time_limit - self.spent
        if left is not None and left <= 0:
            raise self._hung()
        allowed = timeout if left is None else min(timeout, left)
        try:
            yield start + allowed, allowed < timeout
        finally:
            self.spent += time.monotonic() - start

    def _send_raw(self, data: bytes, timeout: float, sending: str) -> None:
        """Write ``data`` within ``timeout`` seconds and within what is left of the time limit.

        A target that stops reading (a frozen container: ``lxc-freeze``, a backup in suspend
        mode, a stopped agent) fills the pipe, and ssh's channel window after it; a blocking
        write of a bigger message would then wait past every limit. The pipe is non-blocking
        and each write waits for room only until the deadline."""
        assert self._process is not None and self._process.stdin is not None
        fd = self._process.stdin.fileno()
        rest = memoryview(data)
        with self._waiting(timeout) as (deadline, bounded), \
                selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            while rest:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if bounded:
                        raise self._hung()
                    raise HostError(f"it stopped reading: {len(data) - len(rest)} of the "
                                    f"{len(data)} bytes of {sending} went in {timeout:g} s",
                                    errno.ETIMEDOUT)
                if not selector.select(min(remaining, 1.0)):
                    continue
                try:
                    rest = rest[os.write(fd, rest):]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the connection is gone
                    raise self._gone("the connection closed") from None
        self.traffic.bytes_sent += len(data)

    def _gone(self, what: str) -> HostError:
        said = self._said()  # waits a moment for the exit status and the last words
        code = self._process.poll() if self._process is not None else None
        if ("python3" in said and ("not found" in said or "No such" in said)) or (
                code == 127 and not said):  # a 127 that names another command is about that
            reason = f"python3 is not installed there (pytest-gpuhost needs python3 " \
                     f"{'.'.join(map(str, MINIMUM_PYTHON))}+ on the target): {said}"
        else:
            reason = said or (f"{self.argv[0]} exited {code}" if code is not None else what)
        return HostError(reason, errno.ECONNRESET)

    def _wait(self, timeout: float, waiting_for: str, why: str | None = None) -> object:
        """One message within ``timeout`` seconds and within what is left of the time limit
        (``why`` the target may take long, said if it takes too long)."""
        with self._waiting(timeout) as (deadline, bounded):
            try:
                return self._receive(deadline, waiting_for)
            except HostError as exc:
                if bounded and exc.errno == errno.ETIMEDOUT:
                    raise self._hung(why) from None
                raise

    def _hung(self, why: str | None = None) -> TargetTimeout:
        step = current_step() or "waiting for it"
        return TargetTimeout(f"target {self.name} hung while {step}: no answer within "
                             f"--gpuhost-target-timeout={self.time_limit:g} s"
                             f"{f' ({why})' if why else ''}, so the run went on without it", step)

    def _receive(self, deadline: float, waiting_for: str) -> object:
        """One message: a length line, then that many bytes of JSON."""
        assert self._process is not None and self._process.stdout is not None
        stdout = self._process.stdout
        fd = stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                newline = self._buffer.find(b"\n")
                if newline >= 0:
                    header = bytes(self._buffer[:newline])
                    try:
                        size = int(header)
                    except ValueError:
                        size = -1
                    if size < 0:
                        raise _garbled(header)
                    if size > MAX_MESSAGE:
                        raise _garbled(header, f" (an answer of {size} bytes, more than the "
                                               f"{MAX_MESSAGE} any answer of the agent's has)")
                    if len(self._buffer) >= newline + 1 + size:
                        payload = bytes(self._buffer[newline + 1:newline + 1 + size])
                        del self._buffer[:newline + 1 + size]
                        self.traffic.bytes_received += newline + 1 + size
                        try:
                            return json.loads(payload)
                        except ValueError:  # not JSON (UnicodeDecodeError is one too)
                            raise _garbled(payload) from None
                elif len(self._buffer) > HEADER_LIMIT:
                    raise _garbled(bytes(self._buffer))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise HostError(f"no answer in time while waiting for {waiting_for}",
                                    errno.ETIMEDOUT)
                if not selector.select(min(remaining, 1.0)):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._gone("the connection closed")
                self._buffer += chunk

    def _exchange(self, requests: list[dict[str, object]], timeout: float,
                  why: str | None = None) -> list[object]:
        self._connect()
        data = json.dumps(encode(requests), separators=(",", ":")).encode()
        try:
            self._send_raw(b"%d\n" % len(data) + data, timeout, f"{len(requests)} request(s)")
            answer = self._wait(timeout, f"{len(requests)} request(s)", why)
        except TargetTimeout as exc:
            self._lost = exc
            self._close_process(kill=True)
            raise
        except HostError as exc:
            self._lost = TargetLost(f"lost the connection to {self.url}: {exc}", exc.errno)
            self._close_process(kill=exc.errno in (errno.EPROTO, errno.ETIMEDOUT))
            raise self._lost from None
        self.traffic.round_trips += 1
        try:
            decoded = decode(answer)
        except ValueError:  # a {"b64": ...} that is not base64
            decoded = None
        if not isinstance(decoded, list) or len(decoded) != len(requests) or not all(
                isinstance(item, dict) and ("value" in item or "error" in item)
                for item in decoded):
            # the next answer could be this one's: nothing more is read from this stream
            self._lost = TargetLost(f"lost the connection to {self.url}: "
                                   f"{_garbled(json.dumps(answer).encode())}", errno.EPROTO)
            self._close_process(kill=True)
            raise self._lost
        return decoded

    def _op(self, request: dict[str, object], timeout: float | None = None,
            why: str | None = None) -> object:
        """One request (``timeout``: OPERATION_TIMEOUT_S as it is when called)."""
        [answer] = self._exchange([request], OPERATION_TIMEOUT_S if timeout is None else timeout,
                                  why)
        assert isinstance(answer, dict)
        if "error" in answer:
            code = answer.get("errno")
            raise HostError(str(answer["error"]), int(code) if isinstance(code, int) else None)
        return answer.get("value")

    def _close_process(self, *, kill: bool = False) -> None:
        """Close the agent's input and let it exit (``kill``: at once, a hung target)."""
        process = self._process
        if process is None:
            return
        if kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, 9)
        for stream in (process.stdin,):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, 9)
            process.wait()

    def close(self) -> None:
        """End the session: the agent sees its input close and exits, leaving nothing (its
        locks drop with it). The next call connects again."""
        self._close_process()
        self._process = None
        self._buffer = bytearray()

    # -- Host -------------------------------------------------------------------------------

    def describe(self) -> str:
        return self.url

    def local_machine(self) -> bool:
        return False

    def local_path(self, path: str) -> Path | None:
        return None

    def privileged(self) -> bool:
        self._connect()
        return self._hello.get("euid") == 0

    def identity(self) -> HostIdentity:
        self._connect()
        identity = self._hello.get("identity")
        return HostIdentity.from_dict(identity if isinstance(identity, dict) else {})

    def invalidate(self) -> None:
        """Nothing is cached here: every read goes to the target."""

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        if not requests:
            return []
        answers = self._exchange([r.wire() for r in requests], OPERATION_TIMEOUT_S)
        return [reply_from_wire(request, answer)  # type: ignore[arg-type]
                for request, answer in zip(requests, answers, strict=True)]

    def write_text(self, path: str, text: str) -> None:
        self._op({"op": "write", "path": checked_relative(path),
                  "data": text.encode("utf-8", "surrogateescape"), "truncate": True})

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        self._op({"op": "write", "path": checked_relative(path), "data": data,
                  "offset": offset, "truncate": False})

    def replace_file(self, path: str, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        self._op({"op": "replace", "path": checked_relative(path), "data": data})

    def remove(self, path: str) -> None:
        self._op({"op": "remove", "path": checked_relative(path)})

    def create_file(self, path: str, data: bytes) -> None:
        self._op({"op": "create", "path": checked_relative(path), "data": data})

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        self._op({"op": "append", "path": checked_relative(path), "data": data, "sync": sync})

    def lock(self, path: str, timeout: float, holder: str) -> int:
        handle = self._op({"op": "lock", "path": checked_relative(path), "timeout": timeout,
                           "holder": holder}, timeout + OPERATION_TIMEOUT_S,
                          f"it was waiting for the lock {path}, which another pytest-gpuhost "
                          f"run may hold, and --gpuhost-lock-timeout={timeout:g} s is longer")
        assert isinstance(handle, int)
        return handle

    def unlock(self, handle: int) -> None:
        if self._lost is None and self._process is not None:  # a lost agent released it
            self._op({"op": "unlock", "handle": handle})

    def which(self, name: str) -> str | None:
        found = self._op({"op": "which", "name": checked_command(name)})
        return str(found) if found is not None else None

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        checked_command(argv[0] if argv else "")
        try:
            done = self._op({"op": "run", "argv": list(argv), "env": dict(env or {}),
                             "timeout": timeout}, timeout + OPERATION_TIMEOUT_S)
        except HostError as exc:
            if exc.errno == errno.ETIMEDOUT and self._lost is None:
                raise CommandTimeout(str(exc), tuple(argv), timeout) from None
            raise
        assert isinstance(done, dict)
        return CommandResult(tuple(argv), int(done["returncode"]), str(done["stdout"]),
                             str(done["stderr"]))


def _garbled(data: bytes, why: str = "") -> HostError:
    """What the target said instead of the agent's answer: a shell's startup file that
    prints, a wrapper's banner, a corrupted stream."""
    return HostError(f"the target sent something that is not the agent's answer: "
                     f"{data[:200]!r}{why}", errno.EPROTO)


def agent_command(root: str, python: str | None = None) -> list[str]:
    """The target's command line: ``python`` (an inventory's ansible_python_interpreter;
    default python3) running the bootstrap, the root as its argument."""
    return [python or "python3", "-c", BOOTSTRAP, root]


MASTER_PERSIST_S = 60
"""How long a shared master connection waits idle for the next session before it ends."""
MAX_SOCKET_PATH = 80
"""A control socket's path, with the 17 characters ssh adds while making it, stays within the
108 bytes of a Unix socket's name."""


def ssh_argv(destination: str, *, port: int | None, user: str | None, config: Path | None,
             connect_timeout: float, inner: Sequence[str], identity_file: str | None = None,
             extra: Sequence[str] = (), master: Path | None = None,
             strict_host_keys: bool = False) -> list[str]:
    """ssh running ``inner`` on ``destination`` (the remote side gets one shell-quoted line).
    ``extra`` (a host's own ssh arguments, an inventory's ``ansible_ssh_common_args``) comes
    before the run's options: ssh keeps the first value it is given of an option, so a host's
    ``-o ConnectTimeout=5`` wins over --gpuhost-connect-timeout, as the configuration file's
    values give way to both. Only ``BatchMode=yes`` comes before it: no host may make the run
    wait on a prompt (a password, a passphrase, an unknown host key), and, with
    ``strict_host_keys`` (a --fix or a rollback, unless --gpuhost-accept-new-host-keys),
    ``StrictHostKeyChecking=yes``: a host key known_hosts does not hold is refused whatever
    the configuration or the host's own arguments say (``accept-new``, ``no``), so root never
    writes to a machine whose key nobody checked. ``master``: a control socket for this
    target alone, shared by the processes of one run (OpenSSH's ControlMaster): the first
    makes the connection, the others open sessions over it without a new key exchange and
    login."""
    argv = ["ssh"]
    if config is not None:
        argv += ["-F", str(config)]
    argv += ["-o", "BatchMode=yes"]
    if strict_host_keys:
        argv += ["-o", "StrictHostKeyChecking=yes"]
    argv += [*extra]
    if identity_file is not None:
        argv += ["-i", identity_file]
    argv += ["-o", f"ConnectTimeout={max(1, round(connect_timeout))}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-T", "-e", "none"]
    if master is not None:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={master}",
                 "-o", f"ControlPersist={MASTER_PERSIST_S}"]
    if port is not None:
        argv += ["-p", str(port)]
    if user is not None:
        argv += ["-l", user]
    return [*argv, "--", destination, shlex.join(inner)]


def masters_directory(parent: Path) -> Path | None:
    """A directory for the control sockets of a run's ssh targets, or None where its path is
    too long for them (then every process makes its own connections)."""
    directory = parent / "ssh"
    if len(str(directory)) + 6 > MAX_SOCKET_PATH:
        return None
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def end_masters(directory: Path, timeout: float = 5.0) -> None:
    """Ask every master connection with a socket in ``directory`` to exit (``ssh -O exit``),
    all at once; one that does not answer within ``timeout`` ends by itself when idle."""
    asked = []
    for socket_path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if socket_path.is_socket():
            with contextlib.suppress(OSError):
                asked.append(subprocess.Popen(
                    ["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}", "-O", "exit",
                     "gpuhost-master"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    for process in asked:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def lxc_argv(container: str, inner: Sequence[str]) -> list[str]:
    """``lxc-attach -n CTID -- ...``: what Proxmox's ``pct exec`` runs."""
    return ["lxc-attach", "-n", container, "--", *inner]
