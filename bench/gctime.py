"""``-p gctime`` (with bench/ on PYTHONPATH): the time a pytest process spends in the garbage
collector, from the first hook to its exit (pytest's own final collections included), appended
to ``$GPUHOST_BENCH_GC`` as ``SECONDS COLLECTIONS GEN2_COLLECTIONS``."""

from __future__ import annotations

import atexit
import gc
import os
import time
from typing import Any

_spent = [0.0, 0, 0]
_started = [0.0]


def _timer(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    _spent[0] += time.perf_counter() - _started[0]
    _spent[1] += 1
    _spent[2] += info.get("generation") == 2


def _write() -> None:
    with open(os.environ["GPUHOST_BENCH_GC"], "a") as out:
        out.write(f"{_spent[0]:.6f} {_spent[1]} {_spent[2]}\n")


gc.callbacks.append(_timer)
atexit.register(_write)
