"""GPUs on PCI: which functions are NVIDIA GPUs, and the ``gpus: count`` check.

Only NVIDIA (vendor 0x10de) display or 3D functions (class 0x0300xx, 0x0302xx) are GPUs: the HD
audio function ``.1`` of a workstation card and NVSwitch bridges are not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..host import Host, HostError
from ..matchers import Expectation, Integer
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from . import Check, Evidence, Facts, NoFix, Observation

PCI_DEVICES = "sys/bus/pci/devices"
NVIDIA = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)
_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])\Z")


def normalize_address(address: str) -> str:
    """The sysfs form ``0000:81:00.0`` of an address (NVML prints ``00000000:81:00.0``)."""
    match = _ADDRESS.fullmatch(address.strip().lower())
    if not match:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def address_order(address: str) -> tuple[int, ...]:
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))


@dataclass(frozen=True)
class Gpu:
    address: str
    device_id: str

    @property
    def sysfs(self) -> str:
        return f"{PCI_DEVICES}/{self.address}"


def _read_hex(host: Host, path: str) -> int | None:
    try:
        return int(host.read_text(path).strip(), 16)
    except (HostError, ValueError):
        return None


def find_gpus(host: Host) -> tuple[Gpu, ...]:
    """Every NVIDIA GPU function under sys/bus/pci/devices, sorted by address."""
    if not host.exists(PCI_DEVICES):
        return ()
    gpus = []
    for name in host.listdir(PCI_DEVICES):
        try:
            address = normalize_address(name)
        except ValueError:
            continue
        base = f"{PCI_DEVICES}/{name}"
        pci_class = _read_hex(host, f"{base}/class")
        if _read_hex(host, f"{base}/vendor") != NVIDIA or pci_class is None:
            continue
        if pci_class >> 8 not in GPU_CLASSES:
            continue
        device = _read_hex(host, f"{base}/device")
        gpus.append(Gpu(address, f"0x{device:04x}" if device is not None else "unknown"))
    return tuple(sorted(gpus, key=lambda g: address_order(g.address)))


@dataclass(frozen=True)
class GpusSection:
    count: tuple[Expectation, EntryOptions] | None


@dataclass(frozen=True)
class GpuCountProbe(NoFix):
    def observe(self, host: Host) -> Observation:
        gpus = find_gpus(host)
        listed = ", ".join(g.address for g in gpus) or "none"
        return Observation(str(len(gpus)), (Evidence(PCI_DEVICES, f"NVIDIA GPUs: {listed}"),))


class GpusKind:
    section = "gpus"
    keys = ("count",)

    def parse(self, node: Node, context: SpecContext) -> GpusSection:
        count = None
        for key, value in node.mapping("gpus"):
            if key == "count":
                count = parse_expectation(value, context, Integer(), what="gpus count",
                                          matchers=("min", "max"))
            else:
                raise value.key_error(f"unknown key {key!r} in gpus; expected one of: "
                                  f"{', '.join(self.keys)}")
        if count is None:
            raise node.error(f"gpus is empty; expected one of: {', '.join(self.keys)}")
        return GpusSection(count)

    def expand(self, section: GpusSection, facts: Facts) -> Sequence[Check]:
        if section.count is None:
            return []
        expect, options = section.count
        return [Check("gpu_count", None, expect, options, GpuCountProbe())]
