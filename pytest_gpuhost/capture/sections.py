"""Each spec section as captured: from the run's records (the values observed) and the section's
model (its entries' options and forms), the section's YAML value and what had to be left out.

The rules: exact values for switches and enums; ``min:`` at the lowest value seen for buffer
sizes, power limits, sizes and versions (and wherever the spec itself asked for a minimum;
``max:`` where it asked for a maximum); link width and speed as trained (GPUs that differ: the
values seen, as ``one_of``); P2P floors at 90% of the lowest measured pair of each class, rounded
down; dmesg ``allow:`` patterns for the records that offended now; modules absent as absent.
Every value is judged with the spec's own matcher against every record before it is kept, so
the captured spec passes on the host it came from; what cannot be written that way (policies
that differ, ACS redirect on, a value that could not be read) is left out with the reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..checks import cpufreq, cpuidle, dmesg, gpus, iommu, kernel, memory, modules, nvml, p2p, pcie
from ..checks.kernel import CmdlineExpectation
from ..checks.pcie_path import PathEntry
from ..linux.cmdline import Parameter
from ..linux.kmsg import LEVELS
from ..linux.sysfs import release_version
from ..result import CheckResult, Outcome
from ..spec import EntryOptions
from ..spec.matchers import (
    Auto,
    Domain,
    Exact,
    Expectation,
    LinkSpeed,
    Match,
    OneOf,
    Range,
    normalize_ws,
)
from .patterns import allow_patterns

OBSERVED = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.FIXED, Outcome.FIX_FAILED,
                      Outcome.WOULD_FIX, Outcome.REBOOT_REQUIRED})
"""Outcomes whose record holds the value the host has now (after a fix, the read-back)."""
BUFFER_SYSCTLS = re.compile(
    r"(?:^|\.)(?:[rw]mem_(?:max|default)|optmem_max|netdev_max_backlog|somaxconn|"
    r"max_map_count|file-max|nr_open|max_user_watches|max_user_instances|shmmax|shmall)\Z")
"""Sysctls that are sizes or limits: more is as good, so they are captured as ``min:``."""
P2P_SHARE = 0.9


@dataclass
class Captured:
    """One section as captured: its entries (None: none could be kept) and what was left out."""

    entries: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def leave_out(self, what: str, why: str) -> None:
        self.notes.append(f"{what}: {' '.join(why.split())[:160]}")


Records = Mapping[str, Sequence[CheckResult]]
"""A spec's records by kind, in run order."""


def options_of(options: EntryOptions) -> dict[str, Any]:
    """The entry options as a spec writes them (only those that differ from the defaults)."""
    shown: dict[str, Any] = {}
    if options.when is not None:
        shown["when"] = str(options.when)
    if not options.fix:
        shown["fix"] = False
    if options.severity != "normal":
        shown["severity"] = options.severity
    if options.why:
        shown["why"] = options.why
    return shown


def entry(form: Mapping[str, Any], options: EntryOptions, value_key: str = "value") -> Any:
    """``{value: X, why: ...}``, or the bare value when there is nothing beside it."""
    extra = options_of(options)
    if list(form) == [value_key] and not extra:
        return form[value_key]
    return {**form, **extra}


def spec_form(expect: Expectation, value_key: str = "value") -> dict[str, Any] | None:
    """An expectation written back as the spec had it (for an entry whose ``when:`` was false)."""
    if isinstance(expect, Exact):
        return {value_key: expect.value}
    if isinstance(expect, OneOf):
        return {"one_of": list(expect.values)}
    if isinstance(expect, Match):
        return {"match": expect.pattern.pattern}
    if isinstance(expect, Range):
        bounds = {"min": expect.min, "max": expect.max}
        return {k: v for k, v in bounds.items() if v is not None}
    return None


def problem(records: Sequence[CheckResult]) -> str | None:
    """Why these records hold no value to capture, or None when every one does."""
    if not records:
        return "no check of it ran (nothing here it applies to, or it was deselected)"
    for record in records:
        if record.outcome is Outcome.SKIPPED:
            return f"skipped: {record.message}"
        if record.outcome is Outcome.ERROR:
            return f"could not be read: {record.message}"
        if record.outcome not in OBSERVED or record.observed is None:
            return f"nothing was read: {record.message}"
    return None


def when_false(records: Sequence[CheckResult], options: EntryOptions) -> bool:
    """Every record skipped by the entry's own ``when:``: kept as the spec has it."""
    return bool(records) and options.when is not None and all(
        r.outcome is Outcome.SKIPPED and r.message.startswith("when:") for r in records)


@dataclass(frozen=True)
class Rule:
    """How one key's values are captured."""

    floor: bool = False
    """Captured as ``min:`` the lowest value seen (sizes, limits, versions)."""
    one_of: bool = False
    """The key takes ``one_of`` (values that differ between GPUs are kept as a list)."""
    show: Callable[[str], str] = str.strip
    """The observed value as the spec writes it."""


def _domain(expect: Expectation) -> Domain:
    found = getattr(expect, "domain", None)
    return found if found is not None else Auto()


def capture_values(values: Sequence[str], expect: Expectation, rule: Rule
                   ) -> tuple[dict[str, Any] | None, str]:
    """The expectation form that every one of ``values`` passes, or None and why not."""
    domain = _domain(expect)
    shown = list(dict.fromkeys(rule.show(v) for v in values))
    bound = "min" if rule.floor else None
    if isinstance(expect, Range) and (expect.min is None) != (expect.max is None):
        bound = "min" if expect.min is not None else "max"
    form: dict[str, Any] | None = None
    matcher: Expectation | None = None
    if bound is not None:
        try:
            ordered = sorted(shown, key=domain.order_key)
        except ValueError:
            bound = None  # no order (a multi-value sysctl under min:): the exact value
        else:
            limit = ordered[0] if bound == "min" else ordered[-1]
            form = {bound: limit}
            matcher = Range(limit if bound == "min" else None, limit if bound == "max" else None,
                            domain)
    if bound is None:
        if len(shown) == 1:
            form, matcher = {"value": shown[0]}, Exact(shown[0], domain)
        elif rule.one_of:
            form, matcher = {"one_of": shown}, OneOf(tuple(shown), domain)
        else:
            return None, f"the values differ ({', '.join(shown)}) and this key takes one value"
    assert form is not None and matcher is not None
    try:
        for value in shown:
            domain.validate(value)
    except ValueError as exc:
        return None, f"{exc} (the spec could not say it)"
    failing = [v for v in values if not matcher.judge(v).ok]
    if failing:
        return None, f"{failing[0]!r} would not pass {matcher.describe()}"
    return form, ""


def capture_key(name: str, records: Sequence[CheckResult], expect: Expectation,
                options: EntryOptions, rule: Rule, out: Captured, label: str) -> None:
    """One spec key over its records (one per GPU, bridge, or a single one) into ``out``."""
    if when_false(records, options):
        form = spec_form(expect)
        if form is not None:
            out.entries[name] = entry(form, options)
            return
    why = problem(records)
    if why is not None:
        out.leave_out(label, why)
        return
    form, reason = capture_values([str(r.observed) for r in records], expect, rule)
    if form is None:
        out.leave_out(label, reason)
        return
    out.entries[name] = entry(form, options)


def _kind(records: Records, kind: str, key: str | None = None) -> list[CheckResult]:
    found = records.get(kind, ())
    return [r for r in found if key is None or r.key == key]


# -- the sections ---------------------------------------------------------------------------


def capture_sysctl(model: Sequence[Any], records: Records) -> Captured:
    out = Captured()
    for item in model:
        rule = Rule(floor=bool(BUFFER_SYSCTLS.search(item.key)), one_of=True,
                    show=normalize_ws)
        capture_key(item.key, _kind(records, "sysctl", item.key), item.expect, item.options,
                    rule, out, f"sysctl[{item.key}]")
    return out


def capture_kernel(model: kernel.KernelSection, records: Records) -> Captured:
    out = Captured()
    if model.release is not None:
        expect, options = model.release
        capture_key("release", _kind(records, "kernel.release"), expect, options,
                    Rule(floor=True, show=lambda raw: release_version(raw.strip())), out,
                    "kernel.release")
    has: list[str] = []
    lacks: list[str] = []
    for item in model.cmdline:
        word = item.parameter.word
        found = _kind(records, "kernel.cmdline", word)
        if when_false(found, item.options):
            (has if item.has else lacks).append(word)
            continue
        why = problem(found)
        if why is not None:
            out.leave_out(f"kernel.cmdline[{word}]", why)
            continue
        observed = str(found[0].observed)
        if CmdlineExpectation(Parameter(word), True).judge(observed).ok:
            has.append(word)
        elif CmdlineExpectation(Parameter(word), False).judge(observed).ok:
            lacks.append(word)
        else:
            out.leave_out(f"kernel.cmdline[{word}]", f"the command line has {observed!r}: "
                          f"neither has nor lacks {word}")
    if has or lacks:
        lists = {name: words for name, words in (("has", has), ("lacks", lacks)) if words}
        out.entries["cmdline"] = {**lists, **options_of(model.cmdline[0].options)}
    return out


def capture_cpufreq(model: cpufreq.CpufreqSection, records: Records) -> Captured:
    out = Captured()
    for item in model.entries:
        found = _kind(records, f"cpufreq.{item.key}")
        mixed = [r for r in found if r.observed and " on cpus " in r.observed]
        if mixed:
            out.leave_out(f"cpufreq.{item.key}", f"the policies differ: {mixed[0].observed}")
            continue
        _, matchers = cpufreq.DOMAINS[item.key]
        capture_key(item.key, found, item.expect, item.options,
                    Rule(one_of="one_of" in matchers), out, f"cpufreq.{item.key}")
    return out


def capture_memory(model: Sequence[memory.MemoryEntry], records: Records) -> Captured:
    out = Captured()
    for item in model:
        capture_key(item.key, _kind(records, f"memory.{item.key}"), item.expect, item.options,
                    Rule(one_of=True), out, f"memory.{item.key}")
    return out


def capture_iommu(model: iommu.IommuSection, records: Records) -> Captured:
    out = Captured()
    capture_key("gpu_groups", _kind(records, "iommu.gpu_groups"), model.expect, model.options,
                Rule(one_of=True), out, "iommu.gpu_groups")
    return out


NVML_FLOORS = ("power_limit", "bar1", "driver_version")


def capture_gpus(model: gpus.GpusSection, records: Records) -> Captured:
    out = Captured()
    if model.count is not None:
        expect, options = model.count
        capture_key("count", _kind(records, "gpu_count"), expect, options, Rule(), out,
                    "gpu_count")
    for item in model.nvml:
        found = _kind(records, f"gpus.{item.key}")
        if item.key in ("driver_match", "p2p_status"):
            wanted = "match" if item.key == "driver_match" else "ok"
            bad = [r for r in found if r.observed not in (None, wanted)]
            if bad:
                out.leave_out(f"gpus.{item.key}", f"{bad[0].observed}")
                continue
        key = nvml.KEYS[item.key]
        capture_key(item.key, found, item.expect, item.options,
                    Rule(floor=item.key in NVML_FLOORS, one_of="one_of" in key.matchers), out,
                    f"gpus.{item.key}")
        if item.key == "driver_match" and out.entries.get("driver_match") == "match":
            out.entries["driver_match"] = True
    return out


def _link_speed(raw: str) -> str:
    """``32.0 GT/s PCIe`` -> ``32.0 GT/s``."""
    return f"{LinkSpeed().order_key(raw):.1f} GT/s"


def capture_pcie(model: Sequence[pcie.PcieEntry | PathEntry], records: Records) -> Captured:
    out = Captured()
    for item in model:
        kind = f"pcie.{item.key}"
        found = _kind(records, kind)
        if isinstance(item, PathEntry):
            _capture_path_key(item, found, out)
            continue
        matchers = pcie.KEYS[item.key].matchers
        show = _link_speed if item.key == "max_link_speed" else str.strip
        capture_key(item.key, found, item.expect, item.options,
                    Rule(floor=item.key == "max_payload", one_of="one_of" in matchers,
                         show=show), out, kind)
    return out


def _capture_path_key(item: PathEntry, found: Sequence[CheckResult], out: Captured) -> None:
    """acs_redirect and aspm can only say ``off``; aer only that the totals do not grow."""
    kind = f"pcie.{item.key}"
    if when_false(found, item.options):
        out.entries[item.key] = _path_form(item, item.since)
        return
    why = problem(found)
    if why is not None:
        out.leave_out(kind, why)
        return
    if item.key != "aer":
        on = [r for r in found if r.observed != "off"]
        if on:
            out.leave_out(kind, f"{on[0].observed} at {on[0].key}"
                          + (f" and {len(on) - 1} more" if len(on) > 1 else ""))
            return
        out.entries[item.key] = _path_form(item, item.since)
        return
    grown = [r for r in found if r.observed != "none"]
    if grown and item.since == "session":
        out.leave_out(kind, f"AER errors grew during the run at {grown[0].key} "
                      f"({grown[0].observed}): look at that link before holding others to it")
        return
    if grown:  # since boot, errors were logged before: only new ones are news from here on
        out.leave_out(f"{kind} since: boot", f"{grown[0].key} has {grown[0].observed}; "
                      "captured as since: session")
    out.entries[item.key] = _path_form(item, "session" if grown else item.since)


def _path_form(item: PathEntry, since: str) -> Any:
    if item.key == "aer":
        return {"since": since, **options_of(item.options)}
    return entry({"value": "off"}, item.options)


def capture_cpuidle(model: cpuidle.CpuidleSection, records: Records) -> Captured:
    out = Captured()
    kept: list[Any] = []
    for state in model.states:
        found = _kind(records, "cpuidle", state.name)
        extra = options_of(state.options)
        if when_false(found, state.options):
            kept.append({"name": state.name, **extra})
            continue
        why = problem(found)
        if why is not None:
            out.leave_out(f"cpuidle[{state.name}]", why)
            continue
        enabled = [r for r in found if r.observed != cpuidle.DISABLED]
        if enabled:
            out.leave_out(f"cpuidle[{state.name}]", f"{enabled[0].observed} (the spec lists "
                          "only states that must be disabled)")
            continue
        kept.append({"name": state.name, **extra} if extra else state.name)
    if not kept:
        return out
    out.entries["disabled"] = kept
    if model.residency is not None:
        window, options = model.residency
        names = [k if isinstance(k, str) else k["name"] for k in kept]
        entered = [r for r in records.get("cpuidle.residency", ())
                   if r.key in names and r.observed != cpuidle.NO_GROWTH]
        if entered:
            out.leave_out("cpuidle.residency", f"{entered[0].key}: "
                          f"{entered[0].observed or entered[0].message}")
        else:
            out.entries["residency"] = {"window": f"{window * 1000:g}ms",
                                        **options_of(options)}
    return out


def capture_modules(model: modules.ModulesSection, records: Records) -> Captured:
    out = Captured()
    for item in model.modules:
        name = modules.canonical(item.name)
        params = [p for p in model.parameters if p.module == name]
        found = _kind(records, "module", item.name)
        if when_false(found, item.options):
            values = {p.parameter: spec_form(p.expect) for p in params}
            out.entries[item.name] = _module(spec_form(item.expect, "state") or {},
                                             {k: v["value"] for k, v in values.items() if v},
                                             item.options)
            continue
        why = problem(found)
        if why is not None:
            out.leave_out(f"module[{item.name}]", why)
            continue
        observed = str(found[0].observed)
        if observed not in (modules.LOADED, modules.BUILTIN, modules.ABSENT):
            out.leave_out(f"module[{item.name}]", f"it is {observed}")
            continue
        loaded = observed != modules.ABSENT
        kept: dict[str, str] = {}
        for param in params:
            label = f"module.parameter[{name}.{param.parameter}]"
            got = _kind(records, "module.parameter", f"{name}.{param.parameter}")
            why = problem(got)
            value = str(got[0].observed).strip() if why is None else ""
            if not loaded:
                out.leave_out(label, f"{item.name} is absent")
            elif why is not None:
                out.leave_out(label, why)
            elif not value or any(c.isspace() for c in value):
                out.leave_out(label, f"the value {value!r} cannot be written as a parameter")
            else:
                kept[param.parameter] = value
        out.entries[item.name] = _module(
            {"state": modules.LOADED if loaded else modules.ABSENT}, kept, item.options)
    return out


def _module(state: Mapping[str, Any], parameters: Mapping[str, str],
            options: EntryOptions) -> Any:
    if parameters and state.get("state") == modules.LOADED:
        return {**state, "parameters": dict(parameters), **options_of(options)}
    return entry(state, options, "state")


def p2p_floor(lowest: float) -> float | int:
    """90% of the lowest measurement, rounded down: to a whole GB/s, or to 0.1 below 1."""
    share = lowest * P2P_SHARE
    return math.floor(share) if share >= 1 else math.floor(share * 10) / 10


def _size(size: int) -> str | int:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return size


def capture_p2p(model: p2p.P2pSection, records: Records) -> Captured:
    out = Captured()
    every = [r for kind in ("p2p", "p2p.h2d", "p2p.d2h", "p2p.concurrent")
             for r in records.get(kind, ())]
    if when_false(every, model.options):
        out.entries.update(_p2p_settings(model, dict(model.floors), model.concurrent,
                                         model.path_floor.fraction if model.path_floor else None))
        return out
    lone = [r for r in records.get("p2p", ()) if r.key is None]
    if lone:
        out.leave_out("p2p", lone[0].message)
        return out
    pairs = records.get("p2p", ())
    unclassed = [r for r in pairs if "class" not in r.details]
    floors: dict[str, float | int] = {}
    for name in p2p.FLOORS:
        if model.floor(name) is None:
            continue
        if name in p2p.CLASSES:
            found = [r for r in pairs if r.details.get("class") == name]
            if unclassed:
                out.leave_out(f"p2p floor {name}", f"{unclassed[0].key}: {unclassed[0].message}")
                continue
        else:
            found = list(records.get(f"p2p.{name}", ()))
        lowest = _lowest(found, f"p2p floor {name}", out)
        if lowest is not None:
            floors[name] = p2p_floor(lowest)
    concurrent = None
    if model.concurrent is not None:
        lowest = _lowest(list(records.get("p2p.concurrent", ())), "p2p concurrent", out)
        concurrent = p2p_floor(lowest) if lowest is not None else None
    usable = {name: value for name, value in floors.items() if value > 0}
    share = _path_share(model, pairs, out)
    if not usable and not concurrent and share is None:
        return out
    out.entries.update(_p2p_settings(model, usable, concurrent, share))
    return out


def _path_share(model: p2p.P2pSection, pairs: Sequence[CheckResult], out: Captured
                ) -> float | None:
    """``floors: path``: 90% of the lowest share of its path's limit a pair reached (of the
    limit the spec names: as negotiated, or as capable), rounded down to a hundredth."""
    if model.path_floor is None:
        return None
    name = "capable_fraction" if model.path_floor.capability else "fraction"
    missing = [r for r in pairs if not isinstance(r.details.get(name), (int, float))]
    if not pairs or missing:
        where = f"{missing[0].key}: {missing[0].message}" if missing else "no pair measured"
        out.leave_out("p2p floor path", where)
        return None
    share = math.floor(min(float(r.details[name]) for r in pairs) * P2P_SHARE * 100) / 100
    if share <= 0:
        out.leave_out("p2p floor path", "a pair measured next to nothing of its path's limit")
        return None
    return share


def _lowest(found: Sequence[CheckResult], label: str, out: Captured) -> float | None:
    why = problem(found)
    if why is not None:
        where = next((f"{r.key}: " for r in found if r.observed is None and r.key), "")
        out.leave_out(label, where + why)
        return None
    return min(float(str(r.observed)) for r in found)


def _p2p_settings(model: p2p.P2pSection, floors: Mapping[str, float | int],
                  concurrent: float | int | None, share: float | None = None
                  ) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "probe": f"file:{model.path}" if model.probe == "file" else model.probe,
        "size": _size(model.size)}
    path = model.path_floor if share is not None else None
    shares = {"path": share, **({"of": "capability"} if path.capability else {})} \
        if path is not None else {}
    if floors or shares:
        settings["floors"] = {**floors, **shares}
    if concurrent:
        settings["concurrent"] = {"floor": concurrent}
    if model.warn_margin:
        settings["warn_margin"] = f"{model.warn_margin * 100:g}%"
    return {**settings, **options_of(model.options)}


def capture_dmesg(model: dmesg.DmesgSection, records: Records) -> Captured:
    out = Captured()
    found = _kind(records, "dmesg")
    settings: dict[str, Any] = {"levels": [LEVELS[level] for level in model.levels],
                                "since": model.since}
    existing = [p.pattern for p in model.allow]
    if when_false(found, model.options):
        out.entries.update({**settings, **({"allow": existing} if existing else {}),
                            **options_of(model.options)})
        return out
    why = problem(found)
    if why is not None:
        out.leave_out("dmesg", why)
        return out
    offending = [str(t) for r in found for t in r.details.get("offending", ())]
    cut = sum(int(r.details.get("offending_cut", 0)) for r in found)
    if cut:
        out.leave_out("dmesg", f"{cut} more distinct offending records than the record keeps: "
                      "they are not allowed here")
    allow = existing + allow_patterns(offending, model.allow)
    out.entries.update({**settings, **({"allow": allow} if allow else {}),
                        **options_of(model.options)})
    return out


CAPTURERS: dict[str, Callable[[Any, Records], Captured]] = {
    "sysctl": capture_sysctl, "kernel": capture_kernel, "cpufreq": capture_cpufreq,
    "memory": capture_memory, "gpus": capture_gpus, "pcie": capture_pcie,
    "iommu": capture_iommu, "cpuidle": capture_cpuidle, "modules": capture_modules,
    "p2p": capture_p2p, "dmesg": capture_dmesg,
}
"""Section -> its capturer, for every built-in kind."""
