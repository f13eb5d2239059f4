"""The health facts of the ``gpus:`` section: each GPU's ECC error counts, remapped rows, pending
page retirement, temperature, clocks event reasons and model, as its NVIDIA driver says them
now, each bad value named with what it means for the card and what to do.

One check per GPU and fact (``gpus.ecc_errors[0000:01:00.0]``), asked through ``Facts.nvml``
as the other NVML keys (the library, nvidia-smi, a recorded snapshot); a fact the GPU does not
support (page retirement on a card that remaps rows) is skipped with the driver's words. None
of them has a fixer: a bad value is the card's, and the remedy (a GPU reset, a drain, a
service call) is the operator's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..gpu.nvml import ECC_COUNTS, Nvml, NvmlNotSupported, NvmlSource
from ..gpu.nvmlcodes import CLOCKS_EVENT_REASONS, event_reasons
from ..host import Host
from ..result import CheckResult
from ..specmodel import OPTION_KEYS, EntryOptions, SpecContext
from ..specmodel.matchers import Verdict
from . import KERNEL, Check, Evidence, NoFix, NotApplicable, Observation
from .nvml import NvmlReads, _open, _unseen

if TYPE_CHECKING:  # capture's, and the spec's node: only named here
    from ..specmodel import Node
    from .capturing import Captured, Records

HEALTH_KEYS = ("clocks_event_reasons", "ecc_errors", "model", "remapped_rows", "retired_pages",
               "temperature")

ECC_MEANING = {
    "uncorrected_volatile": "uncorrected ECC errors since the driver loaded: data in this GPU's "
                            "memory was lost; drain it and reset the GPU (the bad row is "
                            "remapped at the reset), and service the card if they come back",
    "uncorrected_aggregate": "uncorrected ECC errors over the card's life: its memory has "
                             "failed before; service the card if the count grows",
    "corrected_volatile": "corrected ECC errors since the driver loaded: the memory is "
                          "degrading; watch remapped_rows and plan to service the card",
    "corrected_aggregate": "corrected ECC errors over the card's life: the memory is wearing; "
                           "plan to service the card",
}
REASON_MEANING = {
    "hw_slowdown": "the board cuts the clocks (power or heat, signalled by the board): check "
                   "the power supply and the cooling",
    "hw_thermal_slowdown": "the GPU is too hot and cuts its clocks: check the airflow, the fans "
                           "and the inlet temperature",
    "hw_power_brake_slowdown": "the chassis asserted the power brake (the power supply's "
                               "signal): check the PSUs and their cabling",
    "sw_thermal_slowdown": "the driver cuts the clocks to hold the temperature under its "
                           "target: check the cooling",
    "sw_power_cap": "the clocks are held down to stay under the power limit: see "
                    "gpus.power_limit",
    "sync_boost": "the clocks follow the slowest GPU of its sync boost group",
    "applications_clocks_setting": "the clocks are pinned by application clocks: reset them "
                                   "with nvidia-smi -rac",
    "gpu_idle": "nothing runs on the GPU",
    "display_clock_setting": "the clocks are held for a display",
}
_WORDS = re.compile(r"(\w+)=(\w+)")


def _pairs(observed: str) -> dict[str, str]:
    return dict(_WORDS.findall(observed))


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


class EccLimits(msgspec.Struct, frozen=True):
    """At most so many errors of each count named (``uncorrected_volatile: 0``)."""

    limits: tuple[tuple[str, int], ...]

    def describe(self) -> str:
        return ", ".join(f"{count} <= {limit}" for count, limit in self.limits)

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        counts = _pairs(observed)
        bad = [f"{counts.get(count, 'not reported')} {count.replace('_', ' ')} (max {limit}): "
               f"{ECC_MEANING[count]}" for count, limit in self.limits
               if not counts.get(count, "").isdigit() or int(counts[count]) > limit]
        return Verdict(not bad, "; ".join(bad))

    def fix_value(self, observed: str | None) -> str | None:
        return None

    def form(self) -> dict[str, Any]:
        return dict(self.limits)

    def reads(self) -> tuple[str, ...]:
        return tuple(count for count, _ in self.limits)


class Flags(msgspec.Struct, frozen=True):
    """Switches as the driver reports them (``pending: false``), each with what it means when
    it is the other way."""

    key: str
    wanted: tuple[tuple[str, bool], ...]

    def describe(self) -> str:
        return ", ".join(f"{flag} {_yes(value)}" for flag, value in self.wanted)

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        seen = _pairs(observed)
        bad = [_flag_meaning(self.key, flag, seen.get(flag, "not reported"))
               for flag, value in self.wanted if seen.get(flag) != _yes(value)]
        return Verdict(not bad, "; ".join(bad))

    def fix_value(self, observed: str | None) -> str | None:
        return None

    def form(self) -> dict[str, Any]:
        return dict(self.wanted)

    def reads(self) -> tuple[str, ...]:
        return ()


def _flag_meaning(key: str, flag: str, seen: str) -> str:
    if seen == "yes" and (key, flag) == ("remapped_rows", "pending"):
        return ("a row remap is pending: reset the GPU (nvidia-smi -r, or reboot) to apply it; "
                "until then the bad row stays in use")
    if seen == "yes" and (key, flag) == ("remapped_rows", "failure"):
        return ("a row remap failed: the memory bank has no spare row left; drain the node "
                "and service the card")
    if seen == "yes" and (key, flag) == ("retired_pages", "pending"):
        return ("a page retirement is pending: reset the GPU (nvidia-smi -r, or reboot) to "
                "retire the page")
    return f"{key.replace('_', ' ')} {flag}: {seen}"


class TemperatureLimit(msgspec.Struct, frozen=True):
    """The GPU's temperature now, at most ``max`` C."""

    max: int

    def describe(self) -> str:
        return f"<= {self.max} C"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None or not observed.isdigit():
            return Verdict(False, f"no temperature was read: {observed!r}")
        if int(observed) <= self.max:
            return Verdict(True)
        return Verdict(False, f"{observed} C, above {self.max} C: the GPU slows its clocks to "
                              "cool down and heat ages the card: check the airflow, the fans and "
                              "the inlet temperature")

    def fix_value(self, observed: str | None) -> str | None:
        return None

    def form(self) -> dict[str, Any]:
        return {"max": self.max}

    def reads(self) -> tuple[str, ...]:
        return ()


class ReasonsNot(msgspec.Struct, frozen=True):
    """None of these clocks event reasons active now."""

    reasons: tuple[str, ...]

    def describe(self) -> str:
        return f"none of {', '.join(self.reasons)}"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        active = [word.strip() for word in observed.split(",")]
        bad = [f"{reason} is active: {REASON_MEANING[reason]}" for reason in self.reasons
               if reason in active]
        return Verdict(not bad, "; ".join(bad))

    def fix_value(self, observed: str | None) -> str | None:
        return None

    def form(self) -> dict[str, Any]:
        return {"not": list(self.reasons)}

    def reads(self) -> tuple[str, ...]:
        return ()


class ModelIs(msgspec.Struct, frozen=True):
    """The GPU's model, as nvmlDeviceGetName says it."""

    model: str

    def describe(self) -> str:
        return self.model

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        if " ".join(observed.split()) == " ".join(self.model.split()):
            return Verdict(True)
        return Verdict(False, f"this GPU is an {observed!r}, not the {self.model!r} the spec is "
                              "written for: its limits and settings may not hold here")

    def fix_value(self, observed: str | None) -> str | None:
        return None

    def form(self) -> dict[str, Any]:
        return {"value": self.model}

    def reads(self) -> tuple[str, ...]:
        return ()


Health = EccLimits | Flags | TemperatureLimit | ReasonsNot | ModelIs


class HealthEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Health
    options: EntryOptions


def parse_health(key: str, node: Node, context: SpecContext) -> HealthEntry:
    """One health key of ``gpus:`` (``where`` of each error: the file and line)."""
    what = f"gpus {key}"
    inner: tuple[str, ...]
    if key == "model":
        if not node.is_mapping:
            return HealthEntry(key, ModelIs(node.text(what)), EntryOptions(where=node.where))
        inner = ("value",)
    else:
        inner = {"ecc_errors": ECC_COUNTS, "remapped_rows": ("pending", "failure"),
                 "retired_pages": ("pending",), "temperature": ("max",),
                 "clocks_event_reasons": ("not",)}[key]
        if not node.is_mapping:
            raise node.error(f"{what} needs a mapping of {', '.join(inner)}")
    pairs = node.mapping(what)
    for name, value in pairs:
        if name not in (*inner, *OPTION_KEYS):
            raise value.unknown_key(name, what, (*inner, *OPTION_KEYS))
    given = {name: value for name, value in pairs if name not in OPTION_KEYS}
    if not given:
        raise node.error(f"{what} needs at least one of {', '.join(inner)}")
    options = context.parse_options(node, pairs)
    expect: Health
    if key == "model":
        expect = ModelIs(given["value"].text(what))
    elif key == "ecc_errors":
        expect = EccLimits(tuple((name, _count(given[name], f"{what} {name}"))
                                 for name in ECC_COUNTS if name in given))
    elif key in ("remapped_rows", "retired_pages"):
        expect = Flags(key, tuple((name, given[name].boolean(f"{what} {name}"))
                                  for name in inner if name in given))
    elif key == "temperature":
        expect = TemperatureLimit(_count(given["max"], f"{what} max"))
    else:
        names = tuple(item.text(f"{what} not") for item in given["not"].sequence(f"{what} not"))
        unknown = [name for name in names if name not in CLOCKS_EVENT_REASONS]
        if unknown or not names:
            raise given["not"].error(f"{what} not: {', '.join(unknown) or 'nothing'} is not a "
                                     f"reason; expected some of {', '.join(CLOCKS_EVENT_REASONS)}")
        expect = ReasonsNot(names)
    return HealthEntry(key, expect, options)


def _count(node: Node, what: str) -> int:
    if node.is_mapping:
        pairs = dict(node.mapping(what))
        if list(pairs) != ["max"]:
            raise node.error(f"{what}: a count, or {{max: N}}")
        node = pairs["max"]
    value = node.scalar()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise node.error(f"{what}: not a count (a whole number from 0): {value!r}")
    return value


def _ecc(nvml: Nvml, address: str, counts: tuple[str, ...]) -> str:
    return " ".join(f"{count}={nvml.ecc_errors(address, count)}" for count in counts)


def _remapped(nvml: Nvml, address: str) -> str:
    rows = nvml.remapped_rows(address)
    return (f"corrected={rows.corrected} uncorrected={rows.uncorrected} "
            f"pending={_yes(rows.pending)} failure={_yes(rows.failure)}")


def _reasons(nvml: Nvml, address: str) -> str:
    return ", ".join(event_reasons(nvml.clocks_event_reasons(address))) or "none"


READS: dict[str, tuple[str, Callable[[Nvml, str, tuple[str, ...]], str]]] = {
    "ecc_errors": ("nvmlDeviceGetTotalEccErrors", _ecc),
    "remapped_rows": ("nvmlDeviceGetRemappedRows", lambda n, a, _: _remapped(n, a)),
    "retired_pages": ("nvmlDeviceGetRetiredPagesPendingStatus",
                      lambda n, a, _: f"pending={_yes(n.retired_pages_pending(a))}"),
    "temperature": ("nvmlDeviceGetTemperature", lambda n, a, _: str(n.temperature(a))),
    "clocks_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons",
                             lambda n, a, _: _reasons(n, a)),
    "model": ("nvmlDeviceGetName", lambda n, a, _: n.name(a)),
}
"""Each fact: the NVML call that gives it, and the observed value as the check shows it."""


class HealthProbe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
    """One health fact of one GPU, now; a fact the GPU does not support skips the check."""

    nvml: NvmlSource
    address: str
    key: str
    counts: tuple[str, ...] = ()
    """The ECC counts the spec limits (``ecc_errors`` only)."""

    def observe(self, host: Host) -> Observation:
        nvml = _open(self.nvml)
        unseen = _unseen(self.address, nvml)
        if unseen:
            return unseen
        call, read = READS[self.key]
        try:
            value = read(nvml, self.address, self.counts)
        except NvmlNotSupported as exc:
            raise NotApplicable(f"{self.address} does not report {self.key.replace('_', ' ')}"
                                f" (not supported by this GPU or driver: {exc})") from None
        return Observation(value, (Evidence(f"NVML {call}({self.address})", value),))


def expand_health(entries: Sequence[HealthEntry], nvml: NvmlSource,
                  addresses: tuple[str, ...]) -> list[Check]:
    """One check per GPU and health fact."""
    return [Check(f"gpus.{entry.key}", address, entry.expect, entry.options,
                  HealthProbe(nvml, address, entry.key, entry.expect.reads()),
                  subjects={"gpu": address}, scope=KERNEL)
            for entry in entries for address in addresses]


def _as_shown(entry: HealthEntry, records: Sequence[CheckResult]) -> dict[str, Any] | None:
    """The entry's form that the values the host shows now pass (None: none can say it)."""
    seen = [str(r.observed) for r in records]
    expect = entry.expect
    if isinstance(expect, EccLimits):
        return {count: max(int(_pairs(v).get(count, "0")) for v in seen)
                for count, _ in expect.limits}
    if isinstance(expect, Flags):  # a switch is one value: only where every GPU shows it
        shown = {flag: {_pairs(v).get(flag) == "yes" for v in seen} for flag, _ in expect.wanted}
        return {flag: values.pop() for flag, values in shown.items()} \
            if all(len(values) == 1 for values in shown.values()) else None
    if isinstance(expect, TemperatureLimit):
        return {"max": max(int(v) for v in seen if v.isdigit())}
    if isinstance(expect, ReasonsNot):
        active = {word.strip() for v in seen for word in v.split(",")}
        kept = [reason for reason in expect.reasons if reason not in active]
        return {"not": kept} if kept else None
    return {"value": seen[0]} if len(set(seen)) == 1 else None


def capture_health(entries: Sequence[HealthEntry], records: Records, out: Captured) -> None:
    """Each health key as the host shows it: the spec's own limits where every GPU passes
    them; where a fact is already bad, a warning naming each GPU and what its value means, and
    what the host shows where one entry can say it for every GPU (the highest count or
    temperature, a switch every GPU shows the same), else nothing."""
    from .capturing import entry as written
    from .capturing import problem, records_of

    for item in entries:
        found = records_of(records, f"gpus.{item.key}")
        why = problem(found)
        if why is not None:
            out.leave_out(f"gpus.{item.key}", why)
            continue
        # judged by the entry itself: a catalog run passes every value it reads
        bad = [r for r in found if not item.expect.judge(str(r.observed)).ok]
        if not bad:
            out.entries[item.key] = written(item.expect.form(), item.options)
            continue
        form = _as_shown(item, found)
        for record in bad:
            why = item.expect.judge(str(record.observed)).reason
            out.warn(f"gpus.{item.key}", f"already bad on {record.key}: {why}")
        if form is None:
            continue
        out.entries[item.key] = written(form, item.options, why=False)
