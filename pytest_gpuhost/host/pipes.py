"""The pipes to a target's agent: every send and answer bounded by a deadline and by the
target's time limit, the last words of ssh (or python3 there) kept for messages.

A wait that would pass the time limit (--gpuhost-target-timeout) ends with a ``TargetTimeout``
naming the step the run was in (``host.doing``); one that passes its own timeout (a read's
OPERATION_TIMEOUT_S) with a HostError ETIMEDOUT naming the step too. What the target writes to
stderr is read in chunks and only its last STDERR_KEPT bytes kept, however long its lines.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Iterator

import msgspec

from . import HostError, TargetTimeout, current_step
from .answers import garbled, take_message

MINIMUM_PYTHON = (3, 8)
STDERR_KEPT = 8192
"""The bytes of what ssh (or python3 there) last wrote to stderr that are kept for messages:
a target writing megabytes without a newline costs no more than this."""


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


class Pipes:
    """The agent's process (``argv``) and its pipes; ``AgentHost`` is the Host over them."""

    def __init__(self, argv: list[str], name: str, time_limit: float | None) -> None:
        self.argv = argv
        self.name = name
        self.time_limit = time_limit
        """Seconds this process may wait on the target in all (None: no limit)."""
        self.spent = 0.0
        """Seconds waited on it so far."""
        self.traffic = Traffic()
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr = bytearray()
        self._drainer: threading.Thread | None = None
        self._buffer = bytearray()  # appended to in place: a long answer is copied once
        self._partial = False
        """A message went out only in part (an interrupt): nothing more may be sent."""
        self._closing: list[subprocess.Popen[bytes]] = []
        """Processes whose input was closed and that were not waited for yet."""

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session with its stdin non-blocking (writes wait in
        ``_send_raw``, bounded) and its stderr drained; raises OSError."""
        process = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, start_new_session=True)
        self._process = process
        assert process.stdin is not None
        os.set_blocking(process.stdin.fileno(), False)
        self._drainer = threading.Thread(target=self._drain_stderr, args=(process,),
                                         daemon=True)
        self._drainer.start()
        return process

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

    def _send_raw(self, data: bytes, timeout: float, sending: str, *,
                  silent: bool = False, until_said: bool = False) -> int:
        """Write ``data`` within ``timeout`` seconds and within what is left of the time limit.

        A target that stops reading (a frozen container: ``lxc-freeze``, a backup in suspend
        mode, a stopped agent) fills the pipe, and ssh's channel window after it; a blocking
        write of a bigger message would then wait past every limit. The pipe is non-blocking
        and each write waits for room only until the deadline. ``silent``: the target says
        nothing before it has all of ``data`` (the agent, which starts only once it has read
        itself); what it says before that is not the agent's (a shell's startup file that
        prints, a forced command), and ends the send at once rather than when a target that
        no longer reads has let the deadline pass. ``until_said``: what the target says ends
        the send too, but quietly, left for the next ``_wait`` to judge (a first batch sent
        behind the agent: its hello, or what is not the agent's). Returns the bytes written:
        all of ``data`` unless the target spoke first."""
        assert self._process is not None and self._process.stdin is not None
        assert self._process.stdout is not None
        fd = self._process.stdin.fileno()
        out = self._process.stdout.fileno()
        rest = memoryview(data)
        with self._waiting(timeout) as (deadline, bounded), \
                selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_WRITE)
            if silent or until_said:
                selector.register(out, selectors.EVENT_READ)
            self._partial = True
            while rest:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if bounded:
                        raise self._hung()
                    raise HostError(f"it stopped reading: {len(data) - len(rest)} of the "
                                    f"{len(data)} bytes of {sending} went in {timeout:g} s",
                                    errno.ETIMEDOUT)
                ready = selector.select(min(remaining, 1.0))
                if not ready:
                    continue
                if until_said and any(key.fd == out for key, _ in ready):
                    written = len(data) - len(rest)
                    self.traffic.bytes_sent += written
                    return written  # still partial: the rest goes once the target is heard
                if any(key.fd == out for key, _ in ready):
                    said = os.read(out, 4096)  # what a message shows of it: the first 200
                    if not said:
                        raise self._gone("the connection closed")
                    raise garbled(said)
                try:
                    rest = rest[os.write(fd, rest):]
                except BlockingIOError:
                    continue
                except OSError:  # EPIPE: the connection is gone
                    raise self._gone("the connection closed") from None
            self._partial = False
        self.traffic.bytes_sent += len(data)
        return len(data)

    def _wait(self, timeout: float, waiting_for: str, why: str | None = None) -> object:
        """One message within ``timeout`` seconds and within what is left of the time limit
        (``why`` the target may take long, said if it takes too long)."""
        with self._waiting(timeout) as (deadline, bounded):
            try:
                return self._receive(deadline, timeout, waiting_for)
            except HostError as exc:
                if bounded and exc.errno == errno.ETIMEDOUT:
                    raise self._hung(why) from None
                raise

    def _receive(self, deadline: float, timeout: float, waiting_for: str) -> object:
        """One message: a length line, then that many bytes of JSON (``answers``)."""
        assert self._process is not None and self._process.stdout is not None
        fd = self._process.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                before = len(self._buffer)
                whole, message = take_message(self._buffer)
                if whole:
                    self.traffic.bytes_received += before - len(self._buffer)
                    return message
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    step = current_step() or "waiting for it"
                    raise HostError(f"no answer within {timeout:g} s while {step} (waiting for "
                                    f"{waiting_for})", errno.ETIMEDOUT)
                if not selector.select(min(remaining, 1.0)):
                    continue
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise self._gone("the connection closed")
                self._buffer += chunk

    def _hung(self, why: str | None = None) -> TargetTimeout:
        step = current_step() or "waiting for it"
        return TargetTimeout(f"target {self.name} hung while {step}: no answer within "
                             f"--gpuhost-target-timeout={self.time_limit:g} s"
                             f"{f' ({why})' if why else ''}, so the run went on without it", step)

    def _gone(self, what: str) -> HostError:
        said = self._said()  # waits a moment for the exit status and the last words
        code = self._process.poll() if self._process is not None else None
        if ("python3" in said and ("not found" in said or "No such" in said)) or (
                code == 127 and not said):  # a 127 that names another command is about that
            reason = f"python3 is not installed there (pytest-gpuhost needs python3 " \
                     f"{'.'.join(map(str, MINIMUM_PYTHON))}+ on the target): {said}"
        elif "Unknown option: -I" in said:  # a Python 2 (an old inventory's interpreter)
            reason = f"the target's python is too old to start the agent (it has no -I: " \
                     f"pytest-gpuhost needs python3 {'.'.join(map(str, MINIMUM_PYTHON))}+ " \
                     f"there): {said}"
        else:
            reason = said or (f"{self.argv[0]} exited {code}" if code is not None else what)
        return HostError(reason, errno.ECONNRESET)

    def _said(self) -> str:
        """What ssh (or python3 there) last said, for a message: its last three lines, once
        it has exited and its last words were read (each wait bounded)."""
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=0.5)
            if self._process.poll() is not None and self._drainer is not None:
                self._drainer.join(timeout=0.5)  # it ends at the stream's end
        text = bytes(self._stderr).decode("utf-8", "replace")
        lines = [line.strip()[-500:] for line in text.splitlines() if line.strip()]
        return " / ".join(lines[-3:])

    def _drain_stderr(self, process: subprocess.Popen[bytes]) -> None:
        """Keep the last STDERR_KEPT bytes of the target's stderr, read in chunks: a line
        never grows without bound here, whatever the target writes."""
        assert process.stderr is not None
        fd = process.stderr.fileno()
        with contextlib.suppress(OSError, ValueError):  # closed under us: the session ended
            while chunk := os.read(fd, 1 << 16):
                self._stderr += chunk
                del self._stderr[:-STDERR_KEPT]

    def _close_process(self, *, kill: bool = False, wait: bool = True) -> None:
        """Close the agent's input and let it exit (``kill``: at once, a hung target).
        ``wait``: until it has, and every process closed before without waiting with it;
        else it is reaped by the next close that waits (its agent ends on its own, at once:
        its input closed)."""
        process = self._process
        if process is not None and process not in self._closing:
            if kill:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, 9)
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            self._closing.append(process)
        while wait and self._closing:
            ending = self._closing.pop(0)
            try:
                ending.wait(timeout=5)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(ending.pid, 9)
                ending.wait()
