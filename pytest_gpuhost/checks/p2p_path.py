"""The PCIe path between two GPUs (or a GPU and host memory), read in one batch.

From the GPU list's sysfs links (which bridges each GPU sits below, and its host bridge) and one
batch of reads: each GPU's and each of its bridges' ``config`` (link registers, Device Control,
ACS) and each GPU's IOMMU group ``type``. The p2p checks declare these reads, so a run fetches
them with every other observation (one round trip to a remote target); the diagnosis
(``p2p_explain``), the path floors and ``--gpuhost-topology`` all stand on what this module
builds from them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..host import Host, Read, Reply, Request
from ..linux.pciaddr import address_order
from ..linux.pciconfig import BRIDGE_HEADER, ConfigError, header_type
from ..linux.pciext import AcsControl, acs_control
from ..linux.pcilink import IDLE_SPEED, Link, PortRegisters, port_registers
from ..linux.pcipath import Placement, Route, hops, placement, route
from ..linux.pcitopo import PCI_DEVICES, TopologyError
from . import NotApplicable
from .gpus import Gpu
from .iommu import group_paths

SOCKET_HOP_GBPS = 45.0
"""What the hop between sockets (UPI, Infinity Fabric, the link a ``SYS`` pair crosses) carries
one pair's copy each way, where the spec does not say (``p2p: floors: {between_sockets: GB/s}``):
public measurements of the example box's GPU (RTX PRO 6000 Blackwell, PCIe Gen5 x16) read
39-51 GB/s across sockets against 53-57 within one, where the PCIe links alone carry 57.61. 45
puts the low end of that range at 87% of it, as copies within a socket reach ~91% of their links:
``path: 0.85`` is reachable across the sockets of a tuned board of that range."""
HOST = "host"
"""The far end of a host copy's path (h2d, d2h): host memory, behind the root complex."""


def _config(address: str) -> str:
    return f"{PCI_DEVICES}/{address}/config"


def _placement(gpu: Gpu) -> Placement | str:
    if gpu.link is None:
        return f"{PCI_DEVICES}/{gpu.address} is not a link into the device tree"
    try:
        return placement(f"{PCI_DEVICES}/{gpu.address}", gpu.link)
    except TopologyError as exc:
        return str(exc)


def _group_type(gpu: Gpu) -> tuple[str, str] | None:
    """(the group's number, its type file), None without an IOMMU group."""
    try:
        group, path = group_paths(gpu)
    except NotApplicable:
        return None
    return group.rsplit("/", 1)[-1], path


def path_reads(gpus: Sequence[Gpu]) -> tuple[Request, ...]:
    """Every read the paths of these GPUs need: config of each GPU and of every bridge above
    it, and each GPU's IOMMU group type."""
    reads: dict[Request, None] = {}
    for gpu in gpus:
        where = _placement(gpu)
        devices = [gpu.address, *(where.bridges if isinstance(where, Placement) else ())]
        reads.update(dict.fromkeys(Read(_config(device)) for device in devices))
        group = _group_type(gpu)
        if group is not None:
            reads[Read(group[1])] = None
    return tuple(reads)


class Port(msgspec.Struct, frozen=True):
    """One PCI function on a GPU's path, as its config space reads."""

    address: str
    registers: PortRegisters | None
    acs: AcsControl | None
    bridge: bool
    problem: str | None = None
    """Why its registers are unknown (config space of 64 bytes without root, unreadable)."""

    @property
    def kind(self) -> str:
        if self.registers is not None:
            return self.registers.kind
        return "bridge" if self.bridge else "device"


def decode_port(address: str, reply: Reply) -> Port:
    if reply.error is not None:
        return Port(address, None, None, False, f"{_config(address)}: {reply.error}")
    config = reply.data()
    try:
        bridge = header_type(config) == BRIDGE_HEADER
    except ConfigError as exc:
        return Port(address, None, None, False, f"{_config(address)}: {exc}")
    try:
        registers = port_registers(config)
    except ConfigError as exc:
        return Port(address, None, None, bridge, f"{_config(address)}: {exc}")
    try:
        acs = acs_control(config) if bridge else None
    except ConfigError as exc:
        return Port(address, registers, None, bridge, f"{_config(address)}: {exc}")
    return Port(address, registers, acs, bridge)


class PathLink(msgspec.Struct, frozen=True):
    """One link of a path: between ``lower`` (a GPU, a switch's upstream port) and the port
    right above it."""

    lower: str
    upper: str
    current: Link
    """Link Status as read (both ends read the same)."""
    capable: Link
    """What the two ends can train to: the slower of their speeds, the fewer of their lanes."""
    target_speed: float | None
    """The upper port's Target Link Speed (Link Control 2), where it has one."""
    aspm: tuple[tuple[str, str], ...]
    """(end, state) for each end whose Link Control enables ASPM (L0s, L1)."""

    @property
    def idle(self) -> bool:
        """Read at the 2.5 GT/s an idle GPU drops to: the speed under load is not known."""
        return self.current.speed == IDLE_SPEED < self.capable.speed

    @property
    def negotiated(self) -> Link:
        """The link as it runs under load: Link Status, but for an idle read the speed it can
        train to (capped by the Target Link Speed)."""
        if not self.idle:
            return self.current
        cap = self.capable.speed
        speed = min(cap, self.target_speed) if self.target_speed else cap
        return Link(speed, self.current.width)

    @property
    def downtrained(self) -> bool:
        return self.negotiated.below(self.capable)


ASPM_NAMES = {1: "L0s", 2: "L1", 3: "L0s L1"}


class PairPath(msgspec.Struct, frozen=True):
    """The path from ``source`` to ``target`` (``HOST`` for host memory) and its facts."""

    source: str
    target: str
    route: Route | None
    """None for a host copy's path (the GPU up to its root port)."""
    links: tuple[PathLink, ...]
    bridges: tuple[tuple[str, str], ...]
    """(bridge, its role on the path) in the order data crosses them."""
    ports: Mapping[str, Port]
    max_payload: int | None
    """The smallest Max Payload Size on the path (what every TLP is cut to)."""
    problems: tuple[str, ...] = ()
    """Facts of the path that could not be read: what the diagnosis cannot judge."""
    between_sockets: float | None = None
    """GB/s the hop between sockets carries, where the path crosses it (a ``SYS`` pair)."""

    @property
    def level(self) -> str:
        return self.route.level if self.route is not None else HOST

    def links_limit(self, capability: bool = False) -> tuple[float, PathLink] | None:
        """(GB/s, the narrowest link): what the path's PCIe links carry each way at its MPS, as
        negotiated (or, ``capability``, as the hardware could train); None when unknown."""
        if self.max_payload is None or not self.links or self.problems:
            return None
        carried = [((link.capable if capability else link.negotiated).gbps(self.max_payload),
                    link) for link in self.links]
        return min(carried, key=lambda item: item[0])

    def limit(self, capability: bool = False) -> tuple[float, PathLink | None] | None:
        """(GB/s, the narrowest link, None where it is the hop between sockets): what the whole
        path carries, its links (``links_limit``) and the hop between sockets it crosses."""
        found = self.links_limit(capability)
        if found is not None and self.between_sockets is not None \
                and self.between_sockets < found[0]:
            return self.between_sockets, None
        return found

    def as_dict(self) -> dict[str, object]:
        """The path for a report: its class, each bridge with its role and ACS, each link."""
        def port(address: str, role: str) -> dict[str, object]:
            found = self.ports.get(address)
            acs = found.acs.describe() if found is not None and found.acs is not None else None
            return {"address": address, "role": role, "acs": acs}

        return {
            "class": self.level, "source": self.source, "target": self.target,
            "max_payload": self.max_payload,
            "bridges": [port(address, role) for address, role in self.bridges],
            "links": [{"lower": link.lower, "upper": link.upper,
                       "current": link.current.describe(), "capable": link.capable.describe(),
                       "negotiated": link.negotiated.describe(), "idle": link.idle,
                       "aspm": [f"{end} {state}" for end, state in link.aspm]}
                      for link in self.links],
            "problems": list(self.problems),
        }


def _role(port: Port | None, side: str, turn: bool) -> str:
    kind = port.kind if port is not None else "bridge"
    if turn:
        return f"{kind} where the pair turns"
    return f"{kind} of the {side}" if kind == "root port" else f"{kind} above the {side}"


class PathFacts:
    """The GPUs' paths on one host: placements, NUMA nodes, ports, IOMMU group types."""

    def __init__(self, gpus: Sequence[Gpu], ports: Mapping[str, Port],
                 iommu: Mapping[str, tuple[str, str | None]],
                 between_sockets: float = SOCKET_HOP_GBPS) -> None:
        self.between_sockets = between_sockets
        """GB/s the hop between sockets carries (the spec's ``between_sockets``)."""
        self.gpus = {gpu.address: gpu for gpu in gpus}
        self.places = {gpu.address: _placement(gpu) for gpu in gpus}
        self.ports = dict(ports)
        self.iommu = dict(iommu)
        """GPU -> (its IOMMU group, the group's type or None when unreadable); a GPU without
        a group (the IOMMU off) is not in it."""

    def _side_links(self, device: str, side: tuple[str, ...], turn: str | None,
                    problems: list[str]) -> list[PathLink]:
        links = []
        for lower, upper in hops(device, side, turn):
            low, up = self.ports.get(lower), self.ports.get(upper)
            for end in (low, up):
                if end is not None and end.problem and end.problem not in problems:
                    problems.append(end.problem)
            if low is None or up is None or low.registers is None or up.registers is None:
                continue
            if not low.registers.upstream_facing:
                continue  # within a switch: a downstream port below its upstream port
            aspm = tuple((end.address, ASPM_NAMES[end.registers.aspm]) for end in (low, up)
                         if end.registers is not None and end.registers.aspm)
            links.append(PathLink(lower, upper, low.registers.current,
                                  low.registers.capable.narrowest(up.registers.capable),
                                  up.registers.target_speed, aspm))
        alone = self.ports.get(device)
        where = self.places.get(device)
        if not side and turn is None and isinstance(where, Placement) and alone is not None \
                and alone.registers is not None and alone.registers.upstream_facing:
            # on the root bus with no port above it (as in many VMs): its own registers
            registers = alone.registers
            aspm = ((device, ASPM_NAMES[registers.aspm]),) if registers.aspm else ()
            links.append(PathLink(device, where.host_bridge, registers.current,
                                  registers.capable, None, aspm))
        return links

    def _path(self, source: str, target: str, found: Route | None,
              sides: tuple[tuple[str, ...], tuple[str, ...]], turn: str | None,
              problems: list[str], names: tuple[str, str] = ("source", "target")) -> PairPath:
        ends = [gpu for gpu in (source, target) if gpu != HOST]
        up = self._side_links(source, sides[0], turn, problems) if source != HOST else []
        down = self._side_links(target, sides[1], turn, problems)
        bridges = [(b, _role(self.ports.get(b), names[0], False)) for b in sides[0]]
        if turn is not None:
            bridges.append((turn, _role(self.ports.get(turn), "", True)))
        bridges += [(b, _role(self.ports.get(b), names[1], False)) for b in sides[1][::-1]]
        on_path = [*ends, *(b for b, _ in bridges)]
        sizes = [p.registers.max_payload for p in map(self.ports.get, on_path)
                 if p is not None and p.registers is not None]
        for device in on_path:
            if device not in self.ports:
                problems.append(f"{_config(device)} was not read")
        ports = {d: self.ports[d] for d in on_path if d in self.ports}
        return PairPath(source, target, found, (*up, *down[::-1]), tuple(bridges), ports,
                        min(sizes) if sizes else None, tuple(dict.fromkeys(problems)),
                        self.between_sockets if found is not None and found.level == "SYS"
                        else None)

    def pair(self, source: str, target: str) -> PairPath:
        """The path from GPU ``source`` to GPU ``target``."""
        one, other = self.places.get(source), self.places.get(target)
        problems = [p for p in (one, other) if isinstance(p, str)]
        if not isinstance(one, Placement) or not isinstance(other, Placement):
            return PairPath(source, target, None, (), (), {}, None,
                            tuple(problems or [f"{source} or {target} is not a GPU here"]))
        numa = (self.gpus[source].numa_node, self.gpus[target].numa_node)
        found = route(one, other, numa)
        return self._path(source, target, found, (found.source_side, found.target_side),
                          found.turn, [])

    def host_path(self, gpu: str) -> PairPath:
        """The path of a host copy: from host memory, through the root complex, to ``gpu``."""
        where = self.places.get(gpu)
        if not isinstance(where, Placement):
            return PairPath(HOST, gpu, None, (), (), {}, None,
                            (where or f"{gpu} is not a GPU here",))
        return self._path(HOST, gpu, None, ((), where.bridges), None, [], (HOST, "GPU"))


    def topology(self, between_sockets: float | None = None) -> dict[str, Any]:
        """The GPUs' topology for ``--gpuhost-topology`` and the JSON report: the GPU x GPU
        matrix of classes, per GPU its NUMA node, link, MaxReadReq and IOMMU group type, per
        bridge of the paths its kind, the GPUs below it and its ACS Control, and per ordered
        pair what its path carries, the hop between sockets carrying ``between_sockets`` GB/s
        (None: these facts' own figure), which it names."""
        if between_sockets is not None and between_sockets != self.between_sockets:
            other = copy.copy(self)
            other.between_sockets = between_sockets
            return other.topology()
        addresses = sorted(self.gpus, key=address_order)
        gpus = []
        for gpu in addresses:
            path = self.host_path(gpu)
            port = self.ports.get(gpu)
            own = next((link for link in path.links if link.lower == gpu), None)
            registers = port.registers if port is not None else None
            gpus.append({
                "address": gpu, "numa_node": self.gpus[gpu].numa_node,
                "link": own.current.describe() if own else None,
                "capable": own.capable.describe() if own else None,
                "idle": own.idle if own else None,
                "max_read_request": registers.max_read_request if registers else None,
                "max_payload": registers.max_payload if registers else None,
                "iommu": self.iommu.get(gpu, (None, "off"))[1],
                "problems": list(path.problems)})
        pairs = {f"{a}->{b}": self.pair(a, b) for a in addresses for b in addresses if a != b}
        below: dict[str, list[str]] = {}
        for gpu in addresses:
            where = self.places[gpu]
            for bridge in where.bridges if isinstance(where, Placement) else ():
                below.setdefault(bridge, []).append(gpu)
        bridges = []
        for bridge in sorted(below, key=address_order):
            port = self.ports.get(bridge)
            bridges.append({"address": bridge, "kind": port.kind if port else "bridge",
                            "gpus": below[bridge],
                            "acs": port.acs.describe() if port and port.acs else None,
                            "redirect": bool(port and port.acs and port.acs.redirect),
                            "problem": port.problem if port else None})
        return {"gpus": gpus, "bridges": bridges,
                "matrix": [["X" if a == b else pairs[f"{a}->{b}"].level for b in addresses]
                           for a in addresses],
                "pairs": {key: {"class": path.level, "limit_gbps": _rounded(path.limit()),
                                "capable_gbps": _rounded(path.limit(capability=True))}
                          for key, path in pairs.items()},
                "between_sockets_gbps": self.between_sockets}


def _rounded(found: tuple[float, PathLink | None] | None) -> float | None:
    return round(found[0], 2) if found is not None else None


def read_path_facts(host: Host, gpus: Sequence[Gpu],
                    requests: Sequence[Request] | None = None,
                    between_sockets: float = SOCKET_HOP_GBPS) -> PathFacts:
    """The paths of ``gpus``, read in one batch (served from a phase's batch where the checks
    declared these reads; ``requests``: ``path_reads(gpus)`` made already), the hop between
    sockets carrying ``between_sockets`` GB/s."""
    requests = tuple(requests) if requests is not None else path_reads(gpus)
    replies = dict(zip(requests, host.batch(requests), strict=True))
    ports = {}
    for request, reply in replies.items():
        if isinstance(request, Read) and request.path.endswith("/config"):
            address = request.path.split("/")[-2]
            ports[address] = decode_port(address, reply)
    iommu: dict[str, tuple[str, str | None]] = {}
    for gpu in gpus:
        group = _group_type(gpu)
        if group is not None:
            reply = replies[Read(group[1])]
            kind = reply.text().strip() if reply.error is None else None
            iommu[gpu.address] = (group[0], kind)
    return PathFacts(gpus, ports, iommu, between_sockets)
