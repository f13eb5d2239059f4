"""The terminal summary: a table per kind, then under --fix what was fixed (or planned) and why
anything was not, then the values that boot-time configuration would set back."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..printable import printable
from ..result import OUTCOMES, CheckResult, Outcome, summarize
from . import RunInfo

ALWAYS_SHOWN = ("passed", "failed", "fixed", "fix_failed", "skipped")
"""Outcome columns of the summary table; any other outcome gets a column when it occurred."""
PLAN_LINES = 3
WARN_LINES = 12
SESSION_KINDS = ("persist", "rollback")
"""Records of the run's own work (persistence files, restored changes), not of the spec."""


def _attention(result: CheckResult) -> bool:
    return result.outcome not in (Outcome.PASSED, Outcome.SKIPPED)


def _detail(group: Sequence[CheckResult]) -> str:
    """The GPUs and the CPUs (folded, as the kernel lists them) the wrong checks were about."""
    items: list[str] = []
    for result in group:
        if not _attention(result):
            continue
        if "gpu" in result.subjects:
            items.append(result.subjects["gpu"])
        elif "bridge" in result.subjects:
            items.append(result.subjects["bridge"])
        elif "cpus" in result.subjects:
            items.append(f"{result.key} cpus {result.subjects['cpus']}")
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


def _cell(group: Sequence[CheckResult]) -> str:
    """``9 passed``, ``7 failed 2 passed``: a target's outcomes of one kind, worst first."""
    counts = summarize(group)
    order = [o for o in reversed(OUTCOMES) if o != "passed"] + ["passed"]
    return " ".join(f"{counts[o]} {o}" for o in order if counts.get(o)) or "-"


def target_matrix(results: Sequence[CheckResult]) -> list[str]:
    """Kinds by targets, side by side (a host over ssh and its container, say): each cell the
    target's outcomes of that kind. Only for a run of more than one target."""
    targets = list(dict.fromkeys(r.target for r in results if r.target is not None))
    if len(targets) < 2:
        return []
    kinds = list(dict.fromkeys(r.kind for r in results))
    rows = [["kind", *targets]]
    for kind in [*kinds, "total"]:
        rows.append([kind, *(_cell([r for r in results if r.target == target and
                                    (kind == "total" or r.kind == kind)])
                             for target in targets)])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
            .rstrip() for row in rows]


def _plan_lines(results: Sequence[CheckResult]) -> list[str]:
    planned = [r for r in results if r.outcome is Outcome.WOULD_FIX]
    changes = sum(len(r.plan) for r in planned)
    lines = [f"--gpuhost-dry-run: {len(planned)} fixes planned ({changes} changes); nothing was "
             "written"]
    for record in planned:
        lines.append(f"  WOULD_FIX  {record.id}: {record.message}")
        if len(record.plan) > 1:  # one change is what the message already says
            lines += [f"      {change['change']}" for change in record.plan[:PLAN_LINES]]
        if len(record.plan) > PLAN_LINES:
            lines.append(f"      ... and {len(record.plan) - PLAN_LINES} more")
    measured = [r for r in results if r.outcome is Outcome.FAILED and r.measured]
    if measured and planned:
        lines.append(f"  ({len(measured)} {_sections(measured)} checks failed as measured before "
                     "the planned changes; a real --fix measures after them)")
    return lines


def _fix_lines(results: Sequence[CheckResult]) -> list[str]:
    attempted = [r for r in results if r.outcome in (Outcome.FIXED, Outcome.FIX_FAILED)]
    fixes = [r for r in attempted if r.kind not in SESSION_KINDS]
    lines = []
    if any(r.kind != "rollback" for r in results):
        applied = sum(r.outcome is Outcome.FIXED for r in fixes)
        lines.append(f"--fix: {applied} of {len(fixes)} fixes applied")
    for kind, flag, verb in (("persist", "--fix-persist", "files written"),
                             ("rollback", "--gpuhost-rollback", "changes restored")):
        done = [r for r in attempted if r.kind == kind]
        if done or any(r.kind == kind for r in results):
            applied = sum(r.outcome is Outcome.FIXED for r in done)
            lines.append(f"{flag}: {applied} of {len(done)} {verb}")
    return lines + [f"  FIX_FAILED {r.id}: {r.message}" for r in attempted
                    if r.outcome is Outcome.FIX_FAILED]


def summary_lines(results: Sequence[CheckResult], info: RunInfo) -> list[str]:
    if not results:
        return ["no gpuhost checks ran"]
    lines = summary_table(results)
    matrix = target_matrix(results)
    if matrix:
        lines += ["", *matrix]
    if info.dry_run:
        lines += _plan_lines(results)
    elif info.fix:
        lines += _fix_lines(results)
    if info.fix:
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
            where = "in the JSON report" if info.json_report else \
                "(--gpuhost-report=FILE lists them all)"
            lines.append(f"  ... and {len(warned) - WARN_LINES} more {where}")
    return lines


class TerminalSummary:
    """The summary section, written through pytest's terminal reporter."""

    def __init__(self, write_line: Callable[[str], None]) -> None:
        self.write_line = write_line

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        """Each line with its host values escaped (``printable``)."""
        for line in summary_lines(records, info):
            self.write_line(printable(line))


def _sections(records: Sequence[CheckResult]) -> str:
    """``p2p``, or ``p2p and lab``: the sections of some measured records."""
    names = list(dict.fromkeys(str(r.section) for r in records))
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"
