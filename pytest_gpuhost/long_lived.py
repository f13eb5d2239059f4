"""Keeping the garbage collector off what a run keeps to its end.

A gpuhost run builds most of what it holds up front (its modules, the spec's model, then at
collection one item and one check per host check), and each check's record and reports, once
made, live to the end of the session too. CPython's collector walks every tracked object at
each full collection, and a growing heap triggers them: at 5,000 checks it spent more time
walking these objects than pytest spends on as many plain tests. So the run is built with the
collector paused (nothing it builds is a reference cycle that becomes garbage), and what exists
once it is built, after collection, and every FREEZE_EVERY checks is moved out of the
collector's sight with ``gc.freeze()``. ``thaw()`` gives it all back at unconfigure, before
pytest's own end-of-session collections (which must see every object, to report what a
finalizer raised), and again at cleanup whatever happened.

A process whose garbage collector is off, or that froze objects itself, is left as it is.

And at the process's end (``at_exit``): once pytest is done and the interpreter exits, its
finalization runs the collector over every object still alive, to finalize what sits in a
reference cycle; a run's process spent 75 ms there against 44 ms for plain pytest's. The run
freezes everything in an exit handler, so those last collections walk nothing: the objects are
still released by their reference counts, and only a cycle's ``__del__`` at exit is skipped,
which Python never promises (its documentation: ``__del__`` is not guaranteed to be called for
objects that still exist when the interpreter exits). Registered once a process, it changes
nothing before the exit: a process that runs pytest in-process many times (pytester's inline
runs) collects as before until it ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

FREEZE_EVERY = 1000
"""Checks run between two freezes."""


class _State:
    frozen = False
    """Whether this module froze what the collector sees (and must thaw it)."""
    made = 0
    """Items made and checks run since the process started."""
    exit_frozen = False
    """Whether ``at_exit`` registered the exit handler (once a process)."""
    paused = False
    """Whether ``paused`` turned the collector off (and will turn it back on)."""


_state = _State()


def _ours() -> bool:
    """Whether the collector is ours to pause and freeze: on (or off by our own ``paused``),
    and nothing frozen by others."""
    return _state.frozen or ((gc.isenabled() or _state.paused) and gc.get_freeze_count() == 0)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off while the run is built (imports, the spec, the session); what is
    frozen meanwhile is never walked. Nested, the outermost turns it back on."""
    if not gc.isenabled() or not _ours():
        yield
        return
    gc.disable()
    _state.paused = True
    try:
        yield
    finally:
        _state.paused = False
        gc.enable()


def freeze() -> None:
    """Move every object that exists now out of the collector's sight until ``thaw()``."""
    if _ours():
        gc.freeze()
        _state.frozen = True


def made_one() -> None:
    """An item was made or a check ran: every FREEZE_EVERY of them, what exists is frozen too
    (items, checks, records and reports live to the end of the session)."""
    _state.made += 1
    if _state.made % FREEZE_EVERY == 0 and _state.frozen:
        gc.freeze()


def thaw() -> None:
    if _state.frozen:
        _state.frozen = False
        gc.unfreeze()


def at_exit() -> None:
    """Freeze every object when the interpreter exits (its last collections then walk none);
    registered once a process."""
    if not _state.exit_frozen:
        import atexit

        atexit.register(gc.freeze)
        _state.exit_frozen = True
