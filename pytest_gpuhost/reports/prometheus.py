"""The run's checks as a Prometheus textfile, for node_exporter's textfile collector.

node_exporter reads ``*.prom`` files from its ``--collector.textfile.directory`` and rejects
samples with timestamps, so the run's time is a gauge of its own. The file is written to a
temporary name in the same directory and renamed, so the collector never reads half a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..files import write_atomically
from ..gate import OPEN_OUTCOMES
from ..result import OUTCOMES, CheckResult

_NUMBER = re.compile(r"-?\d+(\.\d+)?")


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{name}="{escape_label(value)}"' for name, value in pairs) + "}"


def _metric(name: str, help_text: str, samples: Sequence[tuple[str, float | int]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {value}" for labels, value in samples]
    return lines


def textfile(results: Sequence[CheckResult], *, spec: str, timestamp: float) -> str:
    """The exposition-format text: per check, whether it is good, its outcome and, where the
    observed value is a number, that number; then counts per outcome and the run's time."""

    def spec_of(r: CheckResult) -> str:
        """Each check's own spec (the file it came from), so two specs never make one series."""
        return Path(r.location.rsplit(":", 1)[0]).stem if r.location else spec

    def check_labels(r: CheckResult, *extra: tuple[str, str]) -> str:
        return _labels((("spec", spec_of(r)), ("kind", r.kind), ("key", r.key or ""), *extra))

    specs = sorted({spec_of(r) for r in results}) or [spec]

    ok = [(check_labels(r), int(r.outcome in OPEN_OUTCOMES)) for r in results]
    outcome = [(check_labels(r, ("outcome", name)), int(r.outcome.value == name))
               for r in results for name in OUTCOMES]
    observed = [(check_labels(r), float(r.observed) if "." in r.observed else int(r.observed))
                for r in results if r.observed is not None and _NUMBER.fullmatch(r.observed)]
    counts = [(_labels((("spec", each), ("outcome", name))),
               sum(r.outcome.value == name and spec_of(r) == each for r in results))
              for each in specs for name in OUTCOMES]
    lines = [
        *_metric("gpuhost_check_ok", "1 when the check passed, was fixed or did not apply; "
                 "0 when it failed, its fix failed or the host could not be read", ok),
        *_metric("gpuhost_check_outcome", "1 for the outcome the check had in the last run",
                 outcome),
        *_metric("gpuhost_check_observed", "the value read on the host, where it is a number",
                 observed),
        *_metric("gpuhost_checks", "number of checks per outcome in the last run", counts),
        *_metric("gpuhost_last_run_timestamp_seconds", "when the last run finished (Unix time)",
                 [(_labels((("spec", each),)), round(timestamp, 3)) for each in specs]),
    ]
    return "\n".join(lines) + "\n"


def write_textfile(path: Path, results: Sequence[CheckResult], *, spec: str,
                   timestamp: float) -> None:
    write_atomically(path, textfile(results, spec=spec, timestamp=timestamp))
