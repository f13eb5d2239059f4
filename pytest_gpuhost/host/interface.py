"""The host interface: ``Host``, what every host must answer, and the small protocols of what
only some hosts have (``Closable``, ``Connection``, ``Releasable``, ``GpuControl``,
``GpuSampling``, ``PhaseCache``), with the records they answer in and the step a host call is
made for (``doing``). The package's ``__init__`` re-exports every name; ``LocalHost`` and
``CachedHost`` build on these, so they import this module, never the package."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

from .agent import COMMAND_TIMEOUT_S
from .clock import Clock
from .errors import HostError
from .requests import Glob, Kmsg, Link, ListDir, Match, Read, Reply, Request, Stat, Which

if TYPE_CHECKING:
    from .remote import Traffic

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


class CommandResult(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def shown(self) -> str:
        return " ".join(self.argv)


class HostIdentity(msgspec.Struct, frozen=True):
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


class Host(Protocol):
    """What checks, fixes and reports may ask of a machine: every host answers all of it
    (what only some hosts have is the small protocols below)."""

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
        """``argv[0]``: a bare name (as ``which`` finds it) or a path inside the root
        (``opt/nccl-tests/build/all_reduce_perf``). ``env``: variables merged over the inherited
        environment. Raises CommandTimeout (after killing the command's process group) when it
        runs too long."""


# -- the optional half: each a small protocol, had whole or not at all ---------------------------


@runtime_checkable
class Closable(Protocol):
    """A host that holds something open (a connection, a process): ended when the run is done
    with it, and between phases where another process takes the target over (xdist)."""

    def close(self) -> None:
        """End it; a later call may open it again. Never raises for what is already gone."""


@runtime_checkable
class Connection(Protocol):
    """A target reached over a connection (``remote.AgentHost``): every read costs a round
    trip, it has a time limit (--gpuhost-target-timeout), and it can be lost mid-run."""

    traffic: Traffic
    """What reaching it cost: round trips, connections, bytes, connect time (the JSON report's
    per-target fields)."""
    spent: float
    """Seconds waited on it so far, against its time limit; an xdist worker adds what its
    controller spent on the target before it."""

    @property
    def lost(self) -> HostError | None:
        """Why it cannot be used any more (every later call fails with it), None while it can."""


@runtime_checkable
class Releasable(Protocol):
    """A connection that can end without waiting for its process to exit (``close`` reaps it):
    a run that ends many lets each go, then closes them, and they end together."""

    def let_go(self, *, wait: bool = False) -> None:
        """End the session now; ``wait``: for its process too, as ``close`` does."""


@runtime_checkable
class GpuControl(Protocol):
    """A host whose own NVIDIA driver changes a GPU's settings (the agent's ``Gpus.set``,
    through the machine's libnvidia-ml.so.1 or nvidia-smi): the NVML fixes of a target that is
    not this machine (``gpu.agentnvml``)."""

    def set_gpu(self, address: str, setting: str, value: str) -> None:
        """``persistence_mode`` or ``ecc`` to ``enabled``/``disabled``, ``power_limit`` to a
        number of W; HostError (EPERM: not allowed) when the driver refuses."""


@runtime_checkable
class GpuSampling(Protocol):
    """A host whose own NVIDIA driver gives one sample of every GPU in one round trip, read
    fresh at each call and never cached (the agent's ``Gpus.sample``): what a benchmark's
    envelope compares between its samples (``gpu.agentnvml.gpu_sample``)."""

    def sample_gpus(self) -> Mapping[str, object]:
        """``{"source", "monotonic", "gpus": {address: {...}}}`` or ``{"unavailable": why}``;
        HostError where the target cannot be asked."""


@runtime_checkable
class PhaseCache(Protocol):
    """A host that serves a phase's reads from one batch (``CachedHost``): what a check or the
    engine may ask of it beyond ``Host``."""

    clock: Clock
    """The clock ``fetched_at`` reads."""

    def fetched_at(self, request: Request) -> float | None:
        """When the cached reply of ``request`` was read (``clock.now()``), None when none is."""

    def cached(self, request: Request) -> bool:
        """Whether ``request``'s reply is served from the cache (its read costs nothing)."""

    def forget(self, requests: Iterable[Request]) -> None:
        """Forget these replies only: their next read is live."""

    def assume(self, path: str, data: bytes | None) -> None:
        """Serve ``path`` as holding ``data`` (None: as missing) without writing it: what a dry
        run's change would have left, for the checks after it to see."""


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
