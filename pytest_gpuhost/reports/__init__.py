"""Reporters: every report is fed from the ordered result records and the run's information,
read once by the session; none reads a host or fixes anything.

A reporter is anything with ``write(records, info)``. The reports a run can write are named in
``REPORTS`` (goss keeps its outputers in such a map): each is one module and one line there, made
only when the run asks for it. Plugins add theirs through the ``pytest_gpuhost_reports`` hook.
The terminal summary is the controller's own (``plugin/summary.py``); the JUnit properties and
the failure text are per record.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import msgspec

from ..result import WILL_REVERT, CheckResult


class TargetInfo(msgspec.Struct, frozen=True):
    """One target as it reports itself, and what reaching it cost."""

    name: str
    url: str
    hostname: str | None = None
    kernel: str | None = None
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    unreachable: str | None = None
    journal: str | None = None
    """The journal of the changes made on it, where there were any."""
    journal_on_host: str | None = None
    """A container's journal as a path of the machine whose kernel it runs on (under LXC's
    ``/var/lib/lxc/CTID/rootfs``), where the operator can open it too; None for any other."""
    journal_changes: int | None = None
    """How many of the journal's changes a rollback may undo (every one but those the host
    refused: 0 after a run whose only fixes failed); None without a journal."""
    round_trips: int | None = None
    connections: int | None = None
    bytes_sent: int | None = None
    bytes_received: int | None = None
    connect_seconds: float | None = None
    specs: tuple[str, ...] = ()
    """The specs whose checks ran on it (by name): its own, and its containers' for their
    ``kernel`` checks."""
    kernel_on: str | None = None
    """The target whose kernel it runs on (a container's host), where its ``kernel`` checks
    ran and are reported."""

    def as_dict(self) -> dict[str, object]:
        data = msgspec.structs.asdict(self)
        data["gpus"], data["gpu_models"] = list(self.gpus), list(self.gpu_models)
        data["specs"] = list(self.specs)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetInfo:
        """``as_dict``'s output back (a worker's report, so JSON values: a mapping of Any)."""
        lists = ("gpus", "gpu_models", "specs")
        values = {key: data[key] for key in cls.__struct_fields__ if key in data
                  and key not in lists}
        return cls(**values, gpus=tuple(data.get("gpus") or ()),
                   gpu_models=tuple(data.get("gpu_models") or ()),
                   specs=tuple(data.get("specs") or ()))

    def add_traffic(self, other: TargetInfo) -> TargetInfo:
        """Two workers' connections to one target: their costs add up."""
        def total(a: float | int | None, b: float | int | None) -> Any:
            return None if a is None and b is None else (a or 0) + (b or 0)

        return msgspec.structs.replace(
            self, round_trips=total(self.round_trips, other.round_trips),
            connections=total(self.connections, other.connections),
            bytes_sent=total(self.bytes_sent, other.bytes_sent),
            bytes_received=total(self.bytes_received, other.bytes_received),
            connect_seconds=total(self.connect_seconds, other.connect_seconds),
            unreachable=self.unreachable or other.unreachable,
            journal=self.journal or other.journal,
            journal_on_host=self.journal_on_host or other.journal_on_host,
            journal_changes=total(self.journal_changes, other.journal_changes),
            specs=tuple(dict.fromkeys((*self.specs, *other.specs))))


class RunInfo(msgspec.Struct, frozen=True):
    """What every report says about the run besides its checks."""

    specs: tuple[tuple[str, str], ...]
    """(path as shown, name) of each spec."""
    root: str
    """The host root (``/`` or the fake tree), as the host describes it."""
    hostname: str | None
    """The machine's name as the host reports it (its kernel's hostname), not the runner's."""
    kernel: str | None = None
    driver: str | None = None
    gpus: tuple[str, ...] = ()
    gpu_models: tuple[str, ...] = ()
    fix: bool = False
    dry_run: bool = False
    journal: str | None = None
    rollback: str | None = None
    restored_earlier: int = 0
    """The rolled back journals' changes that an earlier rollback of them restored: not
    judged again, so not among the records."""
    json_report: bool = False
    """Whether a JSON report is written (the terminal refers to it only then)."""
    targets: tuple[TargetInfo, ...] = ()
    """Every target of the run, in the order given; the fields above describe the first."""
    node_targets: tuple[str, ...] | None = None
    """The targets that describe the machine the run ran on (``settings.node_targets``), for
    which NFD's labels and NPD's condition speak; None where the run named no target."""
    state: Mapping[str, Any] | None = None
    """The host state the run verified (``state.py``), where a report that shows it is
    written; None without one (a rollback, no host check selected)."""
    topologies: tuple[tuple[str, dict[str, Any]], ...] = ()
    """--gpuhost-topology: (target name, its GPUs' PCIe topology) for each target."""
    benchmarks: tuple[Mapping[str, Any], ...] = ()
    """Each benchmark's envelope (``{"test", "name", "envelope"}``), in the order they ran:
    pytest-benchmark's tests and each ``gpuhost_envelope`` a test took."""
    stopped: str | None = None
    """Why the run ended before its checks did (an interrupt, a lock it could not have, an
    internal error); None when it ran to its end."""
    finished_at: float = msgspec.field(default_factory=time.time)

    @property
    def spec_names(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.specs)


def reverting(record: CheckResult) -> list[str]:
    """Why a check's value, right now, will not hold after the next boot (``WILL REVERT``):
    its warnings that say so, each without the prefix (``etc/sysctl.d/99-x.conf:1 sets '60'
    on the next boot or `sysctl --system```); empty for any other check."""
    return [warning[len(WILL_REVERT):] for warning in record.warnings
            if warning.startswith(WILL_REVERT)]


class Reporter(Protocol):
    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        """Write the report; raise ``files.OutputError`` when it cannot be written."""


class Report(NamedTuple):
    """A report the run can write: what asks for it, and what makes its reporter."""

    asked: str
    """The setting that asks for it (``Settings.report``), or a plugin's own option by its
    name in ``config.option``: the report is made when it is set."""
    factory: str
    """``module:name`` of what makes the reporter, imported only when the report is asked
    for: called with the value that asked (a path), or (``run``) with it and the run."""
    run: bool = False


REPORTS: dict[str, Report] = {
    "json": Report("report", "pytest_gpuhost.reports.jsonfile:JsonReport"),
    "prometheus": Report("prom", "pytest_gpuhost.reports.prometheus:PrometheusTextfile"),
    "nfd": Report("nfd", "pytest_gpuhost.reports.nfd:nfd_feature_file", run=True),
    "allure": Report("alluredir", "pytest_gpuhost.reports.allure:AllureSessionFiles"),
    "fleet-html": Report("fleet_html", "pytest_gpuhost.reports.fleethtml:FleetHtml"),
    "capture": Report("capture", "pytest_gpuhost.session:capture_report", run=True),
}
"""Every built-in report by name, in the order they are written."""


class ReportRun(Protocol):
    """What a report's factory may read of the run that asks for it (``run=True``)."""

    @property
    def settings(self) -> Any:
        """The run's ``settings.Settings`` (a layer above the reports: not imported here)."""

    @property
    def command(self) -> str:
        """The command line, as a report that records it says it."""

    @property
    def session(self) -> Any:
        """The pytest-free session (a capture reads what its target says of itself)."""
