"""The dmesg check's GPU events judged: each Xid classified, set aside when its GPU was reset since.

The dmesg check walks the kernel log once; each record goes through ``XidLog.feed``, which keeps
the Xid, SXid and off-the-bus events and notes what resets a GPU (a driver load, ``GPU reset``).
At the end ``judged`` sorts the events: set aside (their GPU was reset or the driver loaded
after them), failing (a class of ``xid.fail`` whose action is not ``none``) or warnings (a class
of ``xid.warn``, or action ``none``). A class in neither list is judged as any other record, by
its level.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from operator import attrgetter
from typing import Any, NamedTuple

import msgspec

from ..linux import xid as parse
from ..linux.kmsg import Record
from ..linux.xidcatalog import (
    APPLICATION,
    CLASSES,
    DRIVER,
    HARDWARE,
    INTERCONNECT,
    NONE,
    UNKNOWN,
    Entry,
    severity,
    sxid_entry,
    xid_entry,
)
from ..linux.xidcatalog import (
    FALLEN_OFF as FALLEN_OFF_ENTRY,
)
from ..linux.xidcatalog import (
    INIT_FAILED as INIT_FAILED_ENTRY,
)

DEFAULT_FAIL = (HARDWARE, INTERCONNECT, DRIVER, UNKNOWN)
DEFAULT_WARN = (APPLICATION,)
NAMED = 5
"""The message names the NAMED most severe groups of events (GPU, code), then counts the rest."""
KEPT = 200
"""Events kept in the record's ``details.xid``; past that many, ``xid_cut`` says how many more."""
FAIL, WARN = "fail", "warn"


class XidRule(msgspec.Struct, frozen=True):
    """The spec's ``xid: {fail: [...], warn: [...]}``: which classes fail the check and which
    leave it passed with a warning."""

    fail: tuple[str, ...] = DEFAULT_FAIL
    warn: tuple[str, ...] = DEFAULT_WARN

    def verdict(self, entry: Entry) -> str | None:
        """``fail``, ``warn``, or None: a class the rule leaves to the levels."""
        if entry.cls in self.fail:
            return WARN if entry.action == NONE else FAIL
        if entry.cls in self.warn:
            return WARN
        return None


def rule_of(fail: Sequence[str] | None, warn: Sequence[str] | None) -> XidRule:
    """A list the spec leaves out is its default less the classes the other list names;
    ValueError for an unknown class or one named in both."""
    for name in (*(fail or ()), *(warn or ())):
        if name not in CLASSES:
            raise ValueError(f"unknown Xid class {name!r}; expected one of: {', '.join(CLASSES)}")
    both = sorted(set(fail or ()) & set(warn or ()))
    if both:
        raise ValueError(f"Xid class {both[0]!r} is in both xid.fail and xid.warn")
    if fail is None:
        fail = tuple(c for c in DEFAULT_FAIL if c not in (warn or ()))
    if warn is None:
        warn = tuple(c for c in DEFAULT_WARN if c not in fail)
    return XidRule(tuple(fail), tuple(warn))


class Seen(NamedTuple):
    """One GPU event the rule judges. An Xid or SXid keeps what judges and names it (kind,
    code, GPU, entry); the rest of its event is parsed again from its record when a report
    shows it (``event``): a flood of 50,000 builds none of them."""

    record: Record
    kind: str
    code: int | None
    gpu: str | None
    entry: Entry
    verdict: str
    order: tuple[int, str, int, int]
    """Most severe first, then by GPU, code and sequence number."""
    parsed: parse.XidEvent | None = None
    """An event without an Xid, as the walk parsed it (its GPU may be a record before's)."""

    @property
    def event(self) -> parse.XidEvent:
        event = self.parsed if self.parsed is not None else parse.parse_event(self.record.text)
        if event is None:  # pragma: no cover - a Seen is made of a parsed event
            raise ValueError(f"no GPU event in {self.record.text!r}")
        return event if event.gpu == self.gpu else event._replace(gpu=self.gpu)

    def on(self, gpu: str) -> Seen:
        """The event of ``gpu``, the GPU its UUID names."""
        rank, _, code, seq = self.order
        return self._replace(gpu=gpu, order=(rank, gpu, code, seq))


_ORDER = attrgetter("order")
_GROUP = attrgetter("gpu", "kind", "code", "entry")


def entry_of(event: parse.XidEvent) -> Entry:
    if event.kind == "SXid" and event.code is not None:
        return sxid_entry(event.code, event.detail)
    if event.code is not None:
        return xid_entry(event.code, event.detail)
    return FALLEN_OFF_ENTRY if event.detail == parse.FALLEN_OFF else INIT_FAILED_ENTRY


class _Head(NamedTuple):
    """An Xid's kind, code and GPU, and, where its text after the code cannot change it, its
    entry, verdict and rank: the same for every record of one GPU and code."""

    kind: str
    code: int
    gpu: str
    entry: Entry | None
    verdict: str | None
    rank: int


class XidLog:
    """The GPU events of one walk of the kernel log, and the resets and driver loads in it."""

    def __init__(self, rule: XidRule) -> None:
        self.rule = rule
        self.events: list[Seen] = []
        self.resets: dict[str, tuple[int, str]] = {}
        """GPU -> (sequence number, what) of its last reset."""
        self.load: tuple[int, str] | None = None
        """(sequence number of its first record, what) of the last driver load."""
        self.uuids: dict[str, str] = {}
        self._run_start: int | None = None
        self._last = -2
        self._the_gpu: str | None = None
        self._heads: dict[str, _Head] = {}
        """``Xid (PCI:0000:9b:00): 119`` -> what judges it, once a walk: a flood repeats it."""

    def feed(self, record: Record, index: int) -> Seen | None:
        """The GPU event ``record``, a record of NVIDIA's modules (``parse.DRIVERS``) and
        the ``index``-th record considered, is, where the rule judges its class; None for any
        other record (a reset or load is noted on the way). The other records are never fed
        (a million records of noise cost nothing here): a gap in ``index`` is one of them,
        which ends a run of the driver's records."""
        text = record.text
        match = parse.xid_head(text)
        if match is not None:
            self._last = index
            self._run_start = None  # an Xid is no part of a load's probe
            head = self._heads.get(match.group())
            if head is None:
                head = self._heads[match.group()] = self._head(match)
            if head.entry is None:  # an SXid, or Xid 154: its text says which entry
                return self._xid(record, match, head)
            if head.verdict is None:
                return None
            return Seen(record, head.kind, head.code, head.gpu, head.entry, head.verdict,
                        (head.rank, head.gpu, head.code, record.seq))
        if index != self._last + 1:
            self._run_start = None
        self._last = index
        event = parse.event_without_xid(text)
        if event is None and parse.unloading(text):
            self._run_start = None  # a load's run of records starts after these
            return None
        if self._run_start is None:
            self._run_start = record.seq
        if event is not None:
            if event.gpu is None and self._the_gpu is not None:
                event = event._replace(gpu=self._the_gpu)
            entry = entry_of(event)
            verdict = self.rule.verdict(entry)
            if verdict is None:
                return None
            order = (-severity(entry.action), event.gpu or "", 0, record.seq)
            return Seen(record, event.kind, None, event.gpu, entry, verdict, order, event)
        self._the_gpu = parse.the_gpu(text) or self._the_gpu
        mark = parse.marker(text)
        if mark is not None and mark.gpu is None:
            self.load = (self._run_start, f"{mark.what} (seq {record.seq})")
        elif mark is not None and mark.gpu is not None:
            self.resets[mark.gpu] = (record.seq, f"{mark.what} (seq {record.seq})")
        uuid = parse.uuid_of(text)
        if uuid is not None:
            self.uuids[uuid[0]] = uuid[1]
        return None

    def _xid(self, record: Record, match: re.Match[str], head: _Head) -> Seen | None:
        """An SXid, or Xid 154, whose text says which entry."""
        detail = parse.xid_detail(record.text, match)
        entry = sxid_entry(head.code, detail) if head.kind == "SXid" \
            else xid_entry(head.code, detail)
        verdict = self.rule.verdict(entry)
        if verdict is None:
            return None
        return Seen(record, head.kind, head.code, head.gpu, entry, verdict,
                    (-severity(entry.action), head.gpu, head.code, record.seq))

    def _head(self, match: re.Match[str]) -> _Head:
        kind, code, gpu = parse.head_of(match)
        if kind == "SXid" or code == 154:
            return _Head(kind, code, gpu, None, None, 0)
        entry = xid_entry(code)
        return _Head(kind, code, gpu, entry, self.rule.verdict(entry), -severity(entry.action))

    def keep(self, seen: Seen) -> None:
        self.events.append(seen)

    def judged(self) -> Judged:
        out = Judged()
        if not (self.uuids or self.resets or self.load):  # nothing to map or set aside
            out.failing = [seen for seen in self.events if seen.verdict == FAIL]
            out.warned = [seen for seen in self.events if seen.verdict != FAIL]
        else:
            self._set_aside(out)
        out.failing.sort(key=_ORDER)  # once: each list is read most severe first
        out.warned.sort(key=_ORDER)
        return out

    def _set_aside(self, out: Judged) -> None:
        aside: Counter[tuple[str, str]] = Counter()
        resets: dict[str | None, tuple[int, str] | None] = {}
        for seen in self.events:
            gpu = seen.gpu
            if gpu is not None and gpu.startswith("gpu-") and gpu in self.uuids:
                gpu = self.uuids[gpu]
                seen = seen.on(gpu)
            if gpu in resets:
                reset = resets[gpu]
            else:
                reset = resets[gpu] = self._reset_of(gpu)
            if reset is not None and seen.record.seq < reset[0]:
                aside[(gpu or "an unnamed GPU", reset[1])] += 1
                continue
            (out.failing if seen.verdict == FAIL else out.warned).append(seen)
        out.set_aside = [{"gpu": gpu, "count": count, "why": f"before {why}"}
                         for (gpu, why), count in aside.items()]

    def _reset_of(self, gpu: str | None) -> tuple[int, str] | None:
        own = self.resets.get(gpu) if gpu is not None else None
        candidates = [r for r in (own, self.load) if r is not None]
        return max(candidates) if candidates else None


class Judged:
    """The events sorted: failing, warnings (each most severe first), and what was set aside
    and why."""

    def __init__(self) -> None:
        self.failing: list[Seen] = []
        self.warned: list[Seen] = []
        self.set_aside: list[dict[str, Any]] = []

    def details(self) -> dict[str, Any]:
        """``xid``: the events judged, most severe first (KEPT of them); ``xid_counts``: per
        GPU, code and class, how many; ``xid_worst``: the most severe failing one's action;
        ``xid_set_aside``: what was set aside and why."""
        out: dict[str, Any] = {}
        total = len(self.failing) + len(self.warned)
        if total:
            failing = self.failing[:KEPT]
            out["xid"] = [_event(FAIL, seen) for seen in failing] + \
                [_event(WARN, seen) for seen in self.warned[:KEPT - len(failing)]]
            if total > KEPT:
                out["xid_cut"] = total - KEPT
            out["xid_counts"] = [{**group, "count": count} for group, count
                                 in _groups(((FAIL, self.failing), (WARN, self.warned)))]
        if self.failing:
            worst = self.failing[0]
            out["xid_worst"] = {"action": worst.entry.action, "advice": worst.entry.advice(),
                                "code": worst.code, "kind": worst.kind,
                                "gpu": worst.gpu, "class": worst.entry.cls,
                                "short": _brief(worst), "rank": severity(worst.entry.action)}
        if self.set_aside:
            out["xid_set_aside"] = self.set_aside
        return out

    def failure(self) -> str:
        """The failing events, most severe first, for the failure's message."""
        return _named(self.failing)

    def warning(self) -> str:
        return (f"GPU event(s) that leave the node open: {_named(self.warned)}"
                if self.warned else "")

    def note(self) -> str:
        """What was set aside, for the evidence."""
        return "; ".join(f"{a['count']} GPU event(s) of {a['gpu']} set aside: {a['why']}"
                         for a in self.set_aside)


def _event(verdict: str, seen: Seen) -> dict[str, Any]:
    event, entry = seen.event, seen.entry
    return {"kind": event.kind, "code": event.code, "gpu": event.gpu, "pid": event.pid,
            "name": event.name, "text": event.text, "detail": event.detail,
            "description": entry.name, "class": entry.cls, "action": entry.action,
            "advice": entry.advice(), "verdict": verdict, "seq": seen.record.seq}


def _groups(lists: Iterable[tuple[str, Sequence[Seen]]]
            ) -> list[tuple[dict[str, Any], int]]:
    """Per kind, GPU, code, entry and verdict, how many, in the order first seen: counted a
    run of like events at a time (a flood is one run)."""
    counts: Counter[tuple[str, str, int | None, str | None, str, str, str]] = Counter()
    for verdict, seen in lists:
        for (gpu, kind, code, entry), run in itertools.groupby(seen, _GROUP):
            counts[(kind, gpu or "", code, entry.name, entry.cls, entry.action,
                    verdict)] += len(list(run))
    return [({"kind": kind, "gpu": gpu, "code": code, "description": name, "class": cls,
              "action": action, "verdict": verdict}, count)
            for (kind, gpu, code, name, cls, action, verdict), count in counts.items()]


def _label(kind: str, code: int | None, entry: Entry) -> str:
    return f"{kind} {code} ({entry.name})" if code is not None else entry.name


def _brief(seen: Seen) -> str:
    """``reboot (Xid 79 0000:41:00.0)``: the worst action in a node-health line."""
    what = f"{seen.kind} {seen.code}" if seen.code is not None else seen.entry.name
    return f"{seen.entry.action} ({what} {seen.gpu or 'GPU ?'})"


def _named(seen: Sequence[Seen]) -> str:
    """``0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it
    repeats``, per GPU and code, most severe first (as ``seen`` is), repeats counted, NAMED of
    them."""
    groups: dict[tuple[str, str], tuple[int, Seen]] = {}  # -> (how many, the first)
    for (gpu, kind, code, entry), run in itertools.groupby(seen, _GROUP):
        items = list(run)
        key = (gpu or "GPU ?", _label(kind, code, entry))
        count, first = groups.get(key, (0, items[0]))
        groups[key] = (count + len(items), first)
    parts = [f"{gpu}: {label}{f' x{count}' if count > 1 else ''}: {first.entry.advice()}"
             for (gpu, label), (count, first) in groups.items()]
    more = f" (and {len(parts) - NAMED} more)" if len(parts) > NAMED else ""
    return "; ".join(parts[:NAMED]) + more
