"""Paths resolved inside a host root, as ``openat2(RESOLVE_IN_ROOT)`` or a chroot resolves them.

An absolute symlink target is relative to the root, ``..`` stops at the root. The kernel's
openat2 does it where it exists (Linux 5.6+, called through ctypes); elsewhere a walk one
component at a time, each step relative to a directory descriptor already inside the root and
opened without following links, does the same (``prefer_openat2=False`` forces it, for tests).
The root ``/`` needs neither: there the kernel's own resolution is it.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

from .errors import OpError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    import ctypes
    import subprocess
    from collections.abc import Callable

    from .channel import Channel

MAX_LINKS = 40


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


_SYS_OPENAT2 = 437  # the same number on every architecture (the unified syscall table)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_IN_ROOT = 0x10
_OPENAT2_TRIES = 8
"""openat2 calls a lookup gets while it keeps answering EAGAIN, before the walk takes over."""
_openat2_state: list[ctypes.CDLL | None] = []  # [libc] once probed and usable, [None] when not


def _libc_openat2() -> ctypes.CDLL | None:
    """This process's libc for the openat2 syscall, probed at the first open through a root
    (ctypes is imported then, not with this module, nor when a root is made at start-up)."""
    if not _openat2_state:
        libc = None
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                candidate = ctypes.CDLL(None, use_errno=True)
                candidate.syscall  # noqa: B018 - probe that the symbol exists
                libc = candidate
            except (OSError, AttributeError):
                libc = None
        _openat2_state.append(libc)
    return _openat2_state[0]


def _open_how(flags: int, mode: int, resolve: int) -> ctypes.Array[ctypes.c_uint64]:
    """``struct open_how`` (three u64: flags, mode, resolve) for openat2."""
    import ctypes

    return (ctypes.c_uint64 * 3)(flags, mode, resolve)


class Contained:
    """A host root: resolves relative paths inside it and opens them. The operations build on
    it (``Root`` joins them); it also holds what they share of the run: the clock, the watched
    connection, the locks held and the commands that may still run under them."""

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
        self._openat2 = prefer_openat2 and not self.real
        """Whether openat2 is (still) tried: false once this kernel or libc is seen without it
        (probed at the first open, so that a root made and not yet used imports no ctypes)."""

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
            self._openat2 = False
            return None
        import ctypes

        how = _open_how(flags, mode, _RESOLVE_IN_ROOT | _RESOLVE_NO_MAGICLINKS)
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
        import ctypes

        how = _open_how(os.O_PATH | os.O_CLOEXEC, 0, _RESOLVE_IN_ROOT)
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
