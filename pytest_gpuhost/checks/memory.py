"""memory: transparent hugepages, the ``[bracketed]`` word of transparent_hugepage/enabled.

Fixed by writing the word to the file; --fix-persist adds a tmpfiles.d line that writes it at
every boot. A kernel built without THP has no file: the check is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..host import Host, Read, Request
from ..linux.sysfs import bracketed
from ..result import CheckResult, Outcome
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Choice, Expectation
from . import Check, Evidence, Facts, NotApplicable, Observation, PersistLine

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

THP = "sys/kernel/mm/transparent_hugepage/enabled"
THP_MODES = ("always", "madvise", "never")
KEYS = ("transparent_hugepage",)


class ThpProbe(msgspec.Struct, frozen=True):
    fixable = True

    def reads(self) -> Sequence[Request]:
        return (Read(THP),)

    def _read(self, host: Host) -> str:
        if not host.exists(THP):
            raise NotApplicable(f"{THP} does not exist: this kernel has no transparent hugepages")
        return host.read_text(THP).strip()

    def observe(self, host: Host) -> Observation:
        raw = self._read(host)
        selected = bracketed(raw, THP_MODES)
        return Observation(selected, (Evidence(THP, raw),),
                           problem=None if selected else f"{THP} selects nothing: {raw!r}")

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan, WriteText  # a plan's: a check that passes makes none

        raw = self._read(host)
        return Plan(f"write {value!r} to {THP}", (WriteText(THP, raw + "\n", value + "\n"),))


class MemoryEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Expectation
    options: EntryOptions


class MemoryKind:
    section = "memory"

    @staticmethod
    def persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
        """The lines --fix-persist writes for this kind's checks (see ``_persistence``)."""
        return _persistence(results)

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        return ("tmpfiles",) if check.kind == "memory.transparent_hugepage" else ()

    @staticmethod
    def capture(model: Sequence[MemoryEntry], records: Records) -> Captured:
        from .capturing import Captured, Rule, capture_key, records_of

        out = Captured()
        for item in model:
            capture_key(item.key, records_of(records, f"memory.{item.key}"), item.expect,
                        item.options, Rule(one_of=True), out, f"memory.{item.key}")
        return out

    def parse(self, node: Node, context: SpecContext) -> tuple[MemoryEntry, ...]:
        pairs = node.mapping("memory")
        if not pairs:
            raise node.error(f"memory is empty; expected one of: {', '.join(KEYS)}")
        entries = []
        for key, value in pairs:
            if key not in KEYS:
                raise value.unknown_key(key, "memory", KEYS)
            expect, options = parse_expectation(value, context, Choice(THP_MODES),
                                                what=f"memory {key}", matchers=("one_of",))
            entries.append(MemoryEntry(key, expect, options))
        return tuple(entries)

    def expand(self, section: tuple[MemoryEntry, ...], facts: Facts) -> Sequence[Check]:
        return [Check(f"memory.{e.key}", None, e.expect, e.options, ThpProbe()) for e in section]


def _persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    return [PersistLine("tmpfiles", f"w /{THP} - - - - {r.observed}") for r in results
            if r.kind == "memory.transparent_hugepage" and r.observed
            and r.outcome in (Outcome.PASSED, Outcome.FIXED)]
