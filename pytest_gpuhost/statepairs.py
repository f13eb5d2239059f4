"""Which target of one host state is which of another, for comparing them (``state.py``): the
same machines are the same state whatever they were called.

A state names each target's machine where the run could tell it (``machine``: a keyed hash of
its machine-id and root, ``session/machines.py``): ``lxc://101`` on the host's root and
``ssh://HOST/ROOT?lxc=101`` reach one container, named ``lxc-101`` in one run and
``HOST-lxc-101`` in the other. Targets pair by their machine first (a machine held by one target
on each side), then the rest by name; a single target on each side pairs whatever its name or
machine (one target's digest is its own). Two states are the same when their digests are, or
when every target pairs with one whose digest is its own.

No pytest, no host: JSON values in, pairs out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Target = Mapping[str, Any]
Pair = tuple[str, Target | None, Target | None]
"""The suffix that names a check of the pair (``@NAME``, ``@OLD/NEW`` when the names differ,
"" for one target each), and each side's target (None: only on the other side)."""


def _machines(targets: Mapping[str, Target]) -> dict[str, str]:
    """Each machine held by exactly one target -> that target's name."""
    seen: dict[str, list[str]] = {}
    for name, target in targets.items():
        machine = target.get("machine") if isinstance(target, Mapping) else None
        if isinstance(machine, str) and machine:
            seen.setdefault(machine, []).append(name)
    return {machine: names[0] for machine, names in seen.items() if len(names) == 1}


def pairs(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Pair]:
    """The targets of two states, paired (see the module's docstring), in the old state's
    order, then the new state's targets that pair with none."""
    a, b = old.get("targets") or {}, new.get("targets") or {}
    if len(a) == 1 and len(b) == 1:
        return [("", next(iter(a.values())), next(iter(b.values())))]
    theirs = _machines(b)
    partner: dict[str, str] = {}
    for machine, name in _machines(a).items():
        if machine in theirs:
            partner[name] = theirs[machine]
    taken = set(partner.values())
    for name in a:
        if name not in partner and name in b and name not in taken:
            partner[name] = name
            taken.add(name)
    found: list[Pair] = []
    for name, target in a.items():
        other = partner.get(name)
        suffix = f"@{name}" if other in (None, name) else f"@{name}/{other}"
        found.append((suffix, target, b[other] if other is not None else None))
    found += [(f"@{name}", None, target) for name, target in b.items() if name not in taken]
    return found


def same_machines(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether every target of either state pairs with one of the other whose digest is its
    own: the same state, under other names."""
    found = pairs(old, new)
    return bool(found) and all(
        a is not None and b is not None and bool(a.get("digest"))
        and a.get("digest") == b.get("digest") for _, a, b in found)
