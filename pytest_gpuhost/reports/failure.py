"""The failure text of one check: what pytest shows for a failed, fix_failed or error check."""

from __future__ import annotations

from ..printable import printable
from ..result import CheckResult, Outcome


def format_failure(result: CheckResult) -> str:
    """The reason on the first line (pytest's short summary shows it), then expected against
    observed, why it matters, what a fix did and what was read; host values escaped
    (``printable``)."""
    lines = [result.message or result.outcome.value,
             f"  {result.outcome.shown} {result.id} at {result.location}"
             + (f" on {result.target}" if result.target else "")
             + (" [hardware]" if result.hardware else "")]

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
    return printable("\n".join(lines))
