"""One benchmark's envelope taken around it: the host's half opened, the GPUs sampled before,
during (from a background thread) and after, then judged (``verdict.judge``).

Used as a context manager (``with Envelope(...) as envelope: run()``; then ``envelope.valid``,
``envelope.verdict``): by the ``gpuhost_envelope`` fixture, around each pytest-benchmark test,
and by ``python -m pytest_gpuhost.envelope``. Its own failures are lines of the verdict
(``errors``, ``missing``), never the benchmark's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

from ..checks.gpus import Gpu
from ..host import Host
from ..host.clock import SYSTEM_CLOCK, Clock
from ..specmodel.envelope import DEFAULTS, Limits
from .facts import GpuSampler, Sample
from .hostside import (
    EndBatch,
    HostHalf,
    StateReader,
    container_pids,
    process_names,
    process_tree,
)
from .sampling import Sampling
from .verdict import judge, summary


class Envelope:
    """A window around one benchmark on one host. ``sampler`` None: the GPU half is missing,
    and ``without`` says why; ``roots``: the benchmark's processes (this one, or the wrapped
    command's: ``roots`` is read when a sample needs it, so a command started later counts),
    on ``runs_on``: the host whose pids they are (default ``host``: where the GPUs are). Where
    ``runs_on`` is a container of ``host``, a process on a GPU is the benchmark's when its pid
    in the container's namespace (``NSpid``) is, or, on a kernel without ``NSpid``, when it
    is in the cgroup of one of the benchmark's processes (``hostside.container_pids``);
    ``runs_on`` None: the benchmark runs on no host the run reads (a remote target), and
    other processes are shown, not judged."""

    def __init__(self, host: Host, *, limits: Limits = DEFAULTS,
                 sampler: GpuSampler | None = None, without: str | None = None,
                 state: StateReader | None = None, gpus: Sequence[str] | None = None,
                 roots: Callable[[], Sequence[int]] | None = None,
                 runs_on: Host | bool | None = True, clock: Clock = SYSTEM_CLOCK,
                 known_gpus: Callable[[], Sequence[Gpu]] | None = None,
                 state_before: StateReader | None = None,
                 end_batch: EndBatch | None = None) -> None:
        self.host = host
        self.limits = limits
        self.sampler = sampler
        self.without = without
        self.gpus = gpus
        self.roots = roots or (lambda: [os.getpid()])
        self.runs_on: Host | None = host if runs_on is True else \
            runs_on if not isinstance(runs_on, bool) else None
        self.clock = clock
        self.half = HostHalf(host, gpus=gpus, state=state, known=known_gpus,
                             state_before=state_before, end_batch=end_batch)
        self.sampling: Sampling | None = None
        self.verdict: dict[str, Any] | None = None
        self._start = 0.0

    def ours(self, pids: frozenset[int]) -> frozenset[int]:
        """Of ``pids`` (on the GPUs), the benchmark's: in its process tree, directly or
        mapped across the pid namespace of the container it runs in."""
        if self.runs_on is None:
            return pids  # not judged: the verdict says whose they are is unknown
        tree = process_tree(self.runs_on, self.roots())
        found = pids & tree
        if self.runs_on is not self.host:
            found |= container_pids(self.host, self.runs_on, pids - tree, tree)
        return found

    def __enter__(self) -> Envelope:
        self.half.open()
        self._start = self.clock.now()
        if self.sampler is not None:
            self.sampling = Sampling(self.sampler, self.limits.sample_every, clock=self.clock,
                                     ours=self.ours,
                                     names=lambda pids: process_names(self.host, pids))
            self.sampling.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    def close(self) -> dict[str, Any]:
        """The verdict (once: a second close gives the same)."""
        if self.verdict is not None:
            return self.verdict
        if self.sampling is not None:
            samples = self.sampling.stop()
        else:
            samples = [Sample(self._start), Sample(self.clock.now())]
        host = self.half.close()
        why = self.without or "no GPU sampler"
        if self.sampling is not None and self.sampling.unavailable is not None:
            why = self.sampling.unavailable
        missing = [] if self.sampling is not None and self.sampling.unavailable is None else \
            [f"the GPU half ({why})"]
        if self.runs_on is None and self.sampler is not None:
            missing.append("which processes on the GPUs are the benchmark's (it runs on "
                           "another machine than its GPUs: pass the pids it runs as)")
        described = self.sampler.describe() if self.sampler is not None else None
        self.verdict = judge(samples, host, self.limits, gpus=self.gpus, missing=missing,
                             sampler=described)
        return self.verdict

    @property
    def valid(self) -> bool:
        """Whether the run was valid; asked before the window closed, it closes it."""
        return bool(self.close()["valid"])

    @property
    def reasons(self) -> list[str]:
        return [str(r["text"]) for r in self.close()["reasons"]]

    def summary(self) -> str:
        return summary(self.close())
