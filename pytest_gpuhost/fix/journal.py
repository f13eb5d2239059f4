"""The fix journal: every change is appended, before it is made, with its original.

JSON lines, one file per --fix run on the host it changed (``fix.state``). The change lines of
one fix (a plan: one line per CPU of a C-state, say) are appended in one write and fsync'd
before the first of them is made, so every change line is durable before its change is applied,
and a run that crashes mid-fix (or loses its connection) still leaves what rollback needs: an
entry whose outcome line is missing may or may not have been applied, and restoring its
original is safe either way. Outcome lines are not fsync'd on their own: the next fix's fsync
makes them durable with its change lines, and one that a crash loses leaves its entry pending,
which a rollback treats as possibly made (a lost read-back only makes it more cautious: it then
restores only over the value the fix wrote); the run's end fsyncs the last fix's. A rollback
appends a closing line, fsync'd; one that leaves changes open appends instead a ``restored``
line for each change it did bring back, so that its rerun judges only the rest (a change
restored is never judged again: what the host holds there now is no longer the fix's).

The first line names the host the journal changed (``Host.identity()``), the spec and the tool,
so that a rollback can refuse another host (fix/rollback.py). Only a last line without its
newline can have been cut short by a crash; any other line that is not a valid record is damage,
and a damaged journal is refused as a whole: guessing which change it held could lose an undo.
Journals written before the header existed are still read (their ``identity`` is None). Each
field of a record is checked as it is read: a field of the wrong type or a bad encoding is a
JournalError naming ``file:line``, never a guess at what the change was.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..checks.changes import Change, ChangeError, from_dict, lossless_text, to_dict
from ..host import HostError, HostIdentity, LocalHost
from ..version import __version__
from .state import JOURNAL_DIR as JOURNAL_DIR
from .state import StateFile, StateStore

FORMAT = 2
"""1: no header line (before 0.1.0's identity); 2: a ``journal`` header names the host."""
APPLIED, FAILED, PENDING, UNKNOWN = "applied", "failed", "pending", "unknown"
RESTORED = "restored"
"""A change an earlier rollback of a journal it could not close brought back."""
OUTCOME_EVENTS = (APPLIED, FAILED, UNKNOWN)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _located(where: StateFile | Path) -> StateFile:
    return where if isinstance(where, StateFile) else StateFile.local(where)


def _raw_fields(name: str, raw: bytes) -> dict[str, str]:
    """Bytes as a readable field and, beside it, their exact base64."""
    return {name: lossless_text(raw), f"{name}_base64": base64.b64encode(raw).decode()}


class Journal:
    """Appends to one journal file; shared by the xdist workers of one run (O_APPEND lines).

    The file is created at the first change, with its header already in it (a complete
    temporary file linked into place), so every reader and every other writer sees the header
    first and a run that changes nothing leaves no journal."""

    def __init__(self, where: StateFile | Path, spec: str,
                 identity: HostIdentity | Callable[[], HostIdentity] | None = None, *,
                 shared: bool = False, run: str | None = None,
                 containers: Sequence[str] = ()) -> None:
        self.location = _located(where)
        self.spec = spec
        self.run = run
        """The run's id, the same in every journal of the run (a container's and its host's)."""
        self.containers = tuple(containers)
        """The containers whose host this journal's target was in the run (their URLs)."""
        self._identity = identity
        """The host's identity, or how to ask for it (``host.identity``): asked when the
        header is written, at the first change, so that opening a journal reaches no host."""
        self.shared = shared
        """One run's xdist workers write this one journal: the first of them makes it."""
        self._count = 0
        self._refused = 0
        """Changes written down whose outcome is ``failed``: the host refused them."""
        self._unsynced = False
        """Outcome lines written since the last fsync."""

    @property
    def path(self) -> StateFile:
        return self.location

    @property
    def identity(self) -> HostIdentity | None:
        if callable(self._identity):
            self._identity = self._identity()
        return self._identity

    def _header(self) -> dict[str, Any]:
        return {"event": "journal", "format": FORMAT, "time": _now(), "spec": self.spec,
                "tool": f"pytest-gpuhost {__version__}",
                "identity": self.identity.as_dict() if self.identity else None,
                **({"run": self.run} if self.run else {}),
                **({"containers": list(self.containers)} if self.containers else {})}

    def _create(self) -> None:
        header = (json.dumps(self._header(), sort_keys=True) + "\n").encode()
        try:
            self.location.host.create_file(self.location.path, header)
        except HostError as exc:
            if exc.errno != errno.EEXIST or not self.shared:  # another run's: never shared
                raise
            # another worker of this run was first

    def _append(self, *records: dict[str, Any], sync: bool = True) -> None:
        """Lines in one write(2), fsync'd unless ``sync`` is false; never creates the file (a
        journal whose directory is gone is an error, not a new journal somewhere else)."""
        lines = "".join(json.dumps(record, sort_keys=True) + "\n" for record in records)
        self.location.host.append_file(self.location.path, lines.encode(), sync=sync)
        self._unsynced = not sync

    def sync(self) -> None:
        """Make the outcome lines written since the last fix durable: at the end of the run,
        which has no next fix to fsync them with."""
        if self._unsynced:
            self._append(sync=True)

    @property
    def written(self) -> bool:
        """Whether this process wrote a change into it."""
        return self._count > 0

    @property
    def made(self) -> int:
        """The changes this process wrote down that a rollback may have to undo: every one
        but those the host refused (one whose command timed out may have been made)."""
        return self._count - self._refused

    def record(self, check: str, kind: str, key: str | None, change: Change) -> str:
        """Write the change down before it is made; returns the entry's id."""
        [entry] = self.record_all(check, kind, key, [change])
        return entry

    def record_all(self, check: str, kind: str, key: str | None,
                   changes: Sequence[Change]) -> list[str]:
        """Write down every change of one fix, durably, before the first is made (one write,
        one fsync); returns their entry ids, in order."""
        if self._count == 0 and not self.location.exists():
            self._create()
        entries, records = [], []
        when = _now()
        for change in changes:
            self._count += 1
            entry = f"{os.getpid()}-{self._count}"
            entries.append(entry)
            records.append({"event": "change", "id": entry, "time": when, "spec": self.spec,
                            "check": check, "kind": kind, "key": key,
                            "change": to_dict(change)})
        self._append(*records)
        return entries

    def outcome(self, entry: str, error: str | None, *, unknown: bool = False,
                read_back: bytes | None = None) -> None:
        """``applied`` (with the bytes read back after the write, where it was a write),
        ``failed``, or ``unknown``: a command that timed out may or may not have made it."""
        self.outcomes([(entry, error, unknown, read_back)])

    def outcomes(self, outcomes: Sequence[tuple[str, str | None, bool, bytes | None]]
                 ) -> None:
        """The outcome lines of one fix, ``(entry, error, unknown, read_back)`` each as
        ``outcome`` says, in one write."""
        records = []
        when = _now()
        for entry, error, unknown, read_back in outcomes:
            event = UNKNOWN if unknown else APPLIED if error is None else FAILED
            self._refused += event == FAILED
            record: dict[str, Any] = {"event": event, "id": entry, "time": when, "error": error}
            if read_back is not None:
                record.update(_raw_fields("read_back", read_back))
            records.append(record)
        if records:
            self._append(*records, sync=False)  # durable with the next fix's change lines

    def restored(self, entries: Sequence[str]) -> None:
        """The changes a rollback that leaves the journal open brought back, fsync'd (raises
        JournalError where they cannot be written: a rerun then judges them again)."""
        if entries:
            when = _now()
            try:
                self._append(*({"event": RESTORED, "id": e, "time": when} for e in entries))
            except HostError as exc:
                raise JournalError(f"cannot record the changes restored in {self.location}: "
                                   f"{exc}") from exc

    def close_rollback(self, restored: int, failed: int) -> None:
        """Raises JournalError when the closing line cannot be written."""
        try:
            line = json.dumps({"event": "rolled_back", "time": _now(), "restored": restored,
                               "failed": failed}, sort_keys=True) + "\n"
            # a last line cut short by a crash stays a line of its own: the closing record
            # glued onto it would be one damaged line, and every later rollback refused
            cut = not self.location.read().endswith(b"\n")
            self.location.host.append_file(self.location.path, (("\n" if cut else "") +
                                                                line).encode())
        except HostError as exc:
            reason = os.strerror(exc.errno) if exc.errno else str(exc)
            raise JournalError(f"cannot mark {self.location} rolled back: {reason}") from exc


class JournalEntry(msgspec.Struct, frozen=True):
    id: str
    time: str
    spec: str
    check: str
    kind: str
    key: str | None
    change: Change
    state: str
    """``applied``, ``failed``, ``unknown`` (a command that timed out), or ``pending``
    (written down, then the run stopped)."""
    line: int = 0
    """Where the change is recorded in the journal file."""
    read_back: bytes | None = None
    """What the host held right after the write (a kernel may clamp or round a value)."""
    error: str | None = None
    """Why the host refused it (a ``failed`` or ``unknown`` change), as the run reported it."""
    restored: bool = False
    """An earlier rollback brought it back (and left the journal open for others)."""


class JournalContents(msgspec.Struct, frozen=True):
    location: StateFile
    entries: tuple[JournalEntry, ...]
    rolled_back: bool
    damaged_lines: int
    """1 when the last line was cut short by a crash, else 0."""
    identity: HostIdentity | None = None
    """The host it changed; None in a journal older than the header."""
    run: str | None = None
    """The id of the run that wrote it (None: an older journal)."""
    containers: tuple[str, ...] = ()
    """The containers whose host it changed in that run, by URL."""

    def __post_init__(self) -> None:
        if not isinstance(self.location, StateFile):  # a file of this machine, by its path
            msgspec.structs.force_setattr(self, "location", StateFile.local(self.location))

    @property
    def shown(self) -> str:
        return self.location.shown

    @property
    def local(self) -> Path | None:
        """The journal as a file of this machine, when it is one."""
        return self.location.host.local_path(self.location.path)


def _records(location: StateFile, data: bytes | None
             ) -> Iterator[tuple[int, dict[str, Any] | None]]:
    """(line number, record) per line; None for a last line cut short by a crash."""
    path = location.shown
    if data is None:
        try:
            data = location.read()
        except HostError as exc:
            raise JournalError(f"{path}: cannot read the journal: {exc}") from exc
    lines = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if number == len(lines):  # no newline after it: the write was cut short
                yield number, None
                return
            if _closed_after(lines[number:]):  # cut short, then rolled back (and closed) once
                yield number, None
                continue
            raise JournalError(
                f"{path}:{number}: a damaged journal line ({exc}): "
                f"{line[:80].decode('utf-8', 'replace')!r}; only the last line can have been "
                "cut short by a crash: repair or remove this line by hand (nothing was rolled "
                "back)") from None
        if not isinstance(record, dict):
            raise JournalError(f"{path}:{number}: not a journal record: "
                               f"{line[:80].decode('utf-8', 'replace')}")
        yield number, record


def _closed_after(rest: Sequence[bytes]) -> bool:
    """Whether the lines after a cut-short one are only the closing records of rollbacks,
    which begin on a line of their own after such a line (``close_rollback``)."""
    found = False
    for line in rest:
        if not line.strip():
            continue
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return False
        if not isinstance(record, dict) or record.get("event") != "rolled_back":
            return False
        found = True
    return found


def read_journal(source: StateFile | Path, data: bytes | None = None) -> JournalContents:
    """The journal's changes and their states; ``data``: its bytes, when already read."""
    location = _located(source)
    path = location.shown
    changes: dict[str, tuple[int, dict[str, Any]]] = {}
    states: dict[str, str] = {}
    read_backs: dict[str, bytes | None] = {}
    errors: dict[str, str] = {}
    restored: set[str] = set()
    rolled_back, damaged = False, 0
    identity: HostIdentity | None = None
    header: dict[str, Any] = {}
    first = True
    for number, record in _records(location, data):
        if record is None:
            damaged += 1
            continue
        where = f"{path}:{number}"
        event = record.get("event")
        if event == "journal":
            if not first:
                raise JournalError(f"{where}: a journal header after line 1: two journals were "
                                   "joined into one file; roll each back on its own")
            identity = identity_field(record, where)
            header = record
        elif event == "change":
            entry = text_field(record, "id", where)
            if entry in changes:
                raise JournalError(f"{where}: entry {entry!r} is recorded twice; a journal "
                                   "records one run")
            changes[entry] = (number, record)
            states.setdefault(entry, PENDING)
        elif event in OUTCOME_EVENTS:
            entry = text_field(record, "id", where)
            if entry not in changes:
                raise JournalError(f"{where}: an outcome for entry {entry!r}, which no earlier "
                                   "line records")
            states[entry] = str(event)
            read_backs[entry] = read_back_field(record, where)
            errors[entry] = str(record.get("error") or "")
        elif event == RESTORED:
            entry = text_field(record, "id", where)
            if entry not in changes:
                raise JournalError(f"{where}: a restored record for entry {entry!r}, which no "
                                   "earlier line records")
            restored.add(entry)
        elif event == "rolled_back":
            rolled_back = True
        first = False
    entries = []
    for entry, (number, record) in changes.items():
        where = f"{path}:{number}"
        try:
            change = from_dict(record.get("change"))
        except ChangeError as exc:
            raise JournalError(f"{where}: a change record without a usable 'change': "
                               f"{exc}") from None
        entries.append(JournalEntry(
            id=entry, time=text_field(record, "time", where),
            spec=text_field(record, "spec", where), check=text_field(record, "check", where),
            kind=text_field(record, "kind", where),
            key=text_field(record, "key", where, optional=True), change=change,
            state=states[entry], line=number, read_back=read_backs.get(entry),
            error=errors.get(entry) or None, restored=entry in restored))
    return JournalContents(location, tuple(entries), rolled_back, damaged, identity,
                           *run_fields(header))


def has_undo(contents: JournalContents) -> bool:
    """Something to roll back: not closed, and not every change failed (a second --fix that
    only retried a failing modprobe) or was restored by an earlier rollback. A change in an
    ``unknown`` state (its command timed out) may have been made, so it counts."""
    return not contents.rolled_back and any(e.state != FAILED and not e.restored
                                            for e in contents.entries)


def latest_journal(where: StateStore | Path,
                   accept: Callable[[JournalContents], bool] | None = None) -> StateFile | None:
    """The newest journal on the host (a ``Path``: under that root of this machine) with
    something to undo (``has_undo``), and that ``accept`` takes (a container's host: the
    journal of the container's run)."""
    store = where if isinstance(where, StateStore) else StateStore(LocalHost(where), str(where))
    for path in reversed(store.journals()):
        journal = store.file(path)
        contents = read_journal(journal)
        if has_undo(contents) and (accept is None or accept(contents)):
            return journal
    return None


# -- a record's fields, each checked as it is read --------------------------------------------

class JournalError(Exception):
    """A journal that cannot be rolled back as it is; the message names ``file:line``."""


def text_field(record: dict[str, Any], name: str, where: str, *, optional: bool = False) -> Any:
    value = record.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        shown = "nothing" if name not in record else f"{type(value).__name__} {value!r}"[:60]
        raise JournalError(f"{where}: a change record without a usable {name!r}: expected a "
                           f"string, got {shown}")
    return value


def identity_field(record: dict[str, Any], where: str) -> HostIdentity | None:
    data = record.get("identity")
    if data is None:
        return None
    fields = ("root", "hostname", "machine_id", "boot_id")
    if not isinstance(data, dict) or not isinstance(data.get("root"), str) or any(
            not isinstance(data.get(name), str | None) for name in fields):
        raise JournalError(f"{where}: the journal header's identity must be a mapping of "
                           f"{', '.join(fields)} to strings, got {str(data)[:80]}")
    return HostIdentity(data["root"], data.get("hostname"), data.get("machine_id"),
                        data.get("boot_id"))


def read_back_field(record: dict[str, Any], where: str) -> bytes | None:
    encoded = record.get("read_back_base64")
    if encoded is None:
        return None
    try:
        return base64.b64decode(str(encoded), validate=True)
    except ValueError:
        raise JournalError(f"{where}: 'read_back_base64' is not base64") from None


def run_fields(header: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """The header's run id and the containers whose host the journal's target was (a journal
    older than them: None and none; a rollback then pairs a container with its host's newest)."""
    run, containers = header.get("run"), header.get("containers")
    return (run if isinstance(run, str) else None,
            tuple(str(each) for each in containers) if isinstance(containers, list) else ())
