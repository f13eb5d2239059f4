"""The state a host was verified in, for the benchmark that ran on it, and what changed between
two of them.

A state holds, per target, every host check's id and the value it observed after any fix of
the run, its outcomes counted and its failing ids, beside the spec's name and the digest of its
content. Its ``digest`` is a sha256 over the ids and observed values only (canonical JSON): the
same host state gives the same digest in every run, whatever the time, the journal or the
paths. Measured values (a P2P bandwidth, kernel log records, error counters: ``measured``
records) are results, not settings: listed beside, never in the digest.

    python -m pytest_gpuhost.state diff OLD NEW

compares the states of two JSON reports (``--gpuhost-report``), pytest-benchmark files (their
``machine_info["gpuhost"]``) or states written out (``gpuhost_state.as_dict()``), one of each
too: exit 0 when the states are the same, 1 when they
differ (a target that read nothing on either side is never the same: below), 4
for a missing, unreadable or foreign file, or where neither state read anything (one line on
stderr).

No pytest here: the plugin, the pytest-benchmark hooks and the command share it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import msgspec

from .printable import one_line
from .reports.terminal import SESSION_KINDS
from .result import OPEN_OUTCOMES, OUTCOMES, CheckResult
from .statepairs import pairs, same_machines

VERSION = 1
"""The layout of a state; a reader refuses another."""
LOCAL = "local"
"""The target of a run that names none (this machine, at its root)."""
OPEN = tuple(outcome.value for outcome in OPEN_OUTCOMES)
"""The outcomes that are not failing: the gate's. (``SESSION_KINDS``: the records of a run's
own work, its persistence files and restored changes, are no part of a host's state.)"""
MAX_FILE_BYTES = 512 * 1024 * 1024
"""A report or benchmark file larger than this is refused, not read."""


class Entry(msgspec.Struct, frozen=True):
    """One check as a state holds it (and as an xdist worker's done log carries it)."""

    id: str
    target: str
    observed: str | None
    outcome: str
    measured: bool = False

    @classmethod
    def of(cls, record: CheckResult) -> Entry:
        return cls(record.id, record.target or LOCAL, record.observed, record.outcome.value,
                   record.measured)

    def as_dict(self) -> dict[str, object]:
        return {"id": self.id, "target": self.target, "observed": self.observed,
                "outcome": self.outcome, "measured": self.measured}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        observed = data.get("observed")
        return cls(str(data["id"]), str(data["target"]),
                   None if observed is None else str(observed), str(data["outcome"]),
                   bool(data.get("measured", False)))


def canonical(value: object) -> bytes:
    """The one byte string of a JSON value: keys sorted, no spaces, ASCII only."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checks_digest(checks: Mapping[str, str | None]) -> str:
    """A target's digest: its checks' ids and observed values."""
    return sha256(canonical(dict(checks)))


def run_digest(targets: Mapping[str, str]) -> str:
    """The state's digest from its targets' digests (name -> digest): one target's own digest
    (so the same state on another machine, or reached another way, has the same digest), else
    a digest over every target's name and digest."""
    if len(targets) == 1:
        return next(iter(targets.values()))
    return sha256(canonical(dict(targets)))


class SpecDigest(msgspec.Struct, frozen=True):
    name: str
    digest: str
    """sha256 of the spec file's bytes."""


def spec_digest(name: str, content: bytes) -> SpecDigest:
    return SpecDigest(name, sha256(content))


def build(entries: Iterable[Entry], specs: Sequence[SpecDigest],
          machines: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The state (as plain JSON data) of a run's host checks, in the order they ran, with each
    target's machine where known (``statepairs.py``). An id checked twice on one target (by two
    specs) is one setting of the host: its later value."""
    targets: dict[str, dict[str, Any]] = {}
    for entry in entries:
        target = targets.setdefault(entry.target, {
            "digest": "", "checks": {}, "measured": {},
            "outcomes": dict.fromkeys(OUTCOMES, 0), "failing": []})
        (target["measured"] if entry.measured else target["checks"])[entry.id] = entry.observed
        target["outcomes"][entry.outcome] = target["outcomes"].get(entry.outcome, 0) + 1
        if entry.outcome not in OPEN and entry.id not in target["failing"]:
            target["failing"].append(entry.id)
    for name, target in targets.items():
        target["digest"] = checks_digest(target["checks"])
        target["read"] = sum(value is not None for value in target["checks"].values())
        if machines and machines.get(name):
            target["machine"] = machines[name]
    if len(specs) == 1:
        spec = {"name": specs[0].name, "digest": specs[0].digest}
    else:
        spec = {"name": ", ".join(s.name for s in specs),
                "digest": sha256(canonical([s.digest for s in specs]))}
    return {
        "version": VERSION,
        "digest": run_digest({name: t["digest"] for name, t in targets.items()}),
        "spec": spec,
        "specs": [{"name": s.name, "digest": s.digest} for s in specs],
        "targets": targets,
        "unread": [name for name, target in targets.items() if not target["read"]],
        # the targets whose checks read nothing (errors, skipped): no state vouches for them
    }


def entries_of(records: Iterable[CheckResult]) -> list[Entry]:
    """The host checks among a run's records (not the persistence files it wrote)."""
    return [Entry.of(record) for record in records if record.kind not in SESSION_KINDS]


def _frozen(value: Any) -> Any:
    if isinstance(value, Mapping):
        return MappingProxyType({key: _frozen(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return tuple(_frozen(item) for item in value)
    return value


def _thawed(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _thawed(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_thawed(item) for item in value]
    return value


class HostState(Mapping[str, Any]):
    """A state as the ``gpuhost_state`` fixture gives it: a read-only mapping (``digest``,
    ``spec``, ``specs``, ``targets``, ``version``; nested mappings read-only too).
    ``as_dict()`` is a plain copy to write beside a result (``json.dumps`` takes it)."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data: Mapping[str, Any] = _frozen(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"HostState(digest={self.digest!r}, spec={self['spec']['name']!r})"

    @property
    def digest(self) -> str:
        return str(self._data["digest"])

    def as_dict(self) -> dict[str, Any]:
        thawed: dict[str, Any] = _thawed(self._data)
        return thawed


# -- reading a state from a file -----------------------------------------------------------


class StateFileError(Exception):
    """A file that holds no state this version can read: missing, unreadable, foreign."""


def read_state(path: Path) -> dict[str, Any]:
    """The state in a JSON report (``state``) or a pytest-benchmark file
    (``machine_info["gpuhost"]``), checked: its layout, and its digests against its checks."""
    name = shown(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise StateFileError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateFileError(f"{name}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise StateFileError(f"{name}: {info.st_size} bytes, more than a report or "
                                 f"benchmark file holds ({MAX_FILE_BYTES} at most)")
        with os.fdopen(fd, "rb", closefd=False) as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise StateFileError(f"{name}: cannot read it: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        raise StateFileError(f"{name}: not JSON (a pytest-gpuhost JSON report or a "
                             "pytest-benchmark file was expected)") from None
    return _state_of(document, name)


def _state_of(document: object, name: str) -> dict[str, Any]:
    if isinstance(document, dict) and isinstance(document.get("machine_info"), dict) \
            and "benchmarks" in document:
        state = document["machine_info"].get("gpuhost")
        if state is None:
            raise StateFileError(f"{name}: a pytest-benchmark file without a gpuhost state "
                                 "(saved by a run without pytest-gpuhost's host checks)")
    elif isinstance(document, dict) and str(document.get("tool", "")).startswith(
            "pytest-gpuhost") and "checks" in document:
        state = document.get("state")
        if state is None:
            raise StateFileError(f"{name}: a pytest-gpuhost report without a state (a rollback,"
                                 " a run without host checks, or an older pytest-gpuhost)")
    elif isinstance(document, dict) and {"version", "digest", "targets"} <= document.keys():
        state = document  # a state on its own (``gpuhost_state.as_dict()`` written out)
    else:
        raise StateFileError(f"{name}: neither a pytest-gpuhost JSON report, a "
                             "pytest-benchmark file nor a gpuhost state")
    problem = invalid_reason(state)
    if problem is not None:
        raise StateFileError(f"{name}: its gpuhost state {problem}")
    assert isinstance(state, dict)
    return state


def invalid_reason(state: object) -> str | None:
    """Why ``state`` is no state of this version (None: it is one, its digests hold)."""
    if not isinstance(state, dict):
        return "is not an object"
    if state.get("version") != VERSION:
        return f"has version {shown(state.get('version'))}; this pytest-gpuhost reads {VERSION}"
    targets = state.get("targets")
    if not isinstance(targets, dict) or not targets:
        return "names no target"
    digests: dict[str, str] = {}
    for target_name, target in targets.items():
        checks = target.get("checks") if isinstance(target, dict) else None
        if not isinstance(checks, dict) or not all(
                value is None or isinstance(value, str) for value in checks.values()):
            return f"has no checks of ids and values for target {shown(target_name)}"
        digests[target_name] = checks_digest(checks)
        if target.get("digest") != digests[target_name]:
            return f"does not match its checks on target {shown(target_name)} (edited?)"
    if state.get("digest") != run_digest(digests):
        return "digest does not match its targets' (edited?)"
    if not isinstance(state.get("spec"), dict):
        return "names no spec"
    return None


# -- comparing two states ------------------------------------------------------------------
# Which checks changed between two states, and whether the two are the same state at all.
#
# Nothing vouches for what it did not see: a target whose checks read nothing (each an error or
# skipped: it was not reached, or no check applied) holds no state, whatever its digest (the ids
# with no value are the same on every such run). Two states are the same only where both read
# their every target and their digests agree; a comparison says which target read nothing where.

LIMIT = 20
"""Changed checks a comparison names; the rest are counted."""
SHORT = 12
"""Hex digits of a digest shown in a line (the reports hold all 64)."""
MISSING = object()
"""A check one state holds and the other does not."""


def shown(value: object) -> str:
    """A host value in a line for operators: control characters escaped, nothing read said so."""
    if value is None:
        return "(nothing read)"
    return one_line(str(value))


def short(digest: object) -> str:
    return shown(digest)[:SHORT]


def read_nothing(checks: Mapping[str, str | None]) -> bool:
    """Whether a target's checks read no value at all (every one an error or skipped)."""
    return all(value is None for value in checks.values())


def unread(state: Mapping[str, Any]) -> dict[str, int]:
    """The targets of ``state`` that read nothing, each with its number of checks; computed
    from the checks (a state written before it said so reads the same)."""
    found = {}
    for name, target in (state.get("targets") or {}).items():
        checks = (target or {}).get("checks") or {}
        if read_nothing(checks):
            found[str(name)] = len(checks)
    return found


def read_none(state: Mapping[str, Any]) -> bool:
    """Whether no target of ``state`` read anything: no state to compare."""
    return len(unread(state)) == len(state.get("targets") or {})


class Change(msgspec.Struct, frozen=True):
    name: str
    """The check's id, with ``@target`` when the states have several targets."""
    old: object
    new: object

    def line(self, old_label: str, new_label: str) -> str:
        if self.old is MISSING:
            return f"{shown(self.name)}: only in {new_label} ({shown(self.new)})"
        if self.new is MISSING:
            return f"{shown(self.name)}: only in {old_label} ({shown(self.old)})"
        return f"{shown(self.name)}: {shown(self.old)} -> {shown(self.new)}"


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The checks whose observed value differs, and those on one side only, by id."""
    found: list[Change] = []
    for suffix, a, b in pairs(old, new):
        before = dict((a or {}).get("checks") or {})
        after = dict((b or {}).get("checks") or {})
        for check_id in sorted({*before, *after}):
            was, now = before.get(check_id, MISSING), after.get(check_id, MISSING)
            if check_id in before and check_id in after and was == now:
                continue
            found.append(Change(check_id + suffix, was, now))
    return found


def same(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """The same state: the same digest, or the same machines in the same state under other
    names (``statepairs.py``), and every target of both read something."""
    digests = bool(old.get("digest")) and old.get("digest") == new.get("digest")
    return (digests or same_machines(old, new)) and not unread(old) and not unread(new)


def nothing_in(count: int, label: str) -> str:
    """``in OLD (its 2 checks: errors or skipped)``."""
    return f"in {label} (its {count} check{'' if count == 1 else 's'}: errors or skipped)"


def _unread_sides(checks: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None],
                  labels: tuple[str, str]) -> str:
    """``in OLD (its 2 checks: errors or skipped) nor in NEW (...)``: the sides of one target
    that read nothing; "" where both read something."""
    sides = []
    for target, label in zip(checks, labels, strict=True):
        values = (target or {}).get("checks") or {}
        if target is not None and read_nothing(values):
            sides.append(nothing_in(len(values), label))
    return " nor ".join(sides)


def neither(old: Mapping[str, Any], new: Mapping[str, Any], labels: tuple[str, str]) -> str:
    """``in OLD (its 2 checks: ...) nor in NEW (...)``: two states that read nothing."""
    return " nor ".join(nothing_in(sum(unread(state).values()), label)
                        for state, label in zip((old, new), labels, strict=True))


def unread_line(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str,
                new_label: str) -> str | None:
    """What a comparison says first where a target read nothing on a side; None where none."""
    labels = (old_label, new_label)
    if read_none(old) and read_none(new):
        return f"not comparable: nothing was read {neither(old, new, labels)}, so nothing says " \
               "the host is the same"
    paired = pairs(old, new)
    found = [(suffix, _unread_sides((a, b), labels)) for suffix, a, b in paired]
    found = [(suffix, sides) for suffix, sides in found if sides]
    if not found:
        return None
    if len(paired) == 1:
        return f"host state not the same: nothing was read {found[0][1]}, so nothing says " \
               "the host is the same"
    named = "; ".join(f"on {shown(suffix[1:])} {sides}" for suffix, sides in found)
    return f"host state not the same: nothing was read {named}, so nothing says " \
           f"{'it is' if len(found) == 1 else 'they are'} the same"


def diff_lines(old: Mapping[str, Any], new: Mapping[str, Any], *, old_label: str,
               new_label: str, limit: int | None = LIMIT, indent: str = "  ") -> list[str]:
    """What a comparison says: same state or not (the digests; a target that read nothing
    on either side is never the same), the spec if it changed, then one line per changed
    check, at most ``limit`` (None: all) and how many more."""
    lines: list[str] = []
    nothing = unread_line(old, new, old_label=old_label, new_label=new_label)
    found = changes(old, new)
    if nothing is not None:
        lines.append(nothing)
    elif same(old, new):
        lines.append(f"same host state ({short(new.get('digest'))})" if old.get("digest") ==
                     new.get("digest") else "same host state, the same machines under other "
                     f"names ({short(old.get('digest'))} in {old_label}, "
                     f"{short(new.get('digest'))} in {new_label})")
    else:
        lines.append(f"host state differs ({short(old.get('digest'))} in {old_label}, "
                     f"{short(new.get('digest'))} in {new_label}): "
                     f"{len(found)} check{'' if len(found) == 1 else 's'} changed")
    if nothing is None or not (read_none(old) and read_none(new)):
        listed = found if limit is None else found[:limit]
        lines += [indent + change.line(old_label, new_label) for change in listed]
        if len(found) > len(listed):
            lines.append(f"{indent}and {len(found) - len(listed)} more")
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    if old_spec.get("digest") != new_spec.get("digest"):
        lines.append(f"spec: {shown(old_spec.get('name'))} ({short(old_spec.get('digest'))}) "
                     f"in {old_label}, {shown(new_spec.get('name'))} "
                     f"({short(new_spec.get('digest'))}) in {new_label}")
    return lines


# -- python -m pytest_gpuhost.state diff OLD NEW -------------------------------------------

PROG = "python -m pytest_gpuhost.state"
BAD_INPUT = 4


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """A usage error: one line, and the status of a bad input."""
        print(f"{PROG}: {message} (usage: {PROG} diff OLD NEW [--all])", file=sys.stderr)
        raise SystemExit(BAD_INPUT)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog=PROG, description="Compare the host states of two pytest-gpuhost "
                     "JSON reports or pytest-benchmark files.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    diff = commands.add_parser("diff", help="the checks whose values changed from OLD to NEW; "
                               "exit 0: the same state, 1: it differs, 4: a bad file")
    diff.add_argument("old", type=Path, metavar="OLD")
    diff.add_argument("new", type=Path, metavar="NEW")
    diff.add_argument("--all", action="store_true",
                      help=f"name every changed check (default: the first {LIMIT})")
    args = parser.parse_args(argv)
    try:
        old, new = read_state(args.old), read_state(args.new)
    except StateFileError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return BAD_INPUT
    if read_none(old) and read_none(new):
        print(f"{PROG}: nothing was read {neither(old, new, ('OLD', 'NEW'))}: no host state to "
              "compare; compare runs that reached their hosts", file=sys.stderr)
        return BAD_INPUT
    print(f"OLD: {shown(args.old)}")
    print(f"NEW: {shown(args.new)}")
    for line in diff_lines(old, new, old_label="OLD", new_label="NEW",
                           limit=None if args.all else LIMIT):
        print(line)
    return 0 if same(old, new) else 1


if __name__ == "__main__":
    raise SystemExit(main())
