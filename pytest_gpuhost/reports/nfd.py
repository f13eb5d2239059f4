"""``--gpuhost-nfd=FILE``: a Node Feature Discovery feature file of the run.

nfd-worker's ``local`` source reads every file in its ``features.d`` directory
(``/etc/kubernetes/node-feature-discovery/features.d/``): one ``name=value`` a line, ``#`` lines
ignored unless they start ``# +`` (a directive). The names carry NFD's own namespace,
``feature.node.kubernetes.io/``, which nfd-master always allows: an unprefixed name is prefixed
with it only while the deprecated auto-prefix lasts (its ``DisableAutoPrefix`` gate leaves a
bare label, and nodeSelectors on the documented name stop matching). ``# +expiry-time=`` (RFC
3339, before the labels it covers) makes NFD drop the labels once the checks stop running (a
removed DaemonSet must not leave ``tuned=true`` forever). NFD skips files whose name starts
with a dot, which is what the atomic writer's temporary file is called, so it never reads half
a file.
"""

from __future__ import annotations

import datetime
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ..files import OutputError, write_output
from ..result import CheckResult
from . import ReportRun, RunInfo
from .nodehealth import Health, clean, health_of_results, on_node

NAMESPACE = "feature.node.kubernetes.io/"
"""NFD's default label namespace, allowed by every nfd-master."""
DEFAULT_EXPIRY_S = 3600.0
"""How long the labels stand after a run: twelve runs of the example's every-5-minutes check."""


def expiry_time(finished_at: float, expiry: float) -> str:
    """NFD's ``# +expiry-time`` value: RFC 3339 in UTC, whole seconds."""
    moment = datetime.datetime.fromtimestamp(finished_at + expiry, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def feature_text(health: Health, *, subject: str, expires: str | None = None) -> str:
    """``feature.node.kubernetes.io/gpuhost.tuned`` (true only when there were checks and every
    one passed, was fixed or skipped) and ``.../gpuhost.failed`` (how many did not), after a
    comment naming the run and, given ``expires``, the directive that makes them lapse then."""
    comment = clean(f"pytest-gpuhost: {subject}: {len(health.failing)} of {health.total} "
                    "checks not ok")
    directive = f"# +expiry-time={expires}\n" if expires is not None else ""
    return (f"# {comment}\n{directive}"
            f"{NAMESPACE}gpuhost.tuned={'true' if health.healthy else 'false'}\n"
            f"{NAMESPACE}gpuhost.failed={len(health.failing)}\n")


class NfdFeatureFile:
    """A reporter: the feature file, renamed into place, mode 0644."""

    def __init__(self, path: Path, expiry: float = DEFAULT_EXPIRY_S) -> None:
        self.path = path
        self.expiry = expiry

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        """The labels of the node the run ran on: its targets' checks alone."""
        node = [t for t in info.targets if t.name in (info.node_targets or ())]
        where = node[0].hostname if node else info.hostname
        subject = f"{', '.join(info.spec_names)} on {where or info.root}"
        text = feature_text(health_of_results(on_node(records, info.node_targets)),
                            subject=subject, expires=expiry_time(info.finished_at, self.expiry))
        try:
            write_output(self.path, text)
        except OutputError as exc:
            raise OutputError(f"--gpuhost-nfd: {exc}; {withdraw(self.path)}") from None


def withdraw(path: Path) -> str:
    """An earlier run's labels, taken away when this run's could not be written (NFD drops the
    labels of a removed file): the node must not go on saying what the run could not say.
    What happened, for the message."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return "it is not a file: nothing was removed"
        os.unlink(path)
    except FileNotFoundError:
        return "no earlier labels stand"
    except OSError as exc:
        return (f"the earlier labels in it stand and could not be removed ({exc.strerror}): "
                "remove it")
    return "the earlier labels in it were removed"


def nfd_feature_file(path: Path, run: ReportRun) -> NfdFeatureFile:
    """The report as the run asks for it: its labels stand for ``--gpuhost-nfd-expiry``."""
    return NfdFeatureFile(path, float(run.settings.nfd_expiry))
