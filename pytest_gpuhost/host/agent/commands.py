"""Commands inside a root: found under its sbin/bin directories (on PATH only at ``/``) or named by
their path inside it, run without a shell in their own session, outputs bounded, and ended with
their whole process group at a timeout, a cancel or a signal."""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import stat

from .containment import Contained
from .errors import OpError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    import subprocess
    from typing import Any

COMMAND_DIRS = ("usr/sbin", "usr/bin", "sbin", "bin")
COMMAND_TIMEOUT_S = 120.0
OUTPUT_LIMIT = 16 * 2**20
REAP_S = 5.0
"""How long a killed command's group is waited for before it is left to end by itself."""
EXIT_POLL_S = 0.05
"""How often a command that closed its outputs is looked at until it has ended."""


class Commands(Contained):
    """``which`` and ``run``."""

    def which(self, name: str) -> str | None:
        """A command's path on this machine: under the root's sbin/bin directories (their links
        resolved inside the root), and on PATH only when the root is ``/``."""
        if not isinstance(name, str) or not name or "/" in name or "\0" in name:
            raise OpError(f"command {name!r} must be a bare name", errno.EINVAL)
        for directory in COMMAND_DIRS:
            found = self._executable(f"{directory}/{name}")
            if found is not None:
                return found
        if self.real:
            for directory in os.environ.get("PATH", "").split(os.pathsep):
                candidate = os.path.join(directory, name)
                if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                    return candidate
        return None

    def _executable(self, rel: str) -> str | None:
        """The real path of an executable file at ``rel`` inside the root, or None."""
        try:
            fd = self.open(rel, os.O_PATH)
        except OSError:
            return None
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode) and info.st_mode & 0o111:
                return self.real_path(fd)
            return None
        finally:
            os.close(fd)

    def run(self, argv: list[str], env: dict[str, str] | None = None,
            timeout: float = COMMAND_TIMEOUT_S) -> dict[str, object]:
        """Run a command in its own session, its output bounded, within ``timeout`` s.

        The command inherits the locks this process holds (``pass_fds``): the kernel keeps
        the run lock held until the command has ended, even if this process is killed first
        (SIGKILL, the OOM killer), so a rollback never judges a change a command may still
        be making. Whatever ends the wait (the timeout, the connection closing or a cancel
        seen through ``watch``, a signal turned into an exception) kills the command's whole
        process group first, and the change stays unknown."""
        if not argv or not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
            raise OpError(f"not a command line: {argv!r}", errno.EINVAL)
        if "/" in argv[0]:  # a path inside the root, resolved there (check_relative refuses ..)
            executable = self._executable(argv[0])
            if executable is None:
                raise OpError(f"{self.shown(argv[0])} is not an executable file", errno.ENOENT)
        else:
            executable = self.which(argv[0])
        if executable is None:
            searched = ", ".join(self.shown(d) for d in COMMAND_DIRS)
            raise OpError(f"{argv[0]} not found in {searched}"
                          + (" or on PATH" if self.real else ""), errno.ENOENT)
        environment = dict(os.environ, GPUHOST_ROOT=self.path, LC_ALL="C")
        environment.update(env or {})
        import subprocess  # here, not at the start: most agents never run a command

        with _signals_held() as held:  # none lands between the fork and the try below
            try:
                process = subprocess.Popen(
                    [executable, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, env=environment, cwd=self.path,
                    start_new_session=True, pass_fds=tuple(self._locks))
            except OSError as exc:
                raise OpError(f"cannot run {executable}: {exc.strerror}", exc.errno) from None
        shown = " ".join(argv)
        try:
            for signum in held:  # delivered now that the command is there to be ended
                signal.raise_signal(signum)
            stdout, stderr = self._outputs(process, self.clock() + timeout)
        except _Late:
            self._end(process)
            raise OpError(f"{shown} did not finish in {timeout:g} s; its process group was "
                          "killed, and whether it made its change is unknown",
                          errno.ETIMEDOUT) from None
        except _Stopped as stop:
            self._end(process)
            raise OpError(f"{shown} was stopped ({stop}); its process group was killed, and "
                          "whether it made its change is unknown", errno.EINTR) from None
        except BaseException:
            self._end(process)
            raise
        return {"returncode": process.returncode,
                "stdout": stdout.decode("utf-8", errors="replace"),
                "stderr": stderr.decode("utf-8", errors="replace")}

    def _outputs(self, process: subprocess.Popen[bytes], deadline: float
                 ) -> tuple[bytes, bytes]:
        """The command's stdout and stderr (the last OUTPUT_LIMIT bytes of each) once it has
        ended; ``_Late`` past ``deadline``, ``_Stopped`` when ``watch`` says to stop."""
        import subprocess

        assert process.stdout is not None and process.stderr is not None
        kept = {process.stdout.fileno(): bytearray(), process.stderr.fileno(): bytearray()}
        with selectors.DefaultSelector() as selector:
            for fd in kept:
                selector.register(fd, selectors.EVENT_READ)
            if self.watch is not None:
                selector.register(self.watch.fileno(), selectors.EVENT_READ, _WATCH)
            while True:
                pipes = any(fd in selector.get_map() for fd in kept)
                if not pipes and process.poll() is not None:
                    break
                left = deadline - self.clock()
                if left <= 0:
                    raise _Late
                if not pipes:  # its outputs closed; it has not ended (yet)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(min(left, EXIT_POLL_S))
                for key, _ in selector.select(min(left, 1.0) if pipes else 0):
                    self._take(key, selector, kept)
        return (bytes(kept[process.stdout.fileno()][-OUTPUT_LIMIT:]),
                bytes(kept[process.stderr.fileno()][-OUTPUT_LIMIT:]))

    def _take(self, key: selectors.SelectorKey, selector: selectors.BaseSelector,
              kept: dict[int, bytearray]) -> None:
        """What one ready descriptor of a running command holds: output, kept bounded; or,
        on the watched connection, a reason to stop (``_Stopped``)."""
        if key.data is _WATCH:
            assert self.watch is not None
            why = self.watch.stop()
            if why is not None:
                raise _Stopped(why)
            return
        chunk = os.read(key.fd, 1 << 16)
        if not chunk:
            selector.unregister(key.fd)
            return
        buffer = kept[key.fd]
        buffer += chunk
        if len(buffer) > 2 * OUTPUT_LIMIT:
            del buffer[:-OUTPUT_LIMIT]

    def _end(self, process: subprocess.Popen[bytes]) -> None:
        """Kill the command and every child it started (its own session), then reap it and
        wait for its outputs to close (every process of the group that held them has ended),
        for at most REAP_S s: one still in the kernel then (a module's init) stays in
        ``_running``, and keeps the lock it inherited."""
        import subprocess

        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        deadline = self.clock() + REAP_S
        try:
            process.wait(REAP_S)
        except subprocess.TimeoutExpired:
            self._running.append(process)
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map() and self.clock() < deadline:
                for key, _ in selector.select(max(0.0, min(deadline - self.clock(), 1.0))):
                    if not os.read(key.fd, 1 << 16):
                        selector.unregister(key.fd)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


_WATCH = object()
"""The selector's mark on the watched connection's descriptor."""


@contextlib.contextmanager
def _signals_held() -> Any:
    """SIGINT, SIGTERM and SIGHUP noted instead of handled while a command is being started:
    a handler that raises (an interrupt) inside ``subprocess.Popen`` after its fork would leave
    the command running with nobody to end it. The caller delivers what was noted once the
    command can be killed. Python handlers only (an ignored or default signal is left as it is),
    on the main thread, where Python runs them."""
    held: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    if _on_main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler
                signal.signal(signum, lambda number, frame: held.append(number))
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


class _Late(Exception):
    """A command ran past its timeout."""


class _Stopped(Exception):
    """The watched connection said to stop a command (it closed, or a cancel came)."""
