"""Kernel log records as /dev/kmsg gives them: ``PRIO,SEQ,USEC,FLAGS;TEXT``.

PRIO is ``facility << 3 | level``; lines that start with a space continue the previous record
with ``KEY=value`` pairs (device properties) and are not records of their own.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

LEVELS = ("emerg", "alert", "crit", "err", "warn", "notice", "info", "debug")
ALIASES = {"warning": "warn", "error": "err", "critical": "crit", "emergency": "emerg"}


@dataclass(frozen=True)
class Record:
    level: int
    facility: int
    seq: int
    usec: int
    text: str

    @property
    def level_name(self) -> str:
        return LEVELS[self.level]

    def __str__(self) -> str:
        return f"[{self.usec / 1e6:12.6f}] {self.level_name:<6} {self.text}"


def level_number(name: str) -> int:
    """``warn`` (or ``warning``) -> 4; ValueError for an unknown name."""
    canonical = ALIASES.get(name, name)
    if canonical not in LEVELS:
        raise ValueError(f"unknown log level {name!r}; expected one of: {', '.join(LEVELS)}")
    return LEVELS.index(canonical)


def parse_records(lines: Iterable[str]) -> tuple[list[Record], int]:
    """The records among ``lines`` and how many lines were neither a record nor a continuation."""
    records: list[Record] = []
    malformed = 0
    for line in lines:
        if not line or line[0].isspace():
            continue
        header, sep, text = line.partition(";")
        fields = header.split(",")
        try:
            if not sep or len(fields) < 4:
                raise ValueError(line)
            prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
        except ValueError:
            malformed += 1
            continue
        records.append(Record(prio & 7, prio >> 3, seq, usec, text))
    return records, malformed
