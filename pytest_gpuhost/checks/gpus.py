"""GPUs on PCI: which functions are NVIDIA GPUs, and the ``gpus: count`` check.

Only NVIDIA (vendor 0x10de) display or 3D functions (class 0x0300xx, 0x0302xx) are GPUs: the HD
audio function ``.1`` of a workstation card and NVSwitch bridges are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..host import Host, HostError
from ..linux.pciaddr import address_order, normalize_address
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Choice, Exact, Expectation, Integer
from . import Check, Evidence, Facts, NoFix, Observation
from .nvml import KEYS as NVML_KEYS
from .nvml import NvmlEntry, expand_nvml

PCI_DEVICES = "sys/bus/pci/devices"
NVIDIA = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)


@dataclass(frozen=True)
class MissingGpus(NoFix):
    def observe(self, host: Host) -> Observation:
        return Observation(None, problem="no NVIDIA GPU (vendor 0x10de, class 0x0300/0x0302) "
                                         "under sys/bus/pci/devices")


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
    nvml: tuple[NvmlEntry, ...] = ()
    where: str = ""


@dataclass(frozen=True)
class GpuCountProbe(NoFix):
    def observe(self, host: Host) -> Observation:
        gpus = find_gpus(host)
        listed = ", ".join(g.address for g in gpus) or "none"
        return Observation(str(len(gpus)), (Evidence(PCI_DEVICES, f"NVIDIA GPUs: {listed}"),))


class GpusKind:
    section = "gpus"
    keys = ("count", *NVML_KEYS)

    def parse(self, node: Node, context: SpecContext) -> GpusSection:
        count = None
        nvml: list[NvmlEntry] = []
        for key, value in node.mapping("gpus"):
            if key == "count":
                count = parse_expectation(value, context, Integer(), what="gpus count",
                                          matchers=("min", "max"))
            elif key == "driver_match" and not value.is_mapping and value.scalar() is True:
                nvml.append(NvmlEntry(key, Exact("match", Choice(("match",))),
                                      EntryOptions(where=value.where)))
            elif key in NVML_KEYS:
                spec = NVML_KEYS[key]
                expect, options = parse_expectation(value, context, spec.domain,
                                                    what=f"gpus {key}", matchers=spec.matchers)
                nvml.append(NvmlEntry(key, expect, options))
            else:
                raise value.key_error(f"unknown key {key!r} in gpus; expected one of: "
                                  f"{', '.join(self.keys)}")
        if count is None and not nvml:
            raise node.error(f"gpus is empty; expected one of: {', '.join(self.keys)}")
        return GpusSection(count, tuple(sorted(nvml, key=lambda e: e.key)), node.where)

    def expand(self, section: GpusSection, facts: Facts) -> Sequence[Check]:
        checks: list[Check] = []
        if section.count is not None:
            expect, options = section.count
            checks.append(Check("gpu_count", None, expect, options, GpuCountProbe()))
        addresses = tuple(g.address for g in facts.get(find_gpus))
        checks += expand_nvml(section.nvml, facts.nvml, addresses, section.where)
        return checks
