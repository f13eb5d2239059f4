"""On an xdist controller: a signal the controller gets reaches every worker, and the reports
of what the workers did before it stopped them are taken in before the run ends.

A signal may reach the controller alone (``kill PID``, ``timeout``, ``docker stop`` with pytest
as PID 1). xdist's controller then unwinds at once: its workers go on with their checks (a
``modprobe`` runs to its end, the next fixes are applied) until xdist's teardown interrupts them
seconds later, and the reports they sent meanwhile are never read: a journal says ``applied``
where every report says the check did not run. Here the controller hands each signal to every
worker it started (``interrupts.forward``), each worker unwinds as a run without xdist does (its
command's group killed, its remote agents told to cancel, the change journaled ``unknown``), and
the controller reads the workers' reports until each has finished, or ``DRAIN_S`` has passed
(xdist gives its workers as long before it kills them). A fix the signal cut short sends no
report (pytest reports none of a test it interrupts): the worker writes its record to its log
before it unwinds (``workers.DoneLog.cut``), and the controller's book takes it from there. A
worker not finished by then (a loaded machine) is ended before the run's end reads those logs:
xdist's own teardown of its workers, done early (each told to exit, waited for, killed after
``NodeManager.EXIT_TIMEOUT``), so every log is read once its worker is gone, however slowly it
unwound, and the reports it sent meanwhile are read too.
"""

from __future__ import annotations

import queue
import subprocess
import time
from collections.abc import Callable, Generator
from typing import Any

import pytest

from . import interrupts

DRAIN_S = 10.0
"""How long the controller reads the reports of interrupted workers: xdist's own wait for its
workers to end (``NodeManager.EXIT_TIMEOUT``) before it kills them."""


class WorkerSignals:
    """Registered on an xdist controller (``distributing.Distributing.start``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.gateways: list[Any] = []
        self.up: set[Any] = set()
        """The workers that have not yet finished or gone down."""
        self.stop = interrupts.forward(self.signal_workers)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_newgateway(self, gateway: Any) -> None:
        self.gateways.append(gateway)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        self.up.add(node)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        self.up.discard(node)

    def signal_workers(self, signum: int) -> None:
        """Each worker process this controller started and that has not ended gets the
        signal (``Popen.send_signal`` signals no process it has already reaped)."""
        for gateway in self.gateways:
            popen = getattr(getattr(gateway, "_io", None), "popen", None)
            if isinstance(popen, subprocess.Popen):
                popen.send_signal(signum)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            return (yield)
        except KeyboardInterrupt as exc:
            from xdist.dsession import Interrupted as Stopped  # xdist's own stop, drained

            if not isinstance(exc, Stopped):
                dsession = session.config.pluginmanager.getplugin("dsession")
                self.drain(dsession)
                self.end_unfinished(dsession)
            raise

    def drain(self, dsession: Any) -> None:
        """Read the workers' reports until every worker has finished (or gone down), for at
        most ``DRAIN_S``: the checks they finished are in every report."""
        if dsession is None or getattr(dsession, "sched", None) is None:
            return
        dsession.triggershutdown()  # nothing more is sent to any worker
        deadline = self.clock() + DRAIN_S
        while self.up:
            left = deadline - self.clock()
            if left <= 0:
                return
            try:
                name, kwargs = dsession.queue.get(timeout=left)
            except queue.Empty:
                return
            if name in ("workerfinished", "errordown"):
                self.up.discard(kwargs.get("node"))
            elif name == "testreport":
                try:
                    dsession.worker_testreport(**kwargs)
                except Exception:  # a report's hook failing ends the reading, not the run
                    return

    def end_unfinished(self, dsession: Any) -> None:
        """A worker still up after ``drain`` is ended now, not at xdist's teardown after the
        run's reports are written: ``NodeManager.teardown_nodes`` (xdist's own, a no-op when
        xdist calls it again) waits for each worker's process to end and kills it after
        ``EXIT_TIMEOUT``, so its log holds all it wrote (the record of a fix it cut short);
        then the reports it sent while it unwound are read."""
        nodemanager = getattr(dsession, "nodemanager", None)
        if not self.up or nodemanager is None:
            return
        try:
            nodemanager.teardown_nodes()
        except Exception:  # the run still ends as interrupted; xdist's own teardown tries again
            return
        self.up.clear()
        while True:
            try:
                name, kwargs = dsession.queue.get_nowait()
            except queue.Empty:
                return
            if name == "testreport":
                try:
                    dsession.worker_testreport(**kwargs)
                except Exception:  # as in ``drain``: a report's hook failing ends the reading
                    return

    def pytest_unconfigure(self) -> None:
        self.stop()
