"""The terminal summary: a table per kind, the targets not reached, then under --fix what was
fixed (or planned) and why anything was not, then the values that boot-time configuration would
set back (``WILL REVERT``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..printable import counted, printable
from ..result import INTERRUPTED_FIX, OUTCOMES, WILL_REVERT, CheckResult, Outcome, summarize
from . import RunInfo, TargetInfo, reverting

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
    """``9 passed``, ``7 failed, 2 passed``: a target's outcomes of one kind, worst first (a
    comma between them: two spaces part the cells, which a long total row fills)."""
    counts = summarize(group)
    order = [o for o in reversed(OUTCOMES) if o != "passed"] + ["passed"]
    return ", ".join(f"{counts[o]} {o}" for o in order if counts.get(o)) or "-"


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
    lines = [f"--gpuhost-dry-run: {counted(len(planned), 'fix', 'fixes')} planned "
             f"({counted(changes, 'change')}); nothing was written"]
    for record in planned:
        lines.append(f"  WOULD_FIX  {record.id}: {record.message}")
        if len(record.plan) > 1:  # one change is what the message already says
            lines += [f"      {change['change']}" for change in record.plan[:PLAN_LINES]]
        if len(record.plan) > PLAN_LINES:
            lines.append(f"      ... and {len(record.plan) - PLAN_LINES} more")
    measured = [r for r in results if r.outcome is Outcome.FAILED and r.measured]
    if measured and planned:
        lines.append(f"  ({counted(len(measured), _sections(measured) + ' check')} failed as "
                     "measured before the planned changes; a real --fix measures after them)")
    return lines


def _fix_lines(results: Sequence[CheckResult], earlier: int = 0) -> list[str]:
    attempted = [r for r in results if r.outcome in (Outcome.FIXED, Outcome.FIX_FAILED)]
    fixes = [r for r in attempted if r.kind not in SESSION_KINDS]
    lines = []
    cut = [r for r in results if r.outcome is Outcome.ERROR and
           r.message.startswith(INTERRUPTED_FIX) and r.kind not in SESSION_KINDS]
    if any(r.kind != "rollback" for r in results):
        applied = sum(r.outcome is Outcome.FIXED for r in fixes)
        lines.append(f"--fix: {applied} of {counted(len(fixes) + len(cut), 'fix', 'fixes')} "
                     "applied" + (f", {len(cut)} cut short by the interrupt (journaled "
                                  "unknown)" if cut else ""))
    if any(r.kind == "persist" for r in results):
        written = [r for r in attempted if r.kind == "persist"]
        done = sum(r.outcome is Outcome.FIXED for r in written)
        lines.append(f"--fix-persist: {done} of {counted(len(written), 'file')} written")
    undone = [r for r in results if r.kind == "rollback"]
    if undone:
        lines.append(_rollback_line(undone, earlier))
    return lines + [f"  {r.outcome.shown} {r.id}: {r.message}" for r in attempted
                    if r.outcome is Outcome.FIX_FAILED]


def _rollback_line(undone: Sequence[CheckResult], earlier: int) -> str:
    """``--gpuhost-rollback: 1 of 2 changes restored, 1 not``: every change of the journal
    that is not back yet counted, the ones left as they are (changed since the fix) and
    refused included, then those an earlier rollback restored (``earlier``)."""
    restored = sum(r.outcome is Outcome.FIXED for r in undone)
    back = sum(r.outcome is Outcome.PASSED for r in undone)
    line = f"--gpuhost-rollback: {restored} of {counted(len(undone), 'change')} restored"
    if back:
        line += f", {back} already held {'its original' if back == 1 else 'their originals'}"
    if len(undone) - restored - back:
        line += f", {len(undone) - restored - back} not (below)"
    if earlier:
        line += f"; {earlier} restored by an earlier rollback"
    return line


def _not_reached(results: Sequence[CheckResult], targets: Sequence[TargetInfo]) -> list[str]:
    """One line per target that could not be reached (or was lost on the way), whatever the
    number of its checks, each of which is an error saying the same."""
    lines = []
    for target in targets:
        if target.unreachable is None:
            continue
        reason = target.unreachable.removeprefix(f"cannot reach {target.url}: ")
        ran = any(r.target == target.name and r.outcome is not Outcome.ERROR for r in results)
        lines.append(f"{'lost' if ran else 'not reached'}: {target.name} ({reason})")
    return lines


def summary_lines(results: Sequence[CheckResult], info: RunInfo) -> list[str]:
    if not results:
        return ["no gpuhost checks ran"]
    lines = summary_table(results)
    matrix = target_matrix(results)
    if matrix:
        lines += ["", *matrix]
    lines += _not_reached(results, info.targets)
    if info.dry_run:
        lines += _plan_lines(results)
    elif info.fix:
        lines += _fix_lines(results, info.restored_earlier)
    if info.fix:
        lines += [f"  NOT FIXED  {r.id}: {r.message}" for r in results
                  if r.outcome is Outcome.FAILED]
    reboots = [r for r in results if r.outcome is Outcome.REBOOT_REQUIRED]
    if reboots:
        lines.append(f"reboot required: {counted(len(reboots), 'check')} wrong now, set right "
                     "for the next boot")
        lines += [f"  REBOOT_REQUIRED {r.id}: {r.message}" for r in reboots]
    reverts = [(r.id, why) for r in results for why in reverting(r)]
    if reverts:
        lines.append(f"will revert: {counted(len(reverts), 'check')} right now that the boot "
                     "configuration sets back (passed: it holds until the next boot; change the "
                     "file named)")
        lines += _first([f"  WILL REVERT {check}: {why}" for check, why in reverts], info)
    warned = [(r.id, warning) for r in results for warning in r.warnings
              if not warning.startswith(WILL_REVERT)]
    if warned:
        lines.append(f"warnings: {len(warned)} (passed, but close to failing: a value near its "
                     "floor, a GPU event that leaves the node open)")
        lines += _first([f"  WARN {check}: {warning}" for check, warning in warned], info)
    return lines


def _first(lines: Sequence[str], info: RunInfo) -> list[str]:
    """The first WARN_LINES of ``lines``, and where the rest are."""
    if len(lines) <= WARN_LINES:
        return list(lines)
    where = "in the JSON report" if info.json_report else "(--gpuhost-report=FILE lists them all)"
    return [*lines[:WARN_LINES], f"  ... and {len(lines) - WARN_LINES} more {where}"]


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
