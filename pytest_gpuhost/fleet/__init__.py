"""The fleet view: many targets' records side by side, from the JSON reports of separate runs
(``python -m pytest_gpuhost.fleet REPORT.json ...``, one report per node as a scheduler makes
them) or from one run over several targets (``--gpuhost-fleet-html``).

A target is a row; one that gave no result (its report is missing or unreadable, or every check
is an error because the target could not be reached) is a row of "no result" with the reason,
never left out. ``matrix`` prints the terminal matrix, ``drift`` groups each check's targets by
the value observed, ``page`` writes the self-contained HTML page.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import msgspec

from .. import bundled

GOOD = frozenset({"passed", "fixed", "skipped"})
"""Outcomes that leave a target healthy (as the node-health integrations judge)."""
BUNDLED_DIRECTORY = bundled.DIRECTORY.parts[-2:]
"""Where a bundled spec lies in an installed (or checked out) package:
``pytest_gpuhost/bundled``."""
BUNDLED_DIRECTORIES = frozenset({BUNDLED_DIRECTORY, ("pytest_gpuhost", "specs")})
"""Where it lies, or lay before the folder was named apart from ``spec/``: the reports of a
fleet's nodes not upgraded yet name ``pytest_gpuhost/specs``."""
OUTCOME_ORDER = ("error", "fix_failed", "failed", "reboot_required", "would_fix", "fixed",
                 "passed", "skipped")
"""Worst first: a cell of several checks shows the worst outcome among them."""
NO_RESULT = "no result"

Record = Mapping[str, Any]
"""One check's record as the JSON report holds it (``CheckResult.as_dict``)."""


class FleetRow(msgspec.Struct, frozen=True):
    """One row of the fleet: a target's records, or why there are none."""

    name: str
    source: str
    """The report it came from (or ``this run``)."""
    records: tuple[Record, ...] = ()
    reason: str | None = None
    """Set when the target gave no result: what went wrong."""
    facts: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """host, kernel, driver, gpus (a count), generated_at: as the report says."""

    @property
    def healthy(self) -> bool:
        return self.reason is None and all(r.get("outcome") in GOOD for r in self.records)


def spec_file(record: Record) -> str:
    """The spec file of a record's ``location``; a bundled spec by its file name
    (``blackwell8.yaml``), as in its ids: each node shows the path of its own install (another
    venv, another Python version), and the same check must stay one check across them."""
    location = str(record.get("location") or "")
    path = location.rsplit(":", 1)[0] if location else ""
    parts = PurePosixPath(path).parts
    return parts[-1] if parts[-3:-1] in BUNDLED_DIRECTORIES else path


def check_key(record: Record) -> tuple[str, str]:
    """A check's identity across targets: its spec file and its id."""
    return spec_file(record), str(record.get("id", "?"))


class Sections(msgspec.Struct, frozen=True):
    """What each record says of itself: the spec section it came from (``section``) and whether
    it is a measurement (``measured``). A record without them (a report of an older version, a
    check whose worker went down before it reported) takes them from a record of its kind that
    has them, else its kind is its section and it is a setting."""

    of_kind: Mapping[str, str]
    measured_kinds: frozenset[str]
    first_seen: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Each section's rank: where its first record stands among the rows' records (a report
    holds them in the order the run ran them, which is the spec's order of sections)."""

    @classmethod
    def of(cls, targets: Iterable[FleetRow]) -> Sections:
        of_kind: dict[str, str] = {}
        measured: set[str] = set()
        first_seen: dict[str, int] = {}
        for target in targets:
            for record in target.records:
                kind = str(record.get("kind", ""))
                section = record.get("section")
                if section:
                    of_kind.setdefault(kind, str(section))
                first_seen.setdefault(str(section or kind), len(first_seen))
                if record.get("measured"):
                    measured.add(kind)
        ranks: dict[str, int] = {}
        for name in first_seen:  # a kind first seen without its section ranks as its section
            ranks.setdefault(of_kind.get(name, name), len(ranks))
        return cls(of_kind, frozenset(measured), ranks)

    def section(self, record: Record) -> str:
        found = record.get("section")
        if found:
            return str(found)
        kind = str(record.get("kind", ""))
        return self.of_kind.get(kind, kind)

    def measured(self, record: Record) -> bool:
        found = record.get("measured")
        return bool(found) if found is not None else \
            str(record.get("kind", "")) in self.measured_kinds

    def ordered(self, sections: Iterable[str]) -> list[str]:
        """The sections in the order the runs ran them, then any not seen in a record by
        name."""
        return sorted(set(sections), key=lambda section: (self.rank(section), section))

    def rank(self, section: str) -> int:
        return self.first_seen.get(section, len(self.first_seen))


def worst(outcomes: Iterable[str]) -> str:
    found = set(outcomes)
    return next((o for o in OUTCOME_ORDER if o in found), "passed")


def _facts(data: Mapping[str, Any]) -> dict[str, Any]:
    """What a report (or one of its ``targets`` entries, which says ``hostname``) says of the
    machine."""
    gpus = data.get("gpus")
    specs = data.get("specs")  # a target's: the specs whose checks ran on it
    spec = ", ".join(map(str, specs)) if isinstance(specs, list) and specs else None
    return {"host": data.get("host") or data.get("hostname"), "kernel": data.get("kernel"),
            "driver": data.get("driver"),
            "gpus": len(gpus) if isinstance(gpus, list) else gpus,
            "generated_at": data.get("generated_at"), "spec": spec,
            "kernel_on": data.get("kernel_on") if isinstance(data.get("kernel_on"), str)
            else None}


def _no_result(records: Sequence[Record]) -> str | None:
    """Why records that are all errors say nothing of the target (it was unreachable)."""
    if not records:
        return "no check reported for it"
    if all(r.get("outcome") == "error" for r in records):
        return f"every check is an error: {records[0].get('message') or 'no message'}"
    return None


_TEXT_FIELDS = ("id", "kind", "outcome")
_OPTIONAL_FIELDS = ("key", "expected", "observed", "message", "location", "target")


def _record_problem(record: Record) -> str | None:
    """What makes a record unusable by the fleet view (an ``outcome`` that is a mapping, a
    list where a value belongs, ``evidence`` that is no list); None when it is usable."""
    for name in _TEXT_FIELDS:
        if name in record and not isinstance(record[name], str):
            return f"{name} is {type(record[name]).__name__} {str(record[name])[:60]}"
    for name in _OPTIONAL_FIELDS:
        if record.get(name) is not None and not isinstance(record[name], str):
            return f"{name} is {type(record[name]).__name__} {str(record[name])[:60]}"
    evidence = record.get("evidence")
    if evidence is not None and not isinstance(evidence, list):
        return f"evidence is {type(evidence).__name__}, not a list"
    return None


def targets_of_report(data: Mapping[str, Any], source: str) -> list[FleetRow]:
    """The rows of one JSON report: one per target it names (``targets``, and each record's
    ``target``), or, for a report of one machine without them, one named by its ``host``."""
    checks = data.get("checks")
    if not isinstance(checks, list):
        return [FleetRow(Path(source).stem, source, reason=f"{source}: not a pytest-gpuhost "
                       "report (no 'checks' list)")]
    records = [c for c in checks if isinstance(c, Mapping)]
    for number, record in enumerate(records, 1):
        problem = _record_problem(record)
        if problem is not None:
            return [FleetRow(Path(source).stem, source, reason=f"{source}: check {number} is "
                             f"not a pytest-gpuhost record: {problem}")]
    listed = data.get("targets")
    entries: dict[str, Mapping[str, Any]] = {}
    for item in listed if isinstance(listed, list) else ():
        if isinstance(item, str):
            entries.setdefault(item, {})
        elif isinstance(item, Mapping) and item.get("name"):
            entries.setdefault(str(item["name"]), item)
    if not entries and not any("target" in r for r in records):
        name = str(data.get("host") or Path(source).stem)
        return [FleetRow(name, source, tuple(records), _no_result(records), _facts(data))]
    default = next(iter(entries), str(data.get("host") or Path(source).stem))
    by_target: dict[str, list[Record]] = {name: [] for name in entries}
    for record in records:
        by_target.setdefault(str(record.get("target") or default), []).append(record)
    rows = []
    for name, mine in by_target.items():
        entry = entries.get(name, {})
        reason = entry.get("unreachable") or entry.get("error") or entry.get("reason") or \
            _no_result(mine)
        own = {k: v for k, v in _facts(entry).items() if v is not None}
        # the report's own facts are this target's only where it is the report's one target
        facts = {**_facts(data), **own} if len(by_target) == 1 else \
            {**dict.fromkeys(_facts(data)), "generated_at": data.get("generated_at"), **own}
        rows.append(FleetRow(name, source, tuple(mine), str(reason) if reason else None, facts))
    return rows


def read_report(path: Path) -> list[FleetRow]:
    """One report file's rows; a file that cannot be read is a row of no result saying why."""
    shown = str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [FleetRow(path.stem, shown, reason=f"{shown}: no such report")]
    except OSError as exc:
        return [FleetRow(path.stem, shown, reason=f"{shown}: cannot read it: {exc.strerror}")]
    except (UnicodeDecodeError, ValueError) as exc:
        return [FleetRow(path.stem, shown, reason=f"{shown}: not JSON: {exc}")]
    if not isinstance(data, Mapping):
        return [FleetRow(path.stem, shown, reason=f"{shown}: not a pytest-gpuhost report")]
    return targets_of_report(data, shown)


def merge(rows: Iterable[FleetRow]) -> list[FleetRow]:
    """Every row, each name once: a second row of a name (the same node reported twice) is
    kept under its name and its report's, so neither hides the other."""
    seen: set[str] = set()
    merged = []
    for row in rows:
        name = row.name
        if name in seen:
            name = f"{row.name} ({row.source})"
        seen.add(name)
        merged.append(row if name == row.name else FleetRow(name, row.source, row.records,
                                                           row.reason, row.facts))
    return merged


def read_reports(paths: Sequence[Path]) -> list[FleetRow]:
    """The fleet from report files (a directory stands for the ``*.json`` files in it).

    The garbage collector is paused meanwhile: parsed reports only pile up (no cycles to
    find), and its passes over every dict read so far made reading 1,000 reports 3x slower."""
    files: list[Path] = []
    for path in paths:
        files += sorted(path.glob("*.json")) if path.is_dir() else [path]
    paused = gc.isenabled()
    gc.disable()
    try:
        return merge(row for file in files for row in read_report(file))
    finally:
        if paused:
            gc.enable()

