"""kernel: the running kernel's release, and its command line, one check per parameter.

``release`` reads proc/sys/kernel/osrelease and compares it as a version (``6.8.0-49-generic``
is 6.8.0.49): check only, a kernel is upgraded by the package manager. ``cmdline`` reads
proc/cmdline: ``has: [iommu=pt]`` and ``lacks: [pci=pcie_bus_perf]``, each judged as the
parameter's reader reads the line (``linux.cmdline.READERS``: ``modprobe.blacklist=a,b`` lists
both, ``iommu=pt iommu=1`` is passthrough). A parameter takes effect at boot, so a wrong one is
``reboot_required`` when the boot configuration already sets it right (``bootconfig``, read
the same way), and --fix --fix-persist adds a missing one to our grub.d drop-in (a listed
parameter's missing items, joined into the drop-in's own list).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..host import Host, Read, Request
from ..linux.cmdline import Parameter, split_words, unsafe_word
from ..linux.sysfs import release_version
from ..specmodel import OPTION_KEYS, EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Expectation, Verdict, Version
from . import CannotFix, Check, Evidence, Facts, NextBoot, NoFix, Observation
from .bootconfig import BOOT_READS, dropin_path, plan_dropin, read_boot_config

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

OSRELEASE = "proc/sys/kernel/osrelease"
PROC_CMDLINE = "proc/cmdline"
KEYS = ("release", "cmdline")


class KernelRelease(Version):
    """A spec value is a version (``6.8``); an observed one a release (``6.8.0-49-generic``)."""

    name = "kernel release"

    def order_key(self, raw: str) -> int:
        return super().order_key(release_version(raw))

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return self.order_key(observed) == self.order_key(expected)
        except ValueError:
            return False


class ReleaseProbe(NoFix, msgspec.Struct, frozen=True):
    def reads(self) -> Sequence[Request]:
        return (Read(OSRELEASE),)

    def observe(self, host: Host) -> Observation:
        release = host.read_text(OSRELEASE).strip()
        return Observation(release, (Evidence(OSRELEASE, release),))


class CmdlineExpectation(msgspec.Struct, frozen=True):
    """``has iommu=pt`` or ``lacks pci=pcie_bus_perf``, judged on what a command line says
    about the parameter's key (``iommu=pt``, ``iommu=on iommu=pt``, ``no iommu``)."""

    parameter: Parameter
    has: bool

    def describe(self) -> str:
        return f"{'has' if self.has else 'lacks'} {self.parameter.word}"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        words = [] if observed.startswith("no ") else split_words(observed)
        ok = self.parameter.present(words) if self.has else not self.parameter.mentioned(words)
        if ok:
            return Verdict(True)
        return Verdict(False, self.parameter.why_not(words) if self.has
                       else f"the command line has {observed!r}")

    def fix_value(self, observed: str | None) -> str | None:
        return self.parameter.word


class CmdlineProbe(msgspec.Struct, frozen=True):
    parameter: Parameter
    has: bool
    spec: str
    fixable = True
    boot_time = True

    def reads(self) -> Sequence[Request]:
        return (Read(PROC_CMDLINE), *BOOT_READS, Read(dropin_path(self.spec)))

    def observe(self, host: Host) -> Observation:
        running = split_words(host.read_text(PROC_CMDLINE))
        boot = read_boot_config(host)
        evidence = [Evidence(PROC_CMDLINE, " ".join(running))]
        next_boot = None
        if boot.loader != "none":
            evidence.append(boot.evidence())
            words = [w for w in boot.words if Parameter(w).key == self.parameter.key]
            next_boot = NextBoot(self.parameter.shown(boot.words), boot.where(words),
                                 boot.apply)
        return Observation(self.parameter.shown(running), tuple(evidence), next_boot=next_boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if not self.has:
            where = observed.next_boot.where if observed.next_boot else "the boot configuration"
            raise CannotFix(f"remove {self.parameter.word!r} from {where} yourself: a drop-in "
                            "can add parameters, not take the administrator's away")
        word, by_hand = self.parameter.to_add(read_boot_config(host).words)
        return plan_dropin(host, self.spec, [word], by_hand=by_hand)


class CmdlineEntry(msgspec.Struct, frozen=True):
    parameter: Parameter
    has: bool
    options: EntryOptions


class KernelSection(msgspec.Struct, frozen=True):
    release: tuple[Expectation, EntryOptions] | None
    cmdline: tuple[CmdlineEntry, ...]
    spec: str


def _parameter(node: Node) -> Parameter:
    word = node.text("a kernel parameter")
    if not word or not word.isprintable() or any(c.isspace() or c in "\"'" for c in word) \
            or word.startswith(("-", "=")):
        raise node.error(f"kernel parameter {word!r} must be one word like iommu=pt or nokaslr "
                         "(no spaces or quotes)")
    if unsafe_word(word):
        raise node.error(f"kernel parameter {word!r} holds a character a shell acts on; a "
                         "parameter may hold letters, digits and _ . , : ; = / + @ % ~ [ ] - "
                         "(it may go into a grub.d drop-in, which update-grub runs as shell)")
    return Parameter(word)


def _cmdline(node: Node, context: SpecContext) -> tuple[CmdlineEntry, ...]:
    pairs = node.mapping("kernel cmdline")
    allowed = ("has", "lacks", *OPTION_KEYS)
    entries: dict[str, CmdlineEntry] = {}
    for key, value in pairs:
        if key not in allowed:
            raise value.unknown_key(key, "kernel cmdline", allowed)
    options = context.parse_options(node, pairs)
    for key, value in pairs:
        if key not in ("has", "lacks"):
            continue
        items = value.sequence(f"kernel cmdline {key}")
        if not items:
            raise value.error(f"kernel cmdline {key} is empty; expected parameters like "
                              "[iommu=pt]")
        for item in items:
            parameter = _parameter(item)
            if parameter.word in entries:
                raise item.error(f"kernel parameter {parameter.word!r} is listed twice")
            entries[parameter.word] = CmdlineEntry(parameter, key == "has",
                                                   EntryOptions(item.where, options.why,
                                                                options.fix, options.when,
                                                                options.severity))
    if not entries:
        raise node.error("kernel cmdline needs has: [...] and/or lacks: [...]")
    return tuple(sorted(entries.values(), key=lambda e: e.parameter.word))


class KernelKind:
    section = "kernel"

    @staticmethod
    def capture(model: KernelSection, records: Records) -> Captured:
        return capture_kernel(model, records)

    def parse(self, node: Node, context: SpecContext) -> KernelSection:
        release = None
        cmdline: tuple[CmdlineEntry, ...] = ()
        pairs = node.mapping("kernel")
        if not pairs:
            raise node.error(f"kernel is empty; expected one of: {', '.join(KEYS)}")
        for key, value in pairs:
            if key == "release":
                release = parse_expectation(value, context, KernelRelease(),
                                            what="kernel release")
            elif key == "cmdline":
                cmdline = _cmdline(value, context)
            else:
                raise value.unknown_key(key, "kernel", KEYS)
        return KernelSection(release, cmdline, context.spec_name)

    def expand(self, section: KernelSection, facts: Facts) -> Sequence[Check]:
        checks = []
        if section.release is not None:
            expect, options = section.release
            checks.append(Check("kernel.release", None, expect, options, ReleaseProbe()))
        checks += [Check("kernel.cmdline", e.parameter.word, CmdlineExpectation(e.parameter, e.has),
                         e.options, CmdlineProbe(e.parameter, e.has, section.spec))
                   for e in section.cmdline]
        return checks


def capture_kernel(model: KernelSection, records: Records) -> Captured:
    """The release as ``min:`` the running one; the parameters the command line has and lacks
    as the spec listed them."""
    from .capturing import Captured, Rule, capture_key, options_of, problem, records_of, when_false

    out = Captured()
    if model.release is not None:
        expect, options = model.release
        capture_key("release", records_of(records, "kernel.release"), expect, options,
                    Rule(floor=True, show=lambda raw: release_version(raw.strip())), out,
                    "kernel.release")
    has: list[str] = []
    lacks: list[str] = []
    for item in model.cmdline:
        word = item.parameter.word
        found = records_of(records, "kernel.cmdline", word)
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
