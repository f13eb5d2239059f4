"""The p2p section as captured: a floor per class at 90% of the lowest pair measured, rounded
down (to a whole GB/s, or to 0.1 below 1), a path floor at 90% of the lowest share of its path's
limit; the probe, size and margin as the spec had them.

Apart from ``p2p.py`` so that the measurement's module stays as it is; ``P2pKind.capture`` is
this module's ``capture_p2p``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..result import CheckResult
from .capturing import Captured, Records, options_of, problem, when_false
from .p2p import CLASSES, FLOORS, P2pSection

P2P_SHARE = 0.9


def p2p_floor(lowest: float) -> float | int:
    """90% of the lowest measurement, rounded down: to a whole GB/s, or to 0.1 below 1."""
    share = lowest * P2P_SHARE
    return math.floor(share) if share >= 1 else math.floor(share * 10) / 10


def _size(size: int) -> str | int:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return size


def capture_p2p(model: P2pSection, records: Records) -> Captured:
    out = Captured()
    every = [r for kind in ("p2p", "p2p.h2d", "p2p.d2h", "p2p.concurrent")
             for r in records.get(kind, ())]
    if when_false(every, model.options):
        out.entries.update(_p2p_settings(model, dict(model.floors), model.concurrent,
                                         model.path_floor.fraction if model.path_floor else None))
        return out
    lone = [r for r in records.get("p2p", ()) if r.key is None]
    if lone:
        out.leave_out("p2p", lone[0].message)
        return out
    pairs = records.get("p2p", ())
    unclassed = [r for r in pairs if "class" not in r.details]
    floors: dict[str, float | int] = {}
    for name in FLOORS:
        if model.floor(name) is None:
            continue
        if name in CLASSES:
            found = [r for r in pairs if r.details.get("class") == name]
            if unclassed:
                out.leave_out(f"p2p floor {name}", f"{unclassed[0].key}: {unclassed[0].message}")
                continue
        else:
            found = list(records.get(f"p2p.{name}", ()))
        lowest = _lowest(found, f"p2p floor {name}", out)
        if lowest is not None:
            floors[name] = p2p_floor(lowest)
    concurrent = None
    if model.concurrent is not None:
        lowest = _lowest(list(records.get("p2p.concurrent", ())), "p2p concurrent", out)
        concurrent = p2p_floor(lowest) if lowest is not None else None
    usable = {name: value for name, value in floors.items() if value > 0}
    share = _path_share(model, pairs, out)
    if not usable and not concurrent and share is None:
        return out
    out.entries.update(_p2p_settings(model, usable, concurrent, share))
    return out


def _path_share(model: P2pSection, pairs: Sequence[CheckResult], out: Captured
                ) -> float | None:
    """``floors: path``: 90% of the lowest share of its path's limit a pair reached (of the
    limit the spec names: as negotiated, or as capable), rounded down to a hundredth."""
    if model.path_floor is None:
        return None
    name = "capable_fraction" if model.path_floor.capability else "fraction"
    missing = [r for r in pairs if not isinstance(r.details.get(name), (int, float))]
    if not pairs or missing:
        where = f"{missing[0].key}: {missing[0].message}" if missing else "no pair measured"
        out.leave_out("p2p floor path", where)
        return None
    share = math.floor(min(float(r.details[name]) for r in pairs) * P2P_SHARE * 100) / 100
    if share <= 0:
        out.leave_out("p2p floor path", "a pair measured next to nothing of its path's limit")
        return None
    return share


def _lowest(found: Sequence[CheckResult], label: str, out: Captured) -> float | None:
    why = problem(found)
    if why is not None:
        where = next((f"{r.key}: " for r in found if r.observed is None and r.key), "")
        out.leave_out(label, where + why)
        return None
    return min(float(str(r.observed)) for r in found)


def _p2p_settings(model: P2pSection, floors: Mapping[str, float | int],
                  concurrent: float | int | None, share: float | None = None
                  ) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "probe": f"file:{model.path}" if model.probe == "file" else model.probe,
        "size": _size(model.size)}
    path = model.path_floor if share is not None else None
    shares = {"path": share, **({"of": "capability"} if path.capability else {})} \
        if path is not None else {}
    if floors or shares:
        settings["floors"] = {**floors, **shares}
    if concurrent:
        settings["concurrent"] = {"floor": concurrent}
    if model.warn_margin:
        settings["warn_margin"] = f"{model.warn_margin * 100:g}%"
    return {**settings, **options_of(model.options)}
