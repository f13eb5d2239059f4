"""What differed between two benchmarks' envelopes, for a comparison that asks "why is it
slower?": each GPU measure whose share or median moved, and the reasons one run has and the
other had not (``0000:41:00.0 HW slowdown 34% (0% in 0003)``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .verdict import percent

SHARE_STEP = 0.01
"""A share that moved less than this (1% of the window) is the same."""
CLOCK_STEP = 0.05
"""A median clock that moved less than this share of itself is the same."""
CLOCKS = {"sm_clock": "median SM clock", "mem_clock": "median memory clock"}


def _during(verdict: Mapping[str, Any] | None) -> Mapping[str, Any]:
    during = verdict.get("during") if isinstance(verdict, Mapping) else None
    return during if isinstance(during, Mapping) else {}


def differences(ours: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None, label: str
                ) -> list[str]:
    """The measures of ``ours`` that differ from ``theirs`` (the compared run, ``label``),
    each a phrase; the reasons only ours has after them."""
    if not isinstance(ours, Mapping) or not isinstance(theirs, Mapping):
        return []
    found = []
    now, then = _during(ours), _during(theirs)
    for gpu in sorted(now):
        mine = now[gpu] if isinstance(now[gpu], Mapping) else {}
        other = then.get(gpu) if isinstance(then.get(gpu), Mapping) else {}
        for measure, values in mine.items():
            was = other.get(measure) if isinstance(other, Mapping) else None
            if not isinstance(values, Mapping) or not isinstance(was, Mapping):
                continue
            if "share" in values and "share" in was and \
                    abs(values["share"] - was["share"]) >= SHARE_STEP:
                found.append(f"{gpu} {measure} {percent(values['share'])} "
                             f"({percent(was['share'])} in {label})")
            elif measure in CLOCKS and was.get("median") and \
                    abs(values["median"] - was["median"]) >= CLOCK_STEP * was["median"]:
                found.append(f"{gpu} {CLOCKS[measure]} {values['median']:g} MHz "
                             f"({was['median']:g} MHz in {label})")
    had = {str(r.get("text")) for r in theirs.get("reasons") or [] if isinstance(r, Mapping)}
    found += [f"now: {r.get('text')}" for r in ours.get("reasons") or []
              if isinstance(r, Mapping) and str(r.get("text")) not in had]
    return found
