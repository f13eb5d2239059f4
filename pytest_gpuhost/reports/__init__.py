"""Reporters: every report is fed from the ordered result records and the run's information,
read once by the session; none reads a host or fixes anything.

A reporter is anything with ``write(records, info)``; ``reporters(...)`` makes the ones the run
asked for. The terminal summary, JSON, Prometheus and Allure's session files are reporters; the
JUnit properties and the failure text are per record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..result import CheckResult


@dataclass(frozen=True)
class TargetInfo:
    """One target as it reports itself, and what reaching it cost."""

    name: str
    url: str
    hostname: str | None = None
    kernel: str | None = None
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    unreachable: str | None = None
    journal: str | None = None
    """The journal of the changes made on it, where there were any."""
    round_trips: int | None = None
    connections: int | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    connect_seconds: float | None = None

    def as_dict(self) -> dict[str, object]:
        data = dict(self.__dict__)
        data["gpus"], data["gpu_models"] = list(self.gpus), list(self.gpu_models)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> TargetInfo:
        values = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        for key in ("gpus", "gpu_models"):
            values[key] = tuple(values.get(key) or ())  # type: ignore[arg-type]
        return cls(**values)  # type: ignore[arg-type]

    def add_traffic(self, other: TargetInfo) -> TargetInfo:
        """Two workers' connections to one target: their costs add up."""
        def total(a: float | int | None, b: float | int | None) -> Any:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return dataclasses.replace(
            self, round_trips=total(self.round_trips, other.round_trips),
            connections=total(self.connections, other.connections),
            bytes_sent=total(self.bytes_sent, other.bytes_sent),
            bytes_received=total(self.bytes_received, other.bytes_received),
            connect_seconds=total(self.connect_seconds, other.connect_seconds),
            unreachable=self.unreachable or other.unreachable,
            journal=self.journal or other.journal)


@dataclass(frozen=True)
class RunInfo:
    """What every report says about the run besides its checks."""

    specs: tuple[tuple[str, str], ...]
    """(path as shown, name) of each spec."""
    root: str
    """The host root (``/`` or the fake tree), as the host describes it."""
    hostname: str | None
    """The machine's name as the host reports it (its kernel's hostname), not the runner's."""
    kernel: str | None = None
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    fix: bool = False
    dry_run: bool = False
    journal: str | None = None
    rollback: str | None = None
    json_report: bool = False
    """Whether a JSON report is written (the terminal refers to it only then)."""
    targets: tuple[TargetInfo, ...] = ()
    """Every target of the run, in the order given; the fields above describe the first."""
    stopped: str | None = None
    """Why the run ended before its checks did (an interrupt, a lock it could not have, an
    internal error); None when it ran to its end."""
    finished_at: float = field(default_factory=time.time)

    @property
    def spec_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.specs)


class Reporter(Protocol):
    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        """Write the report; raise ``files.OutputError`` when it cannot be written."""
