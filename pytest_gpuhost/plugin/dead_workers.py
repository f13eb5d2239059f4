"""On an xdist controller: tests never sent to a worker that has just died take the run down.

The race (xdist's own: pytest-xdist issue 204, "Internal error when slave crashed during test"):
a worker sends the completion of a test and dies (a segfault in a GPU library, ``os._exit``).
The controller handles its events in order, so it handles that completion before it learns of
the death, and the scheduler, seeing the worker short of work, sends it more tests: the pipe to
the dead process is broken, execnet raises ``OSError: cannot send (already closed?)``, and the
run ends in INTERNALERROR instead of exit 1 with the lost check reported. xdist guards the
``shutdown`` it sends the same way, but not ``runtests``.

The guard: a send of tests (``runtests``, ``runtests_all``, ``steal``) that fails with OSError is
dropped. Nothing is lost: the scheduler put those tests on the worker's pending list before
sending them, and the death, next in the controller's queue, hands them back out (the one it
crashed on becomes the crash's error record).
"""

from __future__ import annotations

from typing import Any

import pytest

SENDS = frozenset({"runtests", "runtests_all", "steal"})


class DeadWorkerSends:
    """Registered on an xdist controller (``hooks.GpuhostRun.start``)."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodeready(self, node: Any) -> None:
        send = node.sendcommand

        def guarded(name: str, **kwargs: object) -> None:
            try:
                send(name, **kwargs)
            except OSError as exc:
                if name not in SENDS:
                    raise
                node.log(f"not sent to a worker that went down ({exc}): {name}; its death, "
                         "next in the queue, gives the tests out again")

        node.sendcommand = guarded
