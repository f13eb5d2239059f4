"""The JSON report (``--gpuhost-report``): the run's information and every check's record."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..files import write_output
from ..result import CheckResult, summarize
from ..version import __version__
from . import RunInfo


def json_report(records: Sequence[CheckResult], info: RunInfo,
                extra: Mapping[str, object] | None = None) -> dict[str, object]:
    specs = [{"path": path, "name": name} for path, name in info.specs]
    return {
        "spec": specs[0]["path"] if specs else None,
        "spec_name": specs[0]["name"] if specs else None,
        "specs": specs,
        "root": info.root,
        "fix": info.fix,
        "dry_run": info.dry_run,
        "journal": info.journal,
        "rollback": info.rollback,
        "complete": info.stopped is None,
        "stopped": info.stopped,
        **(extra or {}),
        "host": info.hostname,  # null: the host said nothing of itself (a fake root, lost)
        "controller": socket.gethostname(),
        "kernel": info.kernel,
        "driver": info.driver,
        "gpus": list(info.gpus),
        **({"targets": [target.as_dict() for target in info.targets]} if info.targets else {}),
        **({"node_targets": list(info.node_targets)} if info.node_targets is not None else {}),
        **({"topology": dict(info.topologies)} if info.topologies else {}),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(info.finished_at)),
        "tool": f"pytest-gpuhost {__version__}",
        "checks": [record.as_dict() for record in records],
        "summary": summarize(records),
        "state": dict(info.state) if info.state is not None else None,
        **({"benchmarks": [dict(each) for each in info.benchmarks]} if info.benchmarks else {}),
    }


class JsonReport:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        write_output(self.path, json.dumps(json_report(records, info), indent=2) + "\n")
