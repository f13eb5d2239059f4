"""Time, for the code that waits or remembers when: injected, so that a test moves it instead
of waiting for it.

A wait that may end by time (a call into NVML that may never return, the window between two
samples of a counter) and a record of when something was read ask a ``Clock``. The run uses
``SYSTEM_CLOCK`` (``time.monotonic``, real waits); tests give ``testing.clock.FakeClock``, whose
time moves only when the test (or a stuck fake) moves it, so that no test depends on how fast
the machine is.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock (``time.monotonic``: only differences mean anything)."""

    def wait(self, done: threading.Event, seconds: float) -> bool:
        """Until ``done`` is set or ``seconds`` have passed on this clock; whether it was set."""

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's monotonic clock and real waits."""

    def now(self) -> float:
        return time.monotonic()

    def wait(self, done: threading.Event, seconds: float) -> bool:
        return done.wait(seconds)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()
