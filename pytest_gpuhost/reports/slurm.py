"""The drain reason of a Slurm health check, from a ``--gpuhost-report`` (and how pytest ended).

``python -m pytest_gpuhost.reports.slurm REPORT.json --pytest-exit=N [--timeout=S]`` prints one
line and exits 0 when the node is healthy (``gpuhost: 67 checks ok``), 1 when a check failed
(``gpuhost: <first failing check> (+N more)``; where a GPU event in the kernel log failed, its
action first: ``gpuhost: reboot (Xid 79 0000:41:00.0): dmesg``), 2 when the checks could not run
(``gpuhost: checks could not run: ...``). examples/slurm/gpuhost-healthcheck.sh drains the node
with that line as the reason on 1 and 2, and resumes only nodes drained by a ``gpuhost:`` reason.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .nodehealth import (
    PREFIX,
    Health,
    NotThisNode,
    action_template,
    cut,
    first_and_count,
    health_of_report,
    healthy_line,
)

HEALTHY, FAILED, CANNOT_RUN = 0, 1, 2
REASON_WIDTH = 100
"""Slurm keeps longer reasons, but sinfo -R and scontrol show node are read by people."""
TIMED_OUT = (124, 137)
"""timeout(1)'s status when it stopped the command, and when it had to kill it (-k)."""
PYTEST_EXITS = {2: "interrupted (a collection error, or a held --fix lock)",
                3: "pytest internal error", 4: "bad spec, root or options",
                5: "no gpuhost checks collected", 126: "pytest is not executable",
                127: "pytest not found"}


def reason(health: Health) -> str:
    """The drain reason of a run in which checks failed."""
    more = f" (+{len(health.failing) - 1} more)" if len(health.failing) > 1 else ""
    return first_and_count(health, width=REASON_WIDTH,
                           template=PREFIX + " " + action_template(health) + "{first}" + more)


def cannot_run(why: str) -> str:
    return cut(f"{PREFIX} checks could not run: {why}", REASON_WIDTH)


def verdict(report: Path, pytest_exit: int, timeout: float | None = None) -> tuple[int, str]:
    """(status, line) from pytest's exit status and the report it wrote (removed before the
    run, so a stale one is never read)."""
    if pytest_exit in TIMED_OUT:
        after = f" after {timeout:g} s" if timeout is not None else ""
        return CANNOT_RUN, cannot_run(f"timed out{after}")
    if pytest_exit not in (0, 1):
        known = PYTEST_EXITS.get(pytest_exit, "pytest failed")
        return CANNOT_RUN, cannot_run(f"{known} (exit {pytest_exit})")
    try:
        data = json.loads(report.read_text(encoding="utf-8"))
        health = health_of_report(data)
    except OSError as exc:
        return CANNOT_RUN, cannot_run(f"no report ({exc.strerror or exc}; pytest exit "
                                      f"{pytest_exit})")
    except NotThisNode as exc:  # another machine's verdict never drains this node
        return CANNOT_RUN, cannot_run(str(exc))
    except ValueError as exc:
        return CANNOT_RUN, cannot_run(f"not a gpuhost report: {exc}")
    if health.failing:
        return FAILED, reason(health)
    if not health.total:
        return CANNOT_RUN, cannot_run("the report lists no checks")
    if pytest_exit == 0 or health_of_report(data, node_only=False).failing:  # another
        return HEALTHY, healthy_line(health, REASON_WIDTH)  # target's failure: not this node's
    return CANNOT_RUN, cannot_run("pytest exited 1 but no check failed in the report")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_gpuhost.reports.slurm",
                                     description="print a Slurm drain reason from a gpuhost "
                                                 "JSON report")
    parser.add_argument("report", type=Path, help="the --gpuhost-report file of the run")
    parser.add_argument("--pytest-exit", type=int, required=True,
                        help="pytest's exit status (timeout's 124 or 137 when it timed out)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="the run's time limit in seconds, named in a timeout's reason")
    args = parser.parse_args(argv)
    status, line = verdict(args.report, args.pytest_exit, args.timeout)
    print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
