"""The NVML keys of the ``gpus:`` section: driver version, persistence mode, link generation,
P2P read status, and the check that NVML and sysfs see the same GPUs.

Every check asks NVML through ``Facts.nvml`` (opened once, lazily); where NVML is unavailable the
checks are skipped with the reason (what to install, or that the driver is not loaded).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from itertools import permutations
from typing import TYPE_CHECKING

import msgspec

from ..gpu.nvml import PERSISTENCE as PERSISTENCE  # re-exported: defined once, in ..nvml
from ..gpu.nvml import Nvml, NvmlSource, NvmlUnavailable, persistence_text
from ..host import Host, Read, Request
from ..linux.pciaddr import address_order
from ..specmodel import EntryOptions
from ..specmodel.matchers import (
    Auto,
    Choice,
    Domain,
    Expectation,
    Integer,
    Verdict,
    Version,
    finite,
)
from . import (
    KERNEL,
    USERSPACE,
    CannotFix,
    Check,
    Evidence,
    NextBoot,
    NoFix,
    NotApplicable,
    Observation,
    Probe,
)
from .driver_match import NVIDIA_VERSION as NVIDIA_VERSION  # re-exported
from .driver_match import DriverMatchProbe
from .driver_match import module_version as module_version  # re-exported

if TYPE_CHECKING:  # a plan's changes load when used
    from .changes import Plan

ECC = PERSISTENCE
KERNEL_MODULES = ("open", "proprietary")


class Watts(Auto):
    """Power in W (``600``, ``575.5``), compared as numbers."""

    name = "watts"

    def validate(self, value: str) -> None:
        if self.order_key(value) <= 0:
            raise ValueError(f"not a positive number of watts: {value!r}")

    def order_key(self, raw: str) -> float:
        return finite(raw.strip().removesuffix("W").strip(), "a power in W")

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return self.order_key(observed) == self.order_key(expected)
        except ValueError:
            return False


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB)?\Z")
_BINARY = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


class Bytes(Auto):
    """A size (``96GiB``, ``98304 MiB``, bytes), compared in bytes."""

    name = "size"

    def validate(self, value: str) -> None:
        self.order_key(value)

    def order_key(self, raw: str) -> int:
        match = _SIZE.fullmatch(raw.strip())
        if not match:
            raise ValueError(f"not a size like 96GiB: {raw.strip()!r}")
        return int(finite(match.group(1), "a size like 96GiB") * _BINARY[match.group(2)])

    def equal(self, observed: str, expected: str) -> bool:
        try:
            return self.order_key(observed) == self.order_key(expected)
        except ValueError:
            return False


def show_bytes(size: int) -> str:
    return f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"


class NvmlKey(msgspec.Struct, frozen=True):
    domain: Domain
    matchers: tuple[str, ...]
    per_gpu: bool
    scope: str = KERNEL
    """The GPUs' settings are the kernel driver's; the NVML library is the root's own."""


KEYS = {
    "driver_version": NvmlKey(Version(), ("min", "max", "one_of", "match"), per_gpu=False),
    "persistence_mode": NvmlKey(Choice(PERSISTENCE), (), per_gpu=True),
    "max_link_generation": NvmlKey(Integer((1, 2, 3, 4, 5, 6)), ("min", "max", "one_of"),
                                   per_gpu=True),
    "p2p_status": NvmlKey(Choice(("ok",)), (), per_gpu=False),
    "power_limit": NvmlKey(Watts(), ("min", "max", "one_of"), per_gpu=True),
    "ecc": NvmlKey(Choice(ECC), (), per_gpu=True),
    "bar1": NvmlKey(Bytes(), ("min", "max"), per_gpu=True),
    "kernel_module": NvmlKey(Choice(KERNEL_MODULES), (), per_gpu=True),
    "driver_match": NvmlKey(Choice(("match",)), (), per_gpu=False, scope=USERSPACE),
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

    __slots__ = ()  # a mixin of msgspec.Structs: no __dict__
    nvml: NvmlSource

    def reads(self) -> Sequence[Request]:
        return self.nvml.reads()


class DriverVersionProbe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
    nvml: NvmlSource

    def observe(self, host: Host) -> Observation:
        version = _open(self.nvml).driver_version()
        return Observation(version, (Evidence("NVML nvmlSystemGetDriverVersion", version),))


class PersistenceModeProbe(NvmlReads, msgspec.Struct, frozen=True):
    nvml: NvmlSource
    address: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetPersistenceMode",
                        lambda nvml: persistence_text(nvml.persistence_mode(self.address)))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import NvmlSetting, Plan  # a plan's: a check that passes makes none

        change = NvmlSetting(self.address, "persistence_mode", observed.value or "", value)
        return Plan(f"NVML nvmlDeviceSetPersistenceMode({self.address}, {value})", (change,))


class PowerLimitProbe(NvmlReads, msgspec.Struct, frozen=True):
    """The enforced limit, in W; a fix sets the management limit through NVML."""

    nvml: NvmlSource
    address: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetEnforcedPowerLimit",
                        lambda nvml: f"{nvml.power_limit(self.address) / 1000:g}")

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import NvmlSetting, Plan  # a plan's: a check that passes makes none

        low, high = _open(self.nvml).power_limit_range(self.address)
        wanted = round(float(value) * 1000)
        if not low <= wanted <= high:
            raise CannotFix(f"{value} W is outside what this GPU allows ({low / 1000:g}-"
                            f"{high / 1000:g} W, nvmlDeviceGetPowerManagementLimitConstraints)")
        change = NvmlSetting(self.address, "power_limit", observed.value or "", f"{value}")
        return Plan(f"NVML nvmlDeviceSetPowerManagementLimit({self.address}, {wanted} mW)",
                    (change,))


class EccProbe(NvmlReads, msgspec.Struct, frozen=True):
    """The current ECC mode; the pending one is what the next GPU reset or boot brings, so a
    wrong current mode with the right pending one is reboot_required. A fix sets the pending
    mode through NVML (under --fix --fix-persist)."""

    nvml: NvmlSource
    address: str
    fixable = True
    boot_time = True

    def observe(self, host: Host) -> Observation:
        nvml = _open(self.nvml)
        unseen = _unseen(self.address, nvml)
        if unseen:
            return unseen
        current, pending = (persistence_text(m) for m in nvml.ecc_mode(self.address))
        source = f"NVML nvmlDeviceGetEccMode({self.address})"
        return Observation(current, (Evidence(source, f"current {current}, pending {pending}"),),
                           next_boot=NextBoot(pending, f"{source} pending",
                                              "reset the GPU (nvidia-smi -r) or reboot"))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import NvmlSetting, Plan  # a plan's: a check that passes makes none

        pending = observed.next_boot.value if observed.next_boot else ""
        change = NvmlSetting(self.address, "ecc", pending, value)
        return Plan(f"NVML nvmlDeviceSetEccMode({self.address}, {value}) (pending until the "
                    "next GPU reset or boot)", (change,))


class Bar1Probe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
    nvml: NvmlSource
    address: str

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetBAR1MemoryInfo",
                        lambda nvml: show_bytes(nvml.bar1_total(self.address)))


class KernelModuleProbe(NoFix, msgspec.Struct, frozen=True):
    """Which NVIDIA kernel module is loaded: proc/driver/nvidia/version names the open one."""

    address: str

    def reads(self) -> Sequence[Request]:
        return (Read(NVIDIA_VERSION),)

    def observe(self, host: Host) -> Observation:
        if not host.exists(NVIDIA_VERSION):
            return Observation(None, problem=f"{NVIDIA_VERSION} does not exist: the NVIDIA "
                                             "kernel module is not loaded")
        text = host.read_text(NVIDIA_VERSION)
        flavour, _ = module_version(text)
        return Observation(flavour, (Evidence(NVIDIA_VERSION, text.splitlines()[0]
                                              if text.strip() else "(empty)"),))


class MaxLinkGenerationProbe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
    nvml: NvmlSource
    address: str

    def observe(self, host: Host) -> Observation:
        return _per_gpu(self.nvml, self.address, "nvmlDeviceGetMaxPcieLinkGeneration",
                        lambda nvml: str(nvml.max_link_generation(self.address)))


class P2pStatusProbe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
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


class SameGpus(msgspec.Struct, frozen=True):
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


class InventoryProbe(NvmlReads, NoFix, msgspec.Struct, frozen=True):
    nvml: NvmlSource

    def observe(self, host: Host) -> Observation:
        gpus = sorted(_open(self.nvml).gpus(), key=address_order)
        listed = ", ".join(gpus) or "none"
        return Observation(listed, (Evidence("NVML nvmlDeviceGetPciInfo", listed),))


class NvmlEntry(msgspec.Struct, frozen=True):
    key: str
    expect: Expectation
    options: EntryOptions


PER_GPU: dict[str, Callable[[NvmlSource, str], Probe]] = {
    "persistence_mode": PersistenceModeProbe, "power_limit": PowerLimitProbe,
    "ecc": EccProbe, "bar1": Bar1Probe,
    "kernel_module": lambda nvml, address: KernelModuleProbe(address),
}


def expand_nvml(entries: Sequence[NvmlEntry], nvml: NvmlSource,
                addresses: tuple[str, ...], where: str) -> list[Check]:
    """The checks of the NVML keys on the GPUs sysfs lists, plus the inventory agreement (the
    GPUs this root's NVML was given: user space, as the library is)."""
    if not entries:
        return []
    checks = [Check("gpus.nvml_inventory", None, SameGpus(addresses), EntryOptions(where=where),
                    InventoryProbe(nvml), scope=USERSPACE)]
    for entry in entries:
        kind, scope = f"gpus.{entry.key}", KEYS[entry.key].scope
        if entry.key == "driver_version":
            checks.append(Check(kind, None, entry.expect, entry.options, DriverVersionProbe(nvml),
                                scope=scope))
        elif entry.key == "p2p_status":
            checks.append(Check(kind, None, entry.expect, entry.options,
                                P2pStatusProbe(nvml, addresses), scope=scope))
        elif entry.key == "driver_match":
            checks.append(Check(kind, None, entry.expect, entry.options,
                                DriverMatchProbe(nvml), scope=scope))
        else:
            make = PER_GPU.get(entry.key, MaxLinkGenerationProbe)
            checks.extend(Check(kind, a, entry.expect, entry.options, make(nvml, a),
                                subjects={"gpu": a}, scope=scope) for a in addresses)
    return checks
