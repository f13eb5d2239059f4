"""SIGTERM and SIGHUP end a gpuhost run as SIGINT does.

``timeout``, systemd, Slurm's ``scancel`` and CI cancellation send SIGTERM; a closed terminal
sends SIGHUP. Python's default for both ends the process at once, without unwinding: a command
the run started in its own session (a ``modprobe`` of --fix) would go on, and a rollback started
meanwhile would judge its change before it was made. While a run is active each is turned into
``Interrupted``, a KeyboardInterrupt raised wherever the run is, so it unwinds as after Ctrl-C:
a local command's process group is killed (``agent.Root.run``), a remote target's agent is told
to cancel (``AgentHost``), the change is journaled ``unknown``, the journal stays open, and
pytest ends the session with its reports and exit status 2. A signal the process was started
ignoring (``nohup`` ignores SIGHUP) stays ignored.

Under xdist a signal may reach the controller alone (``kill PID``, ``docker stop`` with pytest
as PID 1): the controller hands each signal it gets, SIGINT included, to every worker before it
unwinds (``forward``), so a worker's command and its remote agents' stop as the controller's
would, instead of running on until xdist's teardown interrupts the worker seconds later. A
signal that comes again while the first is unwinding (a forwarded one beside the one a whole
process group got, systemd's SIGTERM to every process of the unit) is not raised a second time
on a worker: it would break off the unwinding itself (a change journaled ``unknown``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the run was."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name} received")
        self.signum = signum


_forwards: list[Callable[[int], None]] = []
"""Who else is handed each signal before the run unwinds (an xdist controller's workers)."""
_raised: set[int] = set()
"""The signals raised once already where each is raised once (an xdist worker)."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _forward(signum)
    raise Interrupted(signum)


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    if _raised:  # the run is unwinding already: let it
        return
    _raised.add(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Interrupted(signum)


def _interrupt_and_forward(signum: int, frame: FrameType | None) -> None:
    """SIGINT on an xdist controller: handed to the workers, then Python's own."""
    _forward(signum)
    signal.default_int_handler(signum, frame)


def _forward(signum: int) -> None:
    for forward_to in list(_forwards):
        with contextlib.suppress(Exception):  # a worker already gone: nothing to hand it
            forward_to(signum)


def forward(to: Callable[[int], None]) -> Callable[[], None]:
    """Hand each signal this process turns into an interrupt to ``to`` too, first; returns
    what stops it."""
    _forwards.append(to)

    def stop() -> None:
        if to in _forwards:
            _forwards.remove(to)

    return stop


def install(*, worker: bool = False, controller: bool = False) -> Callable[[], None]:
    """Turn SIGTERM and SIGHUP into ``Interrupted`` (where their handler is the default, and
    only on the main thread, where Python runs handlers); returns what puts back the handlers
    that were there. ``worker``: an xdist worker, where each of them and SIGINT is raised once
    only; ``controller``: an xdist controller, which forwards SIGINT too."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    _raised.clear()
    signals = (*SIGNALS, signal.SIGINT) if worker or controller else SIGNALS
    previous = {signum: signal.getsignal(signum) for signum in signals}
    default = {signum: signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL
               for signum in signals}
    handler = _interrupt_once if worker else _interrupt
    ours = {signum: _interrupt_and_forward if signum == signal.SIGINT and not worker
            else handler for signum in signals}
    changed = [signum for signum, was in previous.items() if was is default[signum]]
    for signum in changed:
        signal.signal(signum, ours[signum])

    def restore() -> None:
        for signum in changed:
            if signal.getsignal(signum) is ours[signum]:
                signal.signal(signum, previous[signum])

    return restore
