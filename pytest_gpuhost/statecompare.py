"""Comparing two host states (``state.py``'s): which checks changed, and whether the two are
the same state at all.

Nothing vouches for what it did not see: a target whose checks read nothing (each an error or
skipped: it was not reached, or no check applied) holds no state, whatever its digest (the ids
with no value are the same on every such run). Two states are the same only where both read
their every target and their digests agree; a comparison says which target read nothing where.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from .statepairs import pairs, same_machines

LIMIT = 20
"""Changed checks a comparison names; the rest are counted."""
SHORT = 12
"""Hex digits of a digest shown in a line (the reports hold all 64)."""
MISSING = object()
"""A check one state holds and the other does not."""


def shown(value: object) -> str:
    """A host value in a line for operators: control characters escaped, nothing read said so."""
    if value is None:
        return "(nothing read)"
    text = str(value)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def short(digest: object) -> str:
    return shown(digest)[:SHORT]


def read_nothing(checks: Mapping[str, str | None]) -> bool:
    """Whether a target's checks read no value at all (every one an error or skipped)."""
    return all(value is None for value in checks.values())


def unread(state: Mapping[str, Any]) -> dict[str, int]:
    """The targets of ``state`` that read nothing, each with its number of checks; computed
    from the checks (a state written before it said so reads the same)."""
    found = {}
    for name, target in (state.get("targets") or {}).items():
        checks = (target or {}).get("checks") or {}
        if read_nothing(checks):
            found[str(name)] = len(checks)
    return found


def read_none(state: Mapping[str, Any]) -> bool:
    """Whether no target of ``state`` read anything: no state to compare."""
    return len(unread(state)) == len(state.get("targets") or {})


class Change(msgspec.Struct, frozen=True):
    name: str
    """The check's id, with ``@target`` when the states have several targets."""
    old: object
    new: object

    def line(self, old_label: str, new_label: str) -> str:
        if self.old is MISSING:
            return f"{shown(self.name)}: only in {new_label} ({shown(self.new)})"
        if self.new is MISSING:
            return f"{shown(self.name)}: only in {old_label} ({shown(self.old)})"
        return f"{shown(self.name)}: {shown(self.old)} -> {shown(self.new)}"


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The checks whose observed value differs, and those on one side only, by id."""
    found: list[Change] = []
    for suffix, a, b in pairs(old, new):
        before = dict((a or {}).get("checks") or {})
        after = dict((b or {}).get("checks") or {})
        for check_id in sorted({*before, *after}):
            was, now = before.get(check_id, MISSING), after.get(check_id, MISSING)
            if check_id in before and check_id in after and was == now:
                continue
            found.append(Change(check_id + suffix, was, now))
    return found


def same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The same state: the same digest, or the same machines in the same state under other
    names (``statepairs.py``), and every target of both read something."""
    digests = bool(old.get("digest")) and old.get("digest") == new.get("digest")
    return (digests or same_machines(old, new)) and not unread(old) and not unread(new)


def nothing_in(count: int, label: str) -> str:
    """``in OLD (its 2 checks: errors or skipped)``."""
    return f"in {label} (its {count} check{'' if count == 1 else 's'}: errors or skipped)"


def _unread_sides(checks: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
                  labels: tuple[str, str]) -> str:
    """``in OLD (its 2 checks: errors or skipped) nor in NEW (...)``: the sides of one target
    that read nothing; "" where both read something."""
    sides = []
    for target, label in zip(checks, labels, strict=True):
        values = (target or {}).get("checks") or {}
        if target is not None and read_nothing(values):
            sides.append(nothing_in(len(values), label))
    return " nor ".join(sides)


def neither(old: Mapping[str, Any], new: Mapping[str, Any], labels: tuple[str, str]) -> str:
    """``in OLD (its 2 checks: ...) nor in NEW (...)``: two states that read nothing."""
    return " nor ".join(nothing_in(sum(unread(state).values()), label)
                        for state, label in zip((old, new), labels, strict=True))


def unread_line(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str,
                new_label: str) -> str | None:
    """What a comparison says first where a target read nothing on a side; None where none."""
    labels = (old_label, new_label)
    if read_none(old) and read_none(new):
        return f"not comparable: nothing was read {neither(old, new, labels)}, so nothing says " \
               "the host is the same"
    paired = pairs(old, new)
    found = [(suffix, _unread_sides((a, b), labels)) for suffix, a, b in paired]
    found = [(suffix, sides) for suffix, sides in found if sides]
    if not found:
        return None
    if len(paired) == 1:
        return f"host state not the same: nothing was read {found[0][1]}, so nothing says " \
               "the host is the same"
    named = "; ".join(f"on {shown(suffix[1:])} {sides}" for suffix, sides in found)
    return f"host state not the same: nothing was read {named}, so nothing says " \
           f"{'it is' if len(found) == 1 else 'they are'} the same"


def diff_lines(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str,
               new_label: str, limit: int | None = LIMIT, indent: str = "  ") -> list[str]:
    """What a comparison says: same state or not (the digests; a target that read nothing
    on either side is never the same), the spec if it changed, then one line per changed
    check, at most ``limit`` (None: all) and how many more."""
    lines: list[str] = []
    nothing = unread_line(old, new, old_label=old_label, new_label=new_label)
    found = changes(old, new)
    if nothing is not None:
        lines.append(nothing)
    elif same(old, new):
        lines.append(f"same host state ({short(new.get('digest'))})" if old.get("digest") ==
                     new.get("digest") else "same host state, the same machines under other "
                     f"names ({short(old.get('digest'))} in {old_label}, "
                     f"{short(new.get('digest'))} in {new_label})")
    else:
        lines.append(f"host state differs ({short(old.get('digest'))} in {old_label}, "
                     f"{short(new.get('digest'))} in {new_label}): "
                     f"{len(found)} check{'' if len(found) == 1 else 's'} changed")
    if nothing is None or not (read_none(old) and read_none(new)):
        listed = found if limit is None else found[:limit]
        lines += [indent + change.line(old_label, new_label) for change in listed]
        if len(found) > len(listed):
            lines.append(f"{indent}and {len(found) - len(listed)} more")
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("digest") != new_spec.get("digest"):
        lines.append(f"spec: {shown(old_spec.get('name'))} ({short(old_spec.get('digest'))}) "
                     f"in {old_label}, {shown(new_spec.get('name'))} "
                     f"({short(new_spec.get('digest'))}) in {new_label}")
    return lines
