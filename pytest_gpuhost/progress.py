"""Progress of long checks (a bandwidth measurement): a probe calls ``report_progress(text)``
while it works, and the plugin shows each line on the terminal as it comes.

Shown by the process that owns the terminal; under xdist a worker's progress is not shown (the
controller prints each check's status as it finishes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_SINK: ContextVar[Callable[[str], None] | None] = ContextVar("gpuhost_progress", default=None)


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
