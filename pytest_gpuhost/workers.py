"""Ordering across pytest-xdist workers: checks that must run after all others wait for them.

Without xdist, collection order is run order. With ``-n N`` each worker runs its own share, so the
controller hands every worker one shared directory (through ``workerinput``); each finished check
leaves a mark there, and a last-ranked check (dmesg) waits until every other check's mark exists.
A mark holds the check's gate verdict (see ``gate``), so a gated test on any worker can wait for
every host check's mark and read why the gate is open or closed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from .files import write_atomically

WORKERINPUT_KEY = "gpuhost_shared_dir"
WAIT_TIMEOUT_S = 900.0
POLL_S = 0.05


class DoneMarks:
    """One file per finished check, named by its collection index, holding its verdict."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def mark(self, index: int, verdict: str = "") -> None:
        """Write to a temporary name and rename, so a mark that exists is complete."""
        write_atomically(self.directory / f"done-{index}", verdict)

    def verdict(self, index: int) -> str | None:
        try:
            return (self.directory / f"done-{index}").read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def missing(self, indices: Iterable[int]) -> list[int]:
        return [i for i in indices if not (self.directory / f"done-{i}").exists()]

    def wait_for(self, indices: Iterable[int], timeout: float = WAIT_TIMEOUT_S) -> list[int]:
        """Wait until every index is marked; return those still missing at the timeout."""
        wanted = list(indices)
        deadline = time.monotonic() + timeout
        while True:
            missing = self.missing(wanted)
            if not missing or time.monotonic() >= deadline:
                return missing
            wanted = missing
            time.sleep(POLL_S)


class SharedDirectory:
    """Controller side: make the directory and pass it, and ``extra`` values such as the run's
    journal, to every worker."""

    def __init__(self, extra: dict[str, str] | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="pytest-gpuhost-"))
        self.extra = dict(extra or {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = str(self.path)
        node.workerinput.update(self.extra)

    def pytest_unconfigure(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def worker_marks(config: pytest.Config) -> DoneMarks | None:
    """On an xdist worker started by a gpuhost controller, the shared marks; else None."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKERINPUT_KEY not in workerinput:
        return None
    return DoneMarks(Path(workerinput[WORKERINPUT_KEY]))
