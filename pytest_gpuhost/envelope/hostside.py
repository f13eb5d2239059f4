"""The host's half of a benchmark's envelope, read without NVML through a ``Host``: the kernel
log's new records (Xid, NVRM, AER) since the window opened, the AER counters of each GPU and of
each bridge on its path, the host checks' values at both ends, and which processes are the
benchmark's (its process tree, mapped across a container's pid namespace).

At each end the kernel log and the AER counters are read in one batch (one round trip on a
remote target), with the host checks' reads of that end where the session joins them. Each
read that fails is a line of the envelope's errors, never an exception: the window is taken
whatever part of the host can be read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..checks.gpus import PCI_DEVICES, Gpu, find_gpus
from ..checks.pcie_path import AER_FILES, gpu_paths, parse_aer
from ..host import CachedHost, Host, HostError, Kmsg, Read, Request
from ..linux.kmsg import iter_records
from .facts import HostSide, HostWindow

KMSG = "dev/kmsg"
LOGGED = ("NVRM:", "Xid", "AER:")
"""A new kernel log record that holds one of these is the envelope's."""
MAX_LOGGED = 200
"""Kernel log records kept; a storm of them is cut there, and says how many more."""
MAX_DEPTH = 64
"""Generations of a process tree followed (a fork bomb is not followed forever)."""

StateReader = Callable[[], Mapping[str, "str | None"]]
"""The host checks' values now, by id (the session observes them live)."""
EndBatch = Callable[[Sequence[Request], bool], CachedHost]
"""Reads the host half's requests of one end (True: the window's end, False: its start) in one
batch with the host checks' reads of that end, and serves them: one round trip an end."""


def devices_of(found: Sequence[Gpu], gpus: Sequence[str] | None) -> list[str]:
    """Of the GPUs ``found``, those named (else all) and every bridge on their paths, once."""
    chosen = [g for g in found if gpus is None or g.address in gpus]
    paths = gpu_paths(chosen)
    return list(dict.fromkeys([*(g.address for g in chosen),
                               *(b for g in chosen for b in paths[g.address])]))


def devices(host: Host, gpus: Sequence[str] | None) -> list[str]:
    """The GPUs of ``host`` (those named, else all) and every bridge on their paths."""
    return devices_of(find_gpus(host), gpus)


def aer_reads(addresses: Iterable[str]) -> list[Read]:
    """The reads of the AER counters of each device."""
    return [Read(f"{PCI_DEVICES}/{address}/{name}") for address in addresses
            for name in AER_FILES]


def read_aer(host: Host, addresses: Iterable[str]) -> dict[str, dict[str, int]]:
    """Device -> aer_dev_* -> total, for those that have the files (one batch of reads)."""
    wanted = [(address, name) for address in addresses for name in AER_FILES]
    replies = host.batch(aer_reads(addresses))
    totals: dict[str, dict[str, int]] = {}
    for (address, name), reply in zip(wanted, replies, strict=True):
        if reply.error is None and isinstance(reply.value, bytes):
            try:
                totals.setdefault(address, {})[name] = parse_aer(reply.value.decode())
            except ValueError:
                continue
    return totals


def last_seq(host: Host) -> int:
    """The newest kernel log record's sequence number (-1: none)."""
    newest = -1
    for record in iter_records(host.read_kmsg(KMSG)):
        if record is not None:
            newest = max(newest, record.seq)
    return newest


def new_records(host: Host, after: int) -> list[str]:
    """The texts of the records after ``after`` that are the envelope's (``LOGGED``)."""
    found: list[str] = []
    more = 0
    for record in iter_records(host.read_kmsg(KMSG)):
        if record is None or record.seq <= after or not any(w in record.text for w in LOGGED):
            continue
        if len(found) < MAX_LOGGED:
            found.append(record.text)
        else:
            more += 1
    if more:
        found.append(f"... and {more} more records")
    return found


def process_tree(host: Host, roots: Iterable[int]) -> frozenset[int]:
    """``roots`` and every descendant, from ``proc/PID/task/TID/children`` (the kernel's
    CONFIG_PROC_CHILDREN, which every distribution's kernel has)."""
    seen = set(roots)
    generation = set(seen)
    for _ in range(MAX_DEPTH):
        children: set[int] = set()
        for pid in generation:
            try:
                matches = host.glob(f"proc/{pid}/task/*/children")
            except HostError:
                continue
            for _, data in matches:
                if isinstance(data, bytes):
                    children.update(int(word) for word in data.split() if word.isdigit())
        generation = children - seen
        if not generation:
            break
        seen |= generation
    return frozenset(seen)


def namespace_pids(host: Host, pid: int) -> tuple[int, ...] | None:
    """A process's pid in each pid namespace it is in, the host's first (``NSpid`` of
    ``proc/PID/status``); () where the kernel does not say (``NSpid`` came with Linux 4.1);
    None where the status cannot be read."""
    try:
        status = host.read_text(f"proc/{pid}/status")
    except HostError:
        return None
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            words = line.split()[1:]
            return tuple(int(w) for w in words) if all(w.isdigit() for w in words) else None
    return ()


def cgroups_of(host: Host, pid: int) -> dict[str, str] | None:
    """A process's cgroup in each hierarchy (``ID:CONTROLLERS`` -> path, ``proc/PID/cgroup``);
    None where it cannot be read."""
    try:
        text = host.read_text(f"proc/{pid}/cgroup")
    except HostError:
        return None
    found = {}
    for line in text.splitlines():
        parts = line.split(":", 2)  # a path may hold a colon; the first two fields do not
        if len(parts) == 3:
            found[f"{parts[0]}:{parts[1]}"] = parts[2]
    return found or None


def in_cgroups(inner: Mapping[str, str], outer: Mapping[str, str]) -> bool:
    """Whether a process of cgroups ``inner`` is in ``outer``'s, or below, in every hierarchy
    of ``outer``; never where one of them is a root (``/``, which every process of the
    machine is below: a cgroup namespace's root shows so too)."""
    if not outer:
        return False
    for hierarchy, path in outer.items():
        base = path.rstrip("/")
        held = inner.get(hierarchy)
        if not base or held is None or not (held == path or held.startswith(base + "/")):
            return False
    return True


def container_pids(host: Host, runs_on: Host, pids: Iterable[int], tree: frozenset[int]
                   ) -> frozenset[int]:
    """Of ``pids`` (on the GPUs, as ``host`` numbers them), those of the benchmark's ``tree``
    as ``runs_on``, a container of ``host``, numbers it: by each one's pid in the container's
    namespace (the last of ``NSpid``); where the kernel does not give ``NSpid`` (before
    Linux 4.1), by the container's cgroup: in the cgroup of one of the tree's processes, as
    the container reads it, or below it (those kernels have no cgroup namespace, so the
    container reads the host's paths; a tree in a root cgroup matches nothing)."""
    found = set()
    theirs: list[dict[str, str]] | None = None
    for pid in pids:
        inside = namespace_pids(host, pid)
        if inside:
            if inside[-1] in tree:
                found.add(pid)
            continue
        if inside is None:
            continue
        if theirs is None:  # read once a call, and only on such a kernel
            theirs = [c for c in (cgroups_of(runs_on, p) for p in sorted(tree)) if c]
        held = cgroups_of(host, pid)
        if held is not None and any(in_cgroups(held, outer) for outer in theirs):
            found.add(pid)
    return frozenset(found)


def process_names(host: Host, pids: Iterable[int]) -> dict[int, str]:
    """Each process's name (``proc/PID/comm``) where it can still be read."""
    found = {}
    for pid in pids:
        try:
            found[pid] = host.read_text(f"proc/{pid}/comm").strip()
        except HostError:
            continue
    return found


class HostHalf:
    """``open()`` at the window's start, ``close()`` at its end: the host's half between."""

    def __init__(self, host: Host, *, gpus: Sequence[str] | None = None,
                 state: StateReader | None = None,
                 known: Callable[[], Sequence[Gpu]] | None = None,
                 state_before: StateReader | None = None,
                 end_batch: EndBatch | None = None) -> None:
        self.host = host
        self.gpus = gpus
        self.known = known
        """The host's GPUs as the run already read them (its collection's facts); None:
        read here."""
        self.state = state
        self.state_before = state_before
        """The host checks' reader at the start, where it is not ``state``'s (the values the
        run's checks already read, read again only where they did not); None: ``state``."""
        self.end_batch = end_batch
        """Where the host checks' reads join each end's batch; None: the half's alone."""
        self.errors: list[str] = []
        self._devices: list[str] = []
        self._seq: int | None = None
        self._before = HostSide()

    def _try(self, what: str, read: Callable[[], object]) -> object:
        try:
            return read()
        except (HostError, OSError, ValueError) as exc:
            self.errors.append(f"{what}: {exc}")
            return None

    def _end(self, kernel_log: bool, closing: bool) -> Host:
        """The host's own reads of one end, the kernel log's and the AER counters', in one
        batch (one round trip on a remote target), the host checks' with them where
        ``end_batch`` joins them; each read that failed says so when read."""
        wanted: list[Request] = [*([Kmsg(KMSG)] if kernel_log else []),
                                 *aer_reads(self._devices)]
        if self.end_batch is not None:
            batch = self.end_batch
            joined = self._try("the host checks' reads", lambda: batch(wanted, closing))
            if isinstance(joined, CachedHost):
                return joined
        end = CachedHost(self.host)
        with contextlib.suppress(HostError):
            end.prefetch(wanted)
        return end

    def _side(self, end: Host, reader: StateReader | None) -> HostSide:
        aer = self._try("the AER counters", lambda: read_aer(end, self._devices))
        state = self._try("the host checks", reader) if reader is not None else None
        return HostSide(aer=aer if isinstance(aer, dict) else {},
                        state=dict(state) if isinstance(state, Mapping) else None)

    def open(self) -> None:
        known = self.known
        found = self._try("the GPUs' PCI paths", (lambda: devices(self.host, self.gpus))
                          if known is None else (lambda: devices_of(known(), self.gpus)))
        self._devices = found if isinstance(found, list) else []
        end = self._end(kernel_log=True, closing=False)
        seq = self._try("the kernel log", lambda: last_seq(end))
        self._seq = seq if isinstance(seq, int) else None
        self._before = self._side(end, self.state_before if self.state is not None and
                                  self.state_before is not None else self.state)

    def close(self) -> HostWindow:
        logged: object = None
        end = self._end(kernel_log=self._seq is not None, closing=True)
        if self._seq is not None:
            seq = self._seq
            logged = self._try("the kernel log", lambda: new_records(end, seq))
        after = self._side(end, self.state)
        return HostWindow(self._before, after,
                          tuple(logged) if isinstance(logged, list) else (),
                          tuple(self.errors))
