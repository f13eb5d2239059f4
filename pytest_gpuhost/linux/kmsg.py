"""Kernel log records as /dev/kmsg gives them: ``PRIO,SEQ,USEC,FLAGS;TEXT``.

PRIO is ``facility << 3 | level``; lines that start with a space continue the previous record
with ``KEY=value`` pairs (device properties) and are not records of their own.

The kernel escapes each byte of TEXT below 0x20, from 0x7f (so UTF-8, too) and the backslash as
``\\xNN`` (``initrd=\\x5cucode.img``); dmesg(1) shows them decoded. Records are decoded, so an
allow pattern copied from dmesg output matches, and are shown decoded, with control characters
alone escaped again (a log line must not drive the terminal).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def decode_text(text: str) -> str:
    """``initrd=\\x5cucode.img`` -> ``initrd=\\ucode.img``; escaped UTF-8 bytes join into
    their character, bytes that are not UTF-8 become U+FFFD."""
    if "\\x" not in text:
        return text
    raw = _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), text.encode("utf-8"))
    return raw.decode("utf-8", "replace")


def shown_text(text: str) -> str:
    """Decoded text with control characters (ESC, newlines) escaped again, for reports."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")
ALIASES = {"warning": "warn", "error": "err", "critical": "crit", "emergency": "emerg"}


class Record(NamedTuple):
    """One record. A named tuple: a million of them are built in a second, a frozen
    dataclass takes four times as long."""

    level: int
    facility: int
    seq: int
    usec: int
    text: str

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]

    def __str__(self) -> str:
        return f"[{self.usec / 1e6:12.6f}] {self.level_name:<6} {shown_text(self.text)}"


def level_number(name: str) -> int:
    """``warn`` (or ``warning``) -> 4; ValueError for an unknown name."""
    canonical = ALIASES.get(name, name)
    if canonical not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; expected one of: {', '.join(LEVELS)}")
    return LEVELS.index(canonical)


def iter_records(lines: Iterable[str]) -> Iterator[Record | None]:
    """Each record among ``lines`` as it is parsed, None for a line that is neither a record
    nor a continuation. A consumer that keeps only what it needs (the dmesg check keeps the
    offending records) never holds a million records: it stays linear, garbage collector
    included."""
    for line in lines:
        if not line or line[0].isspace():
            continue
        header, sep, text = line.partition(";")
        fields = header.split(",", 3)
        try:
            if not sep or len(fields) < 4:
                raise ValueError(line)
            prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            yield None
            continue
        yield Record(prio & 7, prio >> 3, seq, usec,
                     decode_text(text) if "\\x" in text else text)


def parse_records(lines: Iterable[str]) -> tuple[list[Record], int]:
    """The records among ``lines`` and how many lines were neither a record nor a continuation."""
    records: list[Record] = []
    malformed = 0
    for record in iter_records(lines):
        if record is None:
            malformed += 1
        else:
            records.append(record)
    return records, malformed
