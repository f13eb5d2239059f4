"""pcie: one check per GPU per key; MaxReadReq is fixed by a read-modify-write of DevCtl 14:12.

An idle GPU drops its link to 2.5 GT/s, so speed is checked as ``max_link_speed`` and width as
``current_link_width``, never the idle current speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Host, HostError, Read, Request
from ..linux.pciaddr import normalize_address
from ..linux.pciconfig import BCR_FLR, SIZES, ConfigError, DeviceControl, device_control
from ..result import CheckResult, Outcome
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Domain, Expectation, Integer, LinkSpeed
from . import (
    BootCommand,
    CannotFix,
    Check,
    Evidence,
    Fact,
    Facts,
    NoFix,
    Observation,
    PersistLine,
    right_now,
)
from .conditions import in_container
from .gpus import GPUS, Gpu, MissingGpus

if TYPE_CHECKING:  # the bridges' checks (ACS, ASPM, AER) load when a spec has one of their keys
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan
    from .pcie_path import PathEntry

CONTAINER_HEADER = ("not readable from this container: check the host "
                    "(--gpuhost-target=ssh://HOST), where config space past its 64-byte header "
                    "can be read")


def _device_control(host: Host, gpu: Gpu) -> tuple[DeviceControl, str]:
    path = f"{gpu.sysfs}/config"
    data = host.read_bytes(path)
    try:
        return device_control(data), path
    except ConfigError as exc:
        if len(data) == 64 and in_container(host):
            raise HostError(f"{path}: config space is 64 bytes: {CONTAINER_HEADER}") from exc
        raise HostError(f"{path}: {exc}") from exc


def _devctl_evidence(path: str, devctl: DeviceControl) -> Evidence:
    return Evidence(f"{path} @0x{devctl.offset:02x}",
                    f"DevCtl 0x{devctl.value:04x} (bytes {devctl.raw.hex(' ')}): "
                    f"MaxPayload {devctl.max_payload}, MaxReadReq {devctl.max_read_request}")


class MaxReadRequestProbe(msgspec.Struct, frozen=True):
    gpu: Gpu
    fixable = True

    def reads(self) -> Sequence[Request]:
        return (Read(f"{self.gpu.sysfs}/config"),)

    def observe(self, host: Host) -> Observation:
        devctl, path = _device_control(host, self.gpu)
        return Observation(str(devctl.max_read_request), (_devctl_evidence(path, devctl),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        """A read-modify-write of DevCtl bits 14:12 alone; a word with bit 15 set (FLR) is
        refused, not rewritten."""
        from .changes import Plan, WriteBytes  # a plan's: a check that passes makes none

        devctl, path = _device_control(host, self.gpu)
        try:
            wanted = devctl.with_max_read_request(int(value))
        except ConfigError as exc:
            raise CannotFix(f"{path}: {exc}") from exc
        change = WriteBytes(path, wanted.offset, devctl.raw.hex(), wanted.raw.hex(),
                            never_set=BCR_FLR)
        return Plan(f"write DevCtl 0x{devctl.value:04x} -> 0x{wanted.value:04x} at {path} "
                    f"@0x{wanted.offset:02x} (bits 14:12 only)", (change,))


class MaxPayloadProbe(NoFix, msgspec.Struct, frozen=True):
    gpu: Gpu

    def reads(self) -> Sequence[Request]:
        return (Read(f"{self.gpu.sysfs}/config"),)

    def observe(self, host: Host) -> Observation:
        devctl, path = _device_control(host, self.gpu)
        return Observation(str(devctl.max_payload), (_devctl_evidence(path, devctl),))


LINK_WIDTHS = ("0", "1", "2", "4", "8", "12", "16", "32")
"""What ``current_link_width`` can show of an answering device: the widths PCIe defines, and 0
for a link that is down. The kernel prints Link Status bits 9:4 as they read; a device that
does not answer reads them all ones, 63, which would pass any ``min``."""


class SysfsAttributeProbe(NoFix, msgspec.Struct, frozen=True):
    gpu: Gpu
    attribute: str

    def reads(self) -> Sequence[Request]:
        return (Read(f"{self.gpu.sysfs}/{self.attribute}"),)

    def observe(self, host: Host) -> Observation:
        path = f"{self.gpu.sysfs}/{self.attribute}"
        if not host.exists(path):
            return Observation(None, problem=f"{path} does not exist")
        value = host.read_text(path).strip()
        if self.attribute == "current_link_width" and value not in LINK_WIDTHS:
            raise HostError(f"{path} reads {value!r}, not a PCIe link width "
                            f"({', '.join(LINK_WIDTHS[1:])}; 0: the link is down): 63 is Link "
                            "Status read as all ones, a device that does not answer (gone from "
                            "the bus, or in reset): check dmesg and lspci -vvv")
        return Observation(value, (Evidence(path, value),))


class PcieKey(msgspec.Struct, frozen=True):
    domain: Domain
    matchers: tuple[str, ...]


PATH_KEYS = ("acs_redirect", "aspm", "aer")
KEYS = {
    "max_read_request": PcieKey(Integer(SIZES), ("min", "max", "one_of")),
    "max_payload": PcieKey(Integer(SIZES), ("min", "max", "one_of")),
    "link_width": PcieKey(Integer((1, 2, 4, 8, 16, 32)), ("min", "max", "one_of")),
    "max_link_speed": PcieKey(LinkSpeed(), ("min", "max", "one_of")),
}


HARDWARE_KEYS = ("link_width", "max_link_speed")
"""A narrow or slow link is the slot, riser or card: no setting fixes it."""


class PcieEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Expectation
    options: EntryOptions


def _probe(key: str, gpu: Gpu) -> MaxReadRequestProbe | MaxPayloadProbe | SysfsAttributeProbe:
    if key == "max_read_request":
        return MaxReadRequestProbe(gpu)
    if key == "max_payload":
        return MaxPayloadProbe(gpu)
    attribute = "current_link_width" if key == "link_width" else "max_link_speed"
    return SysfsAttributeProbe(gpu, attribute)


SETPCI = BootCommand("setpci", "pciutils", "MaxReadReq")


def mrrs_persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """A udev rule per GPU that sets its MaxReadReq again when its driver binds, by the target's
    own setpci (udev runs a program by its absolute path)."""
    return [_mrrs_rule(record) for record in right_now(results, "pcie.max_read_request")]


def _mrrs_rule(record: CheckResult) -> PersistLine:
    if record.outcome is Outcome.WOULD_FIX:  # the size the dry run's plan would write
        new = str(record.plan[0]["new"]) if record.plan else ""
        size = DeviceControl(0, int.from_bytes(bytes.fromhex(new), "little")).max_read_request
    else:
        size = int(record.observed or "")
    code = SIZES.index(size) << 12
    try:
        address = normalize_address(record.key or "")
    except ValueError:
        return PersistLine.refuse("udev", f"GPU {record.key!r} is not a PCI address")
    if address != record.key:
        return PersistLine.refuse("udev", f"GPU {record.key!r} is not a PCI address in sysfs "
                                          "form")
    return PersistLine("udev", f'ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="{address}", '
                               f'RUN+="{{setpci}} -s $kernel CAP_EXP+8.w={code:04x}:7000"',
                       runs=SETPCI)


def _link_speed(raw: str) -> str:
    """``32.0 GT/s PCIe`` -> ``32.0 GT/s``."""
    return f"{LinkSpeed().order_key(raw):.1f} GT/s"


def capture_pcie(model: Sequence[PcieEntry | PathEntry], records: Records) -> Captured:
    """Each GPU's key as trained (``max_payload`` as ``min:``); the path keys as
    ``capture_path_key`` says."""
    from .capturing import Captured, Rule, capture_key, records_of

    out = Captured()
    for item in model:
        kind = f"pcie.{item.key}"
        found = records_of(records, kind)
        if not isinstance(item, PcieEntry):
            from .pcie_path import capture_path_key

            capture_path_key(item, found, out)
            continue
        matchers = KEYS[item.key].matchers
        show = _link_speed if item.key == "max_link_speed" else str.strip
        capture_key(item.key, found, item.expect, item.options,
                    Rule(floor=item.key == "max_payload", one_of="one_of" in matchers,
                         show=show), out, kind)
    return out


class PcieKind:
    section = "pcie"
    capture = staticmethod(capture_pcie)

    @staticmethod
    def persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
        """MaxReadReq's udev rules; ACS redirect off in the kernel command line
        (``acs_persistence``)."""
        from .pcie_path import acs_persistence

        return [*mrrs_persistence(results), *acs_persistence(results)]

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        """MaxReadReq into the udev rule, ACS redirect off into the kernel command line."""
        return {"pcie.max_read_request": ("udev",), "pcie.acs_redirect": ("cmdline",)}.get(
            check.kind, ())

    def parse(self, node: Node, context: SpecContext) -> tuple[PcieEntry | PathEntry, ...]:
        entries: list[PcieEntry | PathEntry] = []
        pairs = node.mapping("pcie")
        known = (*KEYS, *PATH_KEYS)
        if not pairs:
            raise node.error(f"pcie is empty; expected one of: {', '.join(known)}")
        for key, value in pairs:
            if key in PATH_KEYS:
                from .pcie_path import parse_path_key

                entries.append(parse_path_key(key, value, context))
                continue
            if key not in KEYS:
                raise value.unknown_key(key, "pcie", known)
            spec = KEYS[key]
            expect, options = parse_expectation(value, context, spec.domain, what=f"pcie {key}",
                                                matchers=spec.matchers)
            entries.append(PcieEntry(key, expect, options))
        return tuple(sorted(entries, key=lambda e: e.key))

    def facts(self, section: tuple[PcieEntry | PathEntry, ...]) -> Sequence[Fact[Any]]:
        if not any(not isinstance(e, PcieEntry) and e.key == "aer" and e.since == "session"
                   for e in section):
            return [GPUS]
        from .pcie_path import AER_COUNTERS

        return [GPUS, AER_COUNTERS]

    def expand(self, section: tuple[PcieEntry | PathEntry, ...], facts: Facts
               ) -> Sequence[Check]:
        gpus = facts.get(GPUS)
        checks: list[Check] = []
        for entry in section:
            if not isinstance(entry, PcieEntry):
                from .pcie_path import expand_path_key

                checks += expand_path_key(entry, facts)
                continue
            kind = f"pcie.{entry.key}"
            hardware = entry.key in HARDWARE_KEYS
            if not gpus:
                checks.append(Check(kind, None, entry.expect, entry.options, MissingGpus(),
                                    hardware=True))
            checks.extend(Check(kind, gpu.address, entry.expect, entry.options,
                                _probe(entry.key, gpu), subjects={"gpu": gpu.address},
                                hardware=hardware) for gpu in gpus)
        return checks
