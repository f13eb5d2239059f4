"""Waiting a bounded time for a call that may never return.

A GPU fallen off the bus blocks NVML and CUDA in the kernel, where no signal ends the call; an
inventory script can wait on a CMDB that never answers. ``within`` makes such a call in a daemon
thread of its own and waits for it a bounded time: a call that has not returned by then is left
behind (a daemon thread does not hold the process's exit), and the caller says what hung. The
wait ends only if the call lets go of the GIL while it is stuck, as ctypes (NVML) and
cuda-python's bindings do. The wait is on an injectable clock (``host.clock``): a test's fake
clock ends it when the test says the time has passed, not when the machine gets round to it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import TypeVar, cast

from .host.clock import SYSTEM_CLOCK, Clock

T = TypeVar("T")


class StillRunning(Exception):
    """The call did not return in time; its thread is left behind."""


def within(timeout: float, call: Callable[[], T], *, name: str,
           clock: Clock = SYSTEM_CLOCK) -> T:
    """``call()``'s value, or what it raised, if it returns within ``timeout`` seconds of
    ``clock``; else StillRunning. It runs in a copy of this thread's context (the step a host
    names, where progress lines go), in a thread named ``gpuhost-NAME``."""
    outcome: list[tuple[bool, object]] = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # raised again in the caller's thread
            outcome.append((False, exc))
        finally:
            done.set()

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,),
                              name=f"gpuhost-{name}", daemon=True)
    thread.start()
    if not clock.wait(done, timeout) or not outcome:
        raise StillRunning(f"{name} did not return within {timeout:g} s")
    returned, value = outcome[0]
    if returned:
        return cast(T, value)
    raise cast(BaseException, value)
