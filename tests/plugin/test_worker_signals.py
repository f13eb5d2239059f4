"""An xdist controller's workers still unwinding after its drain are ended (xdist's own
teardown) before the run's end reads their logs and the reports they sent meanwhile."""

from __future__ import annotations

import queue
from typing import Any

from pytest_gpuhost.plugin.worker_signals import WorkerSignals


class FakeNodes:
    """xdist's ``NodeManager``: ending the workers lets their last messages arrive."""

    def __init__(self, dsession: FakeDSession, last: list[tuple[str, dict[str, Any]]]) -> None:
        self.dsession, self.last = dsession, last
        self.torn_down = 0
        self.error: Exception | None = None

    def teardown_nodes(self) -> None:
        if self.error is not None:
            raise self.error
        self.torn_down += 1
        for message in self.last:
            self.dsession.queue.put(message)


class FakeDSession:
    def __init__(self, last: list[tuple[str, dict[str, Any]]]) -> None:
        self.queue: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.nodemanager = FakeNodes(self, last)
        self.reported: list[object] = []

    def worker_testreport(self, node: object, rep: object) -> None:
        self.reported.append(rep)


def signals(*up: object) -> WorkerSignals:
    made = WorkerSignals()
    made.pytest_unconfigure()  # forwards no signal of this process
    made.up.update(up)
    return made


def test_a_worker_still_up_is_ended_and_what_it_sent_meanwhile_is_read() -> None:
    dsession = FakeDSession([("testreport", {"node": "gw0", "rep": "late"}),
                             ("workerfinished", {"node": "gw0"})])
    ending = signals("gw0")
    ending.end_unfinished(dsession)
    assert dsession.nodemanager.torn_down == 1
    assert dsession.reported == ["late"]
    assert not ending.up


def test_workers_that_all_finished_are_left_to_xdist_s_teardown() -> None:
    dsession = FakeDSession([("testreport", {"node": "gw0", "rep": "late"})])
    signals().end_unfinished(dsession)
    assert dsession.nodemanager.torn_down == 0
    assert dsession.reported == []


def test_a_teardown_that_fails_leaves_the_interrupt_as_it_was() -> None:
    """The signal's ``KeyboardInterrupt`` is what ends the run (its exit status): a failing
    teardown of the workers (xdist's own, which tries again at the session's end) replaces it
    with no error of its own."""
    dsession = FakeDSession([])
    dsession.nodemanager.error = OSError("cannot send (already closed?)")
    ending = signals("gw0")
    ending.end_unfinished(dsession)
    assert ending.up == {"gw0"}  # not known to be gone
