"""modules: one check per kernel module, loaded or absent; fixed with modprobe / modprobe -r.

A module built into the kernel counts as loaded: lsmod and proc/modules miss it, but it has a
``sys/module/NAME`` without ``initstate``, or it is listed in ``modules.builtin``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..fix.changes import Command, Plan
from ..host import Host, HostError, Read, Reply, Request, Stat
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Choice, Expectation
from . import CannotFix, Check, Evidence, Fact, Facts, Observation

LOADED, ABSENT, BUILTIN = "loaded", "absent", "builtin"
_NAME = re.compile(r"[A-Za-z0-9_-]+\Z")


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


OSRELEASE = "proc/sys/kernel/osrelease"


def _release(replies: Sequence[Reply]) -> str | None:
    return replies[0].text().strip() or None if replies[0].error is None else None


RELEASE = Fact("kernel release", (Read(OSRELEASE),), _release)
"""The running kernel's release, which names its lib/modules directory."""


def _builtin_path(release: str) -> str | None:
    if not release or "/" in release or release in (".", ".."):
        return None
    return f"lib/modules/{release}/modules.builtin"


def _builtin_list(host: Host, release: str | None) -> tuple[str, str | None]:
    """(path of modules.builtin, its text or None)."""
    if release is None:
        try:
            release = host.read_text(OSRELEASE).strip()
        except HostError:
            release = ""
    path = _builtin_path(release)
    if path is None:
        return "lib/modules/<unknown release>/modules.builtin", None
    return path, host.read_text(path) if host.exists(path) else None


@dataclass(frozen=True)
class ModuleProbe:
    name: str
    release: str | None = None
    """The kernel release read at collection (None: read it when observing)."""
    fixable = True

    def reads(self) -> Sequence[Request]:
        name = canonical(self.name)
        reads: list[Request] = [Read("proc/modules"), Stat(f"sys/module/{name}"),
                                Stat(f"sys/module/{name}/initstate")]
        builtin = _builtin_path(self.release or "")
        if builtin is not None:
            reads += [Stat(builtin), Read(builtin)]
        return tuple(reads)

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
        path, builtin = _builtin_list(host, self.release)
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
        if not host.exists("proc/modules"):
            raise CannotFix("this kernel has no loadable module support (no proc/modules): "
                            "a module is built in or it is absent")
        if value == ABSENT and observed.value == BUILTIN:
            raise CannotFix(f"{self.name} is built into the kernel and cannot be unloaded")
        load, unload = ("modprobe", self.name), ("modprobe", "-r", self.name)
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
            if not _NAME.match(name):
                raise value.key_error(f"module name {name!r} is not allowed: a module name is "
                                  "letters, digits, '_' and '-'")
            if canonical(name) in entries:
                raise value.key_error(f"module {name!r} is listed twice ('-' and '_' are the same)")
            expect, options = parse_expectation(value, context, ModuleState(),
                                                what=f"module {name}", value_key="state",
                                                matchers=())
            entries[canonical(name)] = ModuleEntry(name, expect, options)
        return tuple(sorted(entries.values(), key=lambda e: e.name))

    def facts(self, section: tuple[ModuleEntry, ...]) -> Sequence[Fact[Any]]:
        return [RELEASE]

    def expand(self, section: tuple[ModuleEntry, ...], facts: Facts) -> Sequence[Check]:
        release = facts.get(RELEASE)
        return [Check("module", e.name, e.expect, e.options, ModuleProbe(e.name, release))
                for e in section]
