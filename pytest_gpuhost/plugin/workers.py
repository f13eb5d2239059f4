"""Ordering across pytest-xdist workers: checks that must run after all others wait for them.
No pytest here: the controller's side is ``distributing.py``, the workers' ``worker.py``.

Without xdist, collection order is run order. With ``-n N`` each worker runs its own share, so the
controller hands every worker one shared directory (through ``workerinput``). Each worker appends
to its own log there, one line when a check starts and one when it is done (with its gate
verdict): one write(2) to a file it keeps open with O_APPEND, no file per check and no open per
line. A line is in the file (and seen by every reader) once the write returns, so nothing is
held back to be batched: a worker that went idle would otherwise hide a done line from the one
waiting for it. A last-ranked check (dmesg) and a gated test wait until every check they depend
on is done, polling the logs every few milliseconds at first, then less often.

A worker that dies is noticed: the controller (which pytest-xdist tells) writes ``down-WORKER``
with the reason, and a waiter stops waiting, within a poll, not after the timeout, for the
checks that worker had started and never finished, and for every check no worker has started:
xdist sends what the dead worker had been given to the live ones, behind what they were given
before, so behind the waiting checks themselves (a wait for them would end only at the
timeout). They are lost to the waiter, which says so; they still run, after it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

WORKERINPUT_KEY = "gpuhost_shared_dir"
TARGETS_KEY = "gpuhost_targets"
"""In a worker's workerinput: the targets its controller resolved (``settings.target_record``)."""
SSH_MASTERS_KEY = "gpuhost_ssh_masters"
"""In a worker's workerinput: the directory of the run's ssh control sockets."""
COLLECTED = "collected.json"
"""In the shared directory: what the controller collected of each remote target (when the
workers do not collect their own)."""
OWN_KEY = "gpuhost_own_targets"
"""In a worker's workerinput, under the target scheduler: the remote targets it collects and
runs itself (its controller connects to none)."""
CONCURRENCY_KEY = "gpuhost_connect_concurrency"
"""In a worker's workerinput, with ``OWN_KEY``: how many of them it connects to at once (its
share of --gpuhost-connect-concurrency)."""
CONTROLLER = "controller"
"""The name the controller reads the workers' logs under (it writes no log of its own)."""
WAIT_TIMEOUT_S = 900.0
POLL_S = (0.005, 0.05)
"""A waiter's first and longest pause between two reads of the logs (doubling in between)."""
T = TypeVar("T")


class Progress(msgspec.Struct):
    """What the logs say so far."""

    done: dict[int, str] = msgspec.field(default_factory=dict)
    """Index -> gate verdict of each finished check."""
    started: dict[int, str] = msgspec.field(default_factory=dict)
    """Index -> the worker that started it."""
    down: dict[str, str] = msgspec.field(default_factory=dict)
    """Worker -> why it went down."""
    records: dict[int, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Index -> the record of each finished check, where the workers share them (a
    persistence file is made of its target's records, run on any worker)."""
    indices: dict[str, int] = msgspec.field(default_factory=dict)
    """Nodeid -> index of every check a worker collected."""
    host_checks: dict[int, str] = msgspec.field(default_factory=dict)
    """Index -> id of every host check a worker collected (the gate waits for them all)."""
    targets: set[str] = msgspec.field(default_factory=set)
    """The targets some worker collected (under the target scheduler, each its own)."""
    cut_short: dict[str, tuple[int, dict[str, Any]]] = msgspec.field(default_factory=dict)
    """Nodeid -> (index, record) of each check whose fix an interrupt cut short on a worker:
    pytest reports no test it interrupts, so the controller takes its record from here."""

    def lost(self, indices: Iterable[int]) -> list[int]:
        """Once a worker went down: the checks not finished that no live worker is running
        (started by the dead one, or by none: re-queued behind the waiters)."""
        if not self.down:
            return []
        return [i for i in indices if i not in self.done and (
            self.started.get(i) is None or self.started[i] in self.down)]


class DoneLog:
    """The shared directory: each worker's log of started and finished checks."""

    def __init__(self, directory: Path, worker: str) -> None:
        self.directory = directory
        self.worker = worker
        self.path = directory / f"log-{worker}"
        self._offsets: dict[Path, int] = {}
        self._fd: int | None = None
        self.progress = Progress()

    def _append(self, line: dict[str, Any]) -> None:
        data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC,
                               0o600)
        os.write(self._fd, data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def start(self, index: int) -> None:
        self._append({"start": index})

    def collected(self, checks: Sequence[tuple[int, str, str, bool]], targets: Sequence[str]
                  ) -> None:
        """What this worker collected: each check's (index, nodeid, id, whether it is a host
        check), of ``targets``; one line, before its first check starts."""
        self._append({"collected": [list(check) for check in checks],
                      "targets": list(targets)})

    def mark(self, index: int, verdict: str, record: dict[str, Any] | None = None) -> None:
        line: dict[str, Any] = {"done": index, "verdict": verdict}
        if record is not None:
            line["record"] = record
        self._append(line)

    def cut(self, index: int, nodeid: str, record: dict[str, Any]) -> None:
        """A check whose fix an interrupt cut short, with its record (its change ``unknown``
        in the journal): written before the worker unwinds, so read by the controller once
        the worker has finished."""
        self._append({"cut": index, "nodeid": nodeid, "record": record})

    def read(self) -> Progress:
        """Read what every log gained since the last read, and which workers went down."""
        for path in sorted(self.directory.glob("log-*")):
            worker = path.name[4:]
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as file:
                file.seek(offset)
                chunk = file.read()
            *lines, rest = chunk.split(b"\n")  # a line being written is read next time
            self._offsets[path] = offset + len(chunk) - len(rest)
            for line in lines:
                entry = json.loads(line)
                if "start" in entry:
                    self.progress.started[int(entry["start"])] = worker
                elif "collected" in entry:
                    self._collected(entry)
                elif "cut" in entry:
                    self.progress.cut_short[str(entry["nodeid"])] = (int(entry["cut"]),
                                                                     entry["record"])
                else:
                    self.progress.done[int(entry["done"])] = str(entry["verdict"])
                    if "record" in entry:
                        self.progress.records[int(entry["done"])] = entry["record"]
        for path in self.directory.glob("down-*"):
            self.progress.down.setdefault(path.name[5:], path.read_text(errors="replace"))
        return self.progress

    def _collected(self, entry: dict[str, Any]) -> None:
        for index, nodeid, check_id, host in entry["collected"]:
            self.progress.indices[nodeid] = int(index)
            if host:
                self.progress.host_checks[int(index)] = str(check_id)
        self.progress.targets.update(entry["targets"])

    def wait_collected(self, targets: Iterable[str], timeout: float = WAIT_TIMEOUT_S
                       ) -> list[str]:
        """Wait until some worker has collected each of ``targets`` (under the target
        scheduler each worker collects its own), or a worker went down (its targets may never
        be: a waiter gives them up, as it gives up the checks a dead worker held); return the
        targets no worker collected."""
        wanted = list(targets)

        def step(progress: Progress) -> tuple[list[str], bool]:
            missing = [name for name in wanted if name not in progress.targets]
            return missing, not missing or bool(progress.down)

        return self._poll(step, timeout)

    def wait_for(self, indices: Iterable[int], timeout: float = WAIT_TIMEOUT_S) -> list[int]:
        """Wait until every index is done or lost; return those not done."""
        wanted = list(indices)

        def step(progress: Progress) -> tuple[list[int], bool]:
            nonlocal wanted
            wanted = [i for i in wanted if i not in progress.done]
            return wanted, not wanted or set(wanted) <= set(progress.lost(wanted))

        return self._poll(step, timeout)

    def _poll(self, step: Callable[[Progress], tuple[list[T], bool]], timeout: float
              ) -> list[T]:
        """Read the progress, pausing longer each time up to POLL_S's longest, until ``step``
        says it may stop or ``timeout`` has passed; what ``step`` last found missing."""
        deadline = time.monotonic() + timeout
        pause, longest = POLL_S
        while True:
            missing, settled = step(self.read())
            if settled or time.monotonic() >= deadline:
                return missing
            time.sleep(pause)
            pause = min(pause * 2, longest)
