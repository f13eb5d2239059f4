"""The failures of a run with many failing checks: written in one pass, and folded past a count.

pytest's own sections (FAILURES, ERRORS) write every failing test in full and, for each, look
through every report of the run for its teardown sections: quadratic in the failures, 45 s for
5,000 failing sysctls and 200 s for 10,000, which is what a first run over an untuned fleet
meets. The checks' reports are taken out of those sections (``Taken``, before pytest writes
them) and written here instead (``Written``), each once: the first FOLD_AFTER in full, as pytest
writes a failure (its headline, then the check's failure text), the rest folded to a count.
Every one keeps its line in pytest's short test summary, which is written after, its place in
the counts and its record in every report; ``-vv`` writes them all in full, ``--tb=no`` and
``--no-summary`` none, as pytest does.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from ..session.containers import unjudged

FOLD_AFTER = 20
CATEGORIES = ("failed", "error")
"""pytest's report categories that its FAILURES and ERRORS sections write."""


class Taken:
    """Holds the checks' failed and error reports out of pytest's sections while they run."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        """The attribute a check's report carries (``hooks.REPORT_ATTR``)."""
        self.kept: dict[str, list[Any]] = {}
        """category -> pytest's own list of its reports, as it was."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None, None, None]:
        stats = terminalreporter.stats
        for category in CATEGORIES:
            reports = stats.get(category)
            if reports and any(hasattr(report, self.marker) for report in reports):
                self.kept[category] = reports
                stats[category] = [r for r in reports if not hasattr(r, self.marker)]
        try:
            return (yield)
        finally:
            self.put_back(terminalreporter)

    def put_back(self, terminalreporter: Any) -> list[tuple[str, Any]]:
        """pytest's lists as they were (for its short summary and its counts, written after);
        returns the checks' reports taken, in order, with their categories."""
        taken = [(category, report) for category, reports in self.kept.items()
                 for report in reports if hasattr(report, self.marker)]
        terminalreporter.stats.update(self.kept)
        self.kept = {}
        return taken


class Written:
    """Writes the checks' failures where pytest's sections were (a plain hook: after pytest's
    sections, before its short summary)."""

    def __init__(self, taken: Taken) -> None:
        self.taken = taken

    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        reports = self.taken.put_back(terminalreporter)
        if not reports or config.option.tbstyle == "no" or \
                getattr(config.option, "no_summary", False):
            return
        written, repeated = _once_per_target(reports, self.taken.marker)
        shown = written if config.get_verbosity() >= 2 else written[:FOLD_AFTER]
        terminalreporter.write_sep("=", f"FAILURES of gpuhost checks ({len(reports)})")
        first = unjudged([str(getattr(_record(report, self.taken.marker), "message", ""))
                          for _, report in reports])
        if first is not None:  # said once, before the blocks it would otherwise hide among
            terminalreporter.write_line(first, yellow=True, bold=True)
        for category, report in shown:
            prefix = "ERROR " if category == "error" else ""
            terminalreporter.write_sep("_", f"{prefix}{report.head_line}", red=True, bold=True)
            terminalreporter.write_line(report.longreprtext)
        for target, count in repeated.items():
            terminalreporter.write_line(
                f"... and {count} more {'check' if count == 1 else 'checks'} of {target} with "
                "the same error (its target was not reached): each has its line in the short "
                "test summary below")
        folded = len(written) - len(shown)
        if folded:
            terminalreporter.write_line(
                f"... and {folded} more failing checks, folded: each has its line in the short "
                "test summary below and its record in every report (-vv writes them all here)")


def _record(report: Any, marker: str) -> object:
    """The check's record a report carries, else None."""
    payload = getattr(report, marker, None)
    return payload.get("result") if isinstance(payload, dict) else None


def _once_per_target(reports: list[tuple[str, Any]], marker: str
                     ) -> tuple[list[tuple[str, Any]], dict[str, int]]:
    """The reports to write, each error of a target that could not be reached once (its
    every check says the same: one block says it), and how many were left out per target."""
    written: list[tuple[str, Any]] = []
    repeated: dict[str, int] = {}
    seen: set[tuple[str, str]] = set()
    for category, report in reports:
        record = _record(report, marker)
        target = getattr(record, "target", None)
        if category == "error" and target is not None and \
                getattr(record, "outcome", None) == "error":
            key = (str(target), str(getattr(record, "message", "")))
            if key in seen:
                repeated[target] = repeated.get(target, 0) + 1
                continue
            seen.add(key)
        written.append((category, report))
    return written, repeated


def register(config: pytest.Config, marker: str) -> None:
    """On the controller: both halves, ``Taken`` around pytest's sections and ``Written``."""
    taken = Taken(marker)
    config.pluginmanager.register(taken, "gpuhost-failures-taken")
    config.pluginmanager.register(Written(taken), "gpuhost-failures-written")
