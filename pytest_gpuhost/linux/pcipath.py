"""The route between two PCI devices, classed as ``nvidia-smi topo -m`` classes it.

Pure: from where each device sits (its sysfs link, resolved: ``sys/devices/pci0000:40/
0000:40:01.1/0000:41:00.0/0000:42:08.0/0000:43:00.0`` is host bridge ``pci0000:40``, then root
port, switch upstream port, switch downstream port, the device) and its NUMA node. Two devices
below one host bridge meet at their nearest common bridge (a switch's upstream port), or, with
none in common, at the host bridge itself; otherwise the route crosses from one host bridge to
the other. The classes, with nvidia-smi's legend (NVML's ``nvmlGpuTopologyLevel_t``):

- ``PIX``: through at most one PCIe switch (one bridge below the common one on each side);
- ``PXB``: through several switches, without the host bridge;
- ``PHB``: through the host bridge (the root complex: two root ports of one host bridge);
- ``NODE``: between host bridges of one NUMA node;
- ``SYS``: between NUMA nodes (the sockets' interconnect: UPI, xGMI).
"""

from __future__ import annotations

from itertools import pairwise

import msgspec

from .pciaddr import normalize_address
from .pcitopo import TopologyError, bridge_path, resolve_link

LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")
LEGEND = {
    "X": "Self",
    "SYS": "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
           "(e.g., QPI/UPI)",
    "NODE": "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
            "within a NUMA node",
    "PHB": "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
    "PXB": "Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
           "Bridge)",
    "PIX": "Connection traversing at most a single PCIe bridge",
}
"""nvidia-smi topo -m's legend of the classes this module gives."""


class Placement(msgspec.Struct, frozen=True):
    """Where a device sits: its host bridge (``pci0000:40``) and its bridges, nearest first."""

    device: str
    host_bridge: str
    bridges: tuple[str, ...]


def placement(link: str, target: str) -> Placement:
    """The placement of the device whose sysfs link (``sys/bus/pci/devices/ADDR``) points at
    ``target``; TopologyError for a link that leads anywhere else."""
    bridges = bridge_path(link, target)
    parts = resolve_link(link, target).split("/")
    if len(parts) < 4 or not parts[2].startswith("pci"):
        raise TopologyError(f"{link} -> {target} does not lead through a host bridge "
                            "(sys/devices/pciDOMAIN:BUS/...)")
    return Placement(normalize_address(parts[-1]), parts[2], bridges)


class Route(msgspec.Struct, frozen=True):
    """How data goes from ``source`` to ``target``: up the source's side to where the two
    meet, then down the target's side."""

    level: str
    source_side: tuple[str, ...]
    """The source's bridges below where the route turns, nearest the source first."""
    target_side: tuple[str, ...]
    """The target's bridges below where the route turns, nearest the target first."""
    turn: str | None
    """The nearest bridge both sit below (PIX, PXB); None: the route crosses the root complex."""
    host_bridges: tuple[str, str]
    numa: tuple[int, int]

    @property
    def through_root_complex(self) -> bool:
        return self.turn is None


def route(source: Placement, target: Placement, numa: tuple[int, int]) -> Route:
    """The route between two devices, each with its NUMA node (-1: the kernel does not say;
    two unknown nodes are taken for one, as on a machine without NUMA)."""
    hosts = (source.host_bridge, target.host_bridge)
    if source.host_bridge != target.host_bridge:
        level = "NODE" if numa[0] == numa[1] else "SYS"
        return Route(level, source.bridges, target.bridges, None, hosts, numa)
    down_a, down_b = source.bridges[::-1], target.bridges[::-1]  # root port first
    common = 0
    while common < min(len(down_a), len(down_b)) and down_a[common] == down_b[common]:
        common += 1
    if not common:
        return Route("PHB", source.bridges, target.bridges, None, hosts, numa)
    side_a, side_b = down_a[common:][::-1], down_b[common:][::-1]
    level = "PIX" if len(side_a) <= 1 and len(side_b) <= 1 else "PXB"
    return Route(level, side_a, side_b, down_a[common - 1], hosts, numa)


def hops(device: str, side: tuple[str, ...], turn: str | None) -> list[tuple[str, str]]:
    """(a device, the bridge right above it) from ``device`` up its side to the turn (the
    root port's own hop, to the host bridge, is not one: a root port's link is below it)."""
    chain = [device, *side, *([turn] if turn is not None else [])]
    return list(pairwise(chain))
