"""Why a measured P2P or host-copy rate is what it is: every fact on its PCIe path that limits
it, each with where it is, what was read, what was expected and what it costs.

Causes, in the order of their usual cost (``explain`` lists them by estimated cost, largest
first):

- ``p2p_unsupported``: NVML's P2P read status for the pair is not ok, or the probe could not
  enable peer access: no peer path at all.
- ``link_downtrained``: a link of the path runs below what both its ends can do (Link Status
  below the narrower Link Capabilities, or a Target Link Speed that caps it). Its cost is
  exact: what the path carries as negotiated against as capable.
- ``acs_redirect``: ACS P2P Request Redirect, Completion Redirect or Egress Control on a
  bridge of the path: peer traffic detours through the root complex.
- ``max_read_request``: the reading GPU's MaxReadReq below the spec's ``pcie
  max_read_request`` (4096 where the spec has none): fewer bytes in flight per request.
- ``cross_socket``: the pair's GPUs are on different NUMA nodes (``SYS``): the sockets'
  interconnect carries it.
- ``iommu_translated``: the IOMMU translates the GPUs' DMA (group type DMA or DMA-FQ, not
  identity, ``iommu=pt``).
- ``aspm``: ASPM L0s or L1 enabled at an end of a link of the path.

The costs other than a downtrained link's are estimates, for the order only: ACS redirect 38%,
MaxReadReq 512 of 4096 12% (33% on a pair across sockets), crossing sockets 22%, from the
rates recorded on the 8-GPU Blackwell box of the example host; the IOMMU's 10% and ASPM's 2%
are not measured. The measurement is the truth; the diagnosis says what to look at.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import permutations
from typing import Any

import msgspec

from ..gpu.nvml import NvmlSource, NvmlUnavailable, RecordedNvml
from ..host import Host, HostError, Request
from ..linux.pciext import acs_names
from ..specmodel.matchers import Expectation, Floor
from . import Evidence
from .gpus import Gpu
from .p2p_path import HOST, SOCKET_HOP_GBPS, PairPath, PathFacts, path_reads, read_path_facts

CAUSES = ("p2p_unsupported", "link_downtrained", "acs_redirect", "max_read_request",
          "cross_socket", "iommu_translated", "aspm")
LOSS = {"p2p_unsupported": 1.0, "acs_redirect": 0.38, "max_read_request": 0.12,
        "max_read_request_sys": 0.33, "cross_socket": 0.22, "iommu_translated": 0.10,
        "aspm": 0.02}
"""Estimated share of a pair's rate each cause costs (see the module's docstring)."""
DEFAULT_MAX_READ_REQUEST = 4096
TRANSLATED = ("DMA", "DMA-FQ")
NO_REDIRECT = acs_names(0)
NO_PEER = ("P2P access is not possible", "P2P is not available")
"""How a probe's reason for a pair without a rate begins when peer access was refused."""


class Tuning(msgspec.Struct, frozen=True):
    """What the spec holds a path's settings to elsewhere: the words of a remedy say whether
    ``--fix`` already covers it."""

    max_read_request: Expectation | None = None
    acs_redirect: bool = False
    aspm: bool = False
    iommu: bool = False
    between_sockets: float = SOCKET_HOP_GBPS
    """GB/s the hop between sockets carries a pair (``p2p: floors: {between_sockets: ...}``):
    part of a ``SYS`` pair's path, its limit and its path floor."""


class PathFloor(msgspec.Struct, frozen=True):
    """``floors: {path: FRACTION, of: negotiated|capability}``."""

    fraction: float
    capability: bool = False


class Flow(msgspec.Struct, frozen=True):
    """What a record measured: ``pair`` or ``ring`` (GPU to GPU), ``h2d``, ``d2h``."""

    kind: str
    source: str
    target: str

    @property
    def peer(self) -> bool:
        return self.kind in ("pair", "ring")

    @property
    def reader(self) -> str | None:
        """The GPU whose copy engine reads (its MaxReadReq bounds the copy); d2h writes."""
        return None if self.kind == "d2h" else self.target

    @property
    def gpus(self) -> tuple[str, ...]:
        return tuple(g for g in (self.source, self.target) if g != HOST)


def flow_of(key: str) -> Flow:
    """The flow of a measurement's key: ``A->B``, ``ring:A->B``, ``h2d[A]``, ``d2h[A]``."""
    if key.startswith(("h2d[", "d2h[")):
        gpu = key[4:-1]
        return Flow("h2d", HOST, gpu) if key.startswith("h2d") else Flow("d2h", gpu, HOST)
    ring = key.startswith("ring:")
    source, _, target = key.removeprefix("ring:").partition("->")
    return Flow("ring" if ring else "pair", source, target)


class Cause(msgspec.Struct, frozen=True):
    cause: str
    at: str
    observed: str
    expected: str
    effect: str
    remedy: str
    loss: float
    subject: str
    """The cause as a sentence begins: ``ACS redirect on 0000:00:01.1 (root port of the
    target)``."""

    @property
    def words(self) -> str:
        """What the failure message says of it: what, where, what it does, what to do."""
        return f"{self.subject} {self.effect}; {self.remedy}"

    def as_dict(self) -> dict[str, object]:
        return {"cause": self.cause, "at": self.at, "observed": self.observed,
                "expected": self.expected, "effect": self.effect, "remedy": self.remedy,
                "loss": round(self.loss, 3)}


class Explained(msgspec.Struct, frozen=True):
    path: PairPath
    causes: tuple[Cause, ...]
    notes: tuple[str, ...] = ()
    """What could not be judged (an unreadable config space, NVML unavailable)."""

    def culprits(self) -> str | None:
        """The top cause in words, then the others by name (the failure's first line)."""
        if not self.causes:
            return None
        top, rest = self.causes[0], self.causes[1:]
        # each by where it is: the same cause on another bridge is another cause
        more = f" (and {len(rest)} more: {'; '.join(f'{c.cause} at {c.at}' for c in rest)})" \
            if rest else ""
        return top.words + more

    def details(self, gbps: float | None) -> dict[str, Any]:
        found, capable = self.path.limit(), self.path.limit(capability=True)
        limit = round(found[0], 2) if found is not None else None
        fraction = round(gbps / found[0], 3) if found is not None and gbps else None
        details: dict[str, Any] = {"topology": self.path.level, "limit_gbps": limit,
                                   "fraction": fraction,
                                   "capable_fraction": round(gbps / capable[0], 3)
                                   if capable is not None and gbps else None,
                                   "explain": [c.as_dict() for c in self.causes],
                                   "path": self.path.as_dict()}
        if self.notes:
            details["explain_notes"] = list(self.notes)
        return details

    def evidence(self) -> tuple[Evidence, ...]:
        found = self.path.limit()
        hops = [self.path.source, *(f"{b} ({role})" for b, role in self.path.bridges),
                self.path.target]
        links = self.path.links_limit()
        limit = "" if found is None or links is None else \
            f"; carries {found[0]:.2f} GB/s (narrowest link: " \
            f"{links[1].negotiated.describe()} at {links[1].lower}, MPS " \
            f"{self.path.max_payload})" if found[1] is not None else \
            f"; carries {found[0]:.2f} GB/s (the hop between sockets, p2p floors " \
            f"between_sockets; its links {links[0]:.2f}: {links[1].negotiated.describe()} at " \
            f"{links[1].lower}, MPS {self.path.max_payload})"
        shown = [Evidence(f"path ({self.path.level})", " > ".join(hops) + limit)]
        shown += [Evidence(f"explain: {c.cause}", f"{c.at}: {c.observed} (expected "
                                                  f"{c.expected}): {c.effect}")
                  for c in self.causes]
        return tuple(shown) + tuple(Evidence("explain: not judged", n) for n in self.notes)

    def floor(self, floor: float | None, label: str, margin: float,
              path: PathFloor | None) -> Floor:
        """The class floor, or the path floor where it is higher (the higher wins)."""
        if path is None:
            return Floor(floor or 0.0, label, margin)
        found = self.path.limit(path.capability)
        if found is None:
            problems = "; ".join(self.path.problems) or "no link registers on the path"
            raise HostError(f"the path floor needs the link registers of the path: {problems}")
        limit, link = found
        value = round(path.fraction * limit, 2)
        if floor is not None and floor >= value:
            return Floor(floor, label, margin)
        narrowest = "the hop between sockets" if link is None else \
            f"{(link.capable if path.capability else link.negotiated).describe()} at MPS " \
            f"{self.path.max_payload}"
        return Floor(value, f"path: {path.fraction:.0%} of {limit:.2f} GB/s, {narrowest}"
                            + (" as capable" if path.capability else ""), margin)


class Explainer:
    """Explains the flows of one expansion: its GPUs' paths, NVML, and the spec's tuning.
    ``kernel``: the machine whose hardware a container's GPUs are (its host), where their
    paths are read: inside, config space stops at its 64-byte header (no ACS, no MaxReadReq),
    and the host's PCIe fixes are what the measurement saw."""

    def __init__(self, gpus: Sequence[Gpu], nvml: NvmlSource | None, tuning: Tuning, *,
                 kernel: Host | None = None) -> None:
        self.gpus = tuple(gpus)
        self.kernel = kernel
        self.nvml = nvml
        self.tuning = tuning
        self._reads = path_reads(self.gpus)
        self._addresses = {gpu.address for gpu in self.gpus}
        self._facts: PathFacts | None = None
        self._status: dict[tuple[str, str], str] = {}
        self._nvml_note: str | None = None
        self._path_note: str | None = None

    def reads(self) -> tuple[Request, ...]:
        """The paths' reads and a recorded NVML's files, until they were read: with every
        other check's, one batch."""
        if self._facts is not None:
            return ()
        paths = self._reads if self.kernel is None else ()  # else read on the host
        return (*paths, *(RecordedNvml.reads if self.nvml else ()))

    def prepare(self, host: Host) -> PathFacts:
        """Read the paths and NVML's P2P status of every pair, once: before the measurement,
        whose command makes a cached host forget the run's batch (another read of them would
        be another round trip to a remote target). The p2p checks run after every fix and fix
        nothing, so what the first of them reads holds for the others."""
        if self._facts is None:
            self._facts = self._read_paths(host)
            if self.nvml is not None:
                try:
                    nvml = self.nvml.get()
                    self._status = {(a, b): nvml.p2p_read_status(a, b)
                                    for a, b in permutations(self._addresses, 2)}
                except (NvmlUnavailable, HostError) as exc:
                    self._nvml_note = f"NVML's P2P status: {exc}"
        return self._facts

    @property
    def prepared(self) -> bool:
        """Whether ``prepare`` has read the paths (a later read of them costs nothing)."""
        return self._facts is not None

    def p2p_status(self, source: str, target: str) -> str:
        """NVML's P2P read status of the pair (``ok`` where NVML was not asked or said so),
        once ``prepare`` has read it."""
        return self._status.get((source, target), "ok")

    def _read_paths(self, host: Host) -> PathFacts:
        """The paths as the host of a container reads them (live: after its fixes), else as
        ``host`` does; a host that cannot be read leaves what ``host`` reads, saying why."""
        if self.kernel is not None:
            try:
                return read_path_facts(self.kernel, self.gpus, self._reads,
                                       self.tuning.between_sockets)
            except HostError as exc:
                self._path_note = f"the host's PCIe paths could not be read ({exc})"
        return read_path_facts(host, self.gpus, self._reads, self.tuning.between_sockets)

    def explain(self, host: Host, flow: Flow, problem: str | None = None) -> Explained:
        facts = self.prepare(host)
        path = facts.pair(flow.source, flow.target) if flow.peer else \
            facts.host_path(flow.target if flow.kind == "h2d" else flow.source)
        notes = [*((self._path_note,) if self._path_note else ()), *path.problems]
        causes = self._unsupported(flow, problem, notes) if flow.peer else []
        causes += self._links(path)
        if flow.peer:
            causes += self._acs(path)
        causes += self._read_request(path, flow)
        if flow.peer and path.level == "SYS":
            numa = path.route.numa if path.route is not None else (-1, -1)
            hosts = path.route.host_bridges if path.route is not None else ("?", "?")
            causes.append(Cause("cross_socket", f"{hosts[0]} -> {hosts[1]}",
                                f"SYS: NUMA node {numa[0]} -> {numa[1]}",
                                "one NUMA node (PIX, PXB, PHB or NODE)",
                                "crosses the sockets' interconnect",
                                "the board decides it: keep the pair's work on GPUs of one "
                                "socket; the path's limit counts the hop between sockets at "
                                f"{path.between_sockets:g} GB/s (p2p floors between_sockets: "
                                "the board's figure)",
                                LOSS["cross_socket"],
                                f"the pair (NUMA node {numa[0]} -> {numa[1]}, SYS)"))
        causes += self._iommu(facts, flow, notes)
        causes += self._aspm(path)
        order = {id(c): i for i, c in enumerate(causes)}
        ranked = sorted(causes, key=lambda c: (-c.loss, CAUSES.index(c.cause), order[id(c)]))
        return Explained(path, tuple(ranked), tuple(dict.fromkeys(notes)))

    def _unsupported(self, flow: Flow, problem: str | None, notes: list[str]) -> list[Cause]:
        found: list[Cause] = []
        remedy = ("enable P2P: the GPU model and driver must support it, and the platform's "
                  "firmware allow it (ACS, IOMMU, Above 4G Decoding)")
        if self._nvml_note is not None:
            notes.append(self._nvml_note)
        status = self._status.get((flow.source, flow.target), "ok")
        if status != "ok":
            found.append(Cause("p2p_unsupported", f"{flow.source}->{flow.target}", status, "ok",
                               "leaves this pair no peer path", remedy, LOSS["p2p_unsupported"],
                               f"NVML's P2P read status ({status})"))
        if problem and problem.startswith(NO_PEER):
            found.append(Cause("p2p_unsupported", "the probe", problem, "peer access enabled",
                               "leaves this pair no peer path", remedy,
                               LOSS["p2p_unsupported"], "the probe's refused peer access"))
        return found

    def _links(self, path: PairPath) -> list[Cause]:
        mps = path.max_payload or 256
        capable = path.limit(capability=True)
        found = []
        for link in path.links:
            if not link.downtrained:
                continue
            now, can = link.negotiated, link.capable
            full = capable[0] if capable is not None else can.gbps(mps)
            loss = 1 - min(full, now.gbps(mps)) / full
            capped = link.target_speed is not None and link.target_speed < can.speed and \
                now.speed < can.speed
            observed = now.describe() + (f" (Target Link Speed {link.target_speed:g} GT/s on "
                                         f"{link.upper})" if capped else "")
            remedy = (f"set the slot of {link.upper} to its full speed (Auto) in the firmware "
                      "setup" if capped else "reseat the card and check the riser and slot "
                      "(hardware: no setting fixes it)")
            found.append(Cause("link_downtrained", f"{link.lower} - {link.upper}", observed,
                               can.describe(), f"leaves the path {now.gbps(mps):.2f} of "
                               f"{full:.2f} GB/s", remedy, loss,
                               f"the link of {link.lower} to {link.upper}, {now.describe()} "
                               f"of {can.describe()},"))
        return found

    def _acs(self, path: PairPath) -> list[Cause]:
        remedy = ("--fix clears it" if self.tuning.acs_redirect else
                  "add pcie: {acs_redirect: off} to the spec and --fix clears it")
        found = []
        for bridge, role in path.bridges[::-1]:  # the reader's side first: its requests
            port = path.ports.get(bridge)
            if port is None or port.acs is None or not port.acs.redirect:
                continue
            found.append(Cause("acs_redirect", bridge, port.acs.describe(),
                               NO_REDIRECT, "sends this pair through the root complex",
                               remedy, LOSS["acs_redirect"],
                               f"ACS redirect on {bridge} ({role})"))
        return found

    def _read_request(self, path: PairPath, flow: Flow) -> list[Cause]:
        reader = flow.reader
        port = path.ports.get(reader) if reader is not None else None
        if port is None or port.registers is None:
            return []
        size = port.registers.max_read_request
        wanted = self.tuning.max_read_request
        if wanted is not None:
            ok, expected = wanted.judge(str(size)).ok, wanted.describe()
        else:
            ok, expected = size >= DEFAULT_MAX_READ_REQUEST, f">= {DEFAULT_MAX_READ_REQUEST}"
        if ok:
            return []
        base = LOSS["max_read_request_sys" if path.level == "SYS" else "max_read_request"]
        steps = math.log2(DEFAULT_MAX_READ_REQUEST / size) / 3 if size else 1.0
        remedy = ("--fix raises it" if wanted is not None else
                  "add pcie: {max_read_request: 4096} to the spec and --fix raises it")
        role = "the reading GPU" if flow.peer else "the GPU"
        return [Cause("max_read_request", reader or "", str(size), expected,
                      f"keeps fewer bytes in flight than {DEFAULT_MAX_READ_REQUEST} would",
                      remedy, min(0.9, base * max(steps, 0.0)),
                      f"MaxReadReq {size} on {reader} ({role})")]

    def _iommu(self, facts: PathFacts, flow: Flow, notes: list[str]) -> list[Cause]:
        translated = []
        for gpu in flow.gpus:
            group, kind = facts.iommu.get(gpu, (None, "off"))
            if kind is None:
                notes.append(f"the IOMMU group type of {gpu} (group {group}) is unreadable")
            elif kind in TRANSLATED:
                translated.append(f"{gpu} (group {group}: {kind})")
        if not translated:
            return []
        remedy = ("--fix --fix-persist writes iommu=pt for the next boot" if self.tuning.iommu
                  else "boot with iommu=pt (iommu: {gpu_groups: identity} and --fix "
                       "--fix-persist write it), then reboot")
        observed = ", ".join(dict.fromkeys(t.rsplit(": ", 1)[1].rstrip(")") for t in translated))
        return [Cause("iommu_translated", ", ".join(translated), observed,
                      "identity (iommu=pt)", "adds an address translation to every DMA of "
                      "this copy", remedy, LOSS["iommu_translated"],
                      f"IOMMU translation for {', '.join(translated)}")]

    def _aspm(self, path: PairPath) -> list[Cause]:
        found = []
        for link in path.links:
            gpu = link.lower in self._addresses
            remedy = ("--fix turns it off" if gpu and self.tuning.aspm else
                      "add pcie: {aspm: off} to the spec and --fix turns it off" if gpu else
                      "boot with pcie_aspm=off or disable ASPM in the firmware setup")
            for end, state in link.aspm:
                found.append(Cause("aspm", end, state, "disabled",
                                   f"lets the link of {link.lower} to {link.upper} sleep: each "
                                   "burst waits for it to wake", remedy, LOSS["aspm"],
                                   f"ASPM {state} on {end}"))
        return found
