"""cpuidle: one check per C-state name, over the per-CPU ``disable`` files of every online CPU.

State names differ by driver (POLL/C1/C2 on acpi_idle, C1E/C6 on intel_idle) and a state's index
can differ between CPUs, so states are matched by ``name``, CPU by CPU.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Host, HostError, PhaseCache, Read, Request
from ..linux.cpulist import fold_cpu_list
from ..result import CheckResult
from ..specmodel import OPTION_KEYS, EntryOptions, SpecContext
from ..specmodel.matchers import Choice, Exact
from . import CannotFix, Check, Evidence, Fact, Facts, NoFix, NotApplicable, Observation
from .cpuidle_states import CPU as CPU  # re-exported
from .cpuidle_states import DRIVER as DRIVER  # re-exported
from .cpuidle_states import IDLE_STATES as IDLE_STATES  # re-exported
from .cpuidle_states import IdleStates as IdleStates  # re-exported
from .cpuidle_states import counter_reads as counter_reads  # re-exported
from .cpuidle_states import find_idle_states as find_idle_states  # re-exported
from .cpuidle_states import read_counters as read_counters  # re-exported
from .persistence import PersistLine, right_now

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

DISABLED = "disabled"


class StateEntry(msgspec.Struct, frozen=True):
    name: str
    options: EntryOptions


NO_GROWTH = "no growth"
RESIDENCY_ORDER = 1  # after the disable checks: under --fix, the state is disabled first
_WINDOW = r"(\d+(?:\.\d+)?)\s*(ms|s)?\Z"
_UNSAFE_NAME = set("/\\'\"$`|;&<>()*?[]%")
"""Characters no real state name has, refused so that a name can never leave the root or
break out of the udev rule that --fix-persist writes with it."""


class ResidencyProbe(NoFix, msgspec.Struct, frozen=True):
    """A disabled state must not be entered: its ``usage`` and ``time`` counters, sampled on
    every online CPU at the start and end of the window, must not grow (growth means firmware
    or another tool re-enabled it)."""

    name: str
    states: IdleStates
    window: float
    sleep: Callable[[float], None] = time.sleep

    def reads(self) -> Sequence[Request]:
        """The first sample: read with the phase's batch, so the window runs while the other
        checks do, and only the second sample costs a read of its own."""
        paths = self.states.by_name.get(self.name, ())
        return (*counter_reads(paths), *(Read(disable) for _, disable in paths))

    def observe(self, host: Host) -> Observation:
        if self.states.problem is not None:
            raise HostError(self.states.problem)
        every = self.states.by_name.get(self.name, ())
        if not every:
            known = ", ".join(self.states.names()) or "none"
            return Observation(None, problem=f"no cpuidle state named {self.name!r} on any "
                                             f"online CPU (driver {self.states.driver}: {known})")
        # only where the state is disabled: on a CPU where it is still enabled, entering it is
        # no override, and cpuidle[NAME] already says it is enabled there
        flags = host.batch([Read(disable) for _, disable in every])
        paths = [pair for pair, flag in zip(every, flags, strict=True)  # an unreadable
                 if flag.text().strip() == "1"]  # flag raises: the check is an error
        if not paths:
            raise NotApplicable(f"{self.name} is not disabled on any online CPU, so there is no "
                                f"override to watch for: see cpuidle[{self.name}]")
        reads = counter_reads(paths)
        start_at = _batched_at(host, reads)
        if start_at is None:
            _live(host, reads)  # not sampled with the phase: sample now, then the whole window
        start = read_counters(host, paths)
        self.sleep(_left(host, self.window, start_at))
        _live(host, reads)  # the second sample is always live
        end = read_counters(host, paths)
        grown = {cpu: (end[cpu][0] - start[cpu][0], end[cpu][1] - start[cpu][1])
                 for cpu in start if end[cpu] > start[cpu]}
        shown = f"{len(paths)} CPUs" if len(paths) == len(every) else \
            f"the {len(paths)} of {len(every)} CPUs where it is disabled"
        raw = (f"{shown} sampled {self.window:g} s apart: usage +"
               f"{sum(u for u, _ in grown.values())}, time +{sum(t for _, t in grown.values())} us")
        if not grown:
            return Observation(NO_GROWTH, (Evidence(f"{CPU}/cpuN/cpuidle/stateM/{{usage,time}}",
                                                    raw),))
        return Observation(f"entered on cpus {fold_cpu_list(grown)}",
                           (Evidence(f"{CPU}/cpuN/cpuidle/stateM/{{usage,time}}", raw),))


def _batched_at(host: Host, reads: Sequence[Request]) -> float | None:
    """When the phase's batch read every one of ``reads`` (by the cache's clock); None when a
    host without a cache, or the batch, did not."""
    if not isinstance(host, PhaseCache):
        return None
    taken = [host.fetched_at(request) for request in reads]
    known = [t for t in taken if t is not None]
    return min(known) if known and len(known) == len(taken) else None


def _left(host: Host, window: float, start_at: float | None) -> float:
    """What is left of ``window`` since the phase's batch read the first sample (by the
    cache's clock); all of it when the first sample was read just now."""
    if start_at is None or not isinstance(host, PhaseCache):
        return window
    return max(0.0, window - (host.clock.now() - start_at))


def _live(host: Host, reads: Sequence[Request]) -> None:
    """The next read of ``reads`` is live (a host without a cache reads live anyway)."""
    if isinstance(host, PhaseCache):
        host.forget(reads)


class IdleStateProbe(msgspec.Struct, frozen=True):
    name: str
    states: IdleStates
    fixable = True

    def reads(self) -> Sequence[Request]:
        return tuple(Read(path) for _, path in self.states.by_name.get(self.name, ()))

    def _read(self, host: Host) -> list[tuple[int, str, str]]:
        return [(cpu, path, host.read_text(path).strip())
                for cpu, path in self.states.by_name.get(self.name, ())]

    def observe(self, host: Host) -> Observation:
        if self.states.problem is not None:
            raise HostError(self.states.problem)
        if not self.states.cpus:
            return Observation(None, problem=f"no online CPUs listed in {CPU}/online")
        if self.name not in self.states.by_name:
            known = ", ".join(self.states.names()) or "none"
            return Observation(None, problem=f"no cpuidle state named {self.name!r} on any "
                                             f"online CPU (driver {self.states.driver}: {known})")
        readings = self._read(host)
        enabled = [cpu for cpu, _, value in readings if value != "1"]
        covered = {cpu for cpu, _, _ in readings}
        without = [cpu for cpu in self.states.cpus if cpu not in covered]
        first_path = readings[0][1].replace(f"cpu{readings[0][0]}/", "cpuN/")
        raw = f"{len(readings) - len(enabled)} of {len(readings)} CPUs disabled"
        if enabled:
            raw += f"; enabled on cpus {fold_cpu_list(enabled)}"
        if without:
            raw += f"; cpus {fold_cpu_list(without)} have no state {self.name}"
        value = DISABLED if not enabled else f"enabled on cpus {fold_cpu_list(enabled)}"
        subjects = {"cpus": fold_cpu_list(enabled)} if enabled else {}
        return Observation(value, (Evidence(first_path, raw),), subjects=subjects)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan, WriteText  # a plan's: a check that passes makes none

        if self.name not in self.states.by_name:
            raise CannotFix(observed.problem or f"no cpuidle state named {self.name!r}")
        enabled = [(cpu, path, current) for cpu, path, current in self._read(host)
                   if current != "1"]
        changes = tuple(WriteText(path, current + "\n", "1\n") for _, path, current in enabled)
        cpus = fold_cpu_list(cpu for cpu, _, _ in enabled)
        return Plan(f"write 1 to cpuidle/{self.name}/disable on cpus {cpus}", changes,
                    brief=f"write 1 to cpuidle/{self.name}/disable on those {len(enabled)} CPUs")


_STATE = r"[A-Za-z0-9][A-Za-z0-9._+-]*( [A-Za-z0-9][A-Za-z0-9._+-]*)*\Z"
"""A C-state name as a udev rule may hold it: plain words with single spaces between
(pseries' ``Shared Cede``)."""


def cpuidle_persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """One udev rule that disables the states again on every CPU that comes online."""
    states = [r.key for r in right_now(results, "cpuidle")]
    for state in states:
        if state is None or not re.match(_STATE, state):
            return [PersistLine.refuse("udev", f"the C-state name {state!r} is not plain words "
                                               "(letters, digits, '.', '_', '+', '-', single "
                                               "spaces), so it is not written into a udev rule")]
    if not states:
        return []
    names = "|".join(str(state).replace(" ", "\\ ") for state in states)  # Shared\ Cede
    return [PersistLine(
        "udev", 'ACTION=="add|online", SUBSYSTEM=="cpu", KERNEL=="cpu[0-9]*", '
        'RUN+="/bin/sh -c \'for d in /sys/devices/system/cpu/%k/cpuidle/state[0-9]*; do '
        f'case $$(cat $$d/name) in {names}) echo 1 > $$d/disable;; esac; done\'"')]


def capture_cpuidle(model: CpuidleSection, records: Records) -> Captured:
    """The states disabled everywhere (one enabled anywhere is left out); the residency window
    where no disabled state was entered."""
    from .capturing import Captured, options_of, problem, records_of, when_false

    out = Captured()
    kept: list[Any] = []
    for state in model.states:
        found = records_of(records, "cpuidle", state.name)
        extra = options_of(state.options)
        if when_false(found, state.options):
            kept.append({"name": state.name, **extra})
            continue
        why = problem(found)
        if why is not None:
            out.leave_out(f"cpuidle[{state.name}]", why)
            continue
        enabled = [r for r in found if r.observed != DISABLED]
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
                   if r.key in names and r.observed != NO_GROWTH]
        if entered:
            out.leave_out("cpuidle.residency", f"{entered[0].key}: "
                          f"{entered[0].observed or entered[0].message}")
        else:
            out.entries["residency"] = {"window": f"{window * 1000:g}ms",
                                        **options_of(options)}
    return out


class CpuidleKind:
    section = "cpuidle"
    persistence = staticmethod(cpuidle_persistence)

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        return ("udev",) if check.kind == "cpuidle" else ()

    @staticmethod
    def capture(model: CpuidleSection, records: Records) -> Captured:
        return capture_cpuidle(model, records)

    def parse(self, node: Node, context: SpecContext) -> CpuidleSection:
        entries: dict[str, StateEntry] = {}
        window: tuple[float, EntryOptions] | None = None
        for key, value in node.mapping("cpuidle"):
            if key == "residency":
                window = self._residency(value, context)
                continue
            if key != "disabled":
                raise value.unknown_key(key, "cpuidle", ("disabled", "residency"))
            items = value.sequence("cpuidle disabled")
            if not items:
                raise value.error("cpuidle disabled is empty; expected state names like [C2]")
            for item in items:
                entry = self._entry(item, context)
                if entry.name in entries:
                    raise item.error(f"cpuidle state {entry.name!r} is listed twice")
                entries[entry.name] = entry
        if not entries:
            raise node.error("cpuidle needs 'disabled: [C2, ...]' (residency samples the "
                             "disabled states)")
        return CpuidleSection(tuple(sorted(entries.values(), key=lambda e: e.name)), window)

    @staticmethod
    def _residency(node: Node, context: SpecContext) -> tuple[float, EntryOptions]:
        pairs = node.mapping("cpuidle residency")
        allowed = ("window", *OPTION_KEYS)
        window = None
        for key, value in pairs:
            if key not in allowed:
                raise value.unknown_key(key, "cpuidle residency", allowed)
            if key == "window":
                match = re.fullmatch(_WINDOW, value.text("cpuidle residency window").strip())
                seconds = float(match.group(1)) / (1000 if match.group(2) == "ms" else 1) \
                    if match else 0.0
                if not 0 < seconds <= 60:
                    raise value.error("cpuidle residency window must be a time like 1s or "
                                      "200ms, at most 60s")
                window = seconds
        if window is None:
            raise node.error("cpuidle residency needs a window, like {window: 1s}")
        return window, context.parse_options(node, pairs)

    def _entry(self, item: Node, context: SpecContext) -> StateEntry:
        if not item.is_mapping:
            return StateEntry(self._name(item), EntryOptions(where=item.where))
        pairs = item.mapping("a cpuidle state")
        allowed = ("name", *OPTION_KEYS)
        for key, value in pairs:
            if key not in allowed:
                raise value.unknown_key(key, "a cpuidle state", allowed)
        names = [value for key, value in pairs if key == "name"]
        if not names:
            raise item.error("a cpuidle state needs 'name:'")
        return StateEntry(self._name(names[0]), context.parse_options(item, pairs))

    @staticmethod
    def _name(node: Node) -> str:
        """Any name a sysfs ``name`` file holds (``Shared Cede`` on pseries, ``C1E``), but
        nothing that could leave the root or quote its way out of a shell rule."""
        name = node.string("a cpuidle state name")
        if not name.isprintable() or name.strip() != name or "  " in name or \
                _UNSAFE_NAME & set(name) or name in (".", ".."):
            raise node.error(f"cpuidle state name {name!r} must be a state name like C2, C1E "
                             "or 'Shared Cede' (printable, no quotes, slashes or shell "
                             "characters, no leading or trailing spaces)")
        return name

    def facts(self, section: CpuidleSection) -> Sequence[Fact[Any]]:
        return [IDLE_STATES]

    def expand(self, section: CpuidleSection, facts: Facts) -> Sequence[Check]:
        states = facts.get(IDLE_STATES)
        expect = Exact(DISABLED, Choice((DISABLED,)))
        checks = [Check("cpuidle", e.name, expect, e.options, IdleStateProbe(e.name, states))
                  for e in section.states]
        if section.residency is not None:
            window, options = section.residency
            quiet = Exact(NO_GROWTH, Choice((NO_GROWTH,)))
            checks += [Check("cpuidle.residency", e.name, quiet, options,
                             ResidencyProbe(e.name, states, window, facts.sleep),
                             order=RESIDENCY_ORDER, measured=True) for e in section.states]
        return checks


class CpuidleSection(msgspec.Struct, frozen=True):
    states: tuple[StateEntry, ...]
    residency: tuple[float, EntryOptions] | None = None
