"""``python -m pytest_gpuhost.fleet REPORT.json ... [--html FILE]``: the fleet view of the JSON
reports of separate runs (one per node, as a scheduler produces them; a directory stands for
the ``*.json`` files in it). Prints the matrix and the drift; exits 0 when every target gave a
result and every check of every target passed, was fixed or skipped, 1 otherwise, 2 for a
usage error."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence
from pathlib import Path

from ..files import OutputError, check_output, write_output
from ..printable import printable
from . import read_reports
from .drift import find_drift
from .matrix import drift_lines, matrix_lines
from .page import render


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_gpuhost.fleet",
        description="Merge pytest-gpuhost JSON reports (--gpuhost-report) into a fleet view.")
    parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json",
                        help="a report, or a directory of them")
    parser.add_argument("--html", type=Path, metavar="FILE",
                        help="also write the self-contained HTML page")
    parser.add_argument("--title", default="pytest-gpuhost fleet", help="the page's title")
    parser.add_argument("--drift-limit", type=int, default=20, metavar="N",
                        help="drifting checks printed (default 20; 0: all)")
    args = parser.parse_args(argv)
    html = None
    if args.html is not None:
        try:
            html = check_output(args.html, f"--html={args.html}")
        except OutputError as exc:
            parser.error(str(exc))
    targets = read_reports(args.reports)
    gc.freeze()  # what was read lives until exit: the collector need not scan it again
    drifts = find_drift(targets)
    for line in [*matrix_lines(targets), "", *drift_lines(drifts, args.drift_limit)]:
        print(printable(line))
    if html is not None:
        try:
            write_output(html, render(targets, drifts, args.title))
        except OutputError as exc:
            print(str(exc), file=sys.stderr)
            return 1
        print(f"fleet page: {html}")
    return 0 if targets and all(t.healthy for t in targets) else 1


if __name__ == "__main__":
    raise SystemExit(main())
