"""``--gpuhost-nfd=FILE``: a Node Feature Discovery feature file of the run.

nfd-worker's ``local`` source reads every file in its ``features.d`` directory
(``/etc/kubernetes/node-feature-discovery/features.d/``): one ``name=value`` a line, ``#`` lines
ignored unless they start ``# +`` (a directive), names without a namespace labelled under
``feature.node.kubernetes.io/``. It skips files whose name starts with a dot, which is what the
atomic writer's temporary file is called, so NFD never reads half a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..files import write_output
from ..result import CheckResult
from . import RunInfo
from .nodehealth import Health, clean, health_of_results


def feature_text(health: Health, *, subject: str) -> str:
    """``gpuhost.tuned`` (true only when there were checks and every one passed, was fixed or
    skipped) and ``gpuhost.failed`` (how many did not), after a comment naming the run."""
    comment = clean(f"pytest-gpuhost: {subject}: {len(health.failing)} of {health.total} "
                    "checks not ok")
    return (f"# {comment}\n"
            f"gpuhost.tuned={'true' if health.healthy else 'false'}\n"
            f"gpuhost.failed={len(health.failing)}\n")


class NfdFeatureFile:
    """A reporter: the feature file, renamed into place, mode 0644."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        subject = f"{', '.join(info.spec_names)} on {info.hostname or info.root}"
        write_output(self.path, feature_text(health_of_results(records), subject=subject))
