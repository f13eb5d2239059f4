"""GPUs on PCI: which functions are NVIDIA GPUs, and the ``gpus: count`` check.

Only NVIDIA (vendor 0x10de) display or 3D functions (class 0x0300xx, 0x0302xx) are GPUs: the HD
audio function ``.1`` of a workstation card and NVSwitch bridges are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Glob, Host, HostError, Reply, Request, TargetLost, unreadable
from ..linux.pciaddr import address_order, normalize_address
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Choice, Exact, Expectation, Integer
from . import Check, Evidence, Fact, Facts, NoFix, Observation

if TYPE_CHECKING:  # the NVML checks' modules load when a spec has an NVML key
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .gpuhealth import HealthEntry
    from .nvml import NvmlEntry

PCI_DEVICES = "sys/bus/pci/devices"
NVIDIA = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)


class MissingGpus(NoFix, msgspec.Struct, frozen=True):
    def observe(self, host: Host) -> Observation:
        return Observation(None, problem="no NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302) "
                                         "under sys/bus/pci/devices")


class Gpu(msgspec.Struct, frozen=True):
    address: str
    device_id: str
    numa_node: int = -1
    """The kernel's NUMA node of the GPU (sysfs numa_node), -1 where it does not know."""
    link: str | None = None
    """Its sys/bus/pci/devices link's target as stored (``../../../devices/pci0000:00/...``):
    where it sits in the device tree, so the bridges above it (None: not a link)."""
    iommu_group: str | None = None
    """Its iommu_group link's target as stored, relative to its device directory (None: no
    IOMMU group, the IOMMU is off)."""

    @property
    def sysfs(self) -> str:
        return f"{PCI_DEVICES}/{self.address}"


_ATTRIBUTES = ("vendor", "class", "device", "numa_node")


def _per_device(reply: Reply, depth: int
                ) -> tuple[dict[str, bytes | str], dict[str, HostError]]:
    """Glob matches -> ({ADDR: what was read, or a link's target}, {ADDR: why it is
    unreadable}), ADDR the path component ``depth`` from the end. A device gone between the
    glob and its read (hot removal) is left out. A glob that failed as a whole finds nothing:
    for a target that cannot be reached, each check that reads the GPUs then reports that
    error itself, under its usual id (``_parse_gpus`` refuses any other such failure)."""
    if reply.error is not None:
        return {}, {}
    found: dict[str, bytes | str] = {}
    errors: dict[str, HostError] = {}
    for path, item in reply.matches():
        address = path.split("/")[-depth]
        if unreadable(item):
            errors[address] = item
        elif item is not None and not isinstance(item, HostError):
            found[address] = item
    return found, errors


def _by_device(reply: Reply) -> tuple[dict[str, str], dict[str, HostError]]:
    """``sys/bus/pci/devices/ADDR/attr`` matches -> ({ADDR: value}, {ADDR: why it is
    unreadable})."""
    found, errors = _per_device(reply, 2)
    return ({address: data.decode("ascii", errors="replace").strip()
             for address, data in found.items() if isinstance(data, bytes)}, errors)


def _unreadable(error: HostError, why: str) -> HostError:
    return HostError(f"{why}: {error}", error.errno)


def _number(text: str | None, base: int) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def _links(reply: Reply, depth: int) -> tuple[dict[str, str], dict[str, HostError]]:
    """Link matches -> ({ADDR: target}, {ADDR: why it is unreadable}), ADDR the path
    component ``depth`` from the end."""
    found, errors = _per_device(reply, depth)
    return {address: target for address, target in found.items()
            if isinstance(target, str)}, errors


def _parse_gpus(replies: Sequence[Reply]) -> tuple[Gpu, ...]:
    """The GPUs, or a HostError when a device's vendor or an NVIDIA device's class cannot be
    read: whether it is a GPU is then unknown, and a GPU left out of the list would take its
    checks out of the run unseen. A GPU's unreadable model or NUMA node is shown as unknown."""
    listed = replies[0].error
    if listed is not None and not isinstance(listed, TargetLost):  # any device may be a GPU
        raise _unreadable(listed, "the PCI devices are unknown")
    (vendor, vendor_errors), (pci_class, class_errors), (device, _), (numa, _) = (
        _by_device(reply) for reply in replies[:4])
    (links, link_errors), (groups, group_errors) = _links(replies[4], 1), _links(replies[5], 2)
    if vendor_errors:
        name = min(vendor_errors)
        raise _unreadable(vendor_errors[name], f"whether PCI device {name} is a GPU is unknown")
    gpus = []
    for name in vendor:
        try:
            address = normalize_address(name)
        except ValueError:
            continue
        if _number(vendor[name], 16) != NVIDIA:
            continue
        if name in class_errors:
            raise _unreadable(class_errors[name],
                              f"whether NVIDIA device {name} is a GPU is unknown")
        code = _number(pci_class.get(name), 16)
        if code is None or code >> 8 not in GPU_CLASSES:
            continue
        for errors, what in ((link_errors, f"where GPU {name} sits on the bus"),
                             (group_errors, f"the IOMMU group of GPU {name}")):
            if name in errors:  # taken for "no bridges" or "no IOMMU", its checks would skip
                raise _unreadable(errors[name], f"{what} is unknown")
        model = _number(device.get(name), 16)
        node = _number(numa.get(name), 10)
        gpus.append(Gpu(address, f"0x{model:04x}" if model is not None else "unknown",
                        node if node is not None else -1, links.get(name), groups.get(name)))
    return tuple(sorted(gpus, key=lambda g: address_order(g.address)))


GPUS = Fact("gpus", (*(Glob(f"{PCI_DEVICES}/*/{name}") for name in _ATTRIBUTES),
                    Glob(f"{PCI_DEVICES}/*", read=False, links=True),
                    Glob(f"{PCI_DEVICES}/*/iommu_group", read=False, links=True)), _parse_gpus)
"""Every NVIDIA GPU function under sys/bus/pci/devices, sorted by address, with where it sits:
one batch of six globs, whatever the number of devices."""


def find_gpus(host: Host) -> tuple[Gpu, ...]:
    return GPUS.read(host)


class GpusSection(msgspec.Struct, frozen=True):
    count: tuple[Expectation, EntryOptions] | None
    nvml: tuple[NvmlEntry, ...] = ()
    where: str = ""
    health: tuple[HealthEntry, ...] = ()
    """The health facts (``gpuhealth``), by key."""


class GpuCountProbe(NoFix, msgspec.Struct, frozen=True):
    def reads(self) -> Sequence[Request]:
        return GPUS.requests

    def observe(self, host: Host) -> Observation:
        gpus = find_gpus(host)
        listed = ", ".join(g.address for g in gpus) or "none"
        return Observation(str(len(gpus)), (Evidence(PCI_DEVICES, f"NVIDIA GPUs: {listed}"),))


NVML_FLOORS = ("power_limit", "bar1", "driver_version")
"""NVML keys captured as ``min:`` the lowest value seen."""


def capture_gpus(model: GpusSection, records: Records) -> Captured:
    """The count as seen; each NVML key as its GPUs hold it (``driver_match`` and
    ``p2p_status`` only where they hold)."""
    from .capturing import Captured, Rule, capture_key, records_of
    from .nvml import KEYS as NVML_KEYS

    out = Captured()
    if model.count is not None:
        expect, options = model.count
        capture_key("count", records_of(records, "gpu_count"), expect, options, Rule(), out,
                    "gpu_count")
    for item in model.nvml:
        found = records_of(records, f"gpus.{item.key}")
        if item.key in ("driver_match", "p2p_status"):
            wanted = "match" if item.key == "driver_match" else "ok"
            bad = [r for r in found if r.observed not in (None, wanted)]
            if bad:
                out.leave_out(f"gpus.{item.key}", f"{bad[0].observed}")
                continue
        key = NVML_KEYS[item.key]
        capture_key(item.key, found, item.expect, item.options,
                    Rule(floor=item.key in NVML_FLOORS, one_of="one_of" in key.matchers), out,
                    f"gpus.{item.key}")
        if item.key == "driver_match" and out.entries.get("driver_match") == "match":
            out.entries["driver_match"] = True
    if model.health:
        from .gpuhealth import capture_health

        capture_health(model.health, records, out)
    return out


class GpusKind:
    section = "gpus"
    capture = staticmethod(capture_gpus)

    @property
    def keys(self) -> tuple[str, ...]:
        from .gpuhealth import HEALTH_KEYS
        from .nvml import KEYS as NVML_KEYS

        return ("count", *NVML_KEYS, *HEALTH_KEYS)

    def parse(self, node: Node, context: SpecContext) -> GpusSection:
        count = None
        nvml: list[NvmlEntry] = []
        health: list[HealthEntry] = []
        for key, value in node.mapping("gpus"):
            if key == "count":
                count = parse_expectation(value, context, Integer(), what="gpus count",
                                          matchers=("min", "max"))
                continue
            from .gpuhealth import HEALTH_KEYS, parse_health
            from .nvml import KEYS as NVML_KEYS
            from .nvml import NvmlEntry

            if key in HEALTH_KEYS:
                health.append(parse_health(key, value, context))
            elif key == "driver_match" and not value.is_mapping and value.scalar() is True:
                nvml.append(NvmlEntry(key, Exact("match", Choice(("match",))),
                                      EntryOptions(where=value.where)))
            elif key in NVML_KEYS:
                spec = NVML_KEYS[key]
                expect, options = parse_expectation(value, context, spec.domain,
                                                    what=f"gpus {key}", matchers=spec.matchers)
                nvml.append(NvmlEntry(key, expect, options))
            else:
                raise value.unknown_key(key, "gpus", self.keys)
        if count is None and not nvml and not health:
            raise node.error(f"gpus is empty; expected one of: {', '.join(self.keys)}")
        return GpusSection(count, tuple(sorted(nvml, key=lambda e: e.key)), node.where,
                           tuple(sorted(health, key=lambda e: e.key)))

    def facts(self, section: GpusSection) -> Sequence[Fact[Any]]:
        return [GPUS]

    def expand(self, section: GpusSection, facts: Facts) -> Sequence[Check]:
        checks: list[Check] = []
        if section.count is not None:
            expect, options = section.count
            checks.append(Check("gpu_count", None, expect, options, GpuCountProbe(), hardware=True))
        if section.nvml:
            from .nvml import expand_nvml

            addresses = tuple(g.address for g in facts.get(GPUS))
            checks += expand_nvml(section.nvml, facts.nvml, addresses, section.where)
        if section.health:
            from .gpuhealth import expand_health

            addresses = tuple(g.address for g in facts.get(GPUS))
            checks += expand_health(section.health, facts.nvml, addresses)
        return checks
