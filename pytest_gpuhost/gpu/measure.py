"""Measure once per session: the first check to need the numbers measures every pair, serially,
under a file lock in the directory shared with the xdist workers; the others read the result.

Without xdist there is one process and the result is kept in memory. A failed measurement is
kept too, so each check reports the same reason instead of trying again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..files import write_atomically
from ..host import HostError
from .bandwidth import Measurements

LOCK_NAME = "p2p-measure.lock"


class MeasurementFailed(HostError):
    """The measurement could not be taken; every check that needs it ends in error with this."""


def cache_key(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class SharedMeasurement:
    def __init__(self, key: str, measure: Callable[[], Measurements],
                 shared_dir: Path | None) -> None:
        self.key = key
        self._measure = measure
        self._shared_dir = shared_dir
        self._result: Measurements | None = None
        self._error: str | None = None
        self.measured_here = False
        """Whether this process took the measurement (rather than reading another's)."""

    @property
    def done(self) -> bool:
        """Whether this process has the numbers (or the reason there are none) already."""
        return self._result is not None or self._error is not None

    def get(self) -> Measurements:
        if self._result is None and self._error is None:
            record = self._shared() if self._shared_dir is not None else self._take()
            if "error" in record:
                self._error = str(record["error"])
            else:
                self._result = Measurements.from_dict(record)
        if self._error is not None:
            raise MeasurementFailed(self._error)
        assert self._result is not None
        return self._result

    def _take(self) -> dict[str, Any]:
        self.measured_here = True
        try:
            return self._measure().as_dict()
        except HostError as exc:
            return {"error": str(exc)}

    def _shared(self) -> dict[str, Any]:
        assert self._shared_dir is not None
        cache = self._shared_dir / f"p2p-{self.key}.json"
        with open(self._shared_dir / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one measurement at a time across all workers
            try:
                if cache.exists():
                    data: dict[str, Any] = json.loads(cache.read_text())
                    return data
                record = self._take()
                write_atomically(cache, json.dumps(record))
                return record
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
