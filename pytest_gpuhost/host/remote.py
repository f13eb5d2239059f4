"""A host reached through a command: over one OpenSSH session, or into an LXC container.

Nothing is installed on the target. The connection's command starts ``python3`` there with a
short bootstrap that reads the agent's source (the modules of ``agent/`` joined into one, by
``upload.py``) from standard input and runs it; from then on each ``batch`` is one message each
way, one round trip. The connection is made at the first call and kept for the run; if it cannot
be made, or is lost, every later call fails at once with the same reason (ssh's own words), and
nothing waits past its timeout.

A time limit (--gpuhost-target-timeout) bounds the sum of this process's waits on the target:
connecting, and every answer after. A wait that would pass it is cut short: the connection is
killed at once (ssh, and a ProxyCommand with it) and the target is lost with a ``TargetTimeout``
naming the step the run was in (``host.doing``), so the run goes on without it.

ssh is run with the user's configuration (``-F FILE`` when given: Host aliases, ProxyJump,
identities, ControlMaster all apply), ``BatchMode=yes`` (never a prompt: a host key that the
configuration does not accept, a password, a passphrase end the connection with ssh's message)
and keep-alives, so a dead peer is noticed.

An interrupt (Ctrl-C, or SIGTERM and SIGHUP, which the run turns into one) while the target works
on a request sends the agent a cancel: a command it runs is killed with its whole process group,
and the connection stays usable for the journal's last lines; a target that does not answer the
cancel in CANCEL_WAIT_S is cut off, and its agent, seeing its input close, does the same.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

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
    checked_program,
    checked_relative,
    current_step,
    doing,
    reply_from_wire,
)
from .agent.wire import decode, encode
from .answers import HEADER_LIMIT as HEADER_LIMIT
from .answers import MAX_MESSAGE as MAX_MESSAGE
from .answers import batch_problem, hello_problem
from .pipes import MINIMUM_PYTHON as MINIMUM_PYTHON
from .pipes import STDERR_KEPT as STDERR_KEPT
from .pipes import Pipes
from .pipes import Traffic as Traffic
from .ssh import end_masters as end_masters
from .ssh import lxc_argv as lxc_argv
from .ssh import masters_directory as masters_directory
from .ssh import ssh_argv as ssh_argv
from .upload import AGENT_NAME as AGENT_NAME
from .upload import AGENT_PACKAGE
from .upload import agent_upload as agent_upload

AGENT_SOURCE = AGENT_PACKAGE
"""Where the agent's source is: the folder of its modules (``upload.py`` joins them)."""
HOST_KEY_REFUSED = "Host key verification failed"
"""What ssh says when it refuses a target's host key (unknown under strict checking, or
changed)."""
OPERATION_TIMEOUT_S = 60.0
"""The longest a read, write or listing may take on the target before the host is lost."""
CANCEL_WAIT_S = 10.0
"""How long an interrupted run waits for the agent to stop what it was doing and answer."""
BOOTSTRAP = (
    "import sys\n"
    f"if sys.version_info < {MINIMUM_PYTHON}: sys.exit('pytest-gpuhost needs python3 "
    f"{'.'.join(map(str, MINIMUM_PYTHON))} or later on the target; it has ' + "
    "sys.version.split()[0])\n"
    "i = sys.stdin.buffer.raw\n"
    "def r(n):\n"
    "    b = b''\n"
    "    while len(b) < n:\n"
    "        d = i.read(n - len(b))\n"
    "        if not d: break\n"
    "        b += d\n"
    "    return b\n"
    "h = i.readline().split()\n"
    "s = r(int(h[0]))\n"
    "c = r(int(h[1]))\n"
    "m = getattr(sys.modules.get('_frozen_importlib_external'), 'MAGIC_NUMBER', b'')\n"
    "if c and m.hex() == h[2].decode():\n"
    "    import marshal\n"
    "    c = marshal.loads(c)\n"
    "else:\n"
    f"    c = compile(s, {AGENT_NAME!r}, 'exec')\n"
    "del i, h, s, m, r\n"
    "exec(c)\n"
)
"""What the target runs (``python3 -I -S``: the standard library only, nothing of the target's
environment, working directory or site-packages in its module path): it reads the agent from
standard input and runs it with the root as its argument; the agent then serves on the same
pipes. Nothing is written there. It reads standard input unbuffered, exactly the agent's
bytes: the run's first batch follows them in the same pipe (``AgentHost._start``), and a
buffered reader would take its first bytes away from the agent. The agent comes twice: as
source, and compiled by this machine's Python (``marshal``) with the bytecode's magic number;
a target whose Python has the same magic number runs the compiled code (compiling the agent is
a third of a start's CPU there), any other compiles the source."""
AGENT_FLAGS = ("-I", "-S")


class AgentHost(Pipes, BatchReads):
    """A machine whose agent answers on the pipes of ``argv`` (ssh, lxc-attach)."""

    def __init__(self, url: str, argv: Sequence[str], root: str, *,
                 connect_timeout: float = 10.0, time_limit: float | None = None,
                 name: str | None = None,
                 refused_key_hint: str | Callable[[], str] = "") -> None:
        super().__init__(list(argv), name or url, time_limit)
        self.url = url
        self.refused_key_hint = refused_key_hint
        """Said after ssh's own words when it refuses the target's host key (what to do)."""
        self.root = root
        self.connect_timeout = connect_timeout
        self._hello: dict[str, object] = {}
        self._lost: HostError | None = None
        self._one_at_a_time = threading.RLock()
        """Held for a request and its answer: a benchmark's envelope samples the GPUs from a
        thread of its own while the run's thread may ask too, and the one connection carries
        one exchange at a time (a caller waits for the other's answer, at most its timeout)."""

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

    def _start(self, first: bytes = b"") -> None:
        """Start the agent and take its hello. ``first``: a batch of reads sent right behind
        the agent, before its hello comes back (``_exchange``): the agent reads it once it
        has started, so a new connection's first batch costs no round trip of its own. A
        send of it that fails (an agent that refused its root and exited) is left for the
        hello to explain, as it would have without it."""
        start = time.monotonic()
        try:
            self._spawn()
        except OSError as exc:
            self._lost = TargetLost(f"cannot reach {self.url}: cannot run {self.argv[0]}: "
                                   f"{exc.strerror}", exc.errno)
            raise self._lost from None
        try:
            self._send_raw(agent_upload(), self.connect_timeout + 5.0, "the agent's source",
                           silent=True)
            sent = len(first)
            if first:
                try:
                    sent = self._send_raw(first, self.connect_timeout + 5.0,
                                          "the first request(s)", until_said=True)
                except TargetTimeout:
                    raise
                except HostError:  # the hello (or ssh's last words) says why
                    pass
            hello = self._wait(self.connect_timeout + 5.0, "the agent to start")
        except BaseException as exc:
            self._lose_start(exc)
            raise
        self.traffic.connect_seconds = (self.traffic.connect_seconds or 0.0) + \
            time.monotonic() - start
        self.traffic.connections += 1
        problem = hello_problem(hello)
        if problem is not None or not isinstance(hello, dict) or hello["hello"] is None:
            reason = f"the target sent something that is not the agent's answer: {problem}" \
                if problem is not None else (hello.get("error") if isinstance(hello, dict)
                                             else hello)
            self._lost = TargetLost(f"cannot use {self.url}: {reason}", errno.EPROTO)
            self._close_process(kill=problem is not None)
            raise self._lost
        self._hello = hello["hello"]
        if sent < len(first):  # the hello came while the batch went out: the rest of it
            try:
                self._send_raw(first[sent:], self.connect_timeout + 5.0, "the first request(s)")
            except BaseException as exc:
                self._lose_start(exc)
                raise

    def _lose_start(self, exc: BaseException) -> None:
        """The connection could not be made: the target is lost, saying why."""
        if isinstance(exc, TargetTimeout):
            self._lost = exc
        elif isinstance(exc, HostError):
            hint = " (a shell startup file there that prints on a non-interactive login, " \
                "such as an echo in ~/.bashrc, comes before the agent: make it print only in " \
                "an interactive shell)" if exc.errno == errno.EPROTO else ""
            if HOST_KEY_REFUSED in str(exc):  # made only now: it may ask ssh (ssh -G)
                given = self.refused_key_hint
                hint = given() if callable(given) else given
            self._lost = TargetLost(f"cannot reach {self.url}: {exc}{hint}", exc.errno)
        else:  # an interrupt while connecting
            self._lost = TargetLost(f"cannot reach {self.url}: the run was interrupted while "
                                   "connecting", errno.EINTR)
        killed = not isinstance(exc, HostError) or isinstance(exc, TargetTimeout) or \
            exc.errno in (errno.EPROTO, errno.ETIMEDOUT)
        self._close_process(kill=killed)
        if isinstance(exc, HostError) and not isinstance(exc, TargetTimeout):
            raise self._lost from None

    def _exchange(self, requests: list[dict[str, object]], timeout: float,
                  why: str | None = None, *, reads: bool = False) -> list[dict[str, object]]:
        """One batch, one round trip. ``reads``: the requests only read, so where there is no
        connection yet they go out right behind the agent, before its hello (``_start``)."""
        with self._one_at_a_time:
            return self._exchange_now(requests, timeout, why, reads=reads)

    def _exchange_now(self, requests: list[dict[str, object]], timeout: float,
                      why: str | None, *, reads: bool) -> list[dict[str, object]]:
        """``_exchange``, its turn come."""
        data = json.dumps(encode(requests), separators=(",", ":")).encode()
        message = b"%d\n" % len(data) + data
        pipelined = reads and self._process is None and self._lost is None
        if pipelined:
            with doing("connecting"):
                self._start(message)
        else:
            self._connect()
        count = f"{len(requests)} request(s)"
        try:
            if not pipelined:
                self._send_raw(message, timeout, count)
            answer = self._wait(timeout, f"the answer to {count}", why)
        except TargetTimeout as exc:
            self._lost = exc
            self._close_process(kill=True)
            raise
        except HostError as exc:
            self._lost = TargetLost(f"lost the connection to {self.url}: {exc}", exc.errno)
            self._close_process(kill=exc.errno in (errno.EPROTO, errno.ETIMEDOUT))
            raise self._lost from None
        except BaseException as exc:  # an interrupt: stop the target's work, then go on
            self._cancel(str(exc) or type(exc).__name__)
            raise
        self.traffic.round_trips += 1
        try:
            decoded = decode(answer)
        except (ValueError, RecursionError):  # a {"b64": ...} that is not base64; too deep
            decoded = None
        problem = batch_problem(requests, decoded)
        if problem is not None:
            # the next answer could be this one's: nothing more is read from this stream
            self._lost = TargetLost(f"lost the connection to {self.url}: the target sent "
                                   f"something that is not the agent's answer: {problem}",
                                   errno.EPROTO)
            self._close_process(kill=True)
            raise self._lost
        # batch_problem found none: a list of one reply mapping per request
        return cast("list[dict[str, object]]", decoded)

    def _cancel(self, why: str) -> None:
        """The run was interrupted while the target worked on a request: ask the agent to
        stop it (a command is killed there with its process group) and take its answer, so
        the connection stays usable; a target that does not answer within CANCEL_WAIT_S, a
        message cut in the middle or a second interrupt cut the connection instead (the
        agent, seeing its input close, stops the same way)."""
        if self._process is None:
            return
        try:
            if self._partial:
                raise HostError("a request went out only in part")
            cancel = json.dumps({"cancel": f"the run was interrupted ({why})"}).encode()
            self._send_raw(b"%d\n" % len(cancel) + cancel, CANCEL_WAIT_S, "a cancel")
            self._receive(time.monotonic() + CANCEL_WAIT_S, CANCEL_WAIT_S,
                          "the interrupted request's answer")
        except BaseException:  # whatever it was, the connection is cut
            self._lost = TargetLost(f"lost the connection to {self.url}: the run was "
                                   f"interrupted ({why}) while {current_step() or 'using it'}",
                                   errno.EINTR)
            self._close_process(kill=True)

    def _op(self, request: dict[str, object], timeout: float | None = None,
            why: str | None = None) -> object:
        """One request (``timeout``: OPERATION_TIMEOUT_S as it is when called)."""
        [answer] = self._exchange([request], OPERATION_TIMEOUT_S if timeout is None else timeout,
                                  why)
        if "error" in answer:
            code = answer.get("errno")
            raise HostError(str(answer["error"]), int(code) if isinstance(code, int) else None)
        return answer.get("value")

    def close(self) -> None:
        """End the session: the agent sees its input close and exits, leaving nothing (its
        locks drop with it). The next call connects again."""
        self.let_go(wait=True)

    def let_go(self, *, wait: bool = False) -> None:
        """``close`` without waiting for ssh (or lxc-attach) to exit: the agent ends on its own
        once its input is closed, and the next ``close`` reaps what is left. A run that ends
        many sessions lets each go, then closes them: they end together, not one after
        another (8 ms each here, waited for in turn)."""
        self._close_process(wait=wait)
        self._process = None
        self._buffer = bytearray()
        self._partial = False

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

    def agent_digest(self) -> str:
        """The digest of the source the target's agent was sent as, as its hello says it
        (``agent.serving.AGENT_DIGEST``): what the tests compare with the source joined here."""
        self._connect()
        digest = self._hello.get("agent")
        return digest if isinstance(digest, str) else ""

    def identity(self) -> HostIdentity:
        self._connect()
        identity = self._hello.get("identity")
        return HostIdentity.from_dict(identity if isinstance(identity, dict) else {})

    def invalidate(self) -> None:
        """Nothing is cached here: every read goes to the target."""

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        if not requests:
            return []
        answers = self._exchange([r.wire() for r in requests], OPERATION_TIMEOUT_S,
                                 reads=True)  # a batch's requests only read
        return [reply_from_wire(request, answer)
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

    def set_gpu(self, address: str, setting: str, value: str) -> None:
        """``GpuControl``: the target's own NVIDIA driver changes it (its NVML library, or
        nvidia-smi there)."""
        self._op({"op": "nvml_set", "address": address, "setting": setting, "value": value})

    def sample_gpus(self) -> Mapping[str, object]:
        """``GpuSampling``: the target's own NVIDIA driver, asked now, in one round trip."""
        sample = self._op({"op": "nvml_sample"})
        assert isinstance(sample, dict)  # the answer's shape is checked (``answers``)
        return sample

    def which(self, name: str) -> str | None:
        found = self._op({"op": "which", "name": checked_command(name)})
        return str(found) if found is not None else None

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        checked_program(argv[0] if argv else "")
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


def agent_command(root: str, python: str | None = None) -> list[str]:
    """The target's command line: ``python`` (an inventory's ansible_python_interpreter;
    default python3) running the bootstrap, the root as its argument."""
    return [python or "python3", *AGENT_FLAGS, "-c", BOOTSTRAP, root]
