"""Reporters fed from the result records: failure text, terminal summary, JSON report."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .. import __version__
from ..files import write_atomically
from ..result import OUTCOMES, CheckResult, Outcome, summarize
from ..spec import Spec


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
    for change in result.plan if result.outcome is Outcome.WOULD_FIX else ():
        row("plan", str(change["change"]))
    for warning in result.warnings:
        row("warning", warning)
    for evidence in result.evidence:
        row("read", f"{evidence['source']}: {evidence['raw']}")
    return "\n".join(lines)


ALWAYS_SHOWN = ("passed", "failed", "fixed", "fix_failed", "skipped")
"""Outcome columns of the summary table; any other outcome gets a column when it occurred."""
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_CPUS = re.compile(r"cpus ([0-9][0-9,-]*)")


def _attention(result: CheckResult) -> bool:
    return result.outcome not in (Outcome.PASSED, Outcome.SKIPPED)


def _detail(group: Sequence[CheckResult]) -> str:
    """The GPUs (by address) and the CPUs (folded, as the kernel lists them) that were wrong."""
    items: list[str] = []
    for result in group:
        if not _attention(result) or result.key is None:
            continue
        if _PCI_ADDRESS.match(result.key):
            items.append(result.key)
            continue
        seen = result.before if result.before is not None else result.observed
        cpus = _CPUS.search(seen or "")
        if cpus:
            items.append(f"{result.key} cpus {cpus.group(1)}")
    return " ".join(items)


def summary_table(results: Sequence[CheckResult]) -> list[str]:
    """One row per kind: checks per outcome (``-`` for none), then the GPUs and CPUs involved."""
    by_kind: dict[str, list[CheckResult]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)
    totals = summarize(results)
    columns = [o for o in OUTCOMES if o in ALWAYS_SHOWN or totals.get(o)]
    header = ["kind", "checks", *columns, ""]
    rows = [[kind, str(len(group)),
             *[str(summarize(group)[c] or "-") for c in columns], _detail(group)]
            for kind, group in by_kind.items()]
    rows.append(["total", str(len(results)), *[str(totals[c] or "-") for c in columns], ""])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def render(row: list[str]) -> str:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in
                                             zip(row[1:-1], widths[1:], strict=True)]
        return "  ".join([*cells, row[-1]]).rstrip()

    return [render(header), *[render(row) for row in rows]]


PLAN_LINES = 3
WARN_LINES = 12


def summary_lines(results: Sequence[CheckResult], *, fix: bool, dry_run: bool = False
                  ) -> list[str]:
    """A table per kind; then, under --fix, the fixes (or the plan) and why any failed; and
    values that boot-time configuration would set back."""
    if not results:
        return ["no gpuhost checks ran"]
    lines = summary_table(results)
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
    reboots = [r for r in results if r.outcome is Outcome.REBOOT_REQUIRED]
    if reboots:
        lines.append(f"reboot required: {len(reboots)} check(s) wrong now, set right for the "
                     "next boot")
        lines += [f"  REBOOT_REQUIRED {r.id}: {r.message}" for r in reboots]
    warned = [(r.id, warning) for r in results for warning in r.warnings]
    if warned:
        lines.append(f"warnings: {len(warned)} (a value close to its floor, or one that boot-time "
                     "configuration would set back)")
        lines += [f"  WARN {check}: {warning}" for check, warning in warned[:WARN_LINES]]
        if len(warned) > WARN_LINES:
            lines.append(f"  ... and {len(warned) - WARN_LINES} more in the JSON report")
    return lines


def junit_properties(result: CheckResult) -> list[tuple[str, str]]:
    """What a JUnit consumer sees of a check, as <property> elements of its test case."""
    values = [("kind", result.kind), ("key", result.key), ("expected", result.expected),
              ("observed", result.observed), ("outcome", result.outcome.value),
              ("before", result.before), ("after", result.after),
              ("severity", result.severity)]
    return [(name, value) for name, value in values if value is not None]


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
    write_atomically(path, json.dumps(data, indent=2) + "\n")
