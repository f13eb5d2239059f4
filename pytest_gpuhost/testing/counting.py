"""A host that counts every call it passes on, by method: a batch is one call, as it is one
round trip to a remote host. Tests and benchmarks wrap a host in it to hold the number of host
calls of a phase constant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..host import (
    COMMAND_TIMEOUT_S,
    CommandResult,
    Host,
    HostIdentity,
    Match,
    Reply,
    Request,
)


class CountingHost:
    def __init__(self, host: Host) -> None:
        self.host = host
        self.calls: Counter[str] = Counter()
        self.ops: Counter[tuple[str, str]] = Counter()
        """(method, path) -> count: the same file read twice shows up here."""
        self.requests = 0
        """Requests carried by the batches (a batch of 300 reads is one call, 300 requests)."""

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def _count(self, method: str, path: str) -> None:
        self.calls[method] += 1
        self.ops[method, path] += 1

    def describe(self) -> str:
        return self.host.describe()

    def local_machine(self) -> bool:
        return self.host.local_machine()

    def privileged(self) -> bool:
        return self.host.privileged()

    def identity(self) -> HostIdentity:
        self._count("identity", "")
        return self.host.identity()

    def local_path(self, path: str) -> Path | None:
        return self.host.local_path(path)

    def invalidate(self) -> None:
        self.host.invalidate()

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        self._count("batch", f"{len(requests)} requests")
        self.requests += len(requests)
        return self.host.batch(requests)

    def read_text(self, path: str) -> str:
        self._count("read_text", path)
        return self.host.read_text(path)

    def read_bytes(self, path: str) -> bytes:
        self._count("read_bytes", path)
        return self.host.read_bytes(path)

    def exists(self, path: str) -> bool:
        self._count("exists", path)
        return self.host.exists(path)

    def listdir(self, path: str) -> list[str]:
        self._count("listdir", path)
        return self.host.listdir(path)

    def glob(self, pattern: str, *, read: bool = True) -> list[Match]:
        self._count("glob", pattern)
        return self.host.glob(pattern, read=read)

    def read_kmsg(self, path: str = "dev/kmsg") -> list[str]:
        self._count("read_kmsg", path)
        return self.host.read_kmsg(path)

    def readlink(self, path: str) -> str | None:
        self._count("readlink", path)
        return self.host.readlink(path)

    def write_text(self, path: str, text: str) -> None:
        self._count("write_text", path)
        self.host.write_text(path, text)

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        self._count("write_bytes", path)
        self.host.write_bytes(path, data, offset)

    def replace_file(self, path: str, text: str | bytes) -> None:
        self._count("replace_file", path)
        self.host.replace_file(path, text)

    def remove(self, path: str) -> None:
        self._count("remove", path)
        self.host.remove(path)

    def create_file(self, path: str, data: bytes) -> None:
        self._count("create_file", path)
        self.host.create_file(path, data)

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        self._count("append_file", path)
        self.host.append_file(path, data, sync=sync)

    def lock(self, path: str, timeout: float, holder: str) -> int:
        self._count("lock", path)
        return self.host.lock(path, timeout, holder)

    def unlock(self, handle: int) -> None:
        self._count("unlock", "")
        self.host.unlock(handle)

    def which(self, name: str) -> str | None:
        self._count("which", name)
        return self.host.which(name)

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        self._count("run", " ".join(argv))
        return self.host.run(argv, env, timeout=timeout)
