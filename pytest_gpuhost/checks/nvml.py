"""The NVML keys of the ``gpus:`` section: driver version, persistence mode, link generation,
P2P read status, and the check that NVML and sysfs see the same GPUs.

Every check asks NVML through ``Facts.nvml`` (opened once, lazily); where NVML is unavailable the
checks are skipped with the reason (what to install, or that the driver is not loaded).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import permutations

from ..fix.changes import NvmlSetting, Plan
from ..gpu.nvml import PERSISTENCE as PERSISTENCE  # re-exported: defined once, in ..nvml
from ..gpu.nvml import Nvml, NvmlSource, NvmlUnavailable, persistence_text
from ..host import Host, Request
from ..linux.pciaddr import address_order
from ..spec import EntryOptions
from ..spec.matchers import Choice, Domain, Expectation, Integer, Verdict, Version
from . import Check, Evidence, NoFix, NotApplicable, Observation


@dataclass(frozen=True)
class NvmlKey:
    domain: Domain
    matchers: tuple[str, ...]
    per_gpu: bool


KEYS = {
    "driver_version": NvmlKey(Version(), ("min", "max", "one_of", "match"), per_gpu=False),
    "persistence_mode": NvmlKey(Choice(PERSISTENCE), (), per_gpu=True),
    "max_link_generation": NvmlKey(Integer((1, 2, 3, 4, 5, 6)), ("min", "max", "one_of"),
                                   per_gpu=True),
    "p2p_status": NvmlKey(Choice(("ok",)), (), per_gpu=False),
}


def _open(source: NvmlSource) -> Nvml:
    try:
        return source.get()
    except NvmlUnavailable as exc:
        raise NotApplicable(f"NVML unavailable: {exc}") from None


def _unseen(address: str, nvml: Nvml) -> Observation | None:
    if address in nvml.gpus():
        return None
    return Observation(None, problem=f"NVML does not see the GPU {address} that sysfs lists "
                                     "(see gpus.nvml_inventory)")


def _per_gpu(source: NvmlSource, address: str, call: str,
             read: Callable[[Nvml], str]) -> Observation:
    """One GPU's NVML value, or why there is none (NVML does not see the GPU sysfs lists)."""
    nvml = _open(source)
    unseen = _unseen(address, nvml)
    if unseen:
        return unseen
    value = read(nvml)
    return Observation(value, (Evidence(f"NVML {call}({address})", value),))


class NvmlReads:
    """The host reads of an NVML probe: a recorded snapshot's files (none for the real one)."""

    nvml: NvmlSource

    def reads(self) -> Sequence[Request]:
        return self.nvml.reads()


@dataclass(frozen=True)
class DriverVersionProbe(NvmlReads, NoFix):
    nvml: NvmlSource

    def observe(self, host: Host) -> Observation:
        version = _open(self.nvml).driver_version()
        return Observation(version, (Evidence("NVML nvmlSystemGetDriverVersion", version),))


@dataclass(frozen=True)
class PersistenceModeProbe(NvmlReads):
    nvml: NvmlSource
    address: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetPersistenceMode",
                        lambda nvml: persistence_text(nvml.persistence_mode(self.address)))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        change = NvmlSetting(self.address, "persistence_mode", observed.value or "", value)
        return Plan(f"NVML nvmlDeviceSetPersistenceMode({self.address}, {value})", (change,))


@dataclass(frozen=True)
class MaxLinkGenerationProbe(NvmlReads, NoFix):
    nvml: NvmlSource
    address: str

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetMaxPcieLinkGeneration",
                        lambda nvml: str(nvml.max_link_generation(self.address)))


@dataclass(frozen=True)
class P2pStatusProbe(NvmlReads, NoFix):
    """nvmlDeviceGetP2PStatus(read) for every ordered pair of GPUs: ``ok`` or the bad pairs."""

    nvml: NvmlSource
    addresses: tuple[str, ...]

    def observe(self, host: Host) -> Observation:
        nvml = _open(self.nvml)
        seen = [a for a in self.addresses if a in nvml.gpus()]
        bad: list[tuple[str, str]] = []
        for source, target in permutations(seen, 2):
            status = nvml.p2p_read_status(source, target)
            if status != "ok":
                bad.append((f"{source}->{target}", status))
        evidence = tuple(Evidence(f"NVML nvmlDeviceGetP2PStatus({pair}, READ)", status)
                         for pair, status in bad)
        pairs = len(seen) * (len(seen) - 1)
        if not bad:
            return Observation("ok", (Evidence("NVML nvmlDeviceGetP2PStatus(READ)",
                                               f"ok for all {pairs} ordered pairs"),))
        shown = "; ".join(f"{pair}: {status}" for pair, status in bad[:3])
        more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
        return Observation(f"{len(bad)} of {pairs} pairs not ok: {shown}{more}", evidence)


@dataclass(frozen=True)
class SameGpus:
    """NVML must list exactly the GPUs sysfs lists."""

    sysfs: tuple[str, ...]

    def describe(self) -> str:
        return ", ".join(self.sysfs) or "none"

    def judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        nvml = [a for a in observed.split(", ") if a and a != "none"]
        if sorted(nvml) == sorted(self.sysfs):
            return Verdict(True)
        missing = [a for a in self.sysfs if a not in nvml]
        extra = [a for a in nvml if a not in self.sysfs]
        detail = "; ".join(part for part in (
            f"missing from NVML: {', '.join(missing)}" if missing else "",
            f"not in sysfs: {', '.join(extra)}" if extra else "") if part)
        return Verdict(False, f"NVML and sysfs disagree ({detail}): NVML sees "
                              f"{len(nvml)} [{observed}], sysfs lists {len(self.sysfs)} "
                              f"[{self.describe()}]")

    def fix_value(self, observed: str | None) -> str | None:
        return None


@dataclass(frozen=True)
class InventoryProbe(NvmlReads, NoFix):
    nvml: NvmlSource

    def observe(self, host: Host) -> Observation:
        gpus = sorted(_open(self.nvml).gpus(), key=address_order)
        listed = ", ".join(gpus) or "none"
        return Observation(listed, (Evidence("NVML nvmlDeviceGetPciInfo", listed),))


@dataclass(frozen=True)
class NvmlEntry:
    key: str
    expect: Expectation
    options: EntryOptions


def expand_nvml(entries: Sequence[NvmlEntry], nvml: NvmlSource,
                addresses: tuple[str, ...], where: str) -> list[Check]:
    """The checks of the NVML keys on the GPUs sysfs lists, plus the inventory agreement."""
    if not entries:
        return []
    checks = [Check("gpus.nvml_inventory", None, SameGpus(addresses), EntryOptions(where=where),
                    InventoryProbe(nvml))]
    for entry in entries:
        kind = f"gpus.{entry.key}"
        if entry.key == "driver_version":
            checks.append(Check(kind, None, entry.expect, entry.options, DriverVersionProbe(nvml)))
        elif entry.key == "p2p_status":
            checks.append(Check(kind, None, entry.expect, entry.options,
                                P2pStatusProbe(nvml, addresses)))
        elif entry.key == "persistence_mode":
            checks.extend(Check(kind, a, entry.expect, entry.options,
                                PersistenceModeProbe(nvml, a), subjects={"gpu": a})
                          for a in addresses)
        else:
            checks.extend(Check(kind, a, entry.expect, entry.options,
                                MaxLinkGenerationProbe(nvml, a), subjects={"gpu": a})
                          for a in addresses)
    return checks
