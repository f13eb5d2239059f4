"""The fleet as terminal text: targets by spec section, each cell the outcome counts or the
failing keys; then the drift, the minority targets of each check whose values differ."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..printable import counted
from . import GOOD, NO_RESULT, FleetRow, Record, Sections
from .drift import Drift

LETTERS = {"failed": "F", "fix_failed": "X", "error": "E", "reboot_required": "R",
           "would_fix": "W"}
CELL = 26
_PCI_DOMAIN = re.compile(r"\b[0-9a-f]{4}:(?=[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


def columns(targets: Sequence[FleetRow], sections: Sections) -> list[str]:
    """One column per spec section the records came from (see ``Sections.ordered``)."""
    return sections.ordered({sections.section(r) for t in targets for r in t.records})


def short_id(record: Record, section: str | None = None) -> str:
    """The id in its section's column (the record's own, unless given), whatever the kind: a
    check ``SECTION.NAME[0000:81:00.0]`` under ``SECTION`` is ``NAME[81:00.0]``, a check
    ``SECTION[KEY]`` is ``KEY``."""
    text = _PCI_DOMAIN.sub("", str(record.get("id", "?")))
    section = section or str(record.get("section") or "")
    if not section:
        return text
    if text.startswith(f"{section}["):
        return text[len(section) + 1:-1]
    return text.removeprefix(f"{section}.")


def short_key(record: Record) -> str:
    """A check's key without PCI domains (``81:00.0``, ``01:00.0->81:00.0``), else its id."""
    key = record.get("key")
    return _PCI_DOMAIN.sub("", str(key)) if key else str(record.get("id", "?"))


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def cell(records: Sequence[Record], section: str | None = None) -> str:
    """``ok 9``; the failing keys when there are one or two (``F vm.swappiness``); else the
    counts of what is wrong out of all (``3F 1E /12``)."""
    if not records:
        return "-"
    bad = [r for r in records if r.get("outcome") not in GOOD]
    if not bad:
        return f"ok {len(records)}"
    if len(bad) <= 2:
        return ", ".join(f"{LETTERS.get(str(r.get('outcome')), '?')} {short_id(r, section)}"
                         for r in bad)
    counts: dict[str, int] = {}
    for record in bad:
        letter = LETTERS.get(str(record.get("outcome")), "?")
        counts[letter] = counts.get(letter, 0) + 1
    return " ".join(f"{n}{letter}" for letter, n in counts.items()) + f" /{len(records)}"


def matrix_lines(targets: Sequence[FleetRow]) -> list[str]:
    sections = Sections.of(targets)
    names = columns(targets, sections)
    header = ["target", *names]
    rows: list[tuple[str, list[str] | None, str]] = []
    """(target, its cells, or None and the reason it has no result)"""
    for target in targets:
        if target.reason is not None:
            rows.append((target.name, None, f"{NO_RESULT}: {target.reason}"))
            continue
        by_section: dict[str, list[Record]] = {}
        for record in target.records:
            by_section.setdefault(sections.section(record), []).append(record)
        rows.append((target.name, [cut(cell(by_section.get(n, []), n), CELL) for n in names],
                     ""))
    widths = [max([len(header[0])] + [len(name) for name, _, _ in rows])]
    widths += [max([len(title)] + [len(cells[i]) for _, cells, _ in rows if cells is not None])
               for i, title in enumerate(names)]

    def line(first: str, cells: Sequence[str]) -> str:
        return "  ".join(f"{c:<{w}}" for c, w in zip([first, *cells], widths, strict=False)
                         ).rstrip()

    healthy = sum(t.healthy for t in targets)
    missing = sum(t.reason is not None for t in targets)
    summary = (f"fleet: {counted(len(targets), 'target')}: {healthy} healthy, "
               f"{len(targets) - healthy - missing} with problems, {missing} {NO_RESULT}")
    legend = ("cells: ok N = all N good; F failed, X fix_failed, E error, R reboot_required, "
              "W would_fix")
    body = [line(name, cells) if cells is not None else f"{name:<{widths[0]}}  {reason}"
            for name, cells, reason in rows]
    return [summary, legend, "", line(header[0], header[1:]), *body]


def drift_lines(drifts: Sequence[Drift], limit: int) -> list[str]:
    """One line per drifting check (the first ``limit``; 0: all): the majority's value and how
    many hold it, then each minority value with its targets."""
    if not drifts:
        return ["drift: every check holds one value on every target"]
    lines = [f"drift: {len(drifts)} check(s) whose value differs between targets "
             "(majority first; * = passes the spec)"]
    shown = drifts if limit <= 0 else drifts[:limit]
    for drift in shown:
        major = drift.majority
        parts = [f"{major.value!r}{'*' if major.passes else ''} on {len(major.targets)}"]
        for group in drift.groups[1:]:
            names = ", ".join(group.targets[:5])
            more = f" +{len(group.targets) - 5}" if len(group.targets) > 5 else ""
            parts.append(f"{group.value!r}{'*' if group.passes else ''} on {names}{more}")
        lines.append(f"  {drift.spec}::{drift.id}: " + "; ".join(parts))
    if len(shown) < len(drifts):
        lines.append(f"  ... and {len(drifts) - len(shown)} more (--drift-limit 0 shows all; "
                     "the HTML page lists every one)")
    return lines
