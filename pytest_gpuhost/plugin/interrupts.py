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
"""

from __future__ import annotations

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


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise Interrupted(signum)


def install() -> Callable[[], None]:
    """Turn SIGTERM and SIGHUP into ``Interrupted`` (where their handler is the default, and
    only on the main thread, where Python runs handlers); returns what puts back the handlers
    that were there."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    changed = [signum for signum, handler in previous.items() if handler is signal.SIG_DFL]
    for signum in changed:
        signal.signal(signum, _interrupt)

    def restore() -> None:
        for signum in changed:
            if signal.getsignal(signum) is _interrupt:
                signal.signal(signum, previous[signum])

    return restore
