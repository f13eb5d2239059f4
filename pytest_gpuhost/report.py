"""Reporters fed from the result records: failure text, terminal summary, JSON report."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from . import __version__
from .result import CheckResult, Outcome, summarize
from .spec import Spec


def format_failure(result: CheckResult) -> str:
    """The reason on the first line (pytest's short summary shows it), then expected against
    observed, why it matters, what a fix did and what was read."""
    lines = [result.message or result.outcome.value,
             f"  {result.outcome.value.upper()} {result.id} at {result.location}"]

    def row(label: str, value: str | None) -> None:
        if value is not None and value != "":
            lines.append(f"  {label:<9} {value}")

    row("expected", result.expected)
    if result.before is not None:
        row("before", result.before)
        row("after", result.after)
    else:
        row("observed", result.observed if result.observed is not None else "(nothing)")
    row("why", result.why)
    if "class" in result.details:
        row("class", str(result.details["class"]))
    row("action", result.action)
    row("output", result.action_output)
    for evidence in result.evidence:
        row("read", f"{evidence['source']}: {evidence['raw']}")
    return "\n".join(lines)


def _counts(results: Sequence[CheckResult]) -> str:
    counts = summarize(results)
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n)


def summary_lines(results: Sequence[CheckResult], *, fix: bool) -> list[str]:
    """One line per kind, then, under --fix, how many fixes were applied and why any failed."""
    if not results:
        return ["no gpuhost checks ran"]
    by_kind: dict[str, list[CheckResult]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)
    width = max(len(kind) for kind in by_kind)
    lines = [f"{kind:<{width}}  {len(group):>4} checks: {_counts(group)}"
             for kind, group in by_kind.items()]
    lines.append(f"{'total':<{width}}  {len(results):>4} checks: {_counts(results)}")
    warned = [r for r in results if r.warning]
    if warned:
        lines.append(f"warnings: {len(warned)} passed close to their floor")
        lines += [f"  WARN {r.id}: {r.warning}" for r in warned]
    if fix:
        attempted = [r for r in results if r.outcome in (Outcome.FIXED, Outcome.FIX_FAILED)]
        applied = sum(r.outcome is Outcome.FIXED for r in attempted)
        lines.append(f"--fix: {applied} of {len(attempted)} fixes applied")
        lines += [f"  FIX_FAILED {r.id}: {r.message}" for r in attempted
                  if r.outcome is Outcome.FIX_FAILED]
        unfixed = [r for r in results if r.outcome is Outcome.FAILED]
        lines += [f"  NOT FIXED  {r.id}: {r.message}" for r in unfixed]
    return lines


def json_report(
    *, specs: Sequence[Spec], root: str, fix: bool, results: Iterable[CheckResult]
) -> dict[str, object]:
    records = list(results)
    return {
        "spec": str(specs[0].path),
        "spec_name": specs[0].name,
        "specs": [{"path": str(spec.path), "name": spec.name} for spec in specs],
        "root": root,
        "fix": fix,
        "host": socket.gethostname(),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool": f"pytest-gpuhost {__version__}",
        "checks": [record.as_dict() for record in records],
        "summary": summarize(records),
    }


def write_json_report(
    path: Path, *, specs: Sequence[Spec], root: str, fix: bool, results: Iterable[CheckResult]
) -> None:
    """Write atomically, so a reader never sees half a report."""
    data = json_report(specs=specs, root=root, fix=fix, results=results)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)
