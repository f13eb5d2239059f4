"""Progress of long checks (a bandwidth measurement): a probe calls ``report_progress(text)``
while it works, and the plugin shows each line on the terminal as it comes; a step that may take
long (``long_step``) says so only when its last run here did, with how long that took, from the
run's memory of earlier runs (pytest's cache: the plugin's ``StepTimes``).

Shown by the process that owns the terminal; under xdist a worker's progress is not shown (the
controller prints each check's status as it finishes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol

_SINK: ContextVar[Callable[[str], None] | None] = ContextVar("gpuhost_progress", default=None)
SLOW_S = 10.0
"""A step whose last run took this long or longer is said to take a while."""


class StepTimes(Protocol):
    """How long each long step took when it last ran (kept across runs by the plugin)."""

    def last(self, key: str) -> float | None: ...

    def remember(self, key: str, seconds: float) -> None: ...


_TIMES: ContextVar[StepTimes | None] = ContextVar("gpuhost_step_times", default=None)


@contextmanager
def long_step(key: str, text: str, clock: Callable[[], float] = time.monotonic
              ) -> Iterator[None]:
    """Report ``text`` as a step begins, with how long its last run (``key``: the same step on
    the same target) took and, where that was ``SLOW_S`` or more, that it takes a while; then
    remember how long this one took (not when it failed: a timeout is no duration)."""
    times = _TIMES.get()
    last = times.last(key) if times is not None else None
    if last is None:
        report_progress(text)
    else:
        report_progress(f"{text}; the last run took {last:.1f} s"
                        + ("; this takes a while" if last >= SLOW_S else ""))
    started = clock()
    yield
    if times is not None:
        times.remember(key, clock() - started)


@contextmanager
def step_times(times: StepTimes | None) -> Iterator[None]:
    token = _TIMES.set(times)
    try:
        yield
    finally:
        _TIMES.reset(token)


def report_progress(text: str) -> None:
    """Tell the person watching what a long check is doing now (no-op outside a check)."""
    sink = _SINK.get()
    if sink is not None:
        sink(text)


@contextmanager
def progress_to(sink: Callable[[str], None] | None) -> Iterator[None]:
    token = _SINK.set(sink)
    try:
        yield
    finally:
        _SINK.reset(token)
