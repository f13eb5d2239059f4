"""Drift: for each check (spec file + id), the targets grouped by the value they hold, the
majority first; every other group's targets are the minority, flagged whether or not their value
passes the spec (one node trained at Gen4 among Gen5 peers passes ``min: 8 GT/s`` and is still
the odd one out; so is one node on another driver).

Measurements (a record's ``measured``: p2p bandwidth) are left out: no two runs measure the same
number, and their floors already say what is too low.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from . import GOOD, FleetRow, Sections, check_key

NO_VALUE = "(no value)"


class Group(msgspec.Struct, frozen=True):
    value: str
    targets: tuple[str, ...]
    passes: bool
    """Every record in the group passed, was fixed or skipped."""


class Drift(msgspec.Struct, frozen=True):
    spec: str
    id: str
    kind: str
    groups: tuple[Group, ...]
    """The majority first (most targets; a tie goes to the value that sorts first)."""

    @property
    def majority(self) -> Group:
        return self.groups[0]

    @property
    def minority(self) -> tuple[str, ...]:
        return tuple(t for group in self.groups[1:] for t in group.targets)

    @property
    def all_pass(self) -> bool:
        return all(group.passes for group in self.groups)


def shown_value(observed: object) -> str:
    return NO_VALUE if observed is None else " ".join(str(observed).split()) or '""'


def find_drift(targets: Sequence[FleetRow]) -> list[Drift]:
    """Every check whose targets do not all hold one value, in the order checks first appear."""
    values: dict[tuple[str, str], dict[str, list[str]]] = {}
    passing: dict[tuple[str, str], dict[str, bool]] = {}
    kinds: dict[tuple[str, str], str] = {}
    sections = Sections.of(targets)
    for target in targets:
        if target.reason is not None:
            continue
        for record in target.records:
            if sections.measured(record):
                continue
            kind = str(record.get("kind", ""))
            key = check_key(record)
            value = shown_value(record.get("observed"))
            values.setdefault(key, {}).setdefault(value, []).append(target.name)
            good = passing.setdefault(key, {})
            good[value] = good.get(value, True) and record.get("outcome") in GOOD
            kinds.setdefault(key, kind)
    drifts = []
    for key, by_value in values.items():
        if len(by_value) < 2:
            continue
        ordered = sorted(by_value.items(), key=lambda item: (-len(item[1]), item[0]))
        groups = tuple(Group(value, tuple(names), passing[key][value])
                       for value, names in ordered)
        drifts.append(Drift(key[0], key[1], kinds[key], groups))
    return drifts
