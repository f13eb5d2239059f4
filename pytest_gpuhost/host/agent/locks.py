"""Locks on a root: an flock on a lock file of ours that names its holder, waited for on the root's
clock, and kept while a command started under it may still run."""

from __future__ import annotations

import errno
import fcntl
import os
import selectors
import time

from .errors import OpError
from .ownfiles import OwnFiles

LOCK_POLL_S = 0.05
"""How often a lock held by another process is tried again."""
LOCK_MARK = b"pytest-gpuhost lock:"
"""How a lock file starts once held: a file that says anything else is not truncated."""


class Locks(OwnFiles):
    """``lock`` and ``unlock``; the handles held are the root's (commands inherit them)."""

    def lock(self, rel: str, timeout: float, holder: str) -> int:
        """Take the flock on a lock file (made here if missing, never through a link, never
        a file that is not one of ours), waiting up to ``timeout`` s; the kernel drops it when
        this process ends and every command it started while holding it has ended (they
        inherit it: see ``run``). Returns a handle for ``unlock``."""
        fd = self._lock_file(rel)
        try:
            seen = os.pread(fd, 256, 0)
            if seen and not seen.startswith(LOCK_MARK):
                raise OpError(f"{self.shown(rel)} holds something else than a pytest-gpuhost "
                              "lock: left as it is (remove it if it is stale)", errno.EINVAL)
            deadline = self.clock() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if self.clock() >= deadline:
                        held = os.pread(fd, 512, 0).decode("utf-8", "replace").strip()
                        raise OpError(f"held by {held[len(LOCK_MARK):].strip() or 'unknown'}",
                                      errno.EWOULDBLOCK) from None
                    self._pause(LOCK_POLL_S)
            os.ftruncate(fd, 0)
            os.pwrite(fd, LOCK_MARK + b" " + holder.encode("utf-8", "replace")[:400] + b"\n", 0)
        except BaseException:
            os.close(fd)
            raise
        self._locks[fd] = rel
        return fd

    def _lock_file(self, rel: str) -> int:
        """The lock file open for reading and writing, made if missing, and ours."""
        try:
            self._make_dirs(rel.rstrip("/").rpartition("/")[0])
            parent, name = self.parent(rel)
        except OSError as exc:
            raise self.fail("take the lock", rel, exc) from None
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                         dir_fd=parent)
        except OSError as exc:
            raise self.fail("take the lock", rel, exc) from None
        finally:
            os.close(parent)
        try:
            self._own(fd, rel)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` (a lock's next try), or less when ``watch`` says the run is over:
        then OpError EINTR, so that a controller gone or interrupted never leaves this agent
        waiting for a lock it would then hold."""
        if self.watch is None:
            time.sleep(seconds)
            return
        with selectors.DefaultSelector() as selector:
            selector.register(self.watch.fileno(), selectors.EVENT_READ)
            if selector.select(seconds):
                why = self.watch.stop()
                if why is not None:
                    raise OpError(f"stopped waiting for the lock: {why}", errno.EINTR)

    def unlock(self, handle: int) -> None:
        """Let the lock go. While a command started under it may still run (one killed that
        did not end in time), the lock and its holder's line stay: that command keeps it
        until it ends (it inherited the lock), and a rollback must wait for that."""
        if self._locks.pop(handle, None) is None:
            return
        self._running = [process for process in self._running if process.poll() is None]
        try:
            if not self._running:
                os.ftruncate(handle, 0)
                fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            os.close(handle)
