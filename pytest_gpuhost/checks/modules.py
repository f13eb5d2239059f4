"""modules: one check per kernel module, loaded or absent; fixed with modprobe / modprobe -r.

A module built into the kernel counts as loaded: lsmod and proc/modules miss it, but it has a
``sys/module/NAME`` without ``initstate``, or it is listed in ``modules.builtin``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..fix.changes import Command, Plan
from ..host import Host, HostError
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Choice, Expectation
from . import CannotFix, Check, Evidence, Facts, Observation

LOADED, ABSENT, BUILTIN = "loaded", "absent", "builtin"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z")
_NAME_MAX = 55  # MODULE_NAME_LEN (64 - sizeof(unsigned long)) - 1 on 64-bit kernels


def module_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a module name, or None. A leading '-' would reach modprobe as an
    option (``--remove-holders``, ``-a``), so it is refused even though every argv also puts
    ``--`` before the name."""
    if name.startswith("-"):
        return "a module name cannot start with '-' (modprobe would read it as an option)"
    if not _NAME.match(name):
        return "a module name is letters, digits, '_' and '-'"
    if len(name) > _NAME_MAX:
        return f"a module name is at most {_NAME_MAX} characters (the kernel's MODULE_NAME_LEN)"
    return None


class ModuleState(Choice):
    """``loaded`` is satisfied by a built-in module too."""

    def __init__(self) -> None:
        super().__init__((LOADED, ABSENT))

    def equal(self, observed: str, expected: str) -> bool:
        state = observed.strip()
        return state == expected or (expected == LOADED and state == BUILTIN)


def canonical(name: str) -> str:
    """The kernel treats '-' and '_' in module names alike and shows '_'."""
    return name.replace("-", "_")


def _builtin_list(host: Host) -> tuple[str, str | None]:
    """(path of modules.builtin, its text or None)."""
    try:
        release = host.read_text("proc/sys/kernel/osrelease").strip()
    except HostError:
        return "lib/modules/<unknown release>/modules.builtin", None
    path = f"lib/modules/{release}/modules.builtin"
    return path, host.read_text(path) if host.exists(path) else None


@dataclass(frozen=True)
class ModuleProbe:
    name: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        name = canonical(self.name)
        # A kernel built without loadable modules (CONFIG_MODULES=n) has no proc/modules:
        # then a module is built in or it is absent.
        listing = host.read_text("proc/modules") if host.exists("proc/modules") else ""
        for line in listing.splitlines():
            fields = line.split()
            if fields and fields[0] == name:
                state = fields[4] if len(fields) > 4 else "Live"
                value = LOADED if state == "Live" else state.lower()
                return Observation(value, (Evidence("proc/modules", line),))
        sysfs = f"sys/module/{name}"
        if host.exists(sysfs) and not host.exists(f"{sysfs}/initstate"):
            return Observation(BUILTIN, (Evidence(sysfs, "present without initstate: built in"),))
        path, builtin = _builtin_list(host)
        if builtin is not None:
            for line in builtin.splitlines():
                stem = line.strip().rsplit("/", 1)[-1].removesuffix(".ko")
                if canonical(stem) == name:
                    return Observation(BUILTIN, (Evidence(path, line.strip()),))
        if not host.exists("proc/modules"):
            return Observation(ABSENT, (Evidence("proc/modules", "absent: this kernel has no "
                                                 "loadable module support"),))
        return Observation(ABSENT, (Evidence("proc/modules", f"no line for {name}"),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if value == ABSENT and observed.value == BUILTIN:
            raise CannotFix(f"{self.name} is built into the kernel and cannot be unloaded")
        # "--" ends modprobe's options: whatever the name, it is never read as one.
        load, unload = ("modprobe", "--", self.name), ("modprobe", "-r", "--", self.name)
        argv, undo = (load, unload) if value == LOADED else (unload, load)
        return Plan(" ".join(argv), (Command(argv, undo, observed.value or ABSENT, value),))


@dataclass(frozen=True)
class ModuleEntry:
    name: str
    expect: Expectation
    options: EntryOptions


class ModulesKind:
    section = "modules"

    def parse(self, node: Node, context: SpecContext) -> tuple[ModuleEntry, ...]:
        pairs = node.mapping("modules")
        if not pairs:
            raise node.error("modules is empty; expected 'name: loaded' or 'name: absent'")
        entries: dict[str, ModuleEntry] = {}
        for name, value in pairs:
            problem = module_name_problem(name)
            if problem is not None:
                raise value.key_error(f"module name {name!r} is not allowed: {problem}")
            if canonical(name) in entries:
                raise value.key_error(f"module {name!r} is listed twice ('-' and '_' are the same)")
            expect, options = parse_expectation(value, context, ModuleState(),
                                                what=f"module {name}", value_key="state",
                                                matchers=())
            entries[canonical(name)] = ModuleEntry(name, expect, options)
        return tuple(sorted(entries.values(), key=lambda e: e.name))

    def expand(self, section: tuple[ModuleEntry, ...], facts: Facts) -> Sequence[Check]:
        return [Check("module", e.name, e.expect, e.options, ModuleProbe(e.name)) for e in section]
