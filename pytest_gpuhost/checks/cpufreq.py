"""cpufreq: the CPU frequency driver, governor, energy-performance preference and boost.

One check per key for all policies (the observed value names the CPUs that differ, as cpuidle
does). ``driver`` is chosen at boot (``amd_pstate=active`` gives amd-pstate-epp): a wrong one is
``reboot_required`` when the boot configuration already asks for the right one, and --fix
--fix-persist adds the parameter to our grub.d drop-in. ``governor``, ``epp`` and ``boost`` are
written to sysfs by --fix, policy by policy. A platform without the file (a VM without cpufreq,
acpi-cpufreq without EPP) makes the check skipped, not failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..host import Glob, Host, Read, Reply, Request, raised, unreadable
from ..linux.cmdline import Parameter
from ..linux.cpufreq import CPUFREQ, GLOBAL_BOOST, INTEL_NO_TURBO, policies, policy_path
from ..linux.cpulist import fold_cpu_list, parse_cpu_list
from ..result import CheckResult, Outcome
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Auto, Domain, Expectation, Integer
from . import (
    CannotFix,
    Check,
    Evidence,
    Facts,
    NextBoot,
    NotApplicable,
    Observation,
    PersistLine,
)
from .bootconfig import BOOT_READS, dropin_path, plan_dropin, read_boot_config

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan, WriteText

KEYS = ("driver", "governor", "epp", "boost")
ATTRIBUTES = {"driver": "scaling_driver", "governor": "scaling_governor",
              "epp": "energy_performance_preference", "boost": "boost"}
BOOT_PARAMETERS = {"amd-pstate-epp": "amd_pstate=active", "amd-pstate": "amd_pstate=passive",
                   "intel_pstate": "intel_pstate=active", "intel_cpufreq": "intel_pstate=passive"}
"""The kernel parameter that selects each driver (where the CPU supports it)."""
_FROM_PARAMETER = {("amd_pstate", "active"): "amd-pstate-epp",
                   ("amd_pstate", "passive"): "amd-pstate",
                   ("amd_pstate", "guided"): "amd-pstate",
                   ("amd_pstate", "disable"): "acpi-cpufreq",
                   ("intel_pstate", "active"): "intel_pstate",
                   ("intel_pstate", "passive"): "intel_cpufreq",
                   ("intel_pstate", "disable"): "acpi-cpufreq"}


class PolicyValue(msgspec.Struct, frozen=True):
    policy: str
    path: str
    cpus: tuple[int, ...]
    value: str


def policy_reads(attribute: str) -> tuple[Request, ...]:
    """What reading ``attribute`` of every policy takes: one batch of three globs (the value,
    the CPUs of each policy, and the driver, for a message), whatever the number of CPUs."""
    return tuple(Glob(f"{CPUFREQ}/policy*/{name}")
                 for name in (attribute, "related_cpus", "scaling_driver"))


def _by_policy(reply: Reply) -> dict[str, str]:
    if reply.error is not None:
        return {}
    return {path.split("/")[-2]: data.decode("utf-8", "replace").strip()
            for path, data in reply.matches() if isinstance(data, bytes)}


def read_policies(host: Host, attribute: str) -> list[PolicyValue]:
    """Every policy's ``attribute``; NotApplicable when there are no policies or none has it."""
    replies = host.batch(policy_reads(attribute))
    if replies[0].error is not None:  # the policies could not be listed: none is known
        raise raised(replies[0].error)
    for _, data in replies[0].matches():
        if unreadable(data):
            # a policy left out would pass (or be fixed) as one without the attribute
            raise raised(data)
    values, related, drivers = (_by_policy(r) for r in replies)
    names = policies(sorted({*values, *related, *drivers}))
    if not names:
        raise NotApplicable(f"no cpufreq policies under {CPUFREQ}: this platform (a VM, or "
                            "cpufreq off) has no CPU frequency scaling")
    found = []
    for policy in names:
        if policy not in values:
            continue
        try:
            cpus = tuple(parse_cpu_list(related.get(policy, "").replace(" ", ",")))
        except ValueError:
            cpus = ()
        found.append(PolicyValue(policy, policy_path(policy, attribute), cpus, values[policy]))
    if not found:
        driver = drivers.get(names[0], "unknown")
        raise NotApplicable(f"no cpufreq policy has {attribute} (driver {driver})")
    return found


def summarize(values: Sequence[PolicyValue]) -> str:
    """``performance`` when every policy agrees, else ``powersave on cpus 0-3; performance on
    cpus 4-63`` (the commonest last)."""
    groups: dict[str, list[int]] = {}
    for item in values:
        groups.setdefault(item.value, []).extend(item.cpus or [int(item.policy[6:])])
    if len(groups) == 1:
        return next(iter(groups))
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), kv[0]))
    return "; ".join(f"{value} on cpus {fold_cpu_list(cpus)}" for value, cpus in ordered)


def _evidence(values: Sequence[PolicyValue]) -> Evidence:
    first = values[0].path.replace(values[0].policy, "policyN")
    return Evidence(first, f"{len(values)} policies: {summarize(values)}")


def _writes(values: Sequence[PolicyValue], value: str) -> tuple[WriteText, ...]:
    from .changes import WriteText  # a plan's: a check that passes makes none

    return tuple(WriteText(v.path, v.value + "\n", value + "\n") for v in values
                 if v.value != value)


class DriverProbe(msgspec.Struct, frozen=True):
    spec: str
    fixable = True
    boot_time = True

    def reads(self) -> Sequence[Request]:
        return (*policy_reads("scaling_driver"), *BOOT_READS, Read(dropin_path(self.spec)))

    def observe(self, host: Host) -> Observation:
        values = read_policies(host, "scaling_driver")
        boot = read_boot_config(host)
        next_boot = None
        for key in ("amd_pstate", "intel_pstate"):
            words = [w for w in boot.words if Parameter(w).key == key]
            if words:
                mode = Parameter(words[-1]).value or ""
                driver = _FROM_PARAMETER.get((key, mode))
                if driver is not None:
                    next_boot = NextBoot(driver, boot.where(words[-1:]), boot.apply)
        evidence = [_evidence(values)] + ([boot.evidence()] if boot.loader != "none" else [])
        return Observation(summarize(values), tuple(evidence), next_boot=next_boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        word = BOOT_PARAMETERS.get(value)
        if word is None:
            raise CannotFix(f"no kernel parameter selects {value} alone (acpi-cpufreq is what "
                            "amd_pstate=disable or intel_pstate=disable leave)")
        return plan_dropin(host, self.spec, [word])


class PolicyAttributeProbe(msgspec.Struct, frozen=True):
    """governor or epp: one sysfs file per policy, written where it differs."""

    attribute: str
    fixable = True

    def reads(self) -> Sequence[Request]:
        offered = "scaling_available_governors" if self.attribute == "scaling_governor" \
            else "energy_performance_available_preferences"
        return (*policy_reads(self.attribute), Glob(f"{CPUFREQ}/policy*/{offered}"))

    def observe(self, host: Host) -> Observation:
        values = read_policies(host, self.attribute)
        return Observation(summarize(values), (_evidence(values),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan  # a plan's: a check that passes makes none

        values = read_policies(host, self.attribute)
        available = "scaling_available_governors" if self.attribute == "scaling_governor" \
            else "energy_performance_available_preferences"
        path = policy_path(values[0].policy, available)
        offered = {p: d for p, d in host.glob(f"{CPUFREQ}/policy*/{available}")}.get(path)
        if isinstance(offered, bytes) and value not in offered.decode(errors="replace").split():
            raise CannotFix(f"{value!r} is not offered by {path}: "
                            f"{offered.decode(errors='replace').strip()}")
        changes = _writes(values, value)
        cpus = fold_cpu_list(c for v in values if v.value != value for c in v.cpus)
        return Plan(f"write {value!r} to cpufreq {self.attribute} on cpus {cpus}", changes)


class BoostProbe(msgspec.Struct, frozen=True):
    """Per-policy boost (6.11 on), else the global switch, else intel_pstate's no_turbo."""

    fixable = True

    def reads(self) -> Sequence[Request]:
        return (*policy_reads("boost"), Read(GLOBAL_BOOST), Read(INTEL_NO_TURBO))

    def _read(self, host: Host) -> tuple[list[PolicyValue], bool]:
        """The boost values and whether they are intel_pstate's inverted no_turbo."""
        try:
            return read_policies(host, "boost"), False
        except NotApplicable:
            pass
        for path, inverted in ((GLOBAL_BOOST, False), (INTEL_NO_TURBO, True)):
            if host.exists(path):
                raw = host.read_text(path).strip()
                return [PolicyValue("global", path, (), raw)], inverted
        raise NotApplicable(f"no boost control ({CPUFREQ}/policy*/boost, {GLOBAL_BOOST}, "
                            f"{INTEL_NO_TURBO}): this platform (a VM?) does not expose one")

    def observe(self, host: Host) -> Observation:
        values, inverted = self._read(host)
        if inverted:
            raw = values[0].value
            shown = {"0": "1", "1": "0"}.get(raw, raw)
            return Observation(shown, (Evidence(values[0].path, f"{raw} (no_turbo: boost "
                                                f"{'off' if raw == '1' else 'on'})"),))
        if values[0].policy == "global":
            return Observation(values[0].value, (Evidence(values[0].path, values[0].value),))
        return Observation(summarize(values), (_evidence(values),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan  # a plan's: a check that passes makes none

        values, inverted = self._read(host)
        if inverted:
            value = {"0": "1", "1": "0"}[value]
        return Plan(f"write {value!r} to {values[0].path.replace(values[0].policy, 'policy*')}",
                    _writes(values, value))


DOMAINS: dict[str, tuple[Domain, tuple[str, ...]]] = {
    "driver": (Auto(), ("one_of",)), "governor": (Auto(), ("one_of",)),
    "epp": (Auto(), ("one_of",)), "boost": (Integer((0, 1)), ()),
}


class CpufreqEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Expectation
    options: EntryOptions


class CpufreqSection(msgspec.Struct, frozen=True):
    entries: tuple[CpufreqEntry, ...]
    spec: str


class CpufreqKind:
    section = "cpufreq"

    @staticmethod
    def persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
        """The lines --fix-persist writes for this kind's checks (see ``_persistence``)."""
        return _persistence(results)

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        return ("tmpfiles",) if check.kind in PERSISTED_FILES else ()

    @staticmethod
    def capture(model: CpufreqSection, records: Records) -> Captured:
        return capture_cpufreq(model, records)

    def parse(self, node: Node, context: SpecContext) -> CpufreqSection:
        pairs = node.mapping("cpufreq")
        if not pairs:
            raise node.error(f"cpufreq is empty; expected one of: {', '.join(KEYS)}")
        entries = []
        for key, value in pairs:
            if key not in KEYS:
                raise value.unknown_key(key, "cpufreq", KEYS)
            domain, matchers = DOMAINS[key]
            expect, options = parse_expectation(value, context, domain, what=f"cpufreq {key}",
                                                matchers=matchers)
            entries.append(CpufreqEntry(key, expect, options))
        return CpufreqSection(tuple(sorted(entries, key=lambda e: e.key)), context.spec_name)

    def expand(self, section: CpufreqSection, facts: Facts) -> Sequence[Check]:
        checks = []
        for entry in section.entries:
            probe: DriverProbe | PolicyAttributeProbe | BoostProbe
            if entry.key == "driver":
                probe = DriverProbe(section.spec)
            elif entry.key == "boost":
                probe = BoostProbe()
            else:
                probe = PolicyAttributeProbe(ATTRIBUTES[entry.key])
            checks.append(Check(f"cpufreq.{entry.key}", None, entry.expect, entry.options,
                                probe))
        return checks


PERSISTED_FILES = {"cpufreq.governor": "scaling_governor",
                   "cpufreq.epp": "energy_performance_preference"}
"""The checks --fix-persist keeps (a tmpfiles.d line each), and the file each writes."""


def _persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """tmpfiles.d ``w`` lines that write the governor and EPP again at every boot (a glob over
    the policies, as systemd-tmpfiles allows for ``w``), for values right at the end of the run."""
    files = PERSISTED_FILES
    return [PersistLine("tmpfiles", f"w /{CPUFREQ}/policy*/{files[r.kind]} - - - - {r.observed}")
            for r in results if r.kind in files and r.outcome in (Outcome.PASSED, Outcome.FIXED)
            and r.observed and " on cpus " not in r.observed]


def capture_cpufreq(model: CpufreqSection, records: Records) -> Captured:
    """Each key as its policies hold it; left out where the policies differ."""
    from .capturing import Captured, Rule, capture_key, records_of

    out = Captured()
    for item in model.entries:
        found = records_of(records, f"cpufreq.{item.key}")
        mixed = [r for r in found if r.observed and " on cpus " in r.observed]
        if mixed:
            out.leave_out(f"cpufreq.{item.key}", f"the policies differ: {mixed[0].observed}")
            continue
        _, matchers = DOMAINS[item.key]
        capture_key(item.key, found, item.expect, item.options,
                    Rule(one_of="one_of" in matchers), out, f"cpufreq.{item.key}")
    return out
