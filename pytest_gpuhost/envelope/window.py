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

from ..host import Host
from ..host.clock import SYSTEM_CLOCK, Clock
from ..specmodel.envelope import DEFAULTS, Limits
from .facts import GpuSampler, Sample
from .hostside import HostHalf, StateReader, process_names, process_tree
from .sampling import Sampling
from .verdict import judge, summary


class Envelope:
    """A window around one benchmark on one host. ``sampler`` None: the GPU half is missing,
    and ``without`` says why; ``roots``: the benchmark's processes (this one, or the wrapped
    command's: ``roots`` is read when a sample needs it, so a command started later counts)."""

    def __init__(self, host: Host, *, limits: Limits = DEFAULTS,
                 sampler: GpuSampler | None = None, without: str | None = None,
                 state: StateReader | None = None, gpus: Sequence[str] | None = None,
                 roots: Callable[[], Sequence[int]] | None = None,
                 clock: Clock = SYSTEM_CLOCK) -> None:
        self.host = host
        self.limits = limits
        self.sampler = sampler
        self.without = without
        self.gpus = gpus
        self.roots = roots or (lambda: [os.getpid()])
        self.clock = clock
        self.half = HostHalf(host, gpus=gpus, state=state)
        self.sampling: Sampling | None = None
        self.verdict: dict[str, Any] | None = None
        self._start = 0.0

    def ours(self) -> frozenset[int]:
        return process_tree(self.host, self.roots())

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
