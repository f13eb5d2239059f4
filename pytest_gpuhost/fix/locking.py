"""One lock per host root, so two --fix runs (or two xdist workers) never interleave writes.

flock(2) on a file under the root's ``var/lib/pytest-gpuhost``: the kernel drops it when the
holder dies, so a crash never leaves a stale lock. The holder writes who it is into the file; a
waiter that times out says who holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import sys
import time
from pathlib import Path

POLL_S = 0.05


class LockUnavailable(Exception):
    """The root's lock cannot be had: a --fix run stops; the message says why."""


class LockTimeout(LockUnavailable):
    """The lock stayed held past the timeout; the message names the holder."""


class RootLock:
    def __init__(self, path: Path, purpose: str) -> None:
        self.path = path
        self.purpose = purpose
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float) -> None:
        if self._fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            hint = " (--fix needs root)" if exc.errno in (errno.EACCES, errno.EPERM) else ""
            raise LockUnavailable(f"cannot take the {self.purpose} lock {self.path}: "
                                  f"{exc.strerror}{hint}") from exc
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self.path.read_text(errors="replace").strip() or "unknown"
                    os.close(fd)
                    raise LockTimeout(
                        f"another pytest-gpuhost run holds the {self.purpose} lock {self.path} "
                        f"(waited {timeout:g} s): {holder}") from None
                time.sleep(POLL_S)
        os.ftruncate(fd, 0)
        argv = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:300]
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {argv}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
