"""iommu: the IOMMU domain type of each GPU's group (``identity`` is passthrough: no DMA
translation on the P2P and host copy paths).

Reads the GPU's sysfs link, then its ``iommu_group`` link (both resolved inside the root) and the
group's ``type``. The type is chosen at boot (``iommu=pt`` makes the default identity): a wrong
one is ``reboot_required`` when the boot configuration already says ``iommu=pt``, and --fix
--fix-persist adds it to our grub.d drop-in. Without an IOMMU there are no groups: skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..fix.changes import Plan
from ..host import Host
from ..linux.cmdline import Parameter
from ..linux.pcitopo import PCI_DEVICES, resolve_link
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Auto, Expectation
from . import CannotFix, Check, Evidence, Facts, NextBoot, NotApplicable, Observation
from .bootconfig import plan_dropin, read_boot_config
from .gpus import MissingGpus, find_gpus

KEYS = ("gpu_groups",)
PASSTHROUGH = ("iommu=pt", "iommu.passthrough=1")


def group_paths(host: Host, address: str) -> tuple[str, str]:
    """(the GPU's group directory, its type file), following the two links inside the root."""
    link = f"{PCI_DEVICES}/{address}"
    target = host.readlink(link)
    device = resolve_link(link, target) if target else link
    group_link = f"{device}/iommu_group"
    group_target = host.readlink(group_link)
    if group_target is None:
        raise NotApplicable(f"{group_link} does not exist: no IOMMU group, so the IOMMU is "
                            "off and the GPU's DMA is not translated")
    group = resolve_link(group_link, group_target)
    return group, f"{group}/type"


@dataclass(frozen=True)
class GroupTypeProbe:
    address: str
    spec: str
    fixable = True
    boot_time = True

    def observe(self, host: Host) -> Observation:
        group, path = group_paths(host, self.address)
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


@dataclass(frozen=True)
class IommuSection:
    expect: Expectation
    options: EntryOptions
    spec: str


class IommuKind:
    section = "iommu"

    def parse(self, node: Node, context: SpecContext) -> IommuSection:
        pairs = node.mapping("iommu")
        if not pairs:
            raise node.error(f"iommu is empty; expected one of: {', '.join(KEYS)}")
        found = None
        for key, value in pairs:
            if key not in KEYS:
                raise value.key_error(f"unknown key {key!r} in iommu; expected one of: "
                                      f"{', '.join(KEYS)}")
            found = parse_expectation(value, context, Auto(), what=f"iommu {key}",
                                      matchers=("one_of",))
        assert found is not None
        return IommuSection(found[0], found[1], context.spec_name)

    def expand(self, section: IommuSection, facts: Facts) -> Sequence[Check]:
        gpus = facts.get(find_gpus)
        if not gpus:
            return [Check("iommu.gpu_groups", None, section.expect, section.options,
                          MissingGpus())]
        return [Check("iommu.gpu_groups", gpu.address, section.expect, section.options,
                      GroupTypeProbe(gpu.address, section.spec)) for gpu in gpus]
