"""Reporters: every report is fed from the ordered result records and the run's information,
read once by the session; none reads a host or fixes anything.

A reporter is anything with ``write(records, info)``; ``reporters(...)`` makes the ones the run
asked for. The terminal summary, JSON, Prometheus and Allure's session files are reporters; the
JUnit properties and the failure text are per record.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..result import CheckResult


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
    finished_at: float = field(default_factory=time.time)

    @property
    def spec_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.specs)


class Reporter(Protocol):
    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        """Write the report; raise ``files.OutputError`` when it cannot be written."""
