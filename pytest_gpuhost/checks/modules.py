"""modules: one check per kernel module, loaded or absent; fixed with modprobe / modprobe -r.

A module built into the kernel counts as loaded: lsmod and proc/modules miss it, but it has a
``sys/module/NAME`` without ``initstate``, or it is listed in ``modules.builtin``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Host, HostError, Read, Reply, Request, Stat
from ..result import CheckResult, Outcome
from ..specmodel import OPTION_KEYS, EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Choice, Exact, Expectation
from . import CannotFix, Check, Evidence, Fact, Facts, Observation, PersistLine, right_now
from .module_params import (
    PARAMETER_ORDER,
    ModuleParameterProbe,
    ParameterEntry,
    ParameterValue,
)
from .module_params import canonical as canonical  # re-exported

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

LOADED, ABSENT, BUILTIN = "loaded", "absent", "builtin"
_NAME = r"[A-Za-z0-9_][A-Za-z0-9_-]*\Z"
_NAME_MAX = 55  # MODULE_NAME_LEN (64 - sizeof(unsigned long)) - 1 on 64-bit kernels


def module_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a module name, or None. A leading '-' would reach modprobe as an
    option (``--remove-holders``, ``-a``), so it is refused even though every argv also puts
    ``--`` before the name."""
    if name.startswith("-"):
        return "a module name cannot start with '-' (modprobe would read it as an option)"
    if not re.match(_NAME, name):
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


class ModuleProbe(msgspec.Struct, frozen=True):
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
        from .changes import Command, Plan  # a plan's: a check that passes makes none

        if not host.exists("proc/modules"):
            raise CannotFix("this kernel has no loadable module support (no proc/modules): "
                            "a module is built in or it is absent")
        if value == ABSENT and observed.value == BUILTIN:
            raise CannotFix(f"{self.name} is built into the kernel and cannot be unloaded")
        # "--" ends modprobe's options: whatever the name, it is never read as one.
        load, unload = ("modprobe", "--", self.name), ("modprobe", "-r", "--", self.name)
        argv, undo = (load, unload) if value == LOADED else (unload, load)
        return Plan(" ".join(argv), (Command(argv, undo, observed.value or ABSENT, value),))


class ModuleEntry(msgspec.Struct, frozen=True):
    name: str
    expect: Expectation
    options: EntryOptions


class ModulesSection(msgspec.Struct, frozen=True):
    modules: tuple[ModuleEntry, ...]
    parameters: tuple[ParameterEntry, ...]
    spec: str


_PARAMETER = r"[A-Za-z0-9_]+\Z"


def modules_persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """etc/modules-load.d names the modules loaded now; etc/modprobe.d keeps the absent ones out
    (``blacklist`` stops the automatic load, ``install ... /bin/false`` any other)."""
    lines: list[PersistLine] = []
    for record in right_now(results, "module"):
        problem = module_name_problem(record.key or "")
        value = record.expected if record.outcome is Outcome.WOULD_FIX else record.observed
        if record.expected == LOADED and value == LOADED:
            lines.append(PersistLine.refuse("modules-load", f"module name {record.key!r}: "
                                                            f"{problem}") if problem else
                         PersistLine("modules-load", str(record.key)))
        elif record.expected == ABSENT:
            lines += [PersistLine.refuse("modprobe", f"module name {record.key!r}: {problem}")] \
                if problem else [PersistLine("modprobe", f"blacklist {record.key}"),
                                 PersistLine("modprobe", f"install {record.key} /bin/false")]
    return lines


def capture_modules(model: ModulesSection, records: Records) -> Captured:
    """Each module loaded or absent as it is; a loaded one's parameters as they read."""
    from .capturing import Captured, problem, records_of, spec_form, when_false

    out = Captured()
    for item in model.modules:
        name = canonical(item.name)
        params = [p for p in model.parameters if p.module == name]
        found = records_of(records, "module", item.name)
        if when_false(found, item.options):
            values = {p.parameter: spec_form(p.expect) for p in params}
            out.entries[item.name] = _module_form(spec_form(item.expect, "state") or {},
                                                  {k: v["value"] for k, v in values.items() if v},
                                                  item.options)
            continue
        why = problem(found)
        if why is not None:
            out.leave_out(f"module[{item.name}]", why)
            continue
        observed = str(found[0].observed)
        if observed not in (LOADED, BUILTIN, ABSENT):
            out.leave_out(f"module[{item.name}]", f"it is {observed}")
            continue
        loaded = observed != ABSENT
        kept = _captured_parameters(item.name, params, loaded, records, out)
        out.entries[item.name] = _module_form({"state": LOADED if loaded else ABSENT}, kept,
                                              item.options)
    return out


def _captured_parameters(module: str, params: Sequence[ParameterEntry], loaded: bool,
                         records: Records, out: Captured) -> dict[str, str]:
    from .capturing import problem, records_of

    kept: dict[str, str] = {}
    for param in params:
        label = f"module.parameter[{param.module}.{param.parameter}]"
        got = records_of(records, "module.parameter", f"{param.module}.{param.parameter}")
        why = problem(got)
        value = str(got[0].observed).strip() if why is None else ""
        if not loaded:
            out.leave_out(label, f"{module} is absent")
        elif why is not None:
            out.leave_out(label, why)
        elif not value or any(c.isspace() for c in value):
            out.leave_out(label, f"the value {value!r} cannot be written as a parameter")
        else:
            kept[param.parameter] = value
    return kept


def _module_form(state: Mapping[str, Any], parameters: Mapping[str, str],
                 options: EntryOptions) -> Any:
    from .capturing import entry, options_of

    if parameters and state.get("state") == LOADED:
        return {**state, "parameters": dict(parameters), **options_of(options)}
    return entry(state, options, "state")


class ModulesKind:
    section = "modules"
    persistence = staticmethod(modules_persistence)

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        """A module expected loaded into modules-load.d, absent into modprobe.d (either,
        for an expectation that allows both); its parameters stay where the spec put them."""
        if check.kind != "module":
            return ()
        wanted = check.expect.describe()
        return {LOADED: ("modules-load",), ABSENT: ("modprobe",)}.get(
            wanted, ("modules-load", "modprobe"))
    capture = staticmethod(capture_modules)

    def parse(self, node: Node, context: SpecContext) -> ModulesSection:
        pairs = node.mapping("modules")
        if not pairs:
            raise node.error("modules is empty; expected 'name: loaded' or 'name: absent'")
        entries: dict[str, ModuleEntry] = {}
        parameters: list[ParameterEntry] = []
        for name, value in pairs:
            problem = module_name_problem(name)
            if problem is not None:
                raise value.key_error(f"module name {name!r} is not allowed: {problem}")
            if canonical(name) in entries:
                raise value.key_error(f"module {name!r} is listed twice ('-' and '_' are the same)")
            if value.is_mapping and any(k == "parameters" for k, _ in value.mapping("a module")):
                expect, options, found = self._with_parameters(name, value, context)
                parameters += found
            else:
                expect, options = parse_expectation(value, context, ModuleState(),
                                                    what=f"module {name}", value_key="state",
                                                    matchers=(), others=("parameters",))
            entries[canonical(name)] = ModuleEntry(name, expect, options)
        return ModulesSection(tuple(sorted(entries.values(), key=lambda e: e.name)),
                              tuple(sorted(parameters, key=lambda p: (p.module, p.parameter))),
                              context.spec_name)

    @staticmethod
    def _with_parameters(name: str, node: Node, context: SpecContext
                         ) -> tuple[Expectation, EntryOptions, list[ParameterEntry]]:
        """``{state: loaded, parameters: {P: V}}``: the module's state and one check per
        parameter (sys/module/NAME/parameters/P), each carrying the entry's options."""
        pairs = node.mapping(f"module {name}")
        allowed = ("state", "parameters", *OPTION_KEYS)
        for key, value in pairs:
            if key not in allowed:
                raise value.unknown_key(key, f"module {name}", allowed)
        given = dict(pairs)
        if "state" not in given:
            raise node.error(f"module {name} with parameters needs state: loaded")
        state = given["state"].text(f"module {name} state")
        try:
            ModuleState().validate(state)
        except ValueError as exc:
            raise given["state"].error(f"module {name}: {exc}") from None
        options = context.parse_options(node, pairs)
        found = []
        for parameter, value in given["parameters"].mapping(f"module {name} parameters"):
            if not re.match(_PARAMETER, parameter):
                raise value.key_error(f"module parameter {parameter!r} is not allowed: a "
                                      "parameter name is letters, digits and '_'")
            text = value.text(f"module {name} parameter {parameter}")
            if not text or any(c.isspace() for c in text):
                raise value.error(f"module {name} parameter {parameter}: a value without "
                                  f"whitespace, got {text!r}")
            found.append(ParameterEntry(canonical(name), parameter,
                                        Exact(text, ParameterValue()),
                                        EntryOptions(value.where, options.why, options.fix,
                                                     options.when, options.severity)))
        if not found:
            raise given["parameters"].error(f"module {name} parameters is empty")
        return Exact(state, ModuleState()), options, found

    def facts(self, section: ModulesSection) -> Sequence[Fact[Any]]:
        return [RELEASE]

    def expand(self, section: ModulesSection, facts: Facts) -> Sequence[Check]:
        release = facts.get(RELEASE)
        checks = [Check("module", e.name, e.expect, e.options, ModuleProbe(e.name, release))
                  for e in section.modules]
        checks += [Check("module.parameter", f"{p.module}.{p.parameter}", p.expect, p.options,
                         ModuleParameterProbe(p.module, p.parameter, section.spec),
                         order=PARAMETER_ORDER) for p in section.parameters]
        return checks
