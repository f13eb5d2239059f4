"""The host agent: every operation pytest-gpuhost makes on a machine, contained in its host root.

(One file over 400 lines on purpose: it is sent to a target as one source over stdin.)

This one file is the whole of what touches a machine. ``LocalHost`` calls it in-process; a remote
host sends this file's source over its one connection and runs it there with ``python3``
(``serve``), so a remote target gets exactly the same containment and limits as a local one.
Hence: the standard library only, Python 3.8 syntax, no imports from the package, nothing
written to the target but what an operation asks for (no temporary files, no caches).

Containment. Every path is relative to the root and resolved inside it the way
``openat2(RESOLVE_IN_ROOT)`` or a chroot resolves it: an absolute symlink target is relative to
the root, ``..`` stops at the root. The kernel's openat2 does it where it exists (Linux 5.6+);
elsewhere a walk one component at a time, each step relative to a directory descriptor already
inside the root and opened without following links, does the same (``Root(prefer_openat2=False)``
forces it, for tests). The root ``/`` needs neither: there the kernel's own resolution is it.

Limits. A read takes a regular file only (/proc and /sys attributes are regular files): a FIFO, a
device or a directory in its place is an error naming it, never a read that blocks or never ends;
sizes are bounded (``DEFAULT_LIMIT``). Only ``kmsg`` reads a character device, and only the
kernel log (1:11), non-blocking and bounded. Commands resolve under the root's sbin/bin
directories, run without a shell in their own session, and a timeout kills their process group.

Errors are ``OpError(message, errno)``; a batch answers each request with its value or its error.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import fcntl
import fnmatch
import json
import os
import selectors
import signal
import stat
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    import subprocess
    from collections.abc import Callable
    from typing import Any

PROTOCOL = 1
DEFAULT_LIMIT = 4 * 2**20
"""Bytes a read may return: more than any kernel attribute, modules.builtin or a tool output."""
KMSG_LIMIT = 64 * 2**20
"""Bytes of kernel log records: the largest ring buffer a kernel allows is 32 MiB."""
COMMAND_DIRS = ("usr/sbin", "usr/bin", "sbin", "bin")
COMMAND_TIMEOUT_S = 120.0
OUTPUT_LIMIT = 16 * 2**20
REAP_S = 5.0
"""How long a killed command's group is waited for before it is left to end by itself."""
LOCK_POLL_S = 0.05
"""How often a lock held by another process is tried again."""
EXIT_POLL_S = 0.05
"""How often a command that closed its outputs is looked at until it has ended."""
MAX_LINKS = 40
KMSG_DEVICE = (1, 11)
LOCK_MARK = b"pytest-gpuhost lock:"
"""How a lock file starts once held: a file that says anything else is not truncated."""
_MISSING = (errno.ENOENT, errno.ENOTDIR)

_TYPES = (
    (stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
    (stat.S_ISLNK, "symbolic link"),
)


class OpError(Exception):
    """An operation that failed; ``str()`` says what, where and why."""

    def __init__(self, message: str, error: int | None = None) -> None:
        super().__init__(message)
        self.errno = error


def file_type(mode: int) -> str:
    for test, name in _TYPES:
        if test(mode):
            return name
    return "special file"


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data``: a write(2) the file system cut short is continued, and the
    next one raises what cut it (ENOSPC, EFBIG past a file size limit)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def check_relative(path: str) -> str:
    """``path`` once it names something under the root: relative, without NUL and without
    ``..`` (which only a link target may hold; it is resolved inside the root)."""
    if not isinstance(path, str) or not path:
        raise OpError("an empty path: host paths are relative to the root", errno.EINVAL)
    if "\0" in path:
        raise OpError(f"path {path!r} contains NUL", errno.EINVAL)
    if path.startswith("/"):
        raise OpError(f"path {path!r} is absolute; host paths are relative to the root",
                      errno.EINVAL)
    parts = path.split("/")
    if ".." in parts or all(part in ("", ".") for part in parts):
        raise OpError(f"path {path!r} would leave the host root", errno.EINVAL)
    return path


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_OPENAT2_TRIES = 8
"""openat2 calls a lookup gets while it keeps answering EAGAIN, before the walk takes over."""
_openat2_state: list[ctypes.CDLL | None] = []  # [libc] once probed and usable, [None] when not


def _libc_openat2() -> ctypes.CDLL | None:
    if not _openat2_state:
        libc = None
        if sys.platform.startswith("linux"):
            try:
                candidate = ctypes.CDLL(None, use_errno=True)
                candidate.syscall  # noqa: B018 - probe that the symbol exists
                libc = candidate
            except (OSError, AttributeError):
                libc = None
        _openat2_state.append(libc)
    return _openat2_state[0]


class Root:
    """A host root: resolves relative paths inside it and opens them."""

    def __init__(self, path: str, *, prefer_openat2: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = os.path.abspath(path)
        self.clock = clock
        """Monotonic seconds: the deadlines of commands and lock waits (injected in tests)."""
        self.watch: Channel | None = None
        """The connection a served agent watches while a command runs or a lock is waited
        for: it closing, or a cancel on it, stops the wait (``Channel.stop``)."""
        self._running: list[subprocess.Popen[bytes]] = []
        """Commands killed that had not ended when their reaping gave up: their locks stay."""
        self.real = os.path.realpath(self.path) == "/"
        self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._locks: dict[int, str] = {}
        """Lock handles (their descriptors) this process holds, for ``unlock``."""
        self.gpus: Gpus | None = None
        """The GPUs through NVML, at their first use (``gpus_of``)."""
        self._openat2 = prefer_openat2 and not self.real and _libc_openat2() is not None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def shown(self, rel: str) -> str:
        return os.path.join(self.path, rel)

    def fail(self, action: str, rel: str, exc: OSError) -> OpError:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        name = errno.errorcode.get(exc.errno or 0, "")
        return OpError(f"cannot {action} {self.shown(rel)}: {reason}"
                       + (f" ({name})" if name else ""), exc.errno)

    # -- resolution -------------------------------------------------------------------------

    def open(self, rel: str, flags: int, mode: int = 0) -> int:
        """Open ``rel`` (its last component followed too) inside the root; raises OSError."""
        check_relative(rel)
        return self._open(rel, flags, mode)

    def _open(self, rel: str, flags: int, mode: int = 0) -> int:
        """``open`` without the check: ``.`` opens the root itself."""
        flags |= os.O_CLOEXEC
        if self.real:
            return os.open("/" + rel, flags, mode)
        if self._openat2:
            fd = self._open_openat2(rel, flags, mode)
            if fd is not None:
                return fd
        parent, name = self._walk(rel, follow_last=True)
        try:
            return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=parent)
        finally:
            if parent != self.fd:
                os.close(parent)

    def _open_openat2(self, rel: str, flags: int, mode: int) -> int | None:
        """The fd, or None to walk instead. EAGAIN is the kernel saying a rename or mount
        anywhere on the machine raced a lookup through ``..`` (every sysfs device link has
        some), so that it cannot vouch for the root's containment this time: retried, as
        openat2(2) advises, then walked (starting containers mount all the time on a busy
        node; an EAGAIN taken for an unreadable file left a GPU out of the inventory)."""
        libc = _libc_openat2()
        if libc is None:
            return None
        how = _OpenHow(flags, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
        for _ in range(_OPENAT2_TRIES):
            fd = libc.syscall(_SYS_OPENAT2, self.fd, os.fsencode(rel), ctypes.byref(how),
                              ctypes.sizeof(how))
            if fd >= 0:
                return int(fd)
            error = ctypes.get_errno()
            if error != errno.EAGAIN:
                break
        else:
            return None  # still racing: the portable walk keeps the root just as well
        if error in (errno.ENOSYS, errno.EPERM) and not self._probe_openat2():
            self._openat2 = False  # no openat2 here (an old kernel, or seccomp): walk instead
            return None
        raise OSError(error, os.strerror(error))

    def _probe_openat2(self) -> bool:
        """Whether openat2 works at all (EPERM can also be the file's own answer)."""
        libc = _libc_openat2()
        if libc is None:
            return False
        how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT)
        fd = libc.syscall(_SYS_OPENAT2, self.fd, b".", ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            os.close(fd)
            return True
        return False

    def parent(self, rel: str) -> tuple[int, str]:
        """The directory holding ``rel``'s last component, resolved inside the root, and that
        component's name, not followed: for creating, replacing and removing without ever
        following a link. The caller closes the descriptor (never the root's own)."""
        check_relative(rel)
        head, _, name = rel.rstrip("/").rpartition("/")
        if name in ("", ".", ".."):
            raise OpError(f"path {rel!r} names no file", errno.EINVAL)
        if not head:
            return os.dup(self.fd), name
        return self.open(head, os.O_PATH | os.O_DIRECTORY), name

    def _walk(self, rel: str, *, follow_last: bool) -> tuple[int, str]:
        """The fallback resolution: (directory fd, last name) with every link on the way
        resolved inside the root. The returned fd is the root's own or one to close."""
        stack = [self.fd]
        parts = [p for p in rel.split("/") if p not in ("", ".")]
        links = 0
        try:
            while parts:
                part = parts.pop(0)
                if part == "..":
                    if len(stack) > 1:
                        os.close(stack.pop())
                    continue
                last = not parts
                try:
                    info = os.stat(part, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    if last:
                        return stack.pop(), part
                    raise
                if stat.S_ISLNK(info.st_mode) and (follow_last or not last):
                    links += 1
                    parts = self._follow(stack, part, links) + parts
                    if not parts:  # a link to the root itself
                        return self._root_as_parent(stack)
                    continue
                if last:
                    return stack.pop(), part
                stack.append(os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                                     | os.O_CLOEXEC, dir_fd=stack[-1]))
            return self._root_as_parent(stack)
        finally:
            for fd in stack[1:]:
                os.close(fd)

    @staticmethod
    def _follow(stack: list[int], name: str, links: int) -> list[str]:
        """The components of the link ``name`` in the directory on top of ``stack``; an
        absolute target starts again at the root (``stack`` is cut back to it)."""
        if links > MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        target = os.readlink(name, dir_fd=stack[-1])
        if target.startswith("/"):
            while len(stack) > 1:
                os.close(stack.pop())
        return [p for p in target.split("/") if p not in ("", ".")]

    def _root_as_parent(self, stack: list[int]) -> tuple[int, str]:
        """A path that resolves to a directory itself: (that directory, ``.``)."""
        return (stack.pop() if len(stack) > 1 else self.fd), "."

    def real_path(self, fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    # -- operations -------------------------------------------------------------------------

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

    def glob(self, pattern: str, *, read: bool, limit: int = DEFAULT_LIMIT,
             links: bool = False) -> list[list[object]]:
        """``[path, content or error or None]`` for every path matching ``pattern`` (fnmatch
        wildcards within one component; names starting with '.' only where the pattern's
        component does), sorted; with ``read``, each match's bytes (or why not); with
        ``links``, each match's link target as stored (None for what is not a link). A
        directory the pattern must list that is missing has no matches; one that cannot be
        listed (EACCES, a link out of the root) fails the whole glob: its matches are
        unknown, and a glob that left them out would drop a CPU or a GPU unseen."""
        check_relative(pattern)
        paths = [""]
        for part in [p for p in pattern.split("/") if p not in ("", ".")]:
            paths = [path for base in paths for path in self._step(base, part)]
        matches = (self._match(path, read, limit, links) for path in sorted(paths))
        return [match for match in matches if match is not None]

    def _step(self, base: str, part: str) -> list[str]:
        """The paths under ``base`` that one component of a glob pattern names."""
        if not any(char in part for char in "*?["):
            return [f"{base}/{part}" if base else part]
        try:
            names = self._listdir(base or ".")
        except OpError as exc:
            if exc.errno in _MISSING:
                return []
            raise
        hidden = part.startswith(".")
        return [f"{base}/{n}" if base else n for n in names
                if fnmatch.fnmatchcase(n, part) and (hidden or n[0] != ".")]

    def _match(self, path: str, read: bool, limit: int, links: bool) -> list[object] | None:
        """One glob match as ``glob`` returns it, or None for a path that is gone."""
        try:
            if links:
                target = self.readlink(path)
                return [path, target] if target is not None or self._lexists(path) else None
            if not read:
                self.stat(path)
                return [path, None]
            return [path, self.read(path, limit)]
        except OpError as exc:
            if links:
                return [path, exc]
            return None if not read or exc.errno in _MISSING else [path, exc]

    def kmsg(self, rel: str, limit: int = KMSG_LIMIT) -> list[str]:
        """The kernel log's records: read(2) per record from the device until EAGAIN, or the
        lines of a plain file in a fake tree. Anything else in its place is refused."""
        try:
            fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        try:
            info = os.fstat(fd)
            if stat.S_ISREG(info.st_mode):
                data = self._bounded(fd, rel, limit)
                return data.decode("utf-8", errors="replace").splitlines()
            device = (os.major(info.st_rdev), os.minor(info.st_rdev))
            if not stat.S_ISCHR(info.st_mode) or device != KMSG_DEVICE:
                what = file_type(info.st_mode)
                if stat.S_ISCHR(info.st_mode):
                    what += f" {device[0]}:{device[1]}"
                raise OpError(f"cannot read {self.shown(rel)}: it is a {what}, not the kernel "
                              "log (character device 1:11)", errno.EINVAL)
            return self._records(fd, rel, limit)
        except OSError as exc:
            raise self.fail("read", rel, exc) from None
        finally:
            os.close(fd)

    def _records(self, fd: int, rel: str, limit: int) -> list[str]:
        records: list[str] = []
        size = 0
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                return records
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records were overwritten while we read
                    continue
                raise
            if not chunk:
                return records
            size += len(chunk)
            if size > limit:
                raise OpError(f"cannot read {self.shown(rel)}: more than {limit} bytes of "
                              "records", errno.EFBIG)
            records.extend(chunk.decode("utf-8", errors="replace").splitlines())

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
                _write_all(fd, data)
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
            if exc.errno in _MISSING:
                return None
            raise self.fail("read the link", rel, exc) from None
        try:
            return os.readlink(name, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (*_MISSING, errno.EINVAL):  # EINVAL: not a link
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

    # -- pytest-gpuhost's own files: journals and locks ---------------------------------------

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
                    _write_all(fd, data)  # a file made whole or not at all
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

    def identity(self) -> dict[str, object]:
        info: dict[str, object] = {"root": os.path.realpath(self.path)}
        if self.real:
            info["hostname"] = os.uname().nodename
            for key, path in (("machine_id", "/etc/machine-id"),
                              ("boot_id", "/proc/sys/kernel/random/boot_id")):
                try:
                    with open(path, encoding="utf-8", errors="replace") as file:
                        info[key] = file.readline().strip() or None
                except OSError:
                    info[key] = None
        return info


# -- NVML: the GPUs' facts on the machine that has them -----------------------------------------

NVML_LIBRARY = "libnvidia-ml.so.1"
NVML_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib",
             "lib/x86_64-linux-gnu", "lib/aarch64-linux-gnu", "lib64", "lib")
"""Where distributions, the NVIDIA installer and the container toolkit put the NVML library."""
SMI_FIELDS = ("pci.bus_id", "driver_version", "persistence_mode", "pcie.link.gen.max",
              "enforced.power.limit", "power.min_limit", "power.max_limit", "ecc.mode.current",
              "ecc.mode.pending")
"""What ``nvidia-smi --query-gpu`` reports of each GPU where the library cannot be loaded."""
NVML_NO_PERMISSION = 4


class _PciInfo(ctypes.Structure):
    """nvmlPciInfo_t (nvmlDeviceGetPciInfo_v3)."""

    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class _Bar1(ctypes.Structure):
    """nvmlBAR1Memory_t."""

    _fields_ = [("bar1Total", ctypes.c_ulonglong), ("bar1Free", ctypes.c_ulonglong),
                ("bar1Used", ctypes.c_ulonglong)]


def _bus_id(raw: str) -> str:
    """NVML's ``00000000:81:00.0`` as sysfs names it: ``0000:81:00.0``."""
    parts = raw.strip().lower().split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


class Gpus:
    """The GPUs as the NVIDIA driver of this machine describes them: through the root's own
    libnvidia-ml.so.1 (ctypes: nothing installed), or ``nvidia-smi --query-gpu`` under the root
    where the library cannot be loaded. ``facts`` is everything the checks ask, in one answer;
    ``set`` changes one setting (persistence mode, power limit, the pending ECC mode)."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.lib: Any = None
        self.where = ""
        self.problem = ""
        self.handles: dict[str, Any] = {}

    def _candidates(self) -> list[str]:
        found = [NVML_LIBRARY] if self.root.real else []
        for directory in NVML_DIRS:
            try:
                fd = self.root.open(f"{directory}/{NVML_LIBRARY}", os.O_PATH)
            except (OSError, OpError):
                continue
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    found.append(self.root.real_path(fd))
            finally:
                os.close(fd)
        return found

    def _load(self) -> bool:
        """The library, loaded and started once; False (``problem`` says why) where none."""
        if self.lib is not None or self.problem:
            return self.lib is not None
        problems = []
        for path in self._candidates():
            try:
                lib = ctypes.CDLL(path)
                lib.nvmlErrorString.restype = ctypes.c_char_p
                start = getattr(lib, "nvmlInit_v2", None) or lib.nvmlInit
                code = start()
            except (OSError, AttributeError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            if code != 0:
                problems.append(f"{path}: nvmlInit failed: {self._words(lib, code)}")
                continue
            self.lib, self.where = lib, path
            return True
        self.problem = "; ".join(problems) or (
            f"no {NVML_LIBRARY} in " + ", ".join(self.root.shown(d) for d in NVML_DIRS))
        return False

    @staticmethod
    def _words(lib: Any, code: int) -> str:
        try:
            return (lib.nvmlErrorString(code) or b"").decode("utf-8", "replace") or str(code)
        except (OSError, AttributeError):
            return f"error {code}"

    def _call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != 0:
            raise OpError(f"NVML {name} failed: {self._words(self.lib, code)}",
                          errno.EPERM if code == NVML_NO_PERMISSION else errno.EIO)

    def _each(self, facts: dict[str, object], key: str, read: Callable[[], object]) -> None:
        try:
            facts[key] = read()
        except (OpError, OSError, AttributeError, ValueError) as exc:
            facts[key] = {"error": str(exc)}

    def _text(self, name: str) -> str:
        buffer = ctypes.create_string_buffer(96)
        self._call(name, buffer, ctypes.c_uint(96))
        return buffer.value.decode("utf-8", "replace")

    def _number(self, name: str, handle: Any) -> int:
        value = ctypes.c_uint()
        self._call(name, handle, ctypes.byref(value))
        return value.value

    def _handles(self) -> dict[str, Any]:
        if not self.handles:
            count = ctypes.c_uint()
            self._call("nvmlDeviceGetCount_v2", ctypes.byref(count))
            for index in range(count.value):
                handle = ctypes.c_void_p()
                self._call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index),
                           ctypes.byref(handle))
                info = _PciInfo()
                self._call("nvmlDeviceGetPciInfo_v3", handle, ctypes.byref(info))
                self.handles[_bus_id(info.busId.decode("ascii", "replace"))] = handle
        return self.handles

    def _gpu(self, handle: Any) -> dict[str, object]:
        gpu: dict[str, object] = {}
        mode = ctypes.c_int()
        low, high, current, pending = (ctypes.c_uint(), ctypes.c_uint(), ctypes.c_int(),
                                       ctypes.c_int())
        bar1 = _Bar1()

        def persistence() -> bool:
            self._call("nvmlDeviceGetPersistenceMode", handle, ctypes.byref(mode))
            return mode.value == 1

        def limits() -> list[int]:
            self._call("nvmlDeviceGetPowerManagementLimitConstraints", handle, ctypes.byref(low),
                       ctypes.byref(high))
            return [low.value, high.value]

        def ecc() -> list[bool]:
            self._call("nvmlDeviceGetEccMode", handle, ctypes.byref(current),
                       ctypes.byref(pending))
            return [current.value == 1, pending.value == 1]

        def bar1_total() -> int:
            self._call("nvmlDeviceGetBAR1MemoryInfo", handle, ctypes.byref(bar1))
            return int(bar1.bar1Total)

        self._each(gpu, "persistence_mode", persistence)
        self._each(gpu, "max_link_generation",
                   lambda: self._number("nvmlDeviceGetMaxPcieLinkGeneration", handle))
        self._each(gpu, "power_limit",
                   lambda: self._number("nvmlDeviceGetEnforcedPowerLimit", handle))
        self._each(gpu, "power_limit_range", limits)
        self._each(gpu, "ecc_mode", ecc)
        self._each(gpu, "bar1_total", bar1_total)
        return gpu

    def _pairs(self, handles: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
        """(the P2P read status of every ordered pair that is not ok, the topology level of
        every pair), as NVML's numbers."""
        p2p: dict[str, int] = {}
        levels: dict[str, int] = {}
        status, level = ctypes.c_int(), ctypes.c_int()
        for one, first in handles.items():
            for other, second in handles.items():
                if one == other:
                    continue
                try:
                    self._call("nvmlDeviceGetP2PStatus", first, second, ctypes.c_int(0),
                               ctypes.byref(status))
                    if status.value:
                        p2p[f"{one}->{other}"] = status.value
                    if one < other:
                        self._call("nvmlDeviceGetTopologyCommonAncestor", first, second,
                                   ctypes.byref(level))
                        levels[f"{one}->{other}"] = level.value
                except (OpError, AttributeError):
                    continue
        return p2p, levels

    def facts(self) -> dict[str, object]:
        """Everything the NVML checks ask: ``{"source", "driver_version", "library_version",
        "gpus": {address: {...}}, "p2p", "topology"}`` (a value that could not be read is
        ``{"error": ...}``), or ``{"unavailable": why}``."""
        if self._load():
            facts: dict[str, object] = {"source": f"{NVML_LIBRARY} ({self.where})"}
            self._each(facts, "driver_version", lambda: self._text("nvmlSystemGetDriverVersion"))
            self._each(facts, "library_version", lambda: self._text("nvmlSystemGetNVMLVersion"))
            handles = self._handles()
            facts["gpus"] = {address: self._gpu(handle) for address, handle in handles.items()}
            facts["p2p"], facts["topology"] = self._pairs(handles)
            return facts
        smi = self.root.which("nvidia-smi")
        if smi is None:
            return {"unavailable": f"{self.problem}; and no nvidia-smi in "
                                   + ", ".join(self.root.shown(d) for d in COMMAND_DIRS)}
        return self._smi_facts()

    def _smi_facts(self) -> dict[str, object]:
        done = self.root.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], timeout=60.0)
        if done["returncode"] != 0:
            return {"unavailable": f"{self.problem}; and nvidia-smi --query-gpu exited "
                                   f"{done['returncode']}: {str(done['stderr']).strip()[-300:]}"}
        gpus: dict[str, object] = {}
        driver = ""
        for line in str(done["stdout"]).splitlines():
            cells = [cell.strip() for cell in line.split(",")]
            if len(cells) != len(SMI_FIELDS):
                continue
            row = {field: cells[index] for index, field in enumerate(SMI_FIELDS)}
            driver = row["driver_version"]
            gpus[_bus_id(row["pci.bus_id"])] = {
                "persistence_mode": _smi(row["persistence_mode"], _enabled),
                "max_link_generation": _smi(row["pcie.link.gen.max"], int),
                "power_limit": _smi(row["enforced.power.limit"], _milliwatts),
                "power_limit_range": _smi(f"{row['power.min_limit']} {row['power.max_limit']}",
                                          lambda text: [_milliwatts(w) for w in text.split()]),
                "ecc_mode": _smi(f"{row['ecc.mode.current']} {row['ecc.mode.pending']}",
                                 lambda text: [_enabled(word) for word in text.split()]),
            }
        return {"source": "nvidia-smi --query-gpu", "library_problem": self.problem,
                "driver_version": driver, "gpus": gpus}

    def set(self, address: str, setting: str, value: str) -> None:
        """Persistence mode and ECC ``enabled``/``disabled``, the power limit in W: through
        the library, else nvidia-smi; EPERM where the driver refuses it for want of root."""
        if self._load():
            handle = self._handles().get(address)
            if handle is None:
                raise OpError(f"NVML has no GPU at {address}", errno.ENODEV)
            if setting == "power_limit":
                self._call("nvmlDeviceSetPowerManagementLimit", handle,
                           ctypes.c_uint(round(float(value) * 1000)))
            elif setting in ("persistence_mode", "ecc"):
                name = "nvmlDeviceSetPersistenceMode" if setting == "persistence_mode" else \
                    "nvmlDeviceSetEccMode"
                self._call(name, handle, ctypes.c_int(1 if value == "enabled" else 0))
            else:
                raise OpError(f"no NVML setting {setting!r}", errno.EINVAL)
            return
        flags = {"persistence_mode": "-pm", "power_limit": "-pl", "ecc": "-e"}
        if setting not in flags:
            raise OpError(f"no NVML setting {setting!r}", errno.EINVAL)
        word = value if setting == "power_limit" else ("1" if value == "enabled" else "0")
        done = self.root.run(["nvidia-smi", "-i", address, flags[setting], word], timeout=60.0)
        if done["returncode"] != 0:
            said = (str(done["stderr"]) + str(done["stdout"])).strip()[-300:]
            raise OpError(f"nvidia-smi -i {address} {flags[setting]} {word} exited "
                          f"{done['returncode']}: {said}",
                          errno.EPERM if "permission" in said.lower() else errno.EIO)


def _enabled(word: str) -> bool:
    if word not in ("Enabled", "Disabled"):
        raise ValueError(f"not Enabled or Disabled: {word!r}")
    return word == "Enabled"


def _milliwatts(text: str) -> int:
    return round(float(text) * 1000)


def _smi(text: str, parse: Callable[[str], object]) -> object:
    """A value nvidia-smi reported, or why it did not (``[N/A]``, ``[Not Supported]``)."""
    try:
        return parse(text)
    except ValueError:
        return {"error": f"nvidia-smi reports {text!r}"}


def gpus_of(root: Root) -> Gpus:
    """The root's ``Gpus``, made at its first use (the library stays loaded)."""
    if root.gpus is None:
        root.gpus = Gpus(root)
    return root.gpus


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


class Ended(BaseException):
    """SIGTERM or SIGHUP to the agent: raised where it is, as SIGINT raises KeyboardInterrupt,
    so a running command's group is killed before the agent exits (and lets its locks go)."""


def _ended(signum: int, frame: object) -> None:
    raise Ended(signal.Signals(signum).name)


# -- requests -----------------------------------------------------------------------------------


def _text(request: dict[str, Any], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str):
        raise OpError(f"a {request.get('op')} request needs {key!r} as a string, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return value


def _whole(request: dict[str, Any], key: str, default: int) -> int:
    value = request.get(key) or default
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpError(f"a {request.get('op')} request needs {key!r} as an integer, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return value


def _seconds(request: dict[str, Any], key: str, default: float) -> float:
    value = request.get(key) or default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpError(f"a {request.get('op')} request needs {key!r} as a number, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return float(value)


def _data(request: dict[str, Any]) -> bytes:
    value = request.get("data")
    if not isinstance(value, bytes):
        raise OpError(f"a {request.get('op')} request needs its data as bytes",
                      errno.EINVAL)
    return value


def _run(root: Root, request: dict[str, Any]) -> object:
    argv, env = request.get("argv"), request.get("env") or {}
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise OpError("a run request needs its argv as a list of strings", errno.EINVAL)
    if not isinstance(env, dict) or not all(isinstance(key, str) and isinstance(value, str)
                                            for key, value in env.items()):
        raise OpError("a run request needs its env as a mapping of strings", errno.EINVAL)
    return root.run(argv, env, _seconds(request, "timeout", COMMAND_TIMEOUT_S))


def _write(root: Root, request: dict[str, Any]) -> object:
    root.write(_text(request, "path"), _data(request), _whole(request, "offset", 0),
               truncate=bool(request.get("truncate")))
    return None


def _replace(root: Root, request: dict[str, Any]) -> object:
    root.replace(_text(request, "path"), _data(request), _whole(request, "mode", 0o644))
    return None


def _create(root: Root, request: dict[str, Any]) -> object:
    root.create(_text(request, "path"), _data(request), _whole(request, "mode", 0o600))
    return None


def _append(root: Root, request: dict[str, Any]) -> object:
    root.append(_text(request, "path"), _data(request), sync=request.get("sync", True) is not False)
    return None


def _remove(root: Root, request: dict[str, Any]) -> object:
    root.remove(_text(request, "path"))
    return None


def _unlock(root: Root, request: dict[str, Any]) -> object:
    root.unlock(_whole(request, "handle", -1))
    return None


OPERATIONS: dict[str, Callable[[Root, dict[str, Any]], object]] = {
    "read": lambda root, r: root.read(_text(r, "path"), _whole(r, "limit", DEFAULT_LIMIT)),
    "stat": lambda root, r: root.stat(_text(r, "path")),
    "list": lambda root, r: root.listdir(_text(r, "path")),
    "glob": lambda root, r: root.glob(_text(r, "pattern"), read=bool(r.get("read")),
                                      limit=_whole(r, "limit", DEFAULT_LIMIT),
                                      links=bool(r.get("links"))),
    "kmsg": lambda root, r: root.kmsg(_text(r, "path"), _whole(r, "limit", KMSG_LIMIT)),
    "readlink": lambda root, r: root.readlink(_text(r, "path")),
    "which": lambda root, r: root.which(_text(r, "name")),
    "identity": lambda root, r: root.identity(),
    "lock": lambda root, r: root.lock(_text(r, "path"), _seconds(r, "timeout", 0.0),
                                      str(r.get("holder") or "")),
    "run": _run, "write": _write, "replace": _replace, "create": _create, "append": _append,
    "remove": _remove, "unlock": _unlock,
    "nvml": lambda root, r: gpus_of(root).facts(),
    "nvml_set": lambda root, r: gpus_of(root).set(_text(r, "address"), _text(r, "setting"),
                                                  _text(r, "value")),
}
"""Each operation a request may name, and what carries it out."""


def execute(root: Root, request: dict[str, Any]) -> object:
    """One request: ``{"op": ..., ...}`` -> its value; raises OpError (a request that is not
    one of the table's, or whose fields have the wrong types, included)."""
    if not isinstance(request, dict):
        raise OpError(f"a request must be a mapping, not {type(request).__name__}",
                      errno.EINVAL)
    op = request.get("op")
    operation = OPERATIONS.get(op) if isinstance(op, str) else None
    if operation is None:
        raise OpError(f"unknown operation {request.get('op')!r}", errno.EINVAL)
    return operation(root, request)


def batch(root: Root, requests: list[dict[str, Any]]) -> list[dict[str, object]]:
    """Each request's ``{"value": ...}`` or ``{"error": message, "errno": n}``, in order."""
    replies: list[dict[str, object]] = []
    for request in requests:
        try:
            replies.append({"value": execute(root, request)})
        except OpError as exc:
            replies.append({"error": str(exc), "errno": exc.errno})
        except OSError as exc:
            replies.append({"error": str(exc), "errno": exc.errno})
    return replies


# -- the remote side ----------------------------------------------------------------------------


def encode(value: object) -> object:
    """JSON for a reply: bytes as ``{"b64": ...}``, errors as ``{"error": ..., "errno": ...}``."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, OpError):
        return {"error": str(value), "errno": value.errno}
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


def decode(value: object) -> object:
    """The inverse of ``encode`` for requests (``{"b64": ...}`` -> bytes)."""
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(str(value["b64"]))
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value


class Channel:
    """The agent's end of its connection: a length line, then that many bytes of JSON, each
    way. Input is read through a buffer of its own, so that while a command runs the agent
    still sees the connection close or a ``{"cancel": ...}`` arrive (``stop``)."""

    HEADER_LIMIT = 32

    def __init__(self, source: int, out: Any) -> None:
        self.source = source
        self.out = out
        self.buffer = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self.source

    def send(self, message: object) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        self.out.write(b"%d\n" % len(data) + data)
        self.out.flush()

    def _fill(self) -> None:
        chunk = os.read(self.source, 1 << 20)
        if chunk:
            self.buffer += chunk
        else:
            self.closed = True

    def _head(self, *, take: bool) -> tuple[bool, object]:
        """(True, the message) when a whole one is at the head of the buffer (taken off it
        with ``take``); ValueError for a stream that is not this protocol."""
        newline = self.buffer.find(b"\n")
        if newline < 0:
            if len(self.buffer) > self.HEADER_LIMIT:
                raise ValueError("not a length line")
            return False, None
        size = int(self.buffer[:newline])
        end = newline + 1 + size
        if size < 0 or len(self.buffer) < end:
            return False, None
        message = json.loads(bytes(self.buffer[newline + 1:end]))
        if take:
            del self.buffer[:end]
        return True, message

    def receive(self) -> object | None:
        """The next message; None once the connection has closed."""
        while True:
            whole, message = self._head(take=True)
            if whole:
                return message
            if self.closed:
                return None
            self._fill()

    def stop(self) -> str | None:
        """Why a running command must end, from what has arrived (called when input is
        ready): the connection closed (the controller or its ssh is gone), or the controller
        asked to cancel; None: go on (a message that is not a cancel waits its turn)."""
        if not self.closed:
            self._fill()
        if self.closed:
            return "the connection to the controller closed"
        whole, message = self._head(take=False)
        if whole and isinstance(message, dict) and "cancel" in message:
            self._head(take=True)
            return f"the controller cancelled it: {message['cancel']}"
        return None


def serve(root_path: str) -> int:
    """Answer batches on stdin/stdout until stdin closes. The first message says who and
    where this is. SIGTERM and SIGHUP end the agent as its input closing does: a command it
    runs is killed (its whole group) first."""
    channel = Channel(sys.stdin.fileno(), sys.stdout.buffer)
    try:
        root = Root(root_path)
    except OSError as exc:
        channel.send({"hello": None, "error": f"the host root {root_path} cannot be opened: "
                                              f"{exc.strerror}", "errno": exc.errno})
        return 1
    root.watch = channel
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ended)
    try:
        channel.send({"hello": {"protocol": PROTOCOL, "python": list(sys.version_info[:3]),
                                "euid": os.geteuid(), "identity": root.identity()}})
        return _answer(root, channel)
    except (Ended, KeyboardInterrupt, OSError, ValueError):  # told to end, the connection
        # gone, or a stream that is not this protocol
        return 1


def _answer(root: Root, channel: Channel) -> int:
    while True:
        message = channel.receive()
        if message is None:
            return 0
        if isinstance(message, dict) and "cancel" in message:
            continue  # for a command that had ended before the cancel came
        requests = decode(message)
        if not isinstance(requests, list):
            channel.send({"error": "not a batch of requests"})
            continue
        channel.send(encode(batch(root, requests)))


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else "/"))
