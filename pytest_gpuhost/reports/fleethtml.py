"""``--gpuhost-fleet-html=FILE``: the fleet page of this run's targets (``fleet.page``)."""

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
        from ..fleet import targets_of_run
        from ..fleet.drift import find_drift
        from ..fleet.page import render

        facts = {"host": info.hostname, "kernel": info.kernel, "driver": info.driver,
                 "gpus": len(info.gpus)}
        targets = targets_of_run([r.as_dict() for r in records], facts,
                                 getattr(info, "targets", ()))
        title = f"pytest-gpuhost: {', '.join(info.spec_names)}"
        write_output(self.path, render(targets, find_drift(targets), title))
