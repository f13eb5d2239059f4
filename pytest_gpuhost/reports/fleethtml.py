"""``--gpuhost-fleet-html=FILE``: the fleet page of this run's targets (``fleet.page``).

The rows are made from the run's JSON report as ``--gpuhost-report`` would write it, so a run over
several targets and the same reports merged later by ``python -m pytest_gpuhost.fleet`` show the
same rows: each target with what it says of itself, an unreachable one as "no result" with
ssh's reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..files import write_output
from ..result import CheckResult
from . import RunInfo


class FleetHtml:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        from ..fleet import targets_of_report
        from ..fleet.drift import find_drift
        from ..fleet.page import render
        from .jsonfile import json_report

        targets = targets_of_report(json_report(records, info), "this run")
        title = f"pytest-gpuhost: {', '.join(info.spec_names)}"
        write_output(self.path, render(targets, find_drift(targets), title))
