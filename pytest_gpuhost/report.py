"""Reporters fed from the result records: failure text, terminal summary, JSON report."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
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
    row("action", result.action)
    row("output", result.action_output)
    for change in result.plan if result.outcome is Outcome.WOULD_FIX else ():
        row("plan", str(change["change"]))
    for warning in result.warnings:
        row("warning", warning)
    for evidence in result.evidence:
        row("read", f"{evidence['source']}: {evidence['raw']}")
    return "\n".join(lines)


def _counts(results: Sequence[CheckResult]) -> str:
    counts = summarize(results)
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items() if n)


PLAN_LINES = 3


def summary_lines(results: Sequence[CheckResult], *, fix: bool, dry_run: bool = False
                  ) -> list[str]:
    """One line per kind; then, under --fix, the fixes (or the plan) and why any failed; and
    values that boot-time configuration would set back."""
    if not results:
        return ["no gpuhost checks ran"]
    by_kind: dict[str, list[CheckResult]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)
    width = max(len(kind) for kind in by_kind)
    lines = [f"{kind:<{width}}  {len(group):>4} checks: {_counts(group)}"
             for kind, group in by_kind.items()]
    lines.append(f"{'total':<{width}}  {len(results):>4} checks: {_counts(results)}")
    if dry_run:
        planned = [r for r in results if r.outcome is Outcome.WOULD_FIX]
        changes = sum(len(r.plan) for r in planned)
        lines.append(f"--gpuhost-dry-run: {len(planned)} fixes planned ({changes} changes); "
                     "nothing was written")
        for record in planned:
            lines.append(f"  WOULD_FIX  {record.id}: {record.message}")
            if len(record.plan) > 1:  # one change is what the message already says
                lines += [f"      {change['change']}" for change in record.plan[:PLAN_LINES]]
            if len(record.plan) > PLAN_LINES:
                lines.append(f"      ... and {len(record.plan) - PLAN_LINES} more")
    elif fix:
        attempted = [r for r in results if r.outcome in (Outcome.FIXED, Outcome.FIX_FAILED)]
        fixes = [r for r in attempted if r.kind not in ("persist", "rollback")]
        if any(r.kind != "rollback" for r in results):
            applied = sum(r.outcome is Outcome.FIXED for r in fixes)
            lines.append(f"--fix: {applied} of {len(fixes)} fixes applied")
        for kind, flag, verb in (("persist", "--fix-persist", "files written"),
                                 ("rollback", "--gpuhost-rollback", "changes restored")):
            done = [r for r in attempted if r.kind == kind]
            if done or any(r.kind == kind for r in results):
                applied = sum(r.outcome is Outcome.FIXED for r in done)
                lines.append(f"{flag}: {applied} of {len(done)} {verb}")
        lines += [f"  FIX_FAILED {r.id}: {r.message}" for r in attempted
                  if r.outcome is Outcome.FIX_FAILED]
    if fix:
        lines += [f"  NOT FIXED  {r.id}: {r.message}" for r in results
                  if r.outcome is Outcome.FAILED]
    lines += [f"  WILL REVERT {r.id}: {warning}" for r in results for warning in r.warnings]
    return lines


def json_report(
    *, specs: Sequence[Spec], root: str, fix: bool, results: Iterable[CheckResult],
    extra: Mapping[str, object] | None = None,
) -> dict[str, object]:
    records = list(results)
    return {
        "spec": str(specs[0].path) if specs else None,
        "spec_name": specs[0].name if specs else None,
        "specs": [{"path": str(spec.path), "name": spec.name} for spec in specs],
        "root": root,
        "fix": fix,
        **(extra or {}),
        "host": socket.gethostname(),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tool": f"pytest-gpuhost {__version__}",
        "checks": [record.as_dict() for record in records],
        "summary": summarize(records),
    }


def write_json_report(
    path: Path, *, specs: Sequence[Spec], root: str, fix: bool, results: Iterable[CheckResult],
    extra: Mapping[str, object] | None = None,
) -> None:
    """Write atomically, so a reader never sees half a report."""
    data = json_report(specs=specs, root=root, fix=fix, results=results, extra=extra)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(data, out, indent=2)
        out.write("\n")
    os.replace(tmp, path)
