"""modules: one check per kernel module, loaded or absent; fixed with modprobe / modprobe -r.

A module built into the kernel counts as loaded: lsmod and proc/modules miss it, but it has a
``sys/module/NAME`` without ``initstate``, or it is listed in ``modules.builtin``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..host import Glob, Host, HostError, Read, Reply, Request, Stat
from ..linux.cmdline import split_words
from ..spec import OPTION_KEYS, EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Auto, Choice, Exact, Expectation
from . import CannotFix, Check, Evidence, Fact, Facts, NextBoot, Observation
from .changes import Command, Plan, ReplaceFile

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
        # "--" ends modprobe's options: whatever the name, it is never read as one.
        load, unload = ("modprobe", "--", self.name), ("modprobe", "-r", "--", self.name)
        argv, undo = (load, unload) if value == LOADED else (unload, load)
        return Plan(" ".join(argv), (Command(argv, undo, observed.value or ABSENT, value),))


MODPROBE_DIRS = ("etc/modprobe.d", "run/modprobe.d", "usr/local/lib/modprobe.d",
                 "lib/modprobe.d", "usr/lib/modprobe.d")
PARAMETER_ORDER = 1  # after the module checks: under --fix, modprobe loads with the options


OPTIONS_READS: tuple[Request, ...] = (*(Glob(f"{d}/*.conf") for d in MODPROBE_DIRS),
                                      Read("proc/cmdline"))
"""Everything module options come from (modprobe.d and the command line), in one batch."""


def _modprobe_files(replies: Sequence[Reply]) -> list[tuple[str, str]]:
    """The files modprobe reads, in its order: ``*.conf`` of every directory sorted by name,
    a name in an earlier directory hiding the same name in a later one."""
    by_name: dict[str, tuple[str, bytes | str | HostError | None]] = {}
    for reply in replies:
        for path, data in reply.matches() if reply.error is None else ():
            by_name.setdefault(path.rsplit("/", 1)[-1], (path, data))
    return [(path, data.decode("utf-8", "replace")) for path, data in
            (by_name[name] for name in sorted(by_name)) if isinstance(data, bytes)]


def parse_options(files: Sequence[tuple[str, str]], cmdline: str = ""
                  ) -> dict[tuple[str, str], tuple[str, str]]:
    """(module, parameter) -> (value, ``file:line``) of what sets it last, as the module gets
    it: kmod reads the modprobe.d files, then the kernel command line's ``module.param=value``
    (libkmod's kmod_config_new parses the command line after the files), and passes the
    options in that order, so the kernel keeps the command line's: it wins."""
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for path, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split("#", 1)[0].split()
            if len(fields) < 3 or fields[0] != "options":
                continue
            for option in fields[2:]:
                parameter, _, value = option.partition("=")
                found[(canonical(fields[1]), parameter)] = (value.strip('"'),
                                                            f"{path}:{number}")
    for word in split_words(cmdline):
        name, _, value = word.partition("=")
        module, dot, parameter = name.partition(".")
        if dot and parameter and "=" in word:
            found[(canonical(module), parameter)] = (value, "proc/cmdline")
    return found


def read_options(host: Host) -> dict[tuple[str, str], tuple[str, str]]:
    replies = host.batch(OPTIONS_READS)
    cmdline = replies[-1].text() if replies[-1].error is None else ""
    return parse_options(_modprobe_files(replies[:-1]), cmdline)


def options_dropin(spec: str) -> str:
    return f"etc/modprobe.d/gpuhost-{spec}-options.conf"


def render_options(spec: str, current: str | None, module: str, parameter: str,
                   value: str) -> str:
    """Our options drop-in with ``module.parameter=value`` merged in (one line per module)."""
    settings: dict[str, dict[str, str]] = {}
    for (name, key), (old, _) in parse_options([("dropin", current or "")]).items():
        settings.setdefault(name, {})[key] = old
    settings.setdefault(module, {})[parameter] = value
    header = (f"# Written by pytest-gpuhost --fix-persist for spec {spec}: module options, "
              "applied when the module\n# loads. Edit the spec rather than this file.\n")
    return header + "".join(
        f"options {name} " + " ".join(f"{k}={v}" for k, v in sorted(values.items())) + "\n"
        for name, values in sorted(settings.items()))


@dataclass(frozen=True)
class ModuleParameterProbe:
    module: str
    parameter: str
    spec: str
    fixable = True
    boot_time = True

    @property
    def path(self) -> str:
        return f"sys/module/{canonical(self.module)}/parameters/{self.parameter}"

    def reads(self) -> Sequence[Request]:
        return (*OPTIONS_READS, Read(self.path), Stat(f"sys/module/{canonical(self.module)}"),
                Read(options_dropin(self.spec)))

    def observe(self, host: Host) -> Observation:
        module = canonical(self.module)
        boot = read_options(host).get((module, self.parameter))
        next_boot = NextBoot(boot[0], boot[1], f"reload {module} (modprobe -r {module}; "
                                               f"modprobe {module}) or reboot") if boot else None
        evidence = (Evidence(boot[1], f"options {module} {self.parameter}={boot[0]}"),) \
            if boot else ()
        if not host.exists(self.path):
            loaded = host.exists(f"sys/module/{module}")
            problem = (f"{self.path} does not exist: {module} has no parameter "
                       f"{self.parameter}" if loaded else f"{module} is not loaded, so its "
                       f"parameter {self.parameter} has no value")
            return Observation(None, evidence, problem, next_boot=next_boot)
        value = host.read_text(self.path).strip()
        return Observation(value, (Evidence(self.path, value), *evidence), next_boot=next_boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        boot = observed.next_boot
        if boot is not None and boot.where == "proc/cmdline":
            module = canonical(self.module)
            raise CannotFix(f"the kernel command line sets {module}.{self.parameter}="
                            f"{boot.value}, which kmod applies after modprobe.d (the command "
                            "line wins): change it in the boot configuration")
        path = options_dropin(self.spec)
        current = host.read_text(path) if host.exists(path) else None
        text = render_options(self.spec, current, canonical(self.module), self.parameter, value)
        if text == current:
            raise CannotFix(f"{path} already sets it, yet a later modprobe.d file overrides it")
        return Plan(f"set options {canonical(self.module)} {self.parameter}={value} in {path}",
                    (ReplaceFile(path, current, text),))


@dataclass(frozen=True)
class ParameterEntry:
    module: str
    parameter: str
    expect: Expectation
    options: EntryOptions


@dataclass(frozen=True)
class ModuleEntry:
    name: str
    expect: Expectation
    options: EntryOptions


@dataclass(frozen=True)
class ModulesSection:
    modules: tuple[ModuleEntry, ...]
    parameters: tuple[ParameterEntry, ...]
    spec: str


_PARAMETER = re.compile(r"[A-Za-z0-9_]+\Z")
KERNEL_TRUE = frozenset({"1", "y", "yes", "on", "true"})
KERNEL_FALSE = frozenset({"0", "n", "no", "off", "false"})
"""How the kernel's bool parameters take a value (kstrtobool, any case), which they show as
``Y``/``N`` whatever was written: ``modeset=1`` reads back ``Y``."""


def kernel_bool(text: str) -> bool | None:
    word = text.strip().lower()
    return True if word in KERNEL_TRUE else False if word in KERNEL_FALSE else None


class ParameterValue(Auto):
    """A module parameter's value: integers as integers, text as text, and two ways of
    writing a bool as the kernel parses them: a spec's ``1``, ``on`` or ``y`` is the ``Y``
    sysfs shows (``10`` is no bool: an integer)."""

    name = "module parameter"

    def equal(self, observed: str, expected: str) -> bool:
        seen, wanted = kernel_bool(observed), kernel_bool(expected)
        if seen is not None and wanted is not None:
            return seen == wanted
        return super().equal(observed, expected)


class ModulesKind:
    section = "modules"

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
            if not _PARAMETER.match(parameter):
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
