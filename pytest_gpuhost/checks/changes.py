"""What a fix would do to a host, as data: planned, shown in a dry run, journaled, undone.

A probe plans changes; the fixer (``fixes.py``) is the only code that carries them out. Each
change knows its original, so the journal can restore it and a dry run can show from -> to.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from ..host import UnsafePath, checked_relative

CONFIG_HEADER = 0x40
"""Config-space writes are to capabilities, never to the 64-byte header (BARs, command)."""


def lossless_text(raw: bytes) -> str:
    """``raw`` as text that tells every two byte strings apart: UTF-8 without a backslash as it
    is (nearly every value), else with each backslash doubled and each byte that is not UTF-8 as
    ``\\xNN`` (``gpu-n\\xf6de``). A rollback compares originals in this form, so bytes that
    decoding would turn into U+FFFD are never taken for restored."""
    if b"\\" not in raw and is_text(raw):
        return raw.decode("utf-8")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def is_text(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class WriteText(msgspec.Struct, frozen=True):
    """Replace the whole value of a text file (a sysctl, a cpuidle ``disable`` file).

    ``old``/``new`` are the text as shown; a value that is not UTF-8 (a hostname written by
    another tool in Latin-1) also keeps its exact bytes in ``old_raw``/``new_raw``, so an undo
    writes those bytes back, not U+FFFD."""

    path: str
    old: str
    new: str
    old_raw: bytes | None = None
    new_raw: bytes | None = None

    @classmethod
    def of_bytes(cls, path: str, old: bytes, new: bytes) -> WriteText:
        """The change from ``old`` to ``new`` as read or to be written, losslessly."""
        return cls(path, old.decode("utf-8", "replace"), new.decode("utf-8", "replace"),
                   None if is_text(old) else old, None if is_text(new) else new)

    @property
    def old_bytes(self) -> bytes:
        return self.old.encode() if self.old_raw is None else self.old_raw

    @property
    def new_bytes(self) -> bytes:
        return self.new.encode() if self.new_raw is None else self.new_raw

    def describe(self) -> str:
        old, new = (lossless_text(value).strip() for value in (self.old_bytes, self.new_bytes))
        return f"write {self.path}: {old!r} -> {new!r}"

    def undo(self) -> WriteText:
        return WriteText(self.path, self.new, self.old, self.new_raw, self.old_raw)


class WriteBytes(msgspec.Struct, frozen=True):
    """Write bytes in place at an offset (config space); ``old``/``new`` are hex strings.

    ``never_set`` is the change's own knowledge of the register: bits no restore of it may
    set (Device Control's bit 15 starts a function-level reset)."""

    path: str
    offset: int
    old: str
    new: str
    never_set: int = 0

    def describe(self) -> str:
        return f"write {self.path} @0x{self.offset:02x}: {self.old} -> {self.new}"

    def undo(self) -> WriteBytes:
        return WriteBytes(self.path, self.offset, self.new, self.old, self.never_set)


class Command(msgspec.Struct, frozen=True):
    """Run a command under the root (modprobe); ``undo_argv`` reverses it."""

    argv: tuple[str, ...]
    undo_argv: tuple[str, ...]
    old: str
    new: str

    def describe(self) -> str:
        return f"run {' '.join(self.argv)} ({self.old} -> {self.new})"

    def undo(self) -> Command:
        return Command(self.undo_argv, self.argv, self.new, self.old)


class ReplaceFile(msgspec.Struct, frozen=True):
    """Create or replace a whole file atomically (persistence); ``old`` None: it did not exist.

    A content that is not UTF-8 (an original an editor saved in Latin-1) also keeps its exact
    bytes in ``old_raw``/``new_raw``, so an undo writes those bytes back, not U+FFFD."""

    path: str
    old: str | None
    new: str | None
    old_raw: bytes | None = None
    new_raw: bytes | None = None

    @classmethod
    def of_bytes(cls, path: str, old: bytes | None, new: str | None) -> ReplaceFile:
        """The change from the file as read (``old``, None: absent) to ``new``, losslessly."""
        if old is None:
            return cls(path, None, new)
        return cls(path, old.decode("utf-8", "replace"), new, None if is_text(old) else old)

    @property
    def new_content(self) -> str | bytes | None:
        """What the change writes: its exact bytes where they are not UTF-8."""
        return self.new if self.new_raw is None else self.new_raw

    def describe(self) -> str:
        if self.new is None:
            return f"remove {self.path}"
        verb = "create" if self.old is None else "replace"
        return f"{verb} {self.path} ({len(self.new.splitlines())} lines)"

    def undo(self) -> ReplaceFile:
        return ReplaceFile(self.path, self.new, self.old, self.new_raw, self.old_raw)


class NvmlSetting(msgspec.Struct, frozen=True):
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


class Plan(msgspec.Struct, frozen=True):
    """What a fix will do: one line for a person, and the changes it is made of."""

    summary: str
    changes: tuple[Change, ...]
    brief: str | None = None
    """The summary after a failure that already names the subject (the CPUs): a dry run's
    "would ..." says it without repeating them."""


def to_dict(change: Change) -> dict[str, Any]:
    """The change as JSON data; exact bytes that are not UTF-8 go beside the text as
    ``old_base64``/``new_base64`` (a reader that predates them still gets the text)."""
    name = next(key for key, cls in _TYPES.items() if isinstance(change, cls))
    data: dict[str, Any] = {"type": name, **msgspec.structs.asdict(change)}
    for key in ("argv", "undo_argv"):
        if key in data:
            data[key] = list(data[key])
    for key in ("old_raw", "new_raw"):
        raw = data.pop(key, None)
        if raw is not None:
            data[key.replace("_raw", "_base64")] = base64.b64encode(raw).decode()
    return data


class ChangeError(ValueError):
    """A recorded change whose fields are missing or of the wrong type; the message names them."""


def _shown(value: object) -> str:
    return f"{type(value).__name__} {value!r}"[:80]


def _field(values: dict[str, Any], name: str, kind: str) -> Any:
    """One field, checked against ``kind``: str, str?, int, int?, argv, hex."""
    if name not in values:
        if kind.endswith("?"):
            return None
        raise ChangeError(f"the change has no {name!r}")
    value = values[name]
    if kind in ("str?", "int?") and value is None:
        return None
    if kind in ("str", "str?", "hex") and not isinstance(value, str):
        raise ChangeError(f"the change's {name!r} must be a string, got {_shown(value)}")
    if kind == "hex":
        try:
            bytes.fromhex(value)
        except ValueError:
            raise ChangeError(f"the change's {name!r} must be hex bytes, got {value!r}") from None
    if kind in ("int", "int?") and (isinstance(value, bool) or not isinstance(value, int)
                                    or value < 0):
        raise ChangeError(f"the change's {name!r} must be a non-negative integer, got "
                          f"{_shown(value)}")
    if kind == "argv":
        if not isinstance(value, list) or not value or not all(isinstance(a, str) for a in value):
            raise ChangeError(f"the change's {name!r} must be a non-empty list of strings, got "
                              f"{_shown(value)}")
        return tuple(value)
    return value


def _base64(values: dict[str, Any], name: str) -> bytes | None:
    encoded = _field(values, name, "str?")
    if encoded is None:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ChangeError(f"the change's {name!r} is not base64: {encoded[:40]!r}") from None


_FIELDS: dict[type[Change], tuple[tuple[str, str], ...]] = {
    WriteText: (("path", "str"), ("old", "str"), ("new", "str")),
    WriteBytes: (("path", "str"), ("offset", "int"), ("old", "hex"), ("new", "hex"),
                 ("never_set", "int?")),
    Command: (("argv", "argv"), ("undo_argv", "argv"), ("old", "str"), ("new", "str")),
    ReplaceFile: (("path", "str"), ("old", "str?"), ("new", "str?")),
    NvmlSetting: (("address", "str"), ("setting", "str"), ("old", "str"), ("new", "str")),
}


def from_dict(data: object) -> Change:
    """A change from JSON data, every field checked (a journal may be hand-edited or damaged);
    raises ChangeError naming the field."""
    if not isinstance(data, dict):
        raise ChangeError(f"the change must be a mapping, got {_shown(data)}")
    values = dict(data)
    kind = values.pop("type", None)
    if not isinstance(kind, str) or kind not in _TYPES:
        raise ChangeError(f"unknown change type {kind!r}; expected one of: {', '.join(_TYPES)}")
    cls = _TYPES[kind]
    raw = cls in (WriteText, ReplaceFile)  # exact bytes that are not UTF-8, beside the text
    extra = {"old_base64", "new_base64"} if raw else set()
    known = {name for name, _ in _FIELDS[cls]} | extra
    unknown = sorted(set(values) - known)
    if unknown:
        raise ChangeError(f"unknown field(s) in a {kind} change: {', '.join(unknown)}")
    checked = {name: _field(values, name, spec) for name, spec in _FIELDS[cls]}
    path = checked.get("path")
    if path is not None:
        try:
            checked_relative(path)
        except UnsafePath as exc:
            raise ChangeError(f"the change's path: {exc}") from None
    if cls is WriteBytes and len(checked["old"]) != len(checked["new"]):
        raise ChangeError("the change's 'old' and 'new' are not the same length")
    if cls is WriteBytes and checked["offset"] < CONFIG_HEADER:
        raise ChangeError(f"the change writes config space at 0x{checked['offset']:02x}, inside "
                          "the 64-byte header, where no fix ever writes")
    if cls is WriteBytes and checked.get("never_set") is None:
        checked["never_set"] = 0  # a journal older than the field: restores change only the
        # bits the fix changed, and a fix never changes FLR, so bit 15 stays as it is anyway
    if raw:
        checked["old_raw"] = _base64(values, "old_base64")
        checked["new_raw"] = _base64(values, "new_base64")
    return cls(**checked)
