"""iommu: the IOMMU domain type of each GPU's group (``identity`` is passthrough: no DMA
translation on the P2P and host copy paths).

Reads the GPU's sysfs link, then its ``iommu_group`` link (both resolved inside the root) and the
group's ``type``. The type is chosen at boot (``iommu=pt`` makes the default identity): a wrong
one is ``reboot_required`` when the boot configuration already says ``iommu=pt``, and --fix
--fix-persist adds it to our grub.d drop-in. Without an IOMMU there are no groups: skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Host, Read, Request
from ..linux.cmdline import Parameter
from ..linux.pcitopo import PCI_DEVICES, resolve_link
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Auto, Expectation
from . import CannotFix, Check, Evidence, Fact, Facts, NextBoot, NotApplicable, Observation
from .bootconfig import BOOT_READS, dropin_path, plan_dropin, read_boot_config
from .gpus import GPUS, Gpu, MissingGpus

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

KEYS = ("gpu_groups",)
PASSTHROUGH = ("iommu=pt", "iommu.passthrough=1")


def group_paths(gpu: Gpu) -> tuple[str, str]:
    """(the GPU's group directory, its type file), from the two links the GPU list read, each
    resolved inside the root."""
    link = f"{PCI_DEVICES}/{gpu.address}"
    device = resolve_link(link, gpu.link) if gpu.link else link
    group_link = f"{device}/iommu_group"
    if gpu.iommu_group is None:
        raise NotApplicable(f"{group_link} does not exist: no IOMMU group, so the IOMMU is "
                            "off and the GPU's DMA is not translated")
    group = resolve_link(group_link, gpu.iommu_group)
    return group, f"{group}/type"


class GroupTypeProbe(msgspec.Struct, frozen=True):
    gpu: Gpu
    spec: str
    fixable = True
    boot_time = True

    @property
    def address(self) -> str:
        return self.gpu.address

    def reads(self) -> Sequence[Request]:
        try:
            return (Read(group_paths(self.gpu)[1]), *BOOT_READS, Read(dropin_path(self.spec)))
        except NotApplicable:
            return ()

    def observe(self, host: Host) -> Observation:
        group, path = group_paths(self.gpu)
        kind = host.read_text(path).strip()
        boot = read_boot_config(host)
        on = [w for w in boot.words if any(Parameter(p).present([w]) for p in PASSTHROUGH)]
        passthrough = any(Parameter(p).present(boot.words) for p in PASSTHROUGH)
        next_boot = NextBoot("identity", boot.where(on), boot.apply) if passthrough else None
        return Observation(kind, (Evidence(path, f"group {group.rsplit('/', 1)[-1]}: {kind}"),),
                           next_boot=next_boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if value != "identity":
            raise CannotFix(f"only identity (iommu=pt) is set from the command line; {value!r} "
                            "needs the IOMMU's own parameters")
        return plan_dropin(host, self.spec, [PASSTHROUGH[0]])


class IommuSection(msgspec.Struct, frozen=True):
    expect: Expectation
    options: EntryOptions
    spec: str


class IommuKind:
    section = "iommu"

    @staticmethod
    def capture(model: IommuSection, records: Records) -> Captured:
        from .capturing import Captured, Rule, capture_key, records_of

        out = Captured()
        capture_key("gpu_groups", records_of(records, "iommu.gpu_groups"), model.expect,
                    model.options, Rule(one_of=True), out, "iommu.gpu_groups")
        return out

    def parse(self, node: Node, context: SpecContext) -> IommuSection:
        pairs = node.mapping("iommu")
        if not pairs:
            raise node.error(f"iommu is empty; expected one of: {', '.join(KEYS)}")
        found = None
        for key, value in pairs:
            if key not in KEYS:
                raise value.unknown_key(key, "iommu", KEYS)
            found = parse_expectation(value, context, Auto(), what=f"iommu {key}",
                                      matchers=("one_of",))
        assert found is not None
        return IommuSection(found[0], found[1], context.spec_name)

    def facts(self, section: IommuSection) -> Sequence[Fact[Any]]:
        return [GPUS]

    def expand(self, section: IommuSection, facts: Facts) -> Sequence[Check]:
        gpus = facts.get(GPUS)
        if not gpus:
            return [Check("iommu.gpu_groups", None, section.expect, section.options,
                          MissingGpus(), hardware=True)]
        return [Check("iommu.gpu_groups", gpu.address, section.expect, section.options,
                      GroupTypeProbe(gpu, section.spec), subjects={"gpu": gpu.address})
                for gpu in gpus]
