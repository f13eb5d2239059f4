"""The probes by name: each is one module and one line here, imported when a measurement first
needs it. The bandwidth probes (``probe.BandwidthProbe``) take the p2p section's measurement,
``auto`` asking them in their order; the collective probes run the nccl section's."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .ncclrun import NcclTestsProbe
    from .probe import BandwidthProbe

PROBES = {
    "cuda": ("cudarun", "CudaProbe"),
    "nvbandwidth": ("nvbandwidthrun", "NvbandwidthProbe"),
    "file": ("savedoutput", "SavedOutput"),
}
"""A probe's name as the spec gives it -> (its module of ``pytest_gpuhost.gpu``, its class)."""


def probe_named(name: str) -> BandwidthProbe:
    """The probe of that name (KeyError for a name no probe has)."""
    module, cls = PROBES[name]
    probe: BandwidthProbe = getattr(importlib.import_module(f"{__package__}.{module}"), cls)()
    return probe


def every_probe() -> list[BandwidthProbe]:
    """Every probe, in the order ``auto`` asks them."""
    return [probe_named(name) for name in PROBES]


COLLECTIVE_PROBES = {
    "nccl-tests": ("ncclrun", "NcclTestsProbe"),
}
"""A collective probe's name -> (its module of ``pytest_gpuhost.gpu``, its class)."""


def collective_probe(name: str = "nccl-tests") -> NcclTestsProbe:
    """The collective probe of that name (KeyError for a name no probe has)."""
    module, cls = COLLECTIVE_PROBES[name]
    probe: NcclTestsProbe = getattr(importlib.import_module(f"{__package__}.{module}"), cls)()
    return probe
