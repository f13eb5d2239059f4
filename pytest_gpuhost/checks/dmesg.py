"""dmesg: one check that the kernel log has no records at the chosen levels, bar allowed noise.

Records come from dev/kmsg, whose ``PRIO`` field gives reliable levels. ``since: session`` judges
only records after the sequence number seen when the session collected its checks, ``since:`` a
time only those logged from then on (the boot's time, ``btime`` of proc/stat, plus a record's
time since boot). The check runs after every other check, so under --fix it sees what the fixes
caused. NVIDIA's GPU events (Xid, SXid, a GPU off the bus) are judged by ``xid:`` instead of
their level (``dmesg_xid``): a failing one fails the check, naming its action; a warning leaves
it passed, as a value close to its floor does.

Capture allows the records that offended now by pattern: a record such as ``nvidia 0000:81:00.0:
Xid 79, pid=4242`` becomes ``^nvidia (?:H{4}:)?H{2}:H{2}\\.[0-7]: Xid \\d+, pid=\\d+$`` (H
stands for ``[0-9a-fA-F]``): anchored, its words literal (every regex metacharacter escaped), so
it allows the same message from another device, process or boot, and nothing else. An Xid's
pattern keeps its code (``Xid \\(PCI:H{4}:H{2}:H{2}\\): 13, pid=\\d+``): allowing Xid 13 never
allows Xid 79. A failing Xid (a hardware one) is never allowed: capture writes its pattern
commented out, with a line saying why.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import msgspec

from .. import long_lived
from ..host import Host, HostError, Kmsg, Read, Reply, Request
from ..linux.kmsg import LEVELS, Record, iter_records, level_number
from ..linux.xid import DRIVERS, code_span
from ..specmodel import EntryOptions, SpecContext, section
from ..specmodel.matchers import Verdict
from . import Check, Evidence, Fact, Facts, NoFix, Observation
from .dmesg_xid import FAIL, XidLog, XidRule, rule_of

if TYPE_CHECKING:  # capture's helpers load when a capture asks
    from ..specmodel import Node
    from .capturing import Captured, Records

KMSG = "dev/kmsg"
DEFAULT_LEVELS = ("emerg", "alert", "crit", "err", "warn")
SINCE = ("boot", "session")
"""Besides a time (``2026-12-01T00:00:00Z``; without a zone, UTC)."""
BOOT_TIME = "proc/stat"
SHOWN = 20
NAMED, SHORT = 3, 100
"""The failure's message names the first NAMED offending records, each cut to SHORT chars."""
KEPT = 1_000
"""Distinct offending texts kept in the record's details (``offending``), for --gpuhost-capture
to allow them by pattern; past that many, ``offending_cut`` says how many more there were."""
LAST = 10_000  # order rank: after every other kind
_SEQ, _RECORD = attrgetter("seq"), attrgetter("record")


class DmesgSection(msgspec.Struct, frozen=True):
    levels: tuple[int, ...]
    since: str
    allow: tuple[re.Pattern[str], ...]
    options: EntryOptions
    xid: XidRule = XidRule()
    after: float | None = None
    """``since:`` a time: seconds since the epoch."""


class NoRecords(msgspec.Struct, frozen=True):
    """The dmesg expectation: zero offending records."""

    section: DmesgSection
    warning: str = ""
    """The GPU events that leave the check passed (an application's Xid), as the observation
    found them."""
    lead: str = ""
    """The failing GPU events, each with its action: what a failure's message says first (the
    line pytest's short summary cuts)."""

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
            return Verdict(True, warning=self.warning)
        counted = f"{observed} kernel log record(s) {self.scope()}"
        return Verdict(False, f"{self.lead}; {counted}" if self.lead else counted)

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
        return (Kmsg(KMSG),) if self.section.after is None else (Kmsg(KMSG), Read(BOOT_TIME))

    def observe(self, host: Host) -> Observation:
        if not host.exists(KMSG):
            return Observation(None, problem=f"{KMSG} does not exist")
        after_usec = None
        if self.section.after is not None:
            boot = _boot_time(host)
            if boot is None:
                return Observation(None, problem=f"'since: {self.section.since}' needs the "
                                   f"boot's time, and {BOOT_TIME} has no btime line")
            after_usec = (self.section.after - boot) * 1e6
        xids = XidLog(self.section.xid)
        with long_lived.paused():  # a flood's events, kept, would set the collector walking
            walk = _partition(iter_records(host.read_kmsg(KMSG)), self.section,
                              self.after_seq, after_usec, xids)
            judged = xids.judged()
        count = len(walk.offending) + len(judged.failing)
        offending = heapq.nsmallest(  # sorted(...)[:SHOWN], not the whole flood sorted
            SHOWN, itertools.chain(walk.offending, map(_RECORD, judged.failing)), key=_SEQ)
        summary = (f"{walk.considered} records since {self.section.since}, {walk.at_level} at "
                   f"the levels, {walk.allowed} allowed as noise, {count} offending")
        if walk.malformed:
            summary += f"; {walk.malformed} malformed line(s) skipped"
        events = len(judged.failing) + len(judged.warned)
        if events or judged.set_aside:
            summary += (f"; GPU events: {len(judged.failing)} failing, {len(judged.warned)} "
                        f"warning(s), {sum(a['count'] for a in judged.set_aside)} set aside")
        evidence = [Evidence(KMSG, summary)]
        if judged.set_aside:
            evidence.append(Evidence(KMSG, judged.note()))
        evidence += [Evidence(f"{KMSG} seq {r.seq}", str(r)) for r in offending]
        if count > SHOWN:
            evidence.append(Evidence(KMSG, f"... and {count - SHOWN} more"))
        evidence += [Evidence(f"{KMSG} seq {s.record.seq} (warning)", str(s.record))
                     for s in judged.warned[:SHOWN]]
        others = walk.offending
        named = "; ".join(_short(str(r)) for r in others[:NAMED])
        more = f" (and {len(others) - NAMED} more)" if len(others) > NAMED else ""
        texts = list(dict.fromkeys(r.text for r in others))
        details: dict[str, Any] = {"offending": texts[:KEPT], **judged.details()}
        if len(texts) > KEPT:
            details["offending_cut"] = len(texts) - KEPT
        return Observation(str(count), tuple(evidence), details=details,
                           culprits=f"first {named}{more}" if others else None,
                           expect=NoRecords(self.section, judged.warning(), judged.failure())
                           if judged.warned or judged.failing else None)


def _boot_time(host: Host) -> float | None:
    """The boot's time (seconds since the epoch) from proc/stat's ``btime``, or None."""
    try:
        text = host.read_text(BOOT_TIME)
    except HostError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "btime" and value.strip().isdigit():
            return float(value)
    return None


class Walk(msgspec.Struct, frozen=True):
    """What one pass over the kernel log counted and kept."""

    considered: int = 0
    at_level: int = 0
    allowed: int = 0
    malformed: int = 0
    offending: list[Record] = msgspec.field(default_factory=list)
    """The records at the levels, not allowed, that are no GPU event the ``xid:`` rule judges."""


def _partition(records: Iterable[Record | None], section: DmesgSection, after_seq: int,
               after_usec: float | None, xids: XidLog) -> Walk:
    """The records counted, in one pass that keeps only the offending records and the GPU
    events: linear in the records (a membership test of each record in the allowed ones was
    quadratic: 40,000 vxlan lines took 76 s). A record that is not an NVIDIA driver's costs
    what it cost before the GPU events were judged, but one prefix test."""
    levels = frozenset(section.levels)
    searches = [pattern.search for pattern in section.allow]
    drivers, starts, feed, keep = DRIVERS, str.startswith, xids.feed, xids.keep
    offending: list[Record] = []
    if after_usec is not None:  # since a time: a test that a run since boot never pays
        records = (r for r in records if r is None or r.usec >= after_usec)
    considered = at_level = malformed = 0
    events_at = events_allowed = 0  # the GPU events the xid: rule judged: at the levels, allowed
    for record in records:
        if record is None:
            malformed += 1
            continue
        if record.seq <= after_seq:
            continue
        considered += 1
        text = record.text
        if starts(text, drivers):
            at = record.level in levels
            seen = feed(record, considered)
            if seen is not None:
                events_at += at
                for search in searches:
                    if search(text):
                        events_allowed += 1
                        break
                else:
                    keep(seen)
                continue
            if not at:
                continue
        elif record.level not in levels:
            continue
        at_level += 1
        for search in searches:
            if search(text):
                break
        else:
            offending.append(record)
    return Walk(considered, at_level + events_at,
                at_level - len(offending) + events_allowed, malformed, offending)


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
    return "^" + _general(text) + "$"


def xid_pattern(text: str) -> str:
    """``generalize`` of an Xid or SXid record, its code kept as it is: Xid 13's pattern
    never allows Xid 79."""
    span = code_span(text)
    if span is None:
        return generalize(text)
    start, end = span
    return "^" + _general(text[:start]) + text[start:end] + _general(text[end:]) + "$"


def _general(text: str) -> str:
    parts: list[str] = []
    position = 0
    for match in _patterns()[0].finditer(text):
        parts.append(escape(text[position:match.start()]))
        index = next(i for i, group in enumerate(match.groups()) if group is not None)
        parts.append(_PIECES[index][1])
        position = match.end()
    parts.append(escape(text[position:]))
    return "".join(parts)


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
    if model.xid != XidRule():
        settings["xid"] = {"fail": list(model.xid.fail), "warn": list(model.xid.warn)}
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
    allow += _xid_patterns(out, [e for r in found for e in r.details.get("xid", ())],
                           [*model.allow, *(re.compile(p) for p in allow)])
    out.entries.update({**settings, **({"allow": allow} if allow else {}),
                        **options_of(model.options)})
    return out


def _xid_patterns(out: Captured, events: Iterable[Any], allowed: list[re.Pattern[str]]
                  ) -> list[str]:
    """A pattern for each kind of GPU event that left the check passed (an application's
    Xid); a failing one (a hardware Xid) is never allowed: its pattern is written commented
    out, below the reason."""
    patterns: list[str] = []
    refused: set[str] = set()
    for event in events:
        if not isinstance(event, dict) or not isinstance(event.get("text"), str):
            continue
        text = event["text"]
        if any(p.search(text) for p in allowed):
            continue
        pattern = xid_pattern(text)
        if event.get("verdict") == FAIL:
            if pattern not in refused:
                refused.add(pattern)
                what = f"{event.get('kind')} {event.get('code')}" \
                    if event.get("code") is not None else "NVRM"
                out.leave_out("dmesg", f"{what} ({event.get('description')}) on "
                              f"{event.get('gpu')} is {event.get('class')}, never allowed: "
                              f"{event.get('advice')}")
                out.notes.append(f"allow: - '{pattern}'")
            continue
        patterns.append(pattern)
        allowed.append(re.compile(pattern))
    return patterns


def _time(text: str, node: Node) -> float:
    """``2026-12-01T00:00:00Z`` -> seconds since the epoch (a time without a zone is UTC)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise node.error(f"dmesg since must be one of: {', '.join(SINCE)}, or a time such as "
                         f"2026-12-01T00:00:00Z; got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _xid_rule(node: Node) -> XidRule:
    """``{fail: [hardware, ...], warn: [application]}``."""
    lists: dict[str, tuple[str, ...]] = {}
    for key, value in node.mapping("dmesg xid"):
        if key not in ("fail", "warn"):
            raise value.unknown_key(key, "dmesg xid", ("fail", "warn"))
        lists[key] = tuple(item.string(f"an Xid class of xid.{key}")
                           for item in value.sequence(f"dmesg xid.{key}"))
    try:
        return rule_of(lists.get("fail"), lists.get("warn"))
    except ValueError as exc:
        raise node.error(str(exc)) from None


class DmesgKind:
    section = "dmesg"
    keys = ("levels", "since", "xid", "allow")
    capture = staticmethod(capture_dmesg)

    def parse(self, node: Node, context: SpecContext) -> DmesgSection:
        levels: tuple[int, ...] = tuple(level_number(name) for name in DEFAULT_LEVELS)
        since = "boot"
        allow: tuple[re.Pattern[str], ...] = ()
        after: float | None = None
        rule = XidRule()
        given = section(node, "dmesg", self.keys, context, empty=True)
        for key, value in given.values.items():
            if key == "levels":
                levels = tuple(self._level(item) for item in value.sequence("dmesg levels"))
                if not levels:
                    raise value.error("dmesg levels is empty; expected names like [err, warn]")
            elif key == "since":
                since = value.string("dmesg since")
                if since not in SINCE:
                    after = _time(since, value)
            elif key == "xid":
                rule = _xid_rule(value)
            elif key == "allow":
                allow = tuple(item.regex("a dmesg allow pattern")
                              for item in value.sequence("dmesg allow"))
        return DmesgSection(tuple(sorted(set(levels))), since, allow, given.options, rule,
                            after)

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
