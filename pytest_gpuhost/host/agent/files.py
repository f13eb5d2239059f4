"""The file operations inside a root: read (bounded, regular files only), stat, list, write into a
file that exists, replace a file atomically, remove a file, read a link as stored."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time

from .containment import Contained, check_relative
from .errors import MISSING, OpError, file_type

DEFAULT_LIMIT = 4 * 2**20
"""Bytes a read may return: more than any kernel attribute, modules.builtin or a tool output."""


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data``: a write(2) the file system cut short is continued, and the
    next one raises what cut it (ENOSPC, EFBIG past a file size limit)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Files(Contained):
    """Every operation on a file of the root that is not pytest-gpuhost's own."""

    def read(self, rel: str, limit: int = DEFAULT_LIMIT) -> bytes:
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OpError(f"cannot read {self.shown(rel)}: it is a {file_type(mode)}, not a "
                              "file", errno.EINVAL)
            return self._bounded(fd, rel, limit)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        finally:
            os.close(fd)

    def _bounded(self, fd: int, rel: str, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise OpError(f"cannot read {self.shown(rel)}: larger than {limit} bytes, "
                              "more than a kernel attribute holds", errno.EFBIG)

    def stat(self, rel: str) -> dict[str, object]:
        try:
            fd = self.open(rel, os.O_PATH)
        except OSError as exc:
            raise self.fail("look at", rel, exc) from None
        try:
            info = os.fstat(fd)
        finally:
            os.close(fd)
        return {"type": file_type(info.st_mode), "size": info.st_size,
                "mode": stat.S_IMODE(info.st_mode),
                "rdev": [os.major(info.st_rdev), os.minor(info.st_rdev)]}

    def listdir(self, rel: str) -> list[str]:
        check_relative(rel)
        return self._listdir(rel)

    def _listdir(self, rel: str) -> list[str]:
        try:
            fd = self._open(rel, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise self.fail("list", rel, exc) from None
        try:
            return sorted(os.listdir(fd))
        except OSError as exc:
            raise self.fail("list", rel, exc) from None
        finally:
            os.close(fd)

    def write(self, rel: str, data: bytes, offset: int = 0, *, truncate: bool) -> None:
        """Write ``data`` into an existing regular file: one write(2), as /proc/sys requires;
        never create, never write a FIFO or device in the file's place."""
        flags = os.O_WRONLY | os.O_NONBLOCK | (os.O_TRUNC if truncate and not offset else 0)
        try:
            fd = self.open(rel, flags)
        except OSError as exc:
            raise self.fail("write", rel, exc) from None
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise OpError(f"cannot write {self.shown(rel)}: it is a {file_type(mode)}, not "
                              "a file", errno.EINVAL)
            written = os.pwrite(fd, data, offset) if offset else os.write(fd, data)
        except OSError as exc:
            raise self.fail("write", rel, exc) from None
        finally:
            os.close(fd)
        if written != len(data):
            raise OpError(f"short write to {self.shown(rel)}: {written} of {len(data)} bytes",
                          errno.EIO)

    def replace(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Create or replace a whole file atomically (a temporary file beside it, fsync,
        rename), creating missing directories inside the root. Refuses to replace anything
        but a regular file: a link, a device or a FIFO in its place stays as it is. A file
        replaced keeps its mode and owner (``mode`` is a new file's), so that restoring an
        original restores them too."""
        try:
            self._make_dirs(rel.rstrip("/").rpartition("/")[0])
            parent, name = self.parent(rel)
        except OSError as exc:
            raise self.fail("write", rel, exc) from None
        tmp = f".{name}.{os.getpid()}.{time.monotonic_ns()}.tmp"
        try:
            try:
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except FileNotFoundError:
                info = None
            if info is not None and not stat.S_ISREG(info.st_mode):
                raise OpError(f"cannot replace {self.shown(rel)}: it is a "
                              f"{file_type(info.st_mode)}; pytest-gpuhost replaces only files",
                              errno.EINVAL)
            if info is not None:
                mode = stat.S_IMODE(info.st_mode)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, mode & 0o777, dir_fd=parent)
            try:
                write_all(fd, data)
                if info is not None and (info.st_uid, info.st_gid) != (os.geteuid(),
                                                                       os.getegid()):
                    os.fchown(fd, info.st_uid, info.st_gid)
                os.fchmod(fd, mode)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            tmp = ""
        except OSError as exc:
            raise self.fail("write", rel, exc) from None
        finally:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=parent)
            os.close(parent)

    def _make_dirs(self, rel: str) -> None:
        """mkdir -p inside the root: each level created relative to its resolved parent."""
        if not rel:
            return
        try:
            os.close(self.open(rel, os.O_PATH | os.O_DIRECTORY))
            return
        except FileNotFoundError:
            pass
        head = rel.rstrip("/").rpartition("/")[0]
        self._make_dirs(head)
        parent, name = self.parent(rel)
        try:
            os.mkdir(name, 0o755, dir_fd=parent)
        except FileExistsError:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISLNK(info.st_mode):
                target = os.readlink(name, dir_fd=parent)
                raise OpError(f"cannot create {self.shown(rel)}: it is a symbolic link to "
                              f"{target}, which does not exist under the root "
                              "(links resolve inside the root)", errno.ENOENT) from None
        finally:
            os.close(parent)

    def remove(self, rel: str) -> None:
        """Remove a regular file (never what a link points to, never a directory)."""
        try:
            parent, name = self.parent(rel)
        except OSError as exc:
            raise self.fail("remove", rel, exc) from None
        try:
            info = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise OpError(f"cannot remove {self.shown(rel)}: it is a "
                              f"{file_type(info.st_mode)}, not a file", errno.EINVAL)
            os.unlink(name, dir_fd=parent)
        except OSError as exc:
            raise self.fail("remove", rel, exc) from None
        finally:
            os.close(parent)

    def readlink(self, rel: str) -> str | None:
        """The target of the link at ``rel`` as stored (never followed), or None when there is
        no link there; the directories above it resolve inside the root."""
        try:
            parent, name = self.parent(rel)
        except OSError as exc:
            if exc.errno in MISSING:
                return None
            raise self.fail("read the link", rel, exc) from None
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (*MISSING, errno.EINVAL):  # EINVAL: not a link
                return None
            raise self.fail("read the link", rel, exc) from None
        finally:
            os.close(parent)

    def _lexists(self, rel: str) -> bool:
        """Whether anything (a link included, not followed) is at ``rel`` inside the root."""
        try:
            parent, name = self.parent(rel)
        except OSError:
            return False
        try:
            os.stat(name, dir_fd=parent, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            os.close(parent)
