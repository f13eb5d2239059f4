"""A phase's reads in one batch: ``CachedHost`` serves reads from what was prefetched.

The session prefetches what a phase will read (collection: every kind's facts; running: every
selected check's observation) in one ``batch`` call, so a remote host costs one round trip per
phase whatever the number of checks. Any change made through it (a write, a replaced file, a
command) forgets everything, and so does ``invalidate()`` (a fix re-observes under its lock):
a read after a change is always live.
"""

from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .agent import COMMAND_TIMEOUT_S
from .clock import SYSTEM_CLOCK, Clock
from .errors import HostError
from .interface import (
    BatchReads,
    CommandResult,
    GpuControl,
    GpuSampling,
    Host,
    HostIdentity,
)
from .requests import Kmsg, ListDir, Read, Reply, Request, Stat


class CachedHost(BatchReads):
    """A ``PhaseCache`` over ``host``; ``clock`` stamps when each reply was read."""

    def __init__(self, host: Host, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.clock = clock
        self._replies: dict[Request, Reply] = {}
        self._fetched: dict[Request, float] = {}
        self.generation = 0
        """Counts the times everything cached was forgotten (a change, ``invalidate()``)."""

    def describe(self) -> str:
        return self.host.describe()

    def local_machine(self) -> bool:
        return self.host.local_machine()

    def privileged(self) -> bool:
        return self.host.privileged()

    def identity(self) -> HostIdentity:
        return self.host.identity()

    def local_path(self, path: str) -> Path | None:
        return self.host.local_path(path)

    def invalidate(self) -> None:
        self._replies.clear()
        self.generation += 1
        self.host.invalidate()

    def clear(self) -> None:
        """Forget every reply and when it was read (the run is over); reads nothing."""
        self._replies.clear()
        self._fetched.clear()
        self.generation += 1

    def prefetch(self, requests: Iterable[Request]) -> int:
        """Read every request not yet cached in one batch; returns how many were read."""
        wanted = list(dict.fromkeys(r for r in requests if r not in self._replies))
        if wanted:
            self._replies.update(zip(wanted, self.host.batch(wanted), strict=True))
            self._fetched.update(dict.fromkeys(wanted, self.clock.now()))
        return len(wanted)

    def replies(self) -> dict[Request, Reply]:
        """Everything cached: what another process may ``seed`` its cache with."""
        return dict(self._replies)

    def seed(self, replies: Mapping[Request, Reply]) -> None:
        """Serve these replies as if read now (another process read them moments ago)."""
        self._replies.update(replies)
        self._fetched.update(dict.fromkeys(replies, self.clock.now()))

    def forget(self, requests: Iterable[Request]) -> None:
        """Forget these replies only: their next read is live, the rest stays cached."""
        for request in requests:
            self._replies.pop(request, None)

    def assume(self, path: str, data: bytes | None) -> None:
        """Serve ``path`` as holding ``data`` (None: as missing) from now on, without writing
        it: what a dry run's change would have left, for the checks after it to see."""
        for request in (Stat(path), ListDir(path)):
            self._replies.pop(request, None)
        self._replies[Read(path)] = Reply(data) if data is not None else Reply(
            error=HostError(f"{path} does not exist (it would be removed)", errno.ENOENT))
        self._fetched[Read(path)] = self.clock.now()

    def fetched_at(self, request: Request) -> float | None:
        """When a cached reply was read (``clock.now()``), None when it is not cached."""
        return self._fetched.get(request) if request in self._replies else None

    def cached(self, request: Request) -> bool:
        return request in self._replies

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        try:  # a check's read of what its phase's batch fetched: no new batch to make
            return [self._replies[request] for request in requests]
        except KeyError:
            self.prefetch(requests)
            return [self._replies[request] for request in requests]

    def exists(self, path: str) -> bool:
        """Answered from any cached request of the path too: what was read, listed or looked
        at exists, and what was missing does not."""
        for request in (Stat(path), Read(path), Kmsg(path), ListDir(path)):
            reply = self._replies.get(request)
            if reply is not None and (reply.error is None or reply.missing):
                return reply.error is None
        return super().exists(path)

    # -- changes forget everything ------------------------------------------------------------

    def write_text(self, path: str, text: str) -> None:
        self.invalidate()
        self.host.write_text(path, text)

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        self.invalidate()
        self.host.write_bytes(path, data, offset)

    def replace_file(self, path: str, text: str | bytes) -> None:
        self.invalidate()
        self.host.replace_file(path, text)

    def remove(self, path: str) -> None:
        self.invalidate()
        self.host.remove(path)

    def create_file(self, path: str, data: bytes) -> None:
        self.host.create_file(path, data)

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        self.host.append_file(path, data, sync=sync)

    def lock(self, path: str, timeout: float, holder: str) -> int:
        return self.host.lock(path, timeout, holder)

    def unlock(self, handle: int) -> None:
        self.host.unlock(handle)

    def run(self, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = COMMAND_TIMEOUT_S) -> CommandResult:
        self.invalidate()
        return self.host.run(argv, env, timeout=timeout)

    def sample_gpus(self) -> Mapping[str, object]:
        """``GpuSampling`` of the host it caches, never from the cache (nor forgetting it: a
        sample changes nothing); a host that has none refuses (HostError)."""
        if not isinstance(self.host, GpuSampling):
            raise HostError(f"{self.host.describe()} has no NVIDIA driver of its own to sample")
        return self.host.sample_gpus()

    def set_gpu(self, address: str, setting: str, value: str) -> None:
        """``GpuControl`` of the host it caches; a host that has none refuses (HostError)."""
        self.invalidate()
        if not isinstance(self.host, GpuControl):
            raise HostError(f"{self.host.describe()} has no NVIDIA driver of its own to set "
                            f"{setting} through")
        self.host.set_gpu(address, setting, value)
