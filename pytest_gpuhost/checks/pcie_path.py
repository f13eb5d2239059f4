"""The pcie keys of a GPU's path: ACS redirect on its bridges, ASPM on its link, AER counters.

``acs_redirect: off``: one check per bridge between a GPU and its root port (the GPU's sysfs link
names them; key: the bridge, subjects: the GPUs behind it). ACS P2P Request Redirect, Completion
Redirect or Egress Control on any of them sends peer traffic up to the root complex (NCCL's
troubleshooting guide). --fix clears those three bits alone by a read-modify-write of ACS
Control, read back; nothing is written to a device that is not on a GPU's path. --fix-persist
adds ``pci=disable_acs_redir=<bridges>`` to our grub.d drop-in.

``aspm: off``: the GPU's Link Control ASPM bits 1:0; fixed through the kernel's
``link/l0s_aspm`` and ``link/l1_aspm`` files, which set both ends of the link.

``aer: {since: session}``: the GPU's aer_dev_correctable, aer_dev_nonfatal and aer_dev_fatal
totals must not grow during the run (``since: boot``: must be zero). Check only; it runs late,
after the checks whose fixes and measurements could cause errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Glob, Host, HostError, Read, Reply, Request
from ..linux.pciaddr import address_order
from ..linux.pciconfig import (
    ASPM_STATES,
    BRIDGE_HEADER,
    ConfigError,
    aspm_control,
    check_answers,
    header_type,
)
from ..linux.pciext import AcsControl, acs_control
from ..linux.pcitopo import PCI_DEVICES, TopologyError, bridge_path
from ..result import CheckResult, Outcome
from ..specmodel import OPTION_KEYS, EntryOptions, SpecContext
from ..specmodel.matchers import Choice, Exact, Expectation
from . import (
    CannotFix,
    Check,
    Evidence,
    Fact,
    Facts,
    NoFix,
    NotApplicable,
    Observation,
    PersistLine,
)
from .gpus import GPUS, Gpu, MissingGpus

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured
    from .changes import Plan

OFF = "off"
AER_FILES = ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal")
AER_ORDER = 9_000  # after the p2p measurements, before dmesg
SINCE = ("session", "boot")


def gpu_paths(gpus: Sequence[Gpu]) -> dict[str, tuple[str, ...]]:
    """Each GPU's bridges, nearest first, from the device links the GPU list read."""
    paths = {}
    for gpu in gpus:
        link = f"{PCI_DEVICES}/{gpu.address}"
        try:
            paths[gpu.address] = bridge_path(link, gpu.link) if gpu.link else ()
        except TopologyError as exc:
            raise HostError(str(exc)) from exc
    return paths


def bridges_above(paths: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """bridge -> the GPUs behind it, bridges in address order."""
    behind: dict[str, list[str]] = {}
    for gpu, bridges in paths.items():
        for bridge in bridges:
            behind.setdefault(bridge, []).append(gpu)
    return {b: tuple(sorted(behind[b], key=address_order))
            for b in sorted(behind, key=address_order)}


def _acs(host: Host, path: str, bridge: str) -> AcsControl | None:
    """The bridge's ACS Control; NotApplicable for a device in a GPU's sysfs path that is no
    bridge (an Intel VMD controller is an endpoint there): its ACS, if it has one, is not the
    redirect a P2P path crosses, and nothing may be written to it."""
    try:
        config = host.read_bytes(path)
        check_answers(config)
        kind = header_type(config)
        if kind != BRIDGE_HEADER:
            raise NotApplicable(f"{bridge} is no PCI bridge (header type {kind}): a device its "
                                "GPU's sysfs path passes through (an Intel VMD controller), "
                                "with no redirect on the P2P path; nothing is read or written "
                                "there")
        return acs_control(config)
    except ConfigError as exc:
        raise HostError(f"{path}: {exc}") from exc


class AcsRedirectProbe(msgspec.Struct, frozen=True):
    bridge: str
    gpus: tuple[str, ...]
    fixable = True

    @property
    def path(self) -> str:
        return f"{PCI_DEVICES}/{self.bridge}/config"

    def reads(self) -> Sequence[Request]:
        return (Read(self.path),)

    def observe(self, host: Host) -> Observation:
        acs = _acs(host, self.path, self.bridge)
        subjects = Evidence(f"{PCI_DEVICES}/{self.bridge}", f"on the path of GPU(s) "
                                                           f"{', '.join(self.gpus)}")
        details = {"gpus": list(self.gpus), "acs": acs is not None}
        if acs is None:
            return Observation(OFF, (subjects, Evidence(self.path, "no ACS capability: it "
                                                                   "cannot redirect")),
                               details=details)
        value = OFF if not acs.redirect else f"on: {acs.describe()}"
        return Observation(value, (subjects, Evidence(f"{self.path} @0x{acs.offset:03x}",
                                                      acs.describe())), details=details)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan, WriteBytes  # a plan's: a check that passes makes none

        acs = _acs(host, self.path, self.bridge)
        if acs is None:
            raise CannotFix(f"{self.bridge} has no ACS capability")
        wanted = acs.without_redirect()
        change = WriteBytes(self.path, acs.offset, acs.raw.hex(), wanted.raw.hex())
        return Plan(f"write ACSCtl 0x{acs.value:04x} -> 0x{wanted.value:04x} at {self.path} "
                    f"@0x{acs.offset:03x} (ReqRedir, CmpltRedir, EgressCtrl cleared only)",
                    (change,))


def acs_persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """``pci=disable_acs_redir=A;B``: the kernel leaves redirect off on these bridges at boot."""
    bridges = [str(r.key) for r in results if r.kind == "pcie.acs_redirect" and r.key
               and r.outcome in (Outcome.PASSED, Outcome.FIXED) and r.details.get("acs")]
    return [PersistLine("cmdline", "pci=disable_acs_redir=" + ";".join(bridges))] if bridges \
        else []


class AspmProbe(msgspec.Struct, frozen=True):
    address: str
    fixable = True

    def reads(self) -> Sequence[Request]:
        return (Read(f"{PCI_DEVICES}/{self.address}/config"),)

    def observe(self, host: Host) -> Observation:
        path = f"{PCI_DEVICES}/{self.address}/config"
        try:
            offset, bits = aspm_control(host.read_bytes(path))
        except ConfigError as exc:
            raise HostError(f"{path}: {exc}") from exc
        state = ASPM_STATES[bits]
        return Observation(OFF if bits == 0 else state,
                           (Evidence(f"{path} @0x{offset:02x}", f"LnkCtl ASPM {state}"),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan, WriteText  # a plan's: a check that passes makes none

        link = f"{PCI_DEVICES}/{self.address}/link"
        files = [f"{link}/{name}" for name in ("l0s_aspm", "l1_aspm")
                 if host.exists(f"{link}/{name}")]
        if not files:
            raise CannotFix(f"{link}/*_aspm do not exist (a kernel before 5.18, or ASPM under "
                            "firmware control): boot with pcie_aspm=off, or disable it in the "
                            "firmware")
        changes = []
        for path in files:
            current = host.read_text(path)
            if current.strip() != "0":
                changes.append(WriteText(path, current, "0\n"))
        return Plan(f"write 0 to {', '.join(p.rsplit('/', 1)[-1] for p in files)} of {link}",
                    tuple(changes))


def parse_aer(text: str) -> int:
    """The TOTAL_ERR_* line of an aer_dev_* file."""
    for line in text.splitlines():
        name, _, count = line.strip().partition(" ")
        if name.startswith("TOTAL_ERR_"):
            return int(count)
    raise ValueError("no TOTAL_ERR_ line")


def read_aer(host: Host, address: str) -> dict[str, int]:
    """name -> total for the AER files the device has; NotApplicable when it has none."""
    paths = {name: f"{PCI_DEVICES}/{address}/{name}" for name in AER_FILES}
    totals = {}
    for name, path in paths.items():
        if host.exists(path):
            try:
                totals[name] = parse_aer(host.read_text(path))
            except ValueError as exc:
                raise HostError(f"{path}: {exc}") from exc
    if not totals:
        raise NotApplicable(f"{PCI_DEVICES}/{address} has no aer_dev_* files (AER is off, "
                            "under firmware control, or the kernel predates them)")
    return totals


def _aer_counters(replies: Sequence[Reply]) -> dict[str, dict[str, int]]:
    """GPU or device -> {aer_dev_*: total} as the session began; unreadable ones left out."""
    counters: dict[str, dict[str, int]] = {}
    for reply in replies:
        for path, data in reply.matches() if reply.error is None else ():
            if not isinstance(data, bytes):
                continue
            device, name = path.split("/")[-2:]
            try:
                counters.setdefault(device, {})[name] = parse_aer(data.decode(errors="replace"))
            except ValueError:
                continue
    return counters


AER_COUNTERS = Fact("AER counters", tuple(Glob(f"{PCI_DEVICES}/*/{name}") for name in AER_FILES),
                    _aer_counters)
"""Every device's AER totals when the session began, in one batch (``since: session``)."""


class AerProbe(NoFix, msgspec.Struct, frozen=True):
    address: str
    since: str
    baseline: dict[str, int] = msgspec.field(default_factory=dict)
    """The totals read when the session began (``since: session``)."""

    def reads(self) -> Sequence[Request]:
        return tuple(Read(f"{PCI_DEVICES}/{self.address}/{name}") for name in AER_FILES)

    def observe(self, host: Host) -> Observation:
        totals = read_aer(host, self.address)
        base = self.baseline if self.since == "session" else {}
        grown = {name.removeprefix("aer_dev_"): count - base.get(name, 0)
                 for name, count in totals.items() if count - base.get(name, 0) > 0}
        raw = ", ".join(f"{name.removeprefix('aer_dev_')} {count}" for name, count in
                        totals.items())
        evidence = [Evidence(f"{PCI_DEVICES}/{self.address}/aer_dev_*", f"totals: {raw}")]
        if base:
            evidence.append(Evidence("at session start", ", ".join(
                f"{name.removeprefix('aer_dev_')} {count}" for name, count in base.items())))
        value = "none" if not grown else ", ".join(f"{name} +{count}" for name, count in
                                                   grown.items())
        return Observation(value, tuple(evidence))


class PathEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Expectation
    options: EntryOptions
    since: str = "session"


def parse_path_key(key: str, node: Node, context: SpecContext) -> PathEntry:
    """``acs_redirect: off``, ``aspm: off``, ``aer: {since: session}`` (each may be a mapping
    with ``value:`` / ``since:`` and the entry options)."""
    if key == "aer":
        if not node.is_mapping:
            raise node.error("pcie aer must be a mapping like {since: session}")
        pairs = node.mapping("pcie aer")
        since = "session"
        for name, value in pairs:
            if name == "since":
                since = value.string("pcie aer since")
                if since not in SINCE:
                    raise value.error(f"pcie aer since must be one of: {', '.join(SINCE)}")
            elif name not in OPTION_KEYS:
                raise value.unknown_key(name, "pcie aer", ("since", *OPTION_KEYS))
        expect = Exact("none", Choice(("none",)))
        return PathEntry(key, expect, context.parse_options(node, pairs), since)
    pairs = node.mapping(f"pcie {key}") if node.is_mapping else []
    value_node = dict(pairs).get("value", node) if node.is_mapping else node
    for name, value in pairs:
        if name not in ("value", *OPTION_KEYS):
            raise value.unknown_key(name, f"pcie {key}", ("value", *OPTION_KEYS))
    word = value_node.text(f"pcie {key}") if not isinstance(value_node.scalar(), bool) \
        else ("off" if value_node.scalar() is False else "on")
    if word != OFF:
        raise value_node.error(f"pcie {key} must be 'off' (the only setting checked), got "
                               f"{word!r}")
    options = context.parse_options(node, pairs) if pairs else EntryOptions(where=node.where)
    return PathEntry(key, Exact(OFF, Choice((OFF,))), options)


def capture_path_key(item: PathEntry, found: Sequence[CheckResult], out: Captured) -> None:
    """acs_redirect and aspm can only say ``off``; aer only that the totals do not grow."""
    from .capturing import problem, when_false

    kind = f"pcie.{item.key}"
    if when_false(found, item.options):
        out.entries[item.key] = _path_form(item, item.since)
        return
    why = problem(found)
    if why is not None:
        out.leave_out(kind, why)
        return
    if item.key != "aer":
        on = [r for r in found if r.observed != OFF]
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
    from .capturing import entry, options_of

    if item.key == "aer":
        return {"since": since, **options_of(item.options)}
    return entry({"value": OFF}, item.options)


class Unreadable(NoFix, msgspec.Struct, frozen=True):
    """The GPUs' paths could not be read: the check reports why."""

    reason: str

    def observe(self, host: Host) -> Observation:
        raise HostError(self.reason)


class NoBridges(NoFix, msgspec.Struct, frozen=True):
    """GPUs with no PCI bridge above them (on the root bus, as in many VMs): nothing to check."""

    gpus: int

    def observe(self, host: Host) -> Observation:
        raise NotApplicable(f"no PCI bridge between any of the {self.gpus} GPU(s) and the root "
                            "bus (GPUs on the root bus, as in many VMs): no ACS to check")


def expand_path_key(entry: PathEntry, facts: Facts) -> list[Check]:
    kind = f"pcie.{entry.key}"
    found = facts.get(GPUS)
    if not found:
        return [Check(kind, None, entry.expect, entry.options, MissingGpus(), hardware=True)]
    if entry.key == "acs_redirect":
        try:
            behind = bridges_above(gpu_paths(found))
        except HostError as exc:
            return [Check(kind, None, entry.expect, entry.options, Unreadable(str(exc)))]
        if not behind:  # one record saying so, never a section that silently checks nothing
            return [Check(kind, None, entry.expect, entry.options, NoBridges(len(found)))]
        return [Check(kind, bridge, entry.expect, entry.options, AcsRedirectProbe(bridge, gpus),
                      subjects={"bridge": bridge, "gpus": " ".join(gpus)})
                for bridge, gpus in behind.items()]
    gpus = [g.address for g in found]
    if entry.key == "aspm":
        return [Check(kind, gpu, entry.expect, entry.options, AspmProbe(gpu),
                      subjects={"gpu": gpu}) for gpu in gpus]
    baselines = facts.get(AER_COUNTERS) if entry.since == "session" else {}
    return [Check(kind, gpu, entry.expect, entry.options,
                  AerProbe(gpu, entry.since, baselines.get(gpu, {})), order=AER_ORDER,
                  subjects={"gpu": gpu}, hardware=True, fresh=True, measured=True)
            for gpu in gpus]
