"""The fix journal: every change is appended, before it is made, with its original.

JSON lines, one file per --fix run, fsync'd after each line, so a run that crashes mid-fix still
leaves what rollback needs: an entry whose outcome line is missing may or may not have been
applied, and restoring its original is safe either way. A rollback appends a closing line.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .changes import Change, from_dict, to_dict

JOURNAL_DIR = "var/lib/pytest-gpuhost/journal"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_journal_path(root: Path, spec: str) -> Path:
    """``ROOT/var/lib/pytest-gpuhost/journal/20261202T143351Z-blackwell8-4242.jsonl``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = root / JOURNAL_DIR / f"{stamp}-{spec}-{os.getpid()}.jsonl"
    number = 1
    while path.exists():  # two runs of one process in one second (pytester, an IDE)
        number += 1
        path = root / JOURNAL_DIR / f"{stamp}-{spec}-{os.getpid()}-{number}.jsonl"
    return path


class Journal:
    """Appends to one journal file; shared by the xdist workers of one run (O_APPEND lines)."""

    def __init__(self, path: Path, spec: str) -> None:
        self.path = path
        self.spec = spec
        self._count = 0

    def _append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, sort_keys=True) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def record(self, check: str, kind: str, key: str | None, change: Change) -> str:
        """Write the change down before it is made; returns the entry's id."""
        self._count += 1
        entry = f"{os.getpid()}-{self._count}"
        self._append({"event": "change", "id": entry, "time": _now(), "spec": self.spec,
                      "check": check, "kind": kind, "key": key, "change": to_dict(change)})
        return entry

    def outcome(self, entry: str, error: str | None) -> None:
        self._append({"event": "applied" if error is None else "failed", "id": entry,
                      "time": _now(), "error": error})

    def close_rollback(self, restored: int, failed: int) -> None:
        self._append({"event": "rolled_back", "time": _now(), "restored": restored,
                      "failed": failed})


class JournalError(Exception):
    """A journal that cannot be rolled back as it is; the message names ``file:line``."""


@dataclass(frozen=True)
class JournalEntry:
    id: str
    time: str
    spec: str
    check: str
    kind: str
    key: str | None
    change: Change
    state: str
    """``applied``, ``failed``, or ``pending`` (written down, then the run stopped)."""
    line: int = 0
    """Where the change is recorded in the journal file."""


@dataclass(frozen=True)
class JournalContents:
    path: Path
    entries: tuple[JournalEntry, ...]
    rolled_back: bool
    damaged_lines: int


def _records(path: Path) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, record) per line; None for a line cut short by a crash."""
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace")
                                  .splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            yield number, None
            continue
        if not isinstance(record, dict):
            raise JournalError(f"{path}:{number}: not a journal record: {line[:80]}")
        yield number, record


def read_journal(path: Path) -> JournalContents:
    changes: dict[str, tuple[int, dict[str, Any]]] = {}
    states: dict[str, str] = {}
    rolled_back, damaged = False, 0
    for number, record in _records(path):
        if record is None:
            damaged += 1
            continue
        event = record.get("event")
        if event == "change":
            if record.get("id") in changes:
                raise JournalError(f"{path}:{number}: entry {record.get('id')!r} is recorded "
                                   "twice; a journal records one run")
            changes[str(record.get("id"))] = (number, record)
            states.setdefault(str(record.get("id")), "pending")
        elif event in ("applied", "failed"):
            states[str(record.get("id"))] = str(event)
        elif event == "rolled_back":
            rolled_back = True
    entries = []
    for entry, (number, record) in changes.items():
        try:
            entries.append(JournalEntry(
                id=entry, time=record["time"], spec=record["spec"], check=record["check"],
                kind=record["kind"], key=record.get("key"), change=from_dict(record["change"]),
                state=states[entry], line=number))
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(f"{path}:{number}: a change record without a usable "
                               f"{exc}") from None
    return JournalContents(path, tuple(entries), rolled_back, damaged)


def latest_journal(root: Path) -> Path | None:
    """The newest journal under the root with something to undo: not rolled back yet, and not
    one whose every change failed (a second --fix that only retried a failing modprobe)."""
    directory = root / JOURNAL_DIR
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("*.jsonl"), key=lambda p: p.name, reverse=True):
        contents = read_journal(path)
        if not contents.rolled_back and any(e.state != "failed" for e in contents.entries):
            return path
    return None
