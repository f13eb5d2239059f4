"""dmesg: one check that the kernel log has no records at the chosen levels, bar allowed noise.

Records come from dev/kmsg, whose ``PRIO`` field gives reliable levels. ``since: session`` judges
only records after the sequence number seen when the session collected its checks. The check runs
after every other check, so under --fix it sees what the fixes caused.

Capture allows the records that offended now by pattern: a record such as ``nvidia 0000:81:00.0:
Xid 79, pid=4242`` becomes ``^nvidia (?:H{4}:)?H{2}:H{2}\\.[0-7]: Xid \\d+, pid=\\d+$`` (H
stands for ``[0-9a-fA-F]``): anchored, its words literal (every regex metacharacter escaped), so
it allows the same message from another device, process or boot, and nothing else.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Host, Kmsg, Reply, Request
from ..linux.kmsg import LEVELS, Record, iter_records, level_number
from ..specmodel import EntryOptions, SpecContext, section
from ..specmodel.matchers import Verdict
from . import Check, Evidence, Fact, Facts, NoFix, Observation

if TYPE_CHECKING:  # capture's helpers load when a capture asks
    from ..specmodel import Node
    from .capturing import Captured, Records

KMSG = "dev/kmsg"
DEFAULT_LEVELS = ("emerg", "alert", "crit", "err", "warn")
SINCE = ("boot", "session")
SHOWN = 20
NAMED, SHORT = 3, 100
"""The failure's message names the first NAMED offending records, each cut to SHORT chars."""
KEPT = 1_000
"""Distinct offending texts kept in the record's details (``offending``), for --gpuhost-capture
to allow them by pattern; past that many, ``offending_cut`` says how many more there were."""
LAST = 10_000  # order rank: after every other kind


class DmesgSection(msgspec.Struct, frozen=True):
    levels: tuple[int, ...]
    since: str
    allow: tuple[re.Pattern[str], ...]
    options: EntryOptions


class NoRecords(msgspec.Struct, frozen=True):
    """The dmesg expectation: zero offending records."""

    section: DmesgSection

    def scope(self) -> str:
        levels = ", ".join(LEVELS[level] for level in self.section.levels)
        allowed = len(self.section.allow)
        noise = f", {allowed} allowed pattern{'s' if allowed != 1 else ''}" if allowed else ""
        return f"at {levels} since {self.section.since}{noise}"

    def describe(self) -> str:
        return f"0 records {self.scope()}"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "the kernel log could not be read")
        if observed == "0":
            return Verdict(True)
        return Verdict(False, f"{observed} kernel log record(s) {self.scope()}")

    def fix_value(self, observed: str | None) -> str | None:
        return None


def _last_seq(replies: Sequence[Reply]) -> int:
    if replies[0].error is not None:
        return -1  # no log yet: every record counts
    return max((r.seq for r in iter_records(replies[0].lines()) if r is not None), default=-1)


LAST_SEQ = Fact("newest kernel log record", (Kmsg(KMSG),), _last_seq)
"""The sequence number of the newest record, taken once when the session collects."""


def last_seq(host: Host) -> int:
    return LAST_SEQ.read(host)


class DmesgProbe(NoFix, msgspec.Struct, frozen=True):
    section: DmesgSection
    after_seq: int

    def reads(self) -> Sequence[Request]:
        return (Kmsg(KMSG),)

    def observe(self, host: Host) -> Observation:
        if not host.exists(KMSG):
            return Observation(None, problem=f"{KMSG} does not exist")
        considered, at_level, allowed, malformed, offending = _partition(
            iter_records(host.read_kmsg(KMSG)), self.section, self.after_seq)
        summary = (f"{considered} records since {self.section.since}, {at_level} at the "
                   f"levels, {allowed} allowed as noise, {len(offending)} offending")
        if malformed:
            summary += f"; {malformed} malformed line(s) skipped"
        evidence = [Evidence(KMSG, summary)]
        evidence += [Evidence(f"{KMSG} seq {r.seq}", str(r)) for r in offending[:SHOWN]]
        if len(offending) > SHOWN:
            evidence.append(Evidence(KMSG, f"... and {len(offending) - SHOWN} more"))
        named = "; ".join(_short(str(r)) for r in offending[:NAMED])
        more = f" (and {len(offending) - NAMED} more)" if len(offending) > NAMED else ""
        texts = list(dict.fromkeys(r.text for r in offending))
        details: dict[str, Any] = {"offending": texts[:KEPT]}
        if len(texts) > KEPT:
            details["offending_cut"] = len(texts) - KEPT
        return Observation(str(len(offending)), tuple(evidence), details=details,
                           culprits=f"first {named}{more}" if offending else None)


def _partition(records: Iterable[Record | None], section: DmesgSection, after_seq: int
               ) -> tuple[int, int, int, int, list[Record]]:
    """(considered, at the levels, allowed, malformed lines, the offending records), in one
    pass that keeps only the offending records: linear in the records (a membership test of
    each record in the allowed ones was quadratic: 40,000 vxlan lines took 76 s)."""
    levels = frozenset(section.levels)
    searches = [pattern.search for pattern in section.allow]
    considered = at_level = malformed = 0
    offending: list[Record] = []
    for record in records:
        if record is None:
            malformed += 1
            continue
        if record.seq <= after_seq:
            continue
        considered += 1
        if record.level not in levels:
            continue
        at_level += 1
        for search in searches:
            if search(record.text):
                break
        else:
            offending.append(record)
    return considered, at_level, at_level - len(offending), malformed, offending


def _short(text: str, width: int = SHORT) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


# -- capture: allow patterns -------------------------------------------------------------------

_HEX = "[0-9a-fA-F]"
_PIECES: tuple[tuple[str, str], ...] = (
    (rf"\b(?:{_HEX}{{4}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]\b",
     rf"(?:{_HEX}{{4}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"),
    (rf"\b{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}\b", rf"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}"),
    (rf"\b{_HEX}{{2}}(?::{_HEX}{{2}}){{5}}\b", rf"{_HEX}{{2}}(?::{_HEX}{{2}}){{5}}"),
    (rf"\b0x{_HEX}+\b", rf"0x{_HEX}+"),
    (rf"\b(?={_HEX}*[0-9])(?={_HEX}*[a-fA-F]){_HEX}{{8,}}\b", rf"{_HEX}+"),
    (r"(?<![A-Za-z_])\d+", r"\d+"),
)
"""(what to find, what stands for it), tried in this order at each position: PCI addresses
(with or without their domain or function), MAC addresses, 0x numbers, bare hex words of 8 or
more digits (kernel pointers), then runs of decimal digits that are not part of a name (PIDs,
counts, IPv4 parts; ``mlx5_core`` and ``eth0`` stay as they are)."""


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The tokens to generalize and the metacharacters to escape, compiled at a capture's first
    use (a verify never needs them) and kept: a capture's own patterns could push them out of
    ``re``'s cache."""
    return (re.compile("|".join(f"({find})" for find, _ in _PIECES)),
            re.compile(r"([.^$*+?{}\[\]\\|()])"))


def escape(text: str) -> str:
    """Regex metacharacters escaped, spaces and other characters kept as they are (readable in
    YAML, unlike re.escape's ``\\ ``)."""
    return _patterns()[1].sub(r"\\\1", text)


def generalize(text: str) -> str:
    """The anchored pattern that allows ``text`` and its kin (see the module's docstring)."""
    parts: list[str] = []
    position = 0
    for match in _patterns()[0].finditer(text):
        parts.append(escape(text[position:match.start()]))
        index = next(i for i, group in enumerate(match.groups()) if group is not None)
        parts.append(_PIECES[index][1])
        position = match.end()
    parts.append(escape(text[position:]))
    return "^" + "".join(parts) + "$"


def allow_patterns(texts: Iterable[str], existing: Iterable[re.Pattern[str]] = ()) -> list[str]:
    """One pattern per kind of record not already allowed, in the order first seen."""
    allowed = list(existing)
    patterns: dict[str, None] = {}
    for text in texts:
        if any(p.search(text) for p in allowed):
            continue
        pattern = generalize(text)
        if pattern not in patterns:
            patterns[pattern] = None
            allowed.append(re.compile(pattern))
    return list(patterns)


def capture_dmesg(model: DmesgSection, records: Records) -> Captured:
    """The levels and since as the spec had them; ``allow:`` patterns for what offended now."""
    from .capturing import Captured, options_of, problem, records_of, when_false

    out = Captured()
    found = records_of(records, "dmesg")
    settings: dict[str, Any] = {"levels": [LEVELS[level] for level in model.levels],
                                "since": model.since}
    existing = [p.pattern for p in model.allow]
    if when_false(found, model.options):
        out.entries.update({**settings, **({"allow": existing} if existing else {}),
                            **options_of(model.options)})
        return out
    why = problem(found)
    if why is not None:
        out.leave_out("dmesg", why)
        return out
    offending = [str(t) for r in found for t in r.details.get("offending", ())]
    cut = sum(int(r.details.get("offending_cut", 0)) for r in found)
    if cut:
        out.leave_out("dmesg", f"{cut} more distinct offending records than the record keeps: "
                      "they are not allowed here")
    allow = existing + allow_patterns(offending, model.allow)
    out.entries.update({**settings, **({"allow": allow} if allow else {}),
                        **options_of(model.options)})
    return out


class DmesgKind:
    section = "dmesg"
    keys = ("levels", "since", "allow")
    capture = staticmethod(capture_dmesg)

    def parse(self, node: Node, context: SpecContext) -> DmesgSection:
        levels: tuple[int, ...] = tuple(level_number(name) for name in DEFAULT_LEVELS)
        since = "boot"
        allow: tuple[re.Pattern[str], ...] = ()
        given = section(node, "dmesg", self.keys, context, empty=True)
        for key, value in given.values.items():
            if key == "levels":
                levels = tuple(self._level(item) for item in value.sequence("dmesg levels"))
                if not levels:
                    raise value.error("dmesg levels is empty; expected names like [err, warn]")
            elif key == "since":
                since = value.string("dmesg since")
                if since not in SINCE:
                    raise value.error(f"dmesg since must be one of: {', '.join(SINCE)}")
            elif key == "allow":
                allow = tuple(item.regex("a dmesg allow pattern")
                              for item in value.sequence("dmesg allow"))
        return DmesgSection(tuple(sorted(set(levels))), since, allow, given.options)

    @staticmethod
    def _level(node: Node) -> int:
        try:
            return level_number(node.string("a dmesg level"))
        except ValueError as exc:
            raise node.error(str(exc)) from None

    def facts(self, section: DmesgSection) -> Sequence[Fact[Any]]:
        return [LAST_SEQ] if section.since == "session" else []

    def expand(self, section: DmesgSection, facts: Facts) -> Sequence[Check]:
        after = facts.get(LAST_SEQ) if section.since == "session" else -1
        probe = DmesgProbe(section, after)
        return [Check("dmesg", None, NoRecords(section), section.options, probe, order=LAST,
                      hardware=True, fresh=True, measured=True)]
