"""How long each long step of a check last took (an nvbandwidth run on a target), kept in
pytest's cache across runs, so that a step says it takes a while only where it did.

pytest's cache: ``.pytest_cache/v/gpuhost/step-seconds`` by default; ``-p no:cacheprovider``
turns it off, and a step then says nothing of its time."""

from __future__ import annotations

from typing import Any

import pytest

KEY = "gpuhost/step-seconds"


class CachedStepTimes:
    """``progress.StepTimes`` over pytest's cache (read once, written at each step's end)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        known = cache.get(KEY, {})
        self.seconds: dict[str, float] = {
            key: float(value) for key, value in known.items()
            if isinstance(key, str) and isinstance(value, int | float)} \
            if isinstance(known, dict) else {}

    def last(self, key: str) -> float | None:
        return self.seconds.get(key)

    def remember(self, key: str, seconds: float) -> None:
        self.seconds[key] = round(seconds, 3)
        self.cache.set(KEY, self.seconds)


def step_times_of(config: pytest.Config) -> CachedStepTimes | None:
    """The run's memory of its long steps, made once; None without pytest's cache."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return None
    made = config.stash.get(_STASHED, None)
    if made is None:
        made = config.stash[_STASHED] = CachedStepTimes(cache)
    return made


_STASHED = pytest.StashKey[CachedStepTimes]()
