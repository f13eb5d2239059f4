"""One lock per host root, so two --fix runs (or two xdist workers) never interleave writes.

flock(2) on a file under the root's ``var/lib/pytest-gpuhost``, taken through the host (so an
ssh target's lock is on the target, held by its agent): the kernel drops it when the holder
dies or its connection ends, so a crash never leaves a stale lock. The holder writes who it is
into the file; a waiter that times out says who holds it. The lock file is opened without
following links and is never truncated unless it is pytest-gpuhost's own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import sys
import time
from pathlib import Path

from ..host import HostError, TargetLost
from . import LockUnavailable as LockUnavailable  # re-exported
from .state import StateFile


class LockTimeout(LockUnavailable):
    """The lock stayed held past the timeout; the message names the holder."""


def holder_line() -> str:
    """Who this run is: pid, machine, start time and the command line with its program."""
    argv = " ".join([os.path.basename(sys.argv[0]), *sys.argv[1:]])[:300]
    return (f"pid {os.getpid()} on {socket.gethostname()} since "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {argv}")


class RootLock:
    def __init__(self, where: StateFile | Path, purpose: str) -> None:
        self.location = where if isinstance(where, StateFile) else StateFile.local(where)
        self.purpose = purpose
        self._handle: int | None = None

    @property
    def path(self) -> StateFile:
        return self.location

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self, timeout: float) -> None:
        if self._handle is not None:
            return
        try:
            self._handle = self.location.host.lock(self.location.path, timeout, holder_line())
        except TargetLost:
            raise  # the target's connection, not its lock: that target is lost, not the run
        except HostError as exc:
            if exc.errno == errno.EWOULDBLOCK:
                holder = str(exc).removeprefix("held by ")
                raise LockTimeout(
                    f"another pytest-gpuhost run holds the {self.purpose} lock {self.location} "
                    f"(waited {timeout:g} s): {holder} (a command a run started, such as a "
                    "modprobe, keeps it until that command ends, even after the run is gone)"
                ) from None
            hint = " (--fix needs root)" if exc.errno in (errno.EACCES, errno.EPERM) else ""
            raise LockUnavailable(f"cannot take the {self.purpose} lock {self.location}: "
                                  f"{exc}{hint}") from exc

    def release(self) -> None:
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        with contextlib.suppress(HostError):  # a lost connection released it already
            self.location.host.unlock(handle)
