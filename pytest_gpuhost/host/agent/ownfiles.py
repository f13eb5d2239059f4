"""pytest-gpuhost's own files (journals, lock files): made whole or not at all, appended to with one
write(2), never through a link, never a file with another name or another user's."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time

from .errors import OpError, file_type
from .files import Files, write_all


class OwnFiles(Files):
    """The state files of a run: a journal is created once, with its header, then appended."""

    def _own(self, fd: int, rel: str) -> None:
        """A state file must be a regular file with one name, made by this user: a hard link
        to another file (``/etc/shadow``) would have us append to or truncate that file, and
        a file another user made first (a shared journal under /tmp) would be replayed by a
        rollback with their lines in it."""
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            what = file_type(info.st_mode) if not stat.S_ISREG(info.st_mode) else \
                f"file with {info.st_nlink} hard links"
            raise OpError(f"{self.shown(rel)} is a {what}, not pytest-gpuhost's own file: "
                          "left as it is", errno.EINVAL)
        if info.st_uid != os.geteuid():
            raise OpError(f"{self.shown(rel)} belongs to uid {info.st_uid}, not to this run's "
                          f"user (uid {os.geteuid()}): not pytest-gpuhost's own file, left as "
                          "it is", errno.EPERM)

    def create(self, rel: str, data: bytes, mode: int = 0o600) -> None:
        """A new file that appears whole (written beside it, then linked into place), or
        EEXIST: a journal is made once, with its header already in it."""
        try:
            self._make_dirs(rel.rstrip("/").rpartition("/")[0])
            parent, name = self.parent(rel)
        except OSError as exc:
            raise self.fail("create", rel, exc) from None
        tmp = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode, dir_fd=parent)
            try:
                try:
                    write_all(fd, data)  # a file made whole or not at all
                    os.fchmod(fd, mode)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.link(tmp, name, src_dir_fd=parent, dst_dir_fd=parent,
                        follow_symlinks=False)
            finally:
                os.unlink(tmp, dir_fd=parent)
            self._sync_dir(parent)
        except OSError as exc:
            raise self.fail("create", rel, exc) from None
        finally:
            os.close(parent)

    @staticmethod
    def _sync_dir(parent: int) -> None:
        fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def append(self, rel: str, data: bytes, *, sync: bool = True) -> None:
        """One write(2) at the end of an existing state file, then fsync (unless ``sync`` is
        false); never creates it, never through a link."""
        try:
            parent, name = self.parent(rel)
        except OSError as exc:
            raise self.fail("append to", rel, exc) from None
        try:
            # O_NONBLOCK: a FIFO in its place is refused (ENXIO, or by _own), never waited on
            fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise self.fail("append to", rel, exc) from None
        finally:
            os.close(parent)
        try:
            self._own(fd, rel)
            start = os.fstat(fd).st_size
            written = os.write(fd, data)
            if written != len(data):
                self._cut_back(fd, start, written)
                raise OpError(f"cannot append to {self.shown(rel)}: the file system took "
                              f"{written} of {len(data)} bytes (full, or past a file size "
                              "limit); the piece written is cut off again", errno.ENOSPC)
            if sync:
                os.fsync(fd)
        except OSError as exc:
            raise self.fail("append to", rel, exc) from None
        finally:
            os.close(fd)

    @staticmethod
    def _cut_back(fd: int, start: int, written: int) -> None:
        """Take a short append back out (a piece of a line, which the next line would be glued
        onto), unless another writer appended after it meanwhile."""
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == start + written:
                os.ftruncate(fd, start)
