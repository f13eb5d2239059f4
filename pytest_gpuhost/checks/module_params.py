"""Module parameters (``modules: {M: {state: loaded, parameters: {P: V}}}``): one check per
parameter, ``sys/module/M/parameters/P``, and the next load's value from modprobe.d and the
kernel command line. A fix writes ``options M P=V`` into our modprobe.d drop-in: it takes effect
at the next load of the module, so the check is boot-time (``reboot_required`` until then).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..host import Glob, Host, HostError, Read, Reply, Request, Stat
from ..specmodel import EntryOptions
from ..specmodel.matchers import Auto, Expectation
from . import CannotFix, Evidence, NextBoot, Observation

if TYPE_CHECKING:  # a plan's changes load when used
    from .changes import Plan


def canonical(name: str) -> str:
    """The kernel treats '-' and '_' in module names alike and shows '_'."""
    return name.replace("-", "_")


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
    from ..linux.cmdline import split_words  # the command line's readers: parameters only

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


class ModuleParameterProbe(msgspec.Struct, frozen=True):
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
        from .changes import Plan, ReplaceFile  # a plan's: a check that passes makes none

        boot = observed.next_boot
        if boot is not None and boot.where == "proc/cmdline":
            module = canonical(self.module)
            raise CannotFix(f"the kernel command line sets {module}.{self.parameter}="
                            f"{boot.value}, which kmod applies after modprobe.d (the command "
                            "line wins): change it in the boot configuration")
        path = options_dropin(self.spec)
        # read once: the text to edit (as read_text gives it) and the change's exact original
        original = host.read_bytes(path) if host.exists(path) else None
        current = None if original is None else original.decode("utf-8", "replace")
        text = render_options(self.spec, current, canonical(self.module), self.parameter, value)
        if text == current:
            raise CannotFix(f"{path} already sets it, yet a later modprobe.d file overrides it")
        return Plan(f"set options {canonical(self.module)} {self.parameter}={value} in {path}",
                    (ReplaceFile.of_bytes(path, original, text),))


class ParameterEntry(msgspec.Struct, frozen=True):
    module: str
    parameter: str
    expect: Expectation
    options: EntryOptions


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
