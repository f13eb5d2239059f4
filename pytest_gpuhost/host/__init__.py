"""The host layer: the only code that touches a machine.

A host has a root (``/`` or a fake tree). Every path is relative to it and is checked so that it
cannot leave it; commands resolve under the root's sbin/bin directories and run without a shell.
Files are read directly (no process per check); a write never creates a file (only
``replace_file``, for the files pytest-gpuhost owns, does).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Protocol

COMMAND_DIRS = ("usr/sbin", "usr/bin", "sbin", "bin")
COMMAND_TIMEOUT_S = 120.0
_MISSING = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


class HostError(Exception):
    """A read, write or command that failed; the message says what and where, ``errno`` why."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class UnsafePath(HostError):
    """A path that would leave the host root."""


class CommandTimeout(HostError):
    """A command that did not finish in time. Its whole process group was killed, but what it
    did before that is unknown: a fix that timed out may or may not have been made."""

    def __init__(self, message: str, argv: tuple[str, ...], timeout: float) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.argv = argv
        self.timeout = timeout


@dataclass(frozen=True)
class HostIdentity:
    """What a journal records of the machine it changed, so that rollback refuses another:
    the root as the host names it and, for the real root, the machine's own ids."""

    root: str
    hostname: str | None = None
    machine_id: str | None = None
    boot_id: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"root": self.root, "hostname": self.hostname, "machine_id": self.machine_id,
                "boot_id": self.boot_id}


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def shown(self) -> str:
        return " ".join(self.argv)


def checked_relative(path: str) -> str:
    """``path``, normalized as ``PurePosixPath`` would, once it is known to stay under the root:
    refuses ``..``, absolute paths, NUL and empty paths. Strings only: this runs for every read
    of every check."""
    if "\0" in path:
        raise UnsafePath(f"path {path!r} contains NUL")
    if path.startswith("/"):
        raise UnsafePath(f"path {path!r} is absolute; host paths are relative to the root")
    parts = path.split("/")
    if ".." in parts or all(part in ("", ".") for part in parts):
        raise UnsafePath(f"path {path!r} would leave the host root")
    return os.path.normpath(path)


def safe_relative(path: str) -> PurePosixPath:
    """A path relative to the root, refusing ``..``, absolute paths, NUL and empty parts."""
    return PurePosixPath(checked_relative(path))


class Host(Protocol):
    """What checks may do to a machine. ``describe()`` names it for reports."""

    def describe(self) -> str: ...

    def privileged(self) -> bool:
        """Whether writes to /proc/sys, /sys and config space may be allowed (root)."""

    def read_text(self, path: str) -> str: ...

    def read_bytes(self, path: str) -> bytes: ...

    def write_text(self, path: str, text: str) -> None:
        """The whole value, encoded as UTF-8 with ``surrogateescape`` (so bytes that are not
        UTF-8, decoded that way, are written back exactly)."""

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None: ...

    def replace_file(self, path: str, text: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def exists(self, path: str) -> bool: ...

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]: ...

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        """``env``: variables merged over the inherited environment. Raises CommandTimeout
        (after killing the command's process group) when it runs too long."""

    def identity(self) -> HostIdentity:
        """The root and, for a real machine, its hostname, machine-id and boot id."""


class LocalHost:
    """This machine, seen through ``root``: ``/`` for the real host, a directory for a fake one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.is_real = root.resolve() == Path("/")
        self._base = os.fspath(root)

    def describe(self) -> str:
        return str(self.root)

    def privileged(self) -> bool:
        return os.geteuid() == 0

    def identity(self) -> HostIdentity:
        root = os.path.realpath(self.root)
        if not self.is_real:
            return HostIdentity(root)

        def first_line(path: str) -> str | None:
            try:
                with open(path, encoding="utf-8", errors="replace") as file:
                    return file.readline().strip() or None
            except OSError:
                return None

        return HostIdentity(root, socket.gethostname(), first_line("/etc/machine-id"),
                            first_line("/proc/sys/kernel/random/boot_id"))

    def path(self, path: str) -> Path:
        return self.root / safe_relative(path)

    def _os_path(self, path: str) -> str:
        """The checked path as a string: without Path objects, a read costs half as much."""
        return os.path.join(self._base, checked_relative(path))

    def _fail(self, action: str, path: str, exc: OSError) -> HostError:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        return HostError(f"cannot {action} {self.path(path)}: {reason}", exc.errno)

    def read_text(self, path: str) -> str:
        try:
            with open(self._os_path(path), encoding="utf-8", errors="replace") as file:
                return file.read()
        except OSError as exc:
            raise self._fail("read", path, exc) from exc

    def read_bytes(self, path: str) -> bytes:
        try:
            with open(self._os_path(path), "rb") as file:
                return file.read()
        except OSError as exc:
            raise self._fail("read", path, exc) from exc

    def write_text(self, path: str, text: str) -> None:
        """Write the whole value in one write(2), as /proc/sys requires; never create the file.
        UTF-8 with surrogate escapes: bytes that are not UTF-8, decoded with
        ``surrogateescape``, are written back as they were."""
        self._write(path, text.encode("utf-8", "surrogateescape"), 0, truncate=True)

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        """Write ``data`` at ``offset`` (config space is written in place); never create."""
        self._write(path, data, offset, truncate=False)

    def _write(self, path: str, data: bytes, offset: int, *, truncate: bool) -> None:
        target = self._os_path(path)
        flags = os.O_WRONLY | (os.O_TRUNC if truncate else 0)
        try:
            fd = os.open(target, flags)
        except OSError as exc:
            raise self._fail("write", path, exc) from exc
        try:
            written = os.pwrite(fd, data, offset) if offset else os.write(fd, data)
        except OSError as exc:
            raise self._fail("write", path, exc) from exc
        finally:
            os.close(fd)
        if written != len(data):
            raise HostError(f"short write to {target}: {written} of {len(data)} bytes")

    def replace_file(self, path: str, text: str) -> None:
        """Create or replace a whole file atomically: a temporary file beside it, fsync, rename.
        For files pytest-gpuhost owns (persistence), never for /proc or /sys."""
        target = self.path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, target)
        except OSError as exc:
            raise self._fail("write", path, exc) from exc

    def remove(self, path: str) -> None:
        try:
            self.path(path).unlink()
        except OSError as exc:
            raise self._fail("remove", path, exc) from exc

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._os_path(path)))
        except OSError as exc:
            raise self._fail("list", path, exc) from exc

    def exists(self, path: str) -> bool:
        """As ``Path.exists``: a missing file is False, any other error (EACCES) a HostError."""
        try:
            os.stat(self._os_path(path))
        except OSError as exc:
            if exc.errno in _MISSING:
                return False
            raise self._fail("look at", path, exc) from exc
        return True

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]:
        """The kernel log records: one read(2) per record from the real device until EAGAIN,
        or the lines of a plain file in a fake tree."""
        target = self.path(path)
        try:
            is_device = stat.S_ISCHR(target.stat().st_mode)
        except OSError as exc:
            raise self._fail("read", path, exc) from exc
        if not is_device:
            return self.read_text(path).splitlines()
        records: list[str] = []
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise self._fail("read", path, exc) from exc
        try:
            while True:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records were overwritten while we read
                        continue
                    raise self._fail("read", path, exc) from exc
                if not chunk:
                    break
                records.extend(chunk.decode("utf-8", errors="replace").splitlines())
        finally:
            os.close(fd)
        return records

    def which(self, name: str) -> Path | None:
        """A command under the root's sbin/bin directories (and PATH only when the root is /)."""
        if "/" in name or not name:
            raise UnsafePath(f"command {name!r} must be a bare name")
        for directory in COMMAND_DIRS:
            candidate = self.root / directory / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        if self.is_real:
            found = shutil.which(name)
            return Path(found) if found else None
        return None

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        executable = self.which(argv[0])
        if executable is None:
            searched = ", ".join(str(self.root / d) for d in COMMAND_DIRS)
            raise HostError(f"{argv[0]} not found in {searched}")
        environment = dict(os.environ, GPUHOST_ROOT=str(self.root), LC_ALL="C")
        environment.update(env or {})
        try:
            process = subprocess.Popen(
                [str(executable), *argv[1:]], stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                errors="replace", env=environment, start_new_session=True)
        except OSError as exc:
            raise HostError(f"cannot run {executable}: {exc.strerror}") from exc
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise CommandTimeout(f"{' '.join(argv)} did not finish in {timeout:g} s; its "
                                 "process group was killed, and whether it made its change "
                                 "is unknown", tuple(argv), timeout) from None
        except BaseException:
            _kill_group(process)
            raise
        return CommandResult(tuple(argv), process.returncode, stdout, stderr)


def _kill_group(process: subprocess.Popen[str]) -> None:
    """Kill the command and every child it started (its own session), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        process.communicate(timeout=5)
