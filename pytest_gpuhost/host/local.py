"""This machine, seen through a root: ``/`` for the real host, a directory for a fake one.

Every operation is the agent's (``agent.Root``), called in-process: the same containment and
limits a remote target gets, without serializing anything.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from .agent import COMMAND_TIMEOUT_S, DEFAULT_LIMIT, OpError, Root, gpus_of
from .errors import CommandTimeout, HostError
from .interface import CommandResult, HostIdentity
from .requests import (
    FileInfo,
    Glob,
    GpuQuery,
    Kmsg,
    Link,
    ListDir,
    Match,
    Read,
    Reply,
    Request,
    Stat,
    Which,
    checked_command,
    checked_program,
    checked_relative,
)


def _error(exc: OpError) -> HostError:
    return HostError(str(exc), exc.errno)


class LocalHost:
    """This machine at ``root``. ``prefer_openat2=False`` resolves paths with the portable walk
    (what a kernel without openat2 gets), for tests of both."""

    def __init__(self, root: Path, *, prefer_openat2: bool = True) -> None:
        self.root = root
        self._root = Root(os.fspath(root), prefer_openat2=prefer_openat2)
        self.is_real = self._root.real

    def __del__(self) -> None:
        root = getattr(self, "_root", None)
        if root is not None:
            root.close()

    def describe(self) -> str:
        return str(self.root)

    def local_machine(self) -> bool:
        return self.is_real

    def privileged(self) -> bool:
        return os.geteuid() == 0

    def identity(self) -> HostIdentity:
        return HostIdentity.from_dict(self._root.identity())

    def invalidate(self) -> None:
        """Nothing is cached: every read is live."""

    def local_path(self, path: str) -> Path | None:
        return self.root / checked_relative(path)

    def path(self, path: str) -> Path:
        """Where ``path`` is shown in messages (not resolved: links are the agent's business)."""
        return self.root / checked_relative(path)

    # -- reads ------------------------------------------------------------------------------

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        replies = []
        for request in requests:
            try:
                replies.append(Reply(self._answer(request)))
            except OpError as exc:
                replies.append(Reply(error=_error(exc)))
        return replies

    def _answer(self, request: Request) -> object:
        if isinstance(request, Read):
            return self._root.read(checked_relative(request.path), request.limit)
        if isinstance(request, Stat):
            info = self._root.stat(checked_relative(request.path))
            rdev = info["rdev"]
            assert isinstance(rdev, list)
            return FileInfo(str(info["type"]), int(str(info["size"])), int(str(info["mode"])),
                            (int(rdev[0]), int(rdev[1])))
        if isinstance(request, ListDir):
            return self._root.listdir(checked_relative(request.path))
        if isinstance(request, Glob):
            return self._glob(request.pattern, request.read, request.links)
        if isinstance(request, Kmsg):
            return self._root.kmsg(checked_relative(request.path), request.limit)
        if isinstance(request, Link):
            return self._root.readlink(checked_relative(request.path))
        if isinstance(request, Which):
            return self._root.which(checked_command(request.name))
        if isinstance(request, GpuQuery):
            return gpus_of(self._root).facts()
        raise TypeError(f"not a host request: {request!r}")

    def _glob(self, pattern: str, read: bool, links: bool = False) -> list[Match]:
        found = self._root.glob(checked_relative(pattern), read=read, limit=DEFAULT_LIMIT,
                                links=links)
        matches: list[Match] = []
        for path, item in found:
            if isinstance(item, OpError):
                matches.append((str(path), _error(item)))
            else:
                assert item is None or isinstance(item, (bytes, str))
                matches.append((str(path), item))
        return matches

    def read_bytes(self, path: str) -> bytes:
        try:
            return self._root.read(checked_relative(path))
        except OpError as exc:
            raise _error(exc) from None

    def read_text(self, path: str) -> str:
        return self.read_bytes(path).decode("utf-8", errors="replace")

    def exists(self, path: str) -> bool:
        try:
            self._root.stat(checked_relative(path))
        except OpError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                return False
            raise _error(exc) from None
        return True

    def listdir(self, path: str) -> list[str]:
        try:
            return self._root.listdir(checked_relative(path))
        except OpError as exc:
            raise _error(exc) from None

    def glob(self, pattern: str, *, read: bool = True) -> list[Match]:
        try:
            return self._glob(pattern, read)
        except OpError as exc:
            raise _error(exc) from None

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]:
        try:
            return self._root.kmsg(checked_relative(path))
        except OpError as exc:
            raise _error(exc) from None

    def readlink(self, path: str) -> str | None:
        try:
            return self._root.readlink(checked_relative(path))
        except OpError as exc:
            raise _error(exc) from None

    # -- writes and commands ----------------------------------------------------------------

    def write_text(self, path: str, text: str) -> None:
        """UTF-8 with surrogate escapes: bytes that are not UTF-8, decoded with
        ``surrogateescape``, are written back as they were."""
        self._write(path, text.encode("utf-8", "surrogateescape"), 0, truncate=True)

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        self._write(path, data, offset, truncate=False)

    def _write(self, path: str, data: bytes, offset: int, *, truncate: bool) -> None:
        try:
            self._root.write(checked_relative(path), data, offset, truncate=truncate)
        except OpError as exc:
            raise _error(exc) from None

    def replace_file(self, path: str, text: str | bytes) -> None:
        data = text.encode() if isinstance(text, str) else text
        try:
            self._root.replace(checked_relative(path), data)
        except OpError as exc:
            raise _error(exc) from None

    def remove(self, path: str) -> None:
        try:
            self._root.remove(checked_relative(path))
        except OpError as exc:
            raise _error(exc) from None

    def create_file(self, path: str, data: bytes) -> None:
        try:
            self._root.create(checked_relative(path), data)
        except OpError as exc:
            raise _error(exc) from None

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        try:
            self._root.append(checked_relative(path), data, sync=sync)
        except OpError as exc:
            raise _error(exc) from None

    def lock(self, path: str, timeout: float, holder: str) -> int:
        try:
            return self._root.lock(checked_relative(path), timeout, holder)
        except OpError as exc:
            raise _error(exc) from None

    def unlock(self, handle: int) -> None:
        self._root.unlock(handle)

    def which(self, name: str) -> str | None:
        try:
            return self._root.which(checked_command(name))
        except OpError as exc:
            raise _error(exc) from None

    def set_gpu(self, address: str, setting: str, value: str) -> None:
        """``GpuControl``: through the root's own NVIDIA driver (the agent's ``Gpus.set``)."""
        try:
            gpus_of(self._root).set(address, setting, value)
        except OpError as exc:
            raise _error(exc) from None

    def sample_gpus(self) -> Mapping[str, object]:
        """``GpuSampling``: the root's own NVIDIA driver, asked now (the agent's
        ``Gpus.sample``)."""
        try:
            return gpus_of(self._root).sample()
        except OpError as exc:
            raise _error(exc) from None

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        checked_program(argv[0] if argv else "")
        try:
            done = self._root.run(list(argv), dict(env or {}), timeout)
        except OpError as exc:
            if exc.errno == errno.ETIMEDOUT:
                raise CommandTimeout(str(exc), tuple(argv), timeout) from None
            raise _error(exc) from None
        return CommandResult(tuple(argv), int(str(done["returncode"])), str(done["stdout"]),
                             str(done["stderr"]))
