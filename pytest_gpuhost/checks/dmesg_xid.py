"""The dmesg check's GPU events judged: each Xid classified, set aside when its GPU was reset since.

The dmesg check walks the kernel log once; each record goes through ``XidLog.feed``, which keeps
the Xid, SXid and off-the-bus events and notes what resets a GPU (a driver load, ``GPU reset``).
At the end ``judged`` sorts the events: set aside (their GPU was reset or the driver loaded
after them), failing (a class of ``xid.fail`` whose action is not ``none``) or warnings (a class
of ``xid.warn``, or action ``none``). A class in neither list is judged as any other record, by
its level.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
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
    record: Record
    event: parse.XidEvent
    entry: Entry


def entry_of(event: parse.XidEvent) -> Entry:
    if event.kind == "SXid" and event.code is not None:
        return sxid_entry(event.code, event.detail)
    if event.code is not None:
        return xid_entry(event.code, event.detail)
    return FALLEN_OFF_ENTRY if event.detail == parse.FALLEN_OFF else INIT_FAILED_ENTRY


class XidLog:
    """The GPU events of one walk of the kernel log, and the resets and driver loads in it."""

    def __init__(self) -> None:
        self.events: list[Seen] = []
        self.resets: dict[str, tuple[int, str]] = {}
        """GPU -> (sequence number, what) of its last reset."""
        self.load: tuple[int, str] | None = None
        """(sequence number of its first record, what) of the last driver load."""
        self.uuids: dict[str, str] = {}
        self._run_start: int | None = None
        self._last = -2
        self._the_gpu: str | None = None

    def feed(self, record: Record, index: int) -> parse.XidEvent | None:
        """The GPU event ``record``, a record of NVIDIA's modules (``parse.DRIVERS``) and
        the ``index``-th record considered, is, or None (a reset or load is noted on the way).
        The other records are never fed (a million records of noise cost nothing here): a gap
        in ``index`` is one of them, which ends a run of the driver's records."""
        text = record.text
        if index != self._last + 1:
            self._run_start = None
        self._last = index
        event = parse.parse_event(text)
        if event is not None and event.kind != "NVRM":
            self._run_start = None  # an Xid is no part of a load's probe
            return event
        if event is None and parse.unloading(text):
            self._run_start = None  # a load's run of records starts after these
            return None
        if self._run_start is None:
            self._run_start = record.seq
        if event is not None:
            if event.gpu is None and self._the_gpu is not None:
                event = event._replace(gpu=self._the_gpu)
            return event
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

    def keep(self, record: Record, event: parse.XidEvent, entry: Entry) -> None:
        self.events.append(Seen(record, event, entry))

    def judged(self, rule: XidRule) -> Judged:
        out = Judged()
        aside: Counter[tuple[str, str]] = Counter()
        for seen in self.events:
            gpu = seen.event.gpu
            if gpu is not None and gpu.startswith("gpu-"):
                gpu = self.uuids.get(gpu, gpu)
                seen = seen._replace(event=seen.event._replace(gpu=gpu))
            reset = self._reset_of(gpu)
            if reset is not None and seen.record.seq < reset[0]:
                aside[(gpu or "an unnamed GPU", reset[1])] += 1
                continue
            verdict = rule.verdict(seen.entry)
            (out.failing if verdict == FAIL else out.warned).append(seen)
        out.set_aside = [{"gpu": gpu, "count": count, "why": f"before {why}"}
                         for (gpu, why), count in aside.items()]
        out.failing.sort(key=_severe)  # once: each list is read most severe first
        out.warned.sort(key=_severe)
        return out

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
        events = [(FAIL, s) for s in self.failing] + [(WARN, s) for s in self.warned]
        if events:
            out["xid"] = [_event(verdict, seen) for verdict, seen in events[:KEPT]]
            if len(events) > KEPT:
                out["xid_cut"] = len(events) - KEPT
            out["xid_counts"] = [{**group, "count": count}
                                 for group, count in _groups(events)]
        if self.failing:
            worst = self.failing[0]
            out["xid_worst"] = {"action": worst.entry.action, "advice": worst.entry.advice(),
                                "code": worst.event.code, "kind": worst.event.kind,
                                "gpu": worst.event.gpu, "class": worst.entry.cls,
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


def _severe(seen: Seen) -> tuple[int, str, int, int]:
    return (-severity(seen.entry.action), seen.event.gpu or "", seen.event.code or 0,
            seen.record.seq)


def _event(verdict: str, seen: Seen) -> dict[str, Any]:
    event, entry = seen.event, seen.entry
    return {"kind": event.kind, "code": event.code, "gpu": event.gpu, "pid": event.pid,
            "name": event.name, "text": event.text, "detail": event.detail,
            "description": entry.name, "class": entry.cls, "action": entry.action,
            "advice": entry.advice(), "verdict": verdict, "seq": seen.record.seq}


def _groups(events: Sequence[tuple[str, Seen]]) -> list[tuple[dict[str, Any], int]]:
    counts: Counter[tuple[str, str, int | None, str | None, str, str, str]] = Counter()
    for verdict, seen in events:
        counts[(seen.event.kind, seen.event.gpu or "", seen.event.code, seen.entry.name,
                seen.entry.cls, seen.entry.action, verdict)] += 1
    return [({"kind": kind, "gpu": gpu, "code": code, "description": name, "class": cls,
              "action": action, "verdict": verdict}, count)
            for (kind, gpu, code, name, cls, action, verdict), count in counts.items()]


def _label(seen: Seen) -> str:
    event = seen.event
    what = f"{event.kind} {event.code}" if event.code is not None else "NVRM"
    return f"{what} ({seen.entry.name})" if event.code is not None else seen.entry.name


def _brief(seen: Seen) -> str:
    """``reboot (Xid 79 0000:41:00.0)``: the worst action in a node-health line."""
    event = seen.event
    what = f"{event.kind} {event.code}" if event.code is not None else seen.entry.name
    return f"{seen.entry.action} ({what} {event.gpu or 'GPU ?'})"


def _named(seen: Sequence[Seen]) -> str:
    """``0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it
    repeats``, per GPU and code, most severe first (as ``seen`` is), repeats counted, NAMED of
    them."""
    groups: dict[tuple[str, str], list[Seen]] = {}
    for each in seen:
        groups.setdefault((each.event.gpu or "GPU ?", _label(each)), []).append(each)
    parts = [f"{gpu}: {label}{f' x{len(items)}' if len(items) > 1 else ''}: "
             f"{items[0].entry.advice()}" for (gpu, label), items in groups.items()]
    more = f" (and {len(parts) - NAMED} more)" if len(parts) > NAMED else ""
    return "; ".join(parts[:NAMED]) + more
