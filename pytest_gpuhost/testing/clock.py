"""A clock for tests: time that moves only when the test says so.

Give it where the code takes a ``host.clock.Clock`` (``bounded.within``, ``PynvmlNvml.open``,
``CachedHost``): a wait ends when its event is set, when the test has moved the clock past its
deadline (``advance``), or when a fake that stands for something stuck says so before it
blocks (``stall``: the wait for it runs out, and the clock moves to its deadline), never by how
fast the machine is. A test then asserts on the clock (how much time passed, how many waits
there were), never on the wall clock.
"""

from __future__ import annotations

import threading
import time

POLL_S = 0.005
"""How often a wait looks at the clock while its event is not set."""


class FakeClock:
    """A monotonic clock that moves by ``advance`` and ``sleep`` only. A wait that nothing
    would end fails the test after ``patience`` real seconds instead of hanging the suite."""

    def __init__(self, start: float = 1000.0, *, patience: float = 60.0) -> None:
        self._now = start
        self._moved = threading.Lock()
        self.patience = patience
        self.waits: list[float] = []
        """Each wait's length, in the order they were asked for."""
        self.slept: list[float] = []
        self._stalls = 0

    def now(self) -> float:
        with self._moved:
            return self._now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass: every wait whose deadline that reaches ends."""
        with self._moved:
            self._now += seconds

    def stall(self) -> None:
        """A call that will never return: the wait for it (now, or the next one) runs to its
        deadline, which is then the clock's time."""
        with self._moved:
            self._stalls += 1

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.advance(seconds)

    def wait(self, done: threading.Event, seconds: float) -> bool:
        self.waits.append(seconds)
        with self._moved:
            deadline = self._now + seconds
        give_up = time.monotonic() + self.patience
        while not done.wait(POLL_S):
            with self._moved:
                if self._stalls and not done.is_set():
                    self._stalls -= 1
                    self._now = max(self._now, deadline)
                if self._now >= deadline:
                    return done.is_set()
            if time.monotonic() > give_up:
                raise AssertionError(f"a wait of {seconds:g} s on the fake clock: nothing set its "
                                     f"event or moved the clock within {self.patience:g} s")
        return True
