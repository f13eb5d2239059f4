"""Keeping the garbage collector off what a run keeps to its end.

A gpuhost run builds most of what it holds up front (its modules, the spec's model, then at
collection one item and one check per host check) and keeps all of it to the end of the session.
CPython's collector walks every tracked object at each full collection, and a growing heap
triggers them: at 5,000 checks it spent more time walking these objects than pytest spends on as
many plain tests. So building the run is done with the collector paused (nothing it builds is a
reference cycle that becomes garbage), and once built, and again after collection, what exists
is moved out of the collector's sight with ``gc.freeze()``. ``thaw()`` (at unconfigure, before
pytest's own end-of-session collections, which must see every object, and again at cleanup
whatever happened) gives it back.

A process whose garbage collector is off, or that froze objects itself, is left as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

_state = {"frozen": False}


def _ours() -> bool:
    """Whether the collector is ours to pause and freeze: on, and nothing frozen by others."""
    return _state["frozen"] or (gc.isenabled() and gc.get_freeze_count() == 0)


@contextmanager
def paused() -> Iterator[None]:
    """The collector off while the run is built (imports, the spec, the session)."""
    if not gc.isenabled() or not _ours():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def freeze() -> None:
    """Move every object that exists now out of the collector's sight until ``thaw()``."""
    if _ours():
        gc.freeze()
        _state["frozen"] = True


def thaw() -> None:
    if _state["frozen"]:
        _state["frozen"] = False
        gc.unfreeze()
