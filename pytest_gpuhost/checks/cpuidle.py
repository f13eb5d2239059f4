"""cpuidle: one check per C-state name, over the per-CPU ``disable`` files of every online CPU.

State names differ by driver (POLL/C1/C2 on acpi_idle, C1E/C6 on intel_idle) and a state's index
can differ between CPUs, so states are matched by ``name``, CPU by CPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..fix.changes import Plan, WriteText
from ..host import Host, HostError
from ..spec import OPTION_KEYS, EntryOptions, Node, SpecContext
from ..spec.matchers import Choice, Exact
from . import CannotFix, Check, Evidence, Facts, Observation

CPU = "sys/devices/system/cpu"
DRIVER = f"{CPU}/cpuidle/current_driver"
DISABLED = "disabled"


MAX_CPUS = 65536
"""No kernel has more CPUs (x86's NR_CPUS tops out at 8192): a larger number or a longer list
in a cpulist is a damaged or hostile file, refused before a range of it is walked."""


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format).

    ValueError, saying why, for anything else: a part that is not ``N`` or ``N-M`` with N <= M,
    a CPU number of MAX_CPUS or more, or more than MAX_CPUS CPUs in all."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or not part.isascii():
            raise ValueError(f"{part[:40]!r} is not a CPU number or a range N-M")
        if len(low) > 6 or len(high) > 6 or max(int(low), int(high or low)) >= MAX_CPUS:
            raise ValueError(f"{part[:40]!r} names a CPU number of {MAX_CPUS} or more")
        first, last = int(low), int(high or low)
        if first > last:
            raise ValueError(f"{part!r} is a range that runs backwards")
        if len(cpus) + last - first + 1 > MAX_CPUS:
            raise ValueError(f"the list names more than {MAX_CPUS} CPUs")
        cpus.extend(range(first, last + 1))
    return cpus


def fold_cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        runs.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(runs)


@dataclass(frozen=True)
class IdleStates:
    """Where each named state's ``disable`` file is, per online CPU; read once per session."""

    driver: str
    cpus: tuple[int, ...]
    by_name: dict[str, tuple[tuple[int, str], ...]]
    problem: str | None = None
    """Why the online CPUs could not be read (a damaged ``online``): each check is an error."""

    def names(self) -> list[str]:
        return sorted(self.by_name)


def find_idle_states(host: Host) -> IdleStates:
    online = f"{CPU}/online"
    try:
        text = host.read_text(online)
    except HostError:
        text = ""  # no such file: no online CPUs to check, said by each check
    try:
        cpus = tuple(parse_cpu_list(text))
    except ValueError as exc:
        shown = text.strip() if len(text) <= 80 else text.strip()[:77] + "..."
        return IdleStates("unknown", (), {}, problem=f"{online}: {shown!r} is not a CPU list: "
                                                      f"{exc}")
    driver = host.read_text(DRIVER).strip() if host.exists(DRIVER) else "unknown"
    by_name: dict[str, list[tuple[int, str]]] = {}
    for cpu in cpus:
        base = f"{CPU}/cpu{cpu}/cpuidle"
        if not host.exists(base):
            continue
        for state in host.listdir(base):
            if not state.startswith("state"):
                continue
            name = host.read_text(f"{base}/{state}/name").strip()
            by_name.setdefault(name, []).append((cpu, f"{base}/{state}/disable"))
    return IdleStates(driver, cpus, {name: tuple(paths) for name, paths in by_name.items()})


@dataclass(frozen=True)
class StateEntry:
    name: str
    options: EntryOptions


@dataclass(frozen=True)
class IdleStateProbe:
    name: str
    states: IdleStates
    fixable = True

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
        return Observation(value, (Evidence(first_path, raw),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if self.name not in self.states.by_name:
            raise CannotFix(observed.problem or f"no cpuidle state named {self.name!r}")
        enabled = [(cpu, path, current) for cpu, path, current in self._read(host)
                   if current != "1"]
        changes = tuple(WriteText(path, current + "\n", "1\n") for _, path, current in enabled)
        cpus = fold_cpu_list(cpu for cpu, _, _ in enabled)
        return Plan(f"write 1 to cpuidle/{self.name}/disable on cpus {cpus}", changes)


class CpuidleKind:
    section = "cpuidle"

    def parse(self, node: Node, context: SpecContext) -> tuple[StateEntry, ...]:
        entries: dict[str, StateEntry] = {}
        for key, value in node.mapping("cpuidle"):
            if key != "disabled":
                raise value.key_error(f"unknown key {key!r} in cpuidle; expected: disabled")
            items = value.sequence("cpuidle disabled")
            if not items:
                raise value.error("cpuidle disabled is empty; expected state names like [C2]")
            for item in items:
                entry = self._entry(item, context)
                if entry.name in entries:
                    raise item.error(f"cpuidle state {entry.name!r} is listed twice")
                entries[entry.name] = entry
        if not entries:
            raise node.error("cpuidle is empty; expected 'disabled: [C2, ...]'")
        return tuple(sorted(entries.values(), key=lambda e: e.name))

    def _entry(self, item: Node, context: SpecContext) -> StateEntry:
        if not item.is_mapping:
            return StateEntry(self._name(item), EntryOptions(where=item.where))
        pairs = item.mapping("a cpuidle state")
        allowed = ("name", *OPTION_KEYS)
        for key, value in pairs:
            if key not in allowed:
                raise value.key_error(f"unknown key {key!r} in a cpuidle state; expected one of: "
                                  f"{', '.join(allowed)}")
        names = [value for key, value in pairs if key == "name"]
        if not names:
            raise item.error("a cpuidle state needs 'name:'")
        return StateEntry(self._name(names[0]), context.parse_options(item, pairs))

    @staticmethod
    def _name(node: Node) -> str:
        name = node.string("a cpuidle state name")
        if not name.isprintable() or "/" in name or name.strip() != name or " " in name:
            raise node.error(f"cpuidle state name {name!r} must be one word like C2 or C1E")
        return name

    def expand(self, section: tuple[StateEntry, ...], facts: Facts) -> Sequence[Check]:
        states = facts.get(find_idle_states)
        expect = Exact(DISABLED, Choice((DISABLED,)))
        return [Check("cpuidle", e.name, expect, e.options, IdleStateProbe(e.name, states))
                for e in section]
