"""The host layer: the only code that touches a machine.

A ``Host`` is a machine seen through a root (``/`` or a fake tree): it reads, writes, lists,
resolves links, finds and runs commands, and reads many paths in one call (``batch``), which is
what makes a remote host cost a constant number of round trips. Every path is relative to the
root and resolved inside it as ``openat2(RESOLVE_IN_ROOT)`` would (see ``agent``): an absolute
link target is relative to the root and ``..`` stops at it, so no read, write, listing or command
ever reaches outside. A write never creates a file; ``replace_file`` (for pytest-gpuhost's own
files) never replaces anything but a file.

Implementations: ``LocalHost`` (this machine, in-process) here, others by URL scheme through the
``pytest_gpuhost_make_host`` hook. ``CachedHost`` wraps any of them to serve a phase's reads from
one batch.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeGuard

from .agent import COMMAND_DIRS as COMMAND_DIRS
from .agent import COMMAND_TIMEOUT_S as COMMAND_TIMEOUT_S
from .agent import DEFAULT_LIMIT, KMSG_LIMIT

MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
"""Errors that mean "there is nothing there" to ``exists``."""


class HostError(Exception):
    """A read, write or command that failed; the message says what and where, ``errno`` why."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def raised(error: HostError) -> HostError:
    """A copy of a kept error, to raise: the kept one (a cached reply's) never takes a
    traceback, which would keep the raising frames alive and grow at every raise. Made
    without calling ``__init__`` (subclasses take other arguments), with the same state."""
    again = type(error).__new__(type(error), *error.args)
    again.__dict__.update(error.__dict__)
    return again


class UnsafePath(HostError):
    """A path that would leave the host root."""


class TargetLost(HostError):
    """What every read of a target that could not be reached fails with: the connection's own
    error (its words and errno), told apart from an error of the host itself."""


class CommandTimeout(HostError):
    """A command that did not finish in time. Its whole process group was killed, but what it
    did before that is unknown: a fix that timed out may or may not have been made."""

    def __init__(self, message: str, argv: tuple[str, ...], timeout: float) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.argv = argv
        self.timeout = timeout


class TargetTimeout(TargetLost):
    """A remote target that used up its time (--gpuhost-target-timeout) waiting on one step:
    its connection is ended, and everything asked of it later fails with this error."""

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.step = step


_STEP: ContextVar[str] = ContextVar("gpuhost_step", default="")


@contextmanager
def doing(step: str) -> Iterator[None]:
    """Say what the run is doing with its host (``collecting facts``, ``applying a fix of
    sysctl[vm.swappiness]``): a host that hangs names it. The host never needs to know what
    a check is; it only repeats these words."""
    token = _STEP.set(step)
    try:
        yield
    finally:
        _STEP.reset(token)


def current_step() -> str:
    """The innermost ``doing`` of this thread, or ``""``."""
    return _STEP.get()


def checked_relative(path: str) -> str:
    """``path``, normalized (``proc//sys/./vm/`` -> ``proc/sys/vm``), once it is known to name
    something under the root: refuses ``..``, absolute paths, NUL and empty paths (``..`` in a
    link target is resolved inside the root)."""
    if not isinstance(path, str):
        raise UnsafePath(f"path {path!r} is not a string")
    if "\0" in path:
        raise UnsafePath(f"path {path!r} contains NUL")
    if path.startswith("/"):
        raise UnsafePath(f"path {path!r} is absolute; host paths are relative to the root")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts or not parts:
        raise UnsafePath(f"path {path!r} would leave the host root")
    return "/".join(parts)


def checked_command(name: str) -> str:
    """A command's bare name: a path (``../../bin/sh``) could run something outside the root."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name:
        raise UnsafePath(f"command {name!r} must be a bare name, found under the root's "
                         f"{', '.join(COMMAND_DIRS)}")
    return name


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def shown(self) -> str:
        return " ".join(self.argv)


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

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> HostIdentity:
        def text(key: str) -> str | None:
            value = data.get(key)
            return str(value) if value is not None else None

        return cls(str(data.get("root", "")), text("hostname"), text("machine_id"),
                   text("boot_id"))


@dataclass(frozen=True)
class FileInfo:
    type: str
    """``file``, ``directory``, ``character device``, ``FIFO``, ..."""
    size: int
    mode: int
    rdev: tuple[int, int] = (0, 0)


# -- batch requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Read:
    """A regular file's bytes (bounded by ``limit``)."""

    path: str
    limit: int = DEFAULT_LIMIT

    def wire(self) -> dict[str, object]:
        return {"op": "read", "path": checked_relative(self.path), "limit": self.limit}


@dataclass(frozen=True)
class Stat:
    """What is at a path (links followed inside the root), or a missing-file error."""

    path: str

    def wire(self) -> dict[str, object]:
        return {"op": "stat", "path": checked_relative(self.path)}


@dataclass(frozen=True)
class ListDir:
    path: str

    def wire(self) -> dict[str, object]:
        return {"op": "list", "path": checked_relative(self.path)}


@dataclass(frozen=True)
class Glob:
    """Every path matching ``pattern`` (fnmatch wildcards within a component), with its bytes
    when ``read``: one request for ``sys/bus/pci/devices/*/vendor``, whatever the count."""

    pattern: str
    read: bool = True
    links: bool = False
    """Each match's symbolic link target as stored (None where it is no link), not its bytes."""

    def wire(self) -> dict[str, object]:
        return {"op": "glob", "pattern": checked_relative(self.pattern), "read": self.read,
                "links": self.links}


@dataclass(frozen=True)
class Kmsg:
    """The kernel log's records (the device, or a plain file in a fake tree)."""

    path: str = "dev/kmsg"
    limit: int = KMSG_LIMIT

    def wire(self) -> dict[str, object]:
        return {"op": "kmsg", "path": checked_relative(self.path), "limit": self.limit}


@dataclass(frozen=True)
class Link:
    """The target of a symbolic link as stored (``../../../devices/pci0000:00/...``), or None
    when the path is not a link; never followed (resolve it with ``linux.pcitopo``)."""

    path: str

    def wire(self) -> dict[str, object]:
        return {"op": "readlink", "path": checked_relative(self.path)}


@dataclass(frozen=True)
class Which:
    """Where a command is under the root's sbin/bin directories (and PATH at ``/``), or None."""

    name: str

    def wire(self) -> dict[str, object]:
        return {"op": "which", "name": checked_command(self.name)}


Request = Read | Stat | ListDir | Glob | Kmsg | Link | Which
Match = tuple[str, "bytes | str | HostError | None"]
"""A glob's match: its path and its bytes, its link target (``links``), an error or None."""


def unreadable(item: object) -> TypeGuard[HostError]:
    """Whether a glob's match could not be read for a reason other than being gone (removed
    between the glob and its read): a value its reader must not take for absent."""
    return isinstance(item, HostError) and item.errno not in MISSING_ERRNOS


@dataclass(frozen=True)
class Reply:
    """One request's answer: its value, or the error the host gave."""

    value: object = None
    error: HostError | None = None

    def get(self) -> object:
        if self.error is not None:
            raise raised(self.error)
        return self.value

    def data(self) -> bytes:
        value = self.get()
        assert isinstance(value, bytes)
        return value

    def text(self) -> str:
        return self.data().decode("utf-8", errors="replace")

    def names(self) -> list[str]:
        value = self.get()
        assert isinstance(value, list)
        return [str(name) for name in value]

    def lines(self) -> list[str]:
        return self.names()

    def info(self) -> FileInfo:
        value = self.get()
        assert isinstance(value, FileInfo)
        return value

    def matches(self) -> list[Match]:
        value = self.get()
        assert isinstance(value, list)
        return value

    @property
    def missing(self) -> bool:
        return self.error is not None and self.error.errno in MISSING_ERRNOS


def reply_from_wire(request: Request, answer: Mapping[str, object]) -> Reply:
    """A reply from the agent's ``{"value": ...}`` / ``{"error": ..., "errno": ...}``."""
    if "error" in answer:
        code = answer.get("errno")
        return Reply(error=HostError(str(answer["error"]),
                                     int(code) if isinstance(code, int) else None))
    value = answer.get("value")
    if isinstance(request, Stat) and isinstance(value, Mapping):
        rdev = value.get("rdev") or (0, 0)
        assert isinstance(rdev, (list, tuple))
        value = FileInfo(str(value["type"]), int(str(value["size"])), int(str(value["mode"])),
                         (int(rdev[0]), int(rdev[1])))
    elif isinstance(request, Glob) and isinstance(value, list):
        value = [(str(path), _glob_item(item)) for path, item in value]
    return Reply(value)


def reply_to_wire(reply: Reply) -> dict[str, object]:
    """The inverse of ``reply_from_wire``: the agent's own form of an answer (bytes stay bytes:
    ``agent.encode`` makes JSON of it)."""
    if reply.error is not None:
        return {"error": str(reply.error), "errno": reply.error.errno}
    value = reply.value
    if isinstance(value, FileInfo):
        return {"value": {"type": value.type, "size": value.size, "mode": value.mode,
                          "rdev": list(value.rdev)}}
    if isinstance(value, list) and value and isinstance(value[0], tuple):  # a glob's matches
        return {"value": [[path, {"error": str(item), "errno": item.errno}
                           if isinstance(item, HostError) else item] for path, item in value]}
    return {"value": value}


_REQUESTS: dict[str, type[Request]] = {"read": Read, "stat": Stat, "list": ListDir, "glob": Glob,
                                       "kmsg": Kmsg, "readlink": Link, "which": Which}


def request_from_wire(wire: Mapping[str, object]) -> Request:
    """The inverse of ``Request.wire()``."""
    fields = {key: value for key, value in wire.items() if key != "op"}
    return _REQUESTS[str(wire["op"])](**fields)  # type: ignore[arg-type]


def _glob_item(item: object) -> bytes | str | HostError | None:
    if isinstance(item, Mapping) and "error" in item:
        code = item.get("errno")
        return HostError(str(item["error"]), int(code) if isinstance(code, int) else None)
    assert item is None or isinstance(item, (bytes, str))
    return item


class Host(Protocol):
    """What checks, fixes and reports may ask of a machine."""

    def describe(self) -> str:
        """The host for messages: the root's path, or the target (``ssh://root@pve/``)."""

    def local_machine(self) -> bool:
        """Whether this is the machine pytest runs on, at ``/``: only then do this process's
        NVML and CUDA describe it."""

    def privileged(self) -> bool:
        """Whether writes to /proc/sys, /sys and config space may be allowed (root)."""

    def identity(self) -> HostIdentity:
        """The root and, for a real machine, its hostname, machine-id and boot id."""

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        """Many reads in one call (one round trip to a remote host): a reply per request."""

    def invalidate(self) -> None:
        """Forget anything read earlier: the next read is live (a no-op without a cache)."""

    def local_path(self, path: str) -> Path | None:
        """Where ``path`` is on the machine pytest runs on, for a host that is a directory of
        it (not resolved: for showing and collecting its own files); None for another."""

    def read_text(self, path: str) -> str: ...

    def read_bytes(self, path: str) -> bytes: ...

    def exists(self, path: str) -> bool:
        """As ``Path.exists``: a missing file is False, any other error a HostError."""

    def listdir(self, path: str) -> list[str]: ...

    def glob(self, pattern: str, *, read: bool = True) -> list[Match]: ...

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]: ...

    def readlink(self, path: str) -> str | None:
        """The target of the symbolic link at ``path`` as stored, or None when ``path`` is not
        a link. Resolving it inside the root is the caller's (``linux.pcitopo``)."""

    def write_text(self, path: str, text: str) -> None:
        """The whole value in one write(2), as /proc/sys requires; never creates the file.
        Encoded as UTF-8 with ``surrogateescape``, so bytes that are not UTF-8, decoded that
        way, are written back exactly."""

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        """``data`` at ``offset`` (config space is written in place); never creates."""

    def replace_file(self, path: str, text: str | bytes) -> None:
        """Create or replace a whole file atomically (persistence files only)."""

    def remove(self, path: str) -> None: ...

    def create_file(self, path: str, data: bytes) -> None:
        """pytest-gpuhost's own new file (a journal), whole or not at all; HostError with
        errno EEXIST when it exists already."""

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        """Lines at the end of one of pytest-gpuhost's own files, in one write(2), then fsync'd
        unless ``sync`` is false (the next synced append makes them durable too); never
        creates it, never through a link or into a file with another name (a hard link)."""

    def lock(self, path: str, timeout: float, holder: str) -> int:
        """Take the flock on a lock file under the root, waiting up to ``timeout`` s; held by
        the host's side of the connection until ``unlock`` or its end (a crash drops it).
        HostError with errno EWOULDBLOCK naming the holder when it stays held."""

    def unlock(self, handle: int) -> None: ...

    def which(self, name: str) -> str | None:
        """A command under the root's sbin/bin directories (and PATH only at ``/``)."""

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        """``env``: variables merged over the inherited environment. Raises CommandTimeout
        (after killing the command's process group) when it runs too long."""


class BatchReads:
    """The single reads of ``Host`` in terms of ``batch``: for hosts whose every call is a
    batch (a remote one, a cache)."""

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        raise NotImplementedError

    def _one(self, request: Request) -> Reply:
        return self.batch([request])[0]

    def read_bytes(self, path: str) -> bytes:
        return self._one(Read(path)).data()

    def read_text(self, path: str) -> str:
        return self._one(Read(path)).text()

    def exists(self, path: str) -> bool:
        reply = self._one(Stat(path))
        if reply.missing:
            return False
        reply.get()
        return True

    def listdir(self, path: str) -> list[str]:
        return self._one(ListDir(path)).names()

    def glob(self, pattern: str, *, read: bool = True) -> list[Match]:
        return self._one(Glob(pattern, read)).matches()

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]:
        return self._one(Kmsg(path)).lines()

    def readlink(self, path: str) -> str | None:
        value = self._one(Link(path)).get()
        return str(value) if value is not None else None

    def which(self, name: str) -> str | None:
        value = self._one(Which(name)).get()
        return str(value) if value is not None else None


from .cache import CachedHost  # noqa: E402  (it builds on the names above)
from .local import LocalHost  # noqa: E402

__all__ = [
    "COMMAND_DIRS",
    "COMMAND_TIMEOUT_S",
    "BatchReads",
    "CachedHost",
    "CommandResult",
    "CommandTimeout",
    "FileInfo",
    "Glob",
    "Host",
    "HostError",
    "HostIdentity",
    "Kmsg",
    "Link",
    "ListDir",
    "LocalHost",
    "Match",
    "Read",
    "Reply",
    "Request",
    "Stat",
    "TargetTimeout",
    "UnsafePath",
    "Which",
    "checked_command",
    "checked_relative",
    "current_step",
    "doing",
]
