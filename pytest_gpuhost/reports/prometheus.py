"""The run's checks as a Prometheus textfile, for node_exporter's textfile collector.

node_exporter reads ``*.prom`` files from its ``--collector.textfile.directory`` and rejects
samples with timestamps, so the run's time is a gauge of its own. The file is written to a
temporary name in the same directory and renamed, so the collector never reads half a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ..bundled import bundled_name
from ..files import write_output
from ..result import OPEN_OUTCOMES, OUTCOMES, CheckResult
from . import RunInfo, reverting

_NUMBER = re.compile(r"-?\d{1,20}(\.\d{1,20})?")
"""An observed value shown as a sample: what a float64 sample can hold (a u64 has 20 digits);
a longer run of digits (a 5000-digit sysctl value) is a value of ``gpuhost_observed_info``."""


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    return "{" + ",".join(f'{name}="{escape_label(value)}"' for name, value in pairs) + "}"


def _metric(name: str, help_text: str, samples: Sequence[tuple[str, float | int]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines += [f"{name}{labels} {value}" for labels, value in samples]
    return lines


def _target(record: CheckResult) -> str:
    """The target a record came from: ``local`` in a run of this machine alone."""
    return record.target or "local"


def _stable_names(files: Iterable[str]) -> dict[str, str]:
    """Each bundled spec's file as shown -> its name (``blackwell8.yaml``), unless another spec
    of the run is shown by that name (a copy at the top of the rootdir: then the bundled one
    keeps its path, as its ids do)."""
    shown = set(files)
    names = {each: bundled_name(Path(each)) for each in shown}
    return {each: name for each, name in names.items()
            if name is not None and name not in shown}


def textfile(results: Sequence[CheckResult], *, specs: Sequence[str], timestamp: float) -> str:
    """The exposition-format text: per check, whether it is good, its outcome and, where the
    observed value is a number, that number; then counts per outcome and the run's time.

    ``spec`` is the name of the file each check came from (``blackwell8``) and ``spec_file`` the
    file as shown (``specs/blackwell8.yaml``), so two specs of one name in two folders, or one
    key in two specs, never make one series twice. A bundled spec's file is its name
    (``blackwell8.yaml``), as in its checks' ids: where the package is installed (a venv,
    rebuilt) is no part of a series' identity."""
    stable = _stable_names([r.spec_file for r in results] or list(specs))

    def file_labels(spec_file: str) -> tuple[tuple[str, str], ...]:
        return (("spec", Path(spec_file).stem), ("spec_file", stable.get(spec_file, spec_file)))

    def check_labels(r: CheckResult, *extra: tuple[str, str]) -> str:
        target = (("target", r.target),) if r.target is not None else ()
        return _labels((*target, *file_labels(r.spec_file), ("kind", r.kind),
                        ("key", r.key or ""), *extra))

    files = sorted({r.spec_file for r in results}) or list(specs)
    ok = [(check_labels(r), int(r.outcome in OPEN_OUTCOMES)) for r in results]
    outcome = [(check_labels(r, ("outcome", name)), int(r.outcome.value == name))
               for r in results for name in OUTCOMES]
    observed = [(check_labels(r), float(r.observed) if "." in r.observed else int(r.observed))
                for r in results if r.observed is not None and _NUMBER.fullmatch(r.observed)]
    reverts = [(check_labels(r), 1) for r in results if reverting(r)]
    warned = [(check_labels(r), len(r.warnings)) for r in results if r.warnings]
    xids = [(_labels((*((("target", r.target),) if r.target is not None else ()),
                      ("gpu", str(group.get("gpu") or "")), ("code", _code(group)),
                      ("class", str(group.get("class"))), ("action", str(group.get("action"))),
                      ("event", str(group.get("kind"))))), int(group.get("count", 0)))
            for r in results for group in r.details.get("xid_counts", ())
            if isinstance(group, dict)]
    groups = sorted({(r.target or "", r.spec_file) for r in results}) or \
        [("", each) for each in files]

    def group_labels(target: str, spec_file: str) -> tuple[tuple[str, str], ...]:
        return ((("target", target),) if target else ()) + file_labels(spec_file)

    counts = [(_labels((*group_labels(*group), ("outcome", name))),
               sum(r.outcome.value == name and ((r.target or ""), r.spec_file) == group
                   for r in results))
              for group in groups for name in OUTCOMES]
    info = [(_labels((("target", _target(r)), *file_labels(r.spec_file), ("kind", r.kind),
                      ("key", r.key or ""), ("value", r.observed))), 1)
            for r in results if r.observed is not None and not _NUMBER.fullmatch(r.observed)]
    lines = [
        *_metric("gpuhost_check_ok", "1 when the check passed, was fixed or did not apply; "
                 "0 when it failed, its fix failed or the host could not be read", ok),
        *_metric("gpuhost_check_outcome", "1 for the outcome the check had in the last run",
                 outcome),
        *_metric("gpuhost_check_observed", "the value read on the host, where it is a number",
                 observed),
        *_metric("gpuhost_observed_info", "1 for the value read on the host, where it is not a "
                 "number (a driver, a link speed, a governor): drift shows as a minority value",
                 info),
        *_metric("gpuhost_check_will_revert", "1 for a check whose value is right now but that "
                 "the boot configuration sets back (absent for every other check)", reverts),
        *_metric("gpuhost_check_warnings", "warnings of a check that passed: a value close to "
                 "its floor, a GPU event that leaves the node open, a value that will revert "
                 "(absent for a check without one)", warned),
        *_metric("gpuhost_xid_total", "GPU events (Xid, SXid, a GPU off the bus) in the kernel "
                 "log judged by the dmesg check, per GPU, code, class and action (those set "
                 "aside after a GPU reset or driver load are not counted)", xids),
        *_metric("gpuhost_checks", "number of checks per outcome in the last run", counts),
        *_metric("gpuhost_last_run_timestamp_seconds", "when the last run finished (Unix time)",
                 [(_labels(group_labels(*group)), round(timestamp, 3)) for group in groups]),
    ]
    return "\n".join(lines) + "\n"


def _code(group: dict[str, object]) -> str:
    """An Xid's or SXid's code; for an event without one, what it is."""
    code = group.get("code")
    return str(code) if code is not None else str(group.get("description") or "")


class PrometheusTextfile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        specs = [path for path, _ in info.specs]
        write_output(self.path, textfile(records, specs=specs, timestamp=info.finished_at))
