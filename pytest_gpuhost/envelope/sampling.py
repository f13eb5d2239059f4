"""Sampling a benchmark's GPUs from a background thread that never blocks the benchmark: a sample
before, one every ``every`` seconds while it runs, one after.

Samples are due at fixed times from the first (a slow sample delays none after it, and none
piles up). The thread waits on an event with the injected clock (``host.clock``), so a test
moves time instead of waiting for it, and a stop ends the wait at once. A sample that fails
(NVML gone, a target lost) is a sample with its error: the envelope says so, the benchmark goes
on. A sampler stuck in a call (a GPU fallen off the bus blocks NVML in the kernel) is left
behind after ``STOP_WAIT_S``: stopping never waits on it longer than that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping

import msgspec

from ..host.clock import SYSTEM_CLOCK, Clock
from .facts import GpuFacts, GpuSampler, NoGpus, Sample

STOP_WAIT_S = 5.0
"""The longest a stop waits for a sample in flight to come back."""
MAX_SAMPLES = 100_000
"""Samples kept during one window (a day at one a second); later ones are left out, evenly."""


Names = Callable[[Iterable[int]], Mapping[int, str]]
"""The names of processes by pid (``proc/PID/comm``), for those a sampler gave none."""


def _named(gpus: dict[str, GpuFacts], names: Names) -> dict[str, GpuFacts]:
    unnamed = {pid for facts in gpus.values() for pid, name in (facts.processes or {}).items()
               if not name}
    if not unnamed:
        return gpus
    found = names(unnamed)
    return {address: msgspec.structs.replace(facts, processes={
        pid: name or found.get(pid, "") for pid, name in facts.processes.items()})
        if facts.processes else facts for address, facts in gpus.items()}


Ours = Callable[[frozenset[int]], frozenset[int]]
"""Of the pids on the GPUs (as the GPUs' host numbers them), the benchmark's."""


def _none_of(pids: frozenset[int]) -> frozenset[int]:
    return frozenset()


def take(sampler: GpuSampler, clock: Clock, ours: Ours,
         names: Names | None = None) -> Sample:
    """One sample now: every GPU's facts and, where a GPU runs a process, the benchmark's
    processes (its tree is read only then) and the names the sampler did not give, or the
    error."""
    at = clock.now()
    try:
        gpus = dict(sampler.sample())
        busy = any(facts.processes for facts in gpus.values())
        if busy and names is not None:
            gpus = _named(gpus, names)
        pids = frozenset(pid for facts in gpus.values() for pid in facts.processes or {})
        return Sample(at, gpus, ours=ours(pids) if busy else frozenset())
    except NoGpus:
        raise
    except Exception as exc:  # the sampler's failure is a line of the envelope
        return Sample(at, error=str(exc) or type(exc).__name__)


class Sampling:
    """``start()`` takes the sample before and starts the thread (none at ``every`` 0);
    ``stop()`` ends the thread and takes the sample after; ``samples`` then holds them all,
    in time order."""

    def __init__(self, sampler: GpuSampler, every: float, *, clock: Clock = SYSTEM_CLOCK,
                 ours: Ours = _none_of,
                 names: Names | None = None) -> None:
        self.sampler = sampler
        self.names = names
        self.every = every
        self.clock = clock
        self.ours = ours
        self.samples: list[Sample] = []
        self.unavailable: str | None = None
        """Why the sampler has no GPUs here (``NoGpus``): then nothing is sampled."""
        self.left_behind = False
        """A sample was still in flight when the stop's wait ran out."""
        self._stop = threading.Event()
        self._done = threading.Event()
        self._during: list[Sample] = []
        self._thread: threading.Thread | None = None
        self._next = 0.0
        """When the next sample is due, on the clock (on time, whenever the thread waits)."""

    def start(self) -> None:
        try:
            self.samples = [take(self.sampler, self.clock, self.ours, self.names)]
        except NoGpus as exc:
            self.unavailable = str(exc) or "no GPUs to sample"
            self.samples = [Sample(self.clock.now())]
            return
        self._next = self.samples[0].at + self.every
        if self.every > 0:
            self._thread = threading.Thread(target=self._run, name="gpuhost-envelope",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        try:
            while not self.clock.wait(self._stop, max(0.0, self._next - self.clock.now())):
                if len(self._during) < MAX_SAMPLES:
                    try:
                        self._during.append(take(self.sampler, self.clock, self.ours, self.names))
                    except NoGpus as exc:
                        self._during.append(Sample(self.clock.now(), error=str(exc)))
                now = self.clock.now()
                self._next += self.every
                if self._next <= now:  # a sample took longer than the interval: no backlog
                    self._next = now + self.every
        finally:
            self._done.set()

    def stop(self) -> list[Sample]:
        """Every sample, the one after included; waits at most ``STOP_WAIT_S`` for a sample in
        flight (then it is left behind, and the envelope says so)."""
        self._stop.set()
        if self.unavailable is not None:
            self.samples = [*self.samples, Sample(self.clock.now())]
            return self.samples
        if self._thread is not None and not self.clock.wait(self._done, STOP_WAIT_S):
            self.left_behind = True
        during = list(self._during)
        if self.left_behind:  # the sampler is stuck: asking it again would block the caller
            after = Sample(self.clock.now(), error=f"a sample did not come back within "
                                                   f"{STOP_WAIT_S:g} s; it was left behind")
        else:
            try:
                after = take(self.sampler, self.clock, self.ours, self.names)
            except NoGpus as exc:  # the driver went away during the run
                after = Sample(self.clock.now(), error=str(exc))
        self.samples = [*self.samples, *during, after]
        return self.samples
