"""The envelope's verdict: pure functions from a window's samples and its host half to
``{"valid", "reasons", "window_s", "samples", "before", "after", "during", ...}``, each reason
worded as an operator says it (``0000:41:00.0: HW slowdown 34% of 12.1 s (limit 1%)``).

Every limit is a share of the window or a count of new errors (``specmodel.envelope``); a share
under its limit keeps the run valid, whatever it is above zero. No host, no clock, no thread:
the sampler (``sampling.py``) and the host's reads (``hostside.py``) hand their facts in.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..printable import one_line
from ..specmodel.envelope import Limits
from .facts import (
    GPU_IDLE,
    JUDGED_POLICIES,
    POWER_CAPS,
    SLOWDOWNS,
    GpuFacts,
    HostWindow,
    Sample,
)

FIELD = "gpuhost_envelope"
"""The key of pytest-benchmark's ``extra_info`` (and of a JSON report's benchmark) that holds
the verdict."""
APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""Xids a program causes itself (an engine exception, a page fault, a stopped or cleaned-up
channel): ``xid: any`` counts them, ``xid: hardware`` does not."""
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                  r"(\d+)(?:, pid=[^,]*, name=[^,]*)?,?\s*(.*)")
READINGS = {"sm_clock": "MHz", "mem_clock": "MHz", "temperature": "C", "power_mw": "mW"}
"""The readings shown as min, median and max over the samples."""
COUNTERS = ("ecc_corrected", "ecc_uncorrected", "pcie_replays", "remapped_pending",
            "remapped_failure", "link_generation", "link_width")
"""The counters and states shown before and after."""


class Reason(msgspec.Struct, frozen=True):
    """Why a run is invalid: where (a GPU's or device's address; None for the host), what,
    what was seen and the limit, and the sentence that says it."""

    gpu: str | None
    what: str
    observed: object
    limit: object
    text: str

    def as_dict(self) -> dict[str, object]:
        return {"gpu": self.gpu, "what": self.what, "observed": self.observed,
                "limit": self.limit, "text": self.text}


def duration(seconds: float) -> str:
    """12.1 -> ``12.1 s``, 0.0512 -> ``0.0512 s``, 345.6 -> ``346 s``."""
    return f"{seconds:.3g} s"


def percent(share: float) -> str:
    """0.34 -> ``34%``, 0.005 -> ``0.5%``, 1/3 -> ``33.3%``."""
    return f"{share * 100:.3g}%"


def _during(samples: Sequence[Sample]) -> list[Sample]:
    """The samples taken while the benchmark ran; the two ends where there were none."""
    inner = [s for s in samples[1:-1] if s.error is None]
    return inner or [s for s in samples if s.error is None]


def _facts(samples: Sequence[Sample], gpu: str) -> list[GpuFacts]:
    return [s.gpus[gpu] for s in samples if s.error is None and gpu in s.gpus]


def reason_shares(samples: Sequence[Sample], gpu: str) -> dict[str, float]:
    """Each judged clock event reason's share of the samples that read the GPU's reasons."""
    masks = [f.reasons for f in _facts(samples, gpu) if f.reasons is not None]
    if not masks:
        return {}
    return {name: sum(1 for m in masks if m & bit) / len(masks)
            for name, bit in {**SLOWDOWNS, **POWER_CAPS}.items()}


def violation_window(first: GpuFacts, last: GpuFacts, window_s: float) -> float:
    """The seconds between two samples as the driver stamped its violation times, where both
    have a stamp that moved on; else the window's own."""
    if first.violation_at_us is not None and last.violation_at_us is not None and \
            last.violation_at_us > first.violation_at_us:
        return (last.violation_at_us - first.violation_at_us) / 1e6
    return window_s


def violation_shares(first: GpuFacts, last: GpuFacts, window_s: float) -> dict[str, float]:
    """Each policy's share of the window in violation: the difference of its violation time
    over the difference of wall time (the driver's, ``violation_window``)."""
    seconds = violation_window(first, last, window_s)
    if seconds <= 0:
        return {}
    return {policy: min(1.0, max(0, last.violation_ns[policy] - ns) / 1e9 / seconds)
            for policy, ns in first.violation_ns.items() if policy in last.violation_ns}


def _spread(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def during_of(samples: Sequence[Sample], gpu: str, window_s: float) -> dict[str, Any]:
    """One GPU's measures over the window: each reading's min, median and max, each clock
    event reason's and each violation policy's share."""
    facts = _facts(_during(samples), gpu)
    shown: dict[str, Any] = {}
    for name in READINGS:
        values = [getattr(f, name) for f in facts if getattr(f, name) is not None]
        if values:
            shown[name] = _spread(values)
    for name, share in reason_shares(samples, gpu).items():
        shown[name] = {"share": share}
    ends = _facts(samples, gpu)
    if len(ends) >= 2:
        seconds = violation_window(ends[0], ends[-1], window_s)
        for policy, share in violation_shares(ends[0], ends[-1], window_s).items():
            shown[f"{policy} violation"] = {"share": share, "of_s": round(seconds, 6)}
    return shown


def _share_reasons(gpu: str, during: Mapping[str, Any], limits: Limits, window_s: float
                   ) -> list[Reason]:
    found = []
    judged = {**dict.fromkeys(SLOWDOWNS, "slowdown"), **dict.fromkeys(POWER_CAPS, "power_cap"),
              **{f"{p} violation": limit for p, limit in JUDGED_POLICIES.items()}}
    for what, key in judged.items():
        share = during.get(what, {}).get("share")
        limit = getattr(limits, key)
        if share is not None and share > limit:
            of = during[what].get("of_s", window_s)
            found.append(Reason(gpu, what, share, limit,
                                f"{gpu}: {what} {percent(share)} of {duration(of)} "
                                f"(limit {percent(limit)})"))
    return found


def _clock_reason(gpu: str, samples: Sequence[Sample], limits: Limits) -> Reason | None:
    """The median SM clock while the GPU was busy (samples without the idle reason), taken
    during the run only: before and after, a GPU may idle."""
    busy = [f for f in _facts(samples[1:-1], gpu)
            if f.sm_clock is not None and f.sm_max and not (f.reasons or 0) & GPU_IDLE]
    if not busy:
        return None
    median = statistics.median(f.sm_clock for f in busy if f.sm_clock is not None)
    top = max(f.sm_max for f in busy if f.sm_max)
    share = median / top
    if share >= limits.clocks:
        return None
    return Reason(gpu, "SM clock", share, limits.clocks,
                  f"{gpu}: median SM clock {median:g} MHz, {percent(share)} of its max "
                  f"{top} MHz (limit {percent(limits.clocks)})")


def _process_reasons(gpu: str, samples: Sequence[Sample], limits: Limits) -> list[Reason]:
    strangers: dict[int, str] = {}
    for sample in samples:
        facts = sample.gpus.get(gpu) if sample.error is None else None
        for pid, name in ((facts.processes or {}) if facts is not None else {}).items():
            if pid not in sample.ours:
                strangers.setdefault(pid, name)
    if len(strangers) <= limits.other_processes:
        return []
    return [Reason(gpu, "process", pid, limits.other_processes,
                   f"{gpu}: pid {pid} ({name or '?'}) on the GPU, not the benchmark's")
            for pid, name in sorted(strangers.items())]


def _counter_reasons(gpu: str, first: GpuFacts, last: GpuFacts, limits: Limits
                     ) -> list[Reason]:
    found = []
    for name, limit, words in (("ecc_uncorrected", limits.ecc_uncorrected,
                                "uncorrected ECC errors"),
                               ("pcie_replays", limits.pcie_replays, "PCIe replays")):
        was, now = getattr(first, name), getattr(last, name)
        if was is not None and now is not None and now - was > limit:
            found.append(Reason(gpu, name, now - was, limit,
                                f"{gpu}: {now - was} {words} during the run (limit {limit})"))
    if last.remapped_pending and not limits.remapped_rows_pending:
        found.append(Reason(gpu, "remapped_rows_pending", True, False,
                            f"{gpu}: a row remap is pending after the run (limit: none)"))
    return found


def xid_class(number: int) -> str:
    """``application`` for an Xid a program causes itself, else ``hardware``."""
    return "application" if number in APPLICATION_XIDS else "hardware"


def xids(kernel_log: Sequence[str]) -> list[tuple[str, int, str]]:
    """(GPU address, Xid, message) of each Xid record; the address as sysfs names it."""
    found = []
    for text in kernel_log:
        match = _XID.search(text)
        if match:
            address = match.group(1).lower()
            address = address if "." in address else f"{address}.0"
            found.append((address, int(match.group(2)), match.group(3).strip()))
    return found


def _xid_reasons(kernel_log: Sequence[str], limits: Limits) -> list[Reason]:
    if limits.xid == "off":
        return []
    found = []
    for address, number, message in xids(kernel_log):
        kind = xid_class(number)
        if limits.xid == "any" or kind == "hardware":
            said = f": {message}" if message else ""
            found.append(Reason(address, "xid", number, limits.xid,
                                f"{address}: Xid {number} during the run ({kind}){said}"))
    return found


def _aer_reasons(host: HostWindow, limits: Limits) -> list[Reason]:
    found = []
    for device, after in sorted(host.after.aer.items()):
        before = host.before.aer.get(device)
        if before is None:
            continue
        for name, limit, words in (
                ("aer_dev_correctable", limits.aer_correctable, "correctable"),
                ("aer_dev_nonfatal", limits.aer_uncorrectable, "non-fatal"),
                ("aer_dev_fatal", limits.aer_uncorrectable, "fatal")):
            if name in before and name in after and after[name] - before[name] > limit:
                new = after[name] - before[name]
                found.append(Reason(device, name, new, limit,
                                    f"{device}: {new} {words} AER errors during the run "
                                    f"(limit {limit})"))
    return found


def _state_reasons(host: HostWindow, limits: Limits) -> list[Reason]:
    if limits.state != "unchanged" or host.before.state is None or host.after.state is None:
        return []
    before, after = host.before.state, host.after.state
    found = []
    for check in sorted({*before, *after}):
        was, now = before.get(check), after.get(check)
        if was != now:
            found.append(Reason(None, "state", {"check": check, "before": was, "after": now},
                                "unchanged", f"{one_line(check)} changed during the run: "
                                f"{one_line(str(was))} -> {one_line(str(now))}"))
    return found


def _ends(samples: Sequence[Sample], gpu: str) -> dict[str, Any]:
    facts = _facts(samples, gpu)
    return {"first": facts[0], "last": facts[-1]} if facts else {}


def _side(facts: GpuFacts | None) -> dict[str, Any]:
    if facts is None:
        return {}
    shown: dict[str, Any] = {name: getattr(facts, name) for name in COUNTERS
                             if getattr(facts, name) is not None}
    if facts.violation_ns:
        shown["violation_ns"] = dict(facts.violation_ns)
    return shown


def state_digest(state: Mapping[str, str | None] | None) -> str | None:
    """A digest of the checks' values read at one end (the state module's canonical form)."""
    if state is None:
        return None
    import hashlib
    import json

    return hashlib.sha256(json.dumps(dict(state), sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=True).encode()).hexdigest()


def judge(samples: Sequence[Sample], host: HostWindow, limits: Limits, *,
          gpus: Sequence[str] | None = None, missing: Sequence[str] = (),
          sampler: str | None = None) -> dict[str, Any]:
    """The verdict of a window: ``samples`` in time order (the first taken before the
    benchmark, the last after it), the host's half, the limits. ``gpus``: the GPUs the
    benchmark uses (None: every GPU a sample read); ``missing``: the halves that could not
    be taken, each a line (the verdict judges what it has)."""
    window_s = samples[-1].at - samples[0].at if samples else 0.0
    read = sorted({gpu for s in samples if s.error is None for gpu in s.gpus})
    chosen = [gpu for gpu in (gpus if gpus is not None else read) if gpu in read]
    reasons: list[Reason] = []
    before: dict[str, Any] = {}
    after: dict[str, Any] = {}
    during: dict[str, Any] = {}
    for gpu in chosen:
        ends = _ends(samples, gpu)
        during[gpu] = during_of(samples, gpu, window_s)
        seen = {pid: name for s in samples if s.error is None and gpu in s.gpus
                for pid, name in (s.gpus[gpu].processes or {}).items()}
        if seen:
            during[gpu]["processes"] = {str(pid): name for pid, name in sorted(seen.items())}
        reasons += _share_reasons(gpu, during[gpu], limits, window_s)
        clock = _clock_reason(gpu, samples, limits)
        reasons += [clock] if clock is not None else []
        reasons += _process_reasons(gpu, samples, limits)
        if ends:
            reasons += _counter_reasons(gpu, ends["first"], ends["last"], limits)
            before[gpu] = _side(ends["first"])
            after[gpu] = _side(ends["last"])
    reasons += _xid_reasons(host.kernel_log, limits)
    reasons += _aer_reasons(host, limits)
    reasons += _state_reasons(host, limits)
    errors = [f"sample at {duration(s.at - samples[0].at)}: {s.error}"
              for s in samples if s.error]
    return {
        "valid": not reasons,
        "reasons": [reason.as_dict() for reason in reasons],
        "window_s": round(window_s, 6),
        "samples": len(samples),
        "before": {"gpus": before, "aer": {k: dict(v) for k, v in host.before.aer.items()},
                   "state": state_digest(host.before.state)},
        "after": {"gpus": after, "aer": {k: dict(v) for k, v in host.after.aer.items()},
                  "state": state_digest(host.after.state)},
        "during": during,
        "kernel_log": list(host.kernel_log),
        "limits": msgspec.to_builtins(limits),
        "sampler": sampler,
        "missing": list(missing),
        "errors": [*errors, *host.errors],
    }


def summary(verdict: Mapping[str, Any]) -> str:
    """The verdict in one line: ``valid (12.1 s, 13 samples)`` or ``invalid: REASON; ...``."""
    if verdict.get("valid"):
        missing = verdict.get("missing") or []
        without = f"; without {'; '.join(missing)}" if missing else ""
        return f"valid ({duration(verdict.get('window_s', 0))}, {verdict.get('samples', 0)} " \
               f"samples{without})"
    texts = [str(reason.get("text", reason.get("what"))) for reason in verdict.get("reasons", [])]
    return "invalid: " + "; ".join(texts)
