"""What a fix would do to a host, as data: planned, shown in a dry run, journaled, undone.

A probe plans changes; the fixer (``fixes.py``) is the only code that carries them out. Each
change knows its original, so the journal can restore it and a dry run can show from -> to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WriteText:
    """Replace the whole value of a text file (a sysctl, a cpuidle ``disable`` file)."""

    path: str
    old: str
    new: str

    def describe(self) -> str:
        return f"write {self.path}: {self.old.strip()!r} -> {self.new.strip()!r}"

    def undo(self) -> WriteText:
        return WriteText(self.path, self.new, self.old)


@dataclass(frozen=True)
class WriteBytes:
    """Write bytes in place at an offset (config space); ``old``/``new`` are hex strings."""

    path: str
    offset: int
    old: str
    new: str

    def describe(self) -> str:
        return f"write {self.path} @0x{self.offset:02x}: {self.old} -> {self.new}"

    def undo(self) -> WriteBytes:
        return WriteBytes(self.path, self.offset, self.new, self.old)


@dataclass(frozen=True)
class Command:
    """Run a command under the root (modprobe); ``undo_argv`` reverses it."""

    argv: tuple[str, ...]
    undo_argv: tuple[str, ...]
    old: str
    new: str

    def describe(self) -> str:
        return f"run {' '.join(self.argv)} ({self.old} -> {self.new})"

    def undo(self) -> Command:
        return Command(self.undo_argv, self.argv, self.new, self.old)


@dataclass(frozen=True)
class ReplaceFile:
    """Create or replace a whole file atomically (persistence); ``old`` None: it did not exist."""

    path: str
    old: str | None
    new: str | None

    def describe(self) -> str:
        if self.new is None:
            return f"remove {self.path}"
        verb = "create" if self.old is None else "replace"
        return f"{verb} {self.path} ({len(self.new.splitlines())} lines)"

    def undo(self) -> ReplaceFile:
        return ReplaceFile(self.path, self.new, self.old)


@dataclass(frozen=True)
class NvmlSetting:
    """A GPU setting made through NVML (persistence mode), for the GPU at ``address``."""

    address: str
    setting: str
    old: str
    new: str

    def describe(self) -> str:
        return f"set NVML {self.setting} of {self.address}: {self.old} -> {self.new}"

    def undo(self) -> NvmlSetting:
        return NvmlSetting(self.address, self.setting, self.new, self.old)


Change = WriteText | WriteBytes | Command | ReplaceFile | NvmlSetting
_TYPES: dict[str, type[Change]] = {
    "write_text": WriteText, "write_bytes": WriteBytes, "command": Command,
    "replace_file": ReplaceFile, "nvml_setting": NvmlSetting,
}


@dataclass(frozen=True)
class Plan:
    """What a fix will do: one line for a person, and the changes it is made of."""

    summary: str
    changes: tuple[Change, ...]
    brief: str | None = None
    """The summary after a failure that already names the subject (the CPUs): a dry run's
    "would ..." says it without repeating them."""


def to_dict(change: Change) -> dict[str, Any]:
    name = next(key for key, cls in _TYPES.items() if isinstance(change, cls))
    data: dict[str, Any] = {"type": name, **change.__dict__}
    for key in ("argv", "undo_argv"):
        if key in data:
            data[key] = list(data[key])
    return data


def from_dict(data: dict[str, Any]) -> Change:
    values = dict(data)
    cls = _TYPES[values.pop("type")]
    for key in ("argv", "undo_argv"):
        if key in values:
            values[key] = tuple(values[key])
    return cls(**values)
