"""p2p: GPU-to-GPU bandwidth, measured once per session, held to a floor per topology class or
to a share of what its PCIe path can carry, and explained by the facts of that path.

One check per ordered pair (``p2p[0000:01:00.0->0000:81:00.0]``), classed ``same_numa`` or
``cross_numa`` by the GPUs' sysfs ``numa_node`` (NVML's topology where sysfs says -1); ``h2d`` and
``d2h`` floors add one check per GPU, ``concurrent`` one per flow of a ring in which every GPU
sends to its neighbour at once. The checks run after every other check but dmesg, so under
``--fix`` a live probe sees the fixed MaxReadReq. Every p2p check is slow (marked
``gpuhost_slow``): a health check with a deadline leaves them out.

Every record names the facts of its path that limit it (``p2p_explain``: ACS redirect,
MaxReadReq, a downtrained link, crossing sockets, IOMMU translation, ASPM, no P2P), read with
every other observation in one batch (``p2p_path``), and gives what its path carries
(``limit_gbps``) and the share of it measured (``fraction``). ``floors: {path: 0.85}`` holds each
pair to that share of its path's limit as negotiated (``of: capability``: as the hardware could
train), a cross-socket pair's path including the hop between sockets (``between_sockets``, in
GB/s); the class floor and the path floor combine, the higher wins. How the probe is chosen
and run: ``gpu/measure.py``. Captured (``capture_p2p``), each floor is 90% of the lowest
measured, rounded down.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from itertools import permutations
from typing import TYPE_CHECKING, Any

import msgspec

from ..gpu.measure import Measurer, SharedMeasurement, cache_key, probe_reads
from ..gpu.nvml import NvmlSource, NvmlUnavailable
from ..host import Host, HostError, Request
from ..result import BETWEEN_SOCKETS
from ..specmodel import EntryOptions, SpecContext, parse_expectation, section
from ..specmodel.matchers import Floor, finite
from . import USERSPACE, Check, Evidence, Fact, Facts, NoFix, Observation
from .gpus import GPUS
from .offers import p2p_bandwidth
from .p2p_explain import NO_PEER, Explained, Explainer, PathFloor, Tuning, flow_of
from .p2p_path import SOCKET_HOP_GBPS

if TYPE_CHECKING:  # capture's module loads when a capture asks
    from ..result import CheckResult
    from ..specmodel import Node
    from .capturing import Captured, Records

ORDER = 5_000  # after the checks whose fixes change bandwidth (pcie), before dmesg
PROBES = ("auto", "cuda", "nvbandwidth", "file:PATH")
CLASSES = ("same_numa", "cross_numa")
FLOORS = (*CLASSES, "h2d", "d2h")
PATH_KEYS = ("path", "of", "between_sockets")
"""``floors: {path: FRACTION, of: negotiated|capability}``: a share of the path's limit;
``between_sockets: GB/s``: what the hop between sockets carries (a part of a ``SYS`` pair's
path, ``p2p_path.SOCKET_HOP_GBPS`` where the spec does not say)."""
OF = ("negotiated", "capability")
KEYS = ("probe", "size", "floors", "warn_margin", "concurrent", "timeout")
MEASURE_TIMEOUT_S = 600.0
"""The longest a measurement may take (``timeout:`` in the section). Not a command's 120 s:
nvbandwidth's read test copies ``size`` at least 48 times per ordered pair (3 samples of a
16-copy loop), 13 GB at 256 MiB, so the 56 pairs of 8 GPUs take ~33 s at 22 GB/s (PCIe Gen4,
the 6x RTX A6000 of nvbandwidth issue 50) and ~180 s on links trained down to 4 GB/s: the
fault the check is for, which a 120 s limit would report as a hang. It stays below the 900 s
an xdist waiter (dmesg) gives the checks before it."""
_SIZE = re.compile(r"(\d+)\s*(B|KiB|MiB|GiB|KB|MB|GB)?\Z")
_UNITS = {None: 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30,
          "KB": 10**3, "MB": 10**6, "GB": 10**9}


class P2pSection(msgspec.Struct, frozen=True):
    probe: str
    path: str | None
    size: int
    floors: tuple[tuple[str, float], ...]
    warn_margin: float
    concurrent: float | None
    options: EntryOptions
    timeout: float = MEASURE_TIMEOUT_S
    path_floor: PathFloor | None = None
    tuning: Tuning = msgspec.field(default_factory=Tuning)
    """The spec's pcie and iommu keys, for the words of a remedy."""
    spec: str = ""
    """The spec file it came from: its measurement of the pairs is offered to the kinds of
    that spec (``offers.p2p_bandwidth``)."""

    def floor(self, name: str) -> float | None:
        return dict(self.floors).get(name)


def _number(node: Node, what: str) -> float:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    number = _finite(value)
    if number is None or number <= 0:
        raise node.error(f"{what} must be a positive number of GB/s, got {node.kind_name()}")
    return number


def _finite(value: object) -> float | None:
    """A YAML number as a finite float; None for anything else (an integer of 400 digits is no
    float: a floor that no bandwidth reaches is a mistake)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _seconds(node: Node) -> float:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1e9:
        raise node.error(f"p2p timeout must be a positive number of seconds, got "
                         f"{node.kind_name()}")
    return float(value)


def _size(node: Node) -> int:
    text = node.text("p2p size").strip()
    match = _SIZE.fullmatch(text)
    if not match or int(match.group(1)) == 0:
        raise node.error(f"p2p size must be a positive size like 256MiB (B, KiB, MiB, GiB, KB, "
                         f"MB, GB), got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _share(node: Node) -> float:
    """A percentage (``85%``) or a fraction (``0.85``); -1 for anything else."""
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return finite(value.strip()[:-1], "a percentage") / 100
        except ValueError:
            return -1.0
    number = _finite(value)
    return -1.0 if number is None else number


def _margin(node: Node) -> float:
    fraction = _share(node)
    if not 0 <= fraction < 1:
        raise node.error(f"p2p warn_margin must be a percentage like 5% (or a fraction "
                         f"0 <= x < 1), got {node.kind_name()}")
    return fraction


def _floors(node: Node) -> tuple[dict[str, float], PathFloor | None, float | None]:
    """The GB/s floors by name, ``path: FRACTION`` with ``of:`` beside them, and what the hop
    between sockets carries where the spec says."""
    floors: dict[str, float] = {}
    fraction: float | None = None
    of: Node | None = None
    between_sockets: float | None = None
    for name, floor in node.mapping("p2p floors"):
        if name == "between_sockets":
            between_sockets = _number(floor, "p2p floors between_sockets (what the hop "
                                             "between sockets carries a pair)")
        elif name == "path":
            fraction = _share(floor)
            if not 0 < fraction <= 1:
                raise floor.error(f"p2p floor path must be a share of the path's limit like 0.85 "
                                  f"or 85% (0 < x <= 1), got {floor.kind_name()}")
        elif name == "of":
            of = floor
            if floor.string("p2p floors of") not in OF:
                raise floor.error(f"p2p floors of must be one of: {', '.join(OF)}")
        elif name in FLOORS:
            floors[name] = _number(floor, f"p2p floor {name}")
        else:
            raise floor.key_error(f"unknown floor {name!r} in p2p floors; expected one of: "
                                  f"{', '.join((*FLOORS, *PATH_KEYS))}")
    if of is not None and fraction is None:
        raise of.error("p2p floors of: says what path: is a share of; add path: 0.85 beside it")
    if fraction is None:
        return floors, None, between_sockets
    return (floors, PathFloor(fraction, of is not None and of.string("of") == "capability"),
            between_sockets)


def _tuning(context: SpecContext) -> Tuning:
    """What the spec's pcie and iommu sections hold the path to (for the remedies' words)."""
    pcie, iommu = context.sections.get("pcie"), context.sections.get("iommu")
    keys = dict(pcie.mapping("pcie")) if pcie is not None and pcie.is_mapping else {}
    wanted = None
    if "max_read_request" in keys:
        from .pcie import KEYS as PCIE_KEYS

        spec = PCIE_KEYS["max_read_request"]
        wanted, _ = parse_expectation(keys["max_read_request"], context, spec.domain,
                                      what="pcie max_read_request", matchers=spec.matchers)
    return Tuning(wanted, "acs_redirect" in keys, "aspm" in keys, iommu is not None)


def _probe(node: Node) -> tuple[str, str | None]:
    text = node.string("p2p probe").strip()
    if text.startswith("file:"):
        path = text[5:].strip()
        if not path:
            raise node.error("p2p probe file: needs a path, like file:var/lib/nvbandwidth.txt")
        return "file", path
    if text not in PROBES[:3]:
        raise node.error(f"p2p probe {text!r} is not one of: {', '.join(PROBES)}")
    return text, None


class P2pKind:
    section = "p2p"
    scope = USERSPACE  # measured where the benchmark runs
    measured = True  # a bandwidth, not a setting: no two runs read the same number

    @staticmethod
    def capture(model: P2pSection, records: Records) -> Captured:
        return capture_p2p(model, records)

    def facts(self, section: P2pSection) -> Sequence[Fact[Any]]:
        return [GPUS]

    def parse(self, node: Node, context: SpecContext) -> P2pSection:
        given = section(node, "p2p", KEYS, context)
        probe, path, size, margin = "auto", None, 256 * 2**20, 0.0
        floors: dict[str, float] = {}
        path_floor: PathFloor | None = None
        between_sockets: float | None = None
        concurrent: float | None = None
        timeout = MEASURE_TIMEOUT_S
        for key, value in given.values.items():
            if key == "probe":
                probe, path = _probe(value)
            elif key == "size":
                size = _size(value)
            elif key == "warn_margin":
                margin = _margin(value)
            elif key == "timeout":
                timeout = _seconds(value)
            elif key == "floors":
                floors, path_floor, between_sockets = _floors(value)
            elif key == "concurrent":
                for name, floor in value.mapping("p2p concurrent"):
                    if name != "floor":
                        raise floor.unknown_key(name, "p2p concurrent", ("floor",))
                    concurrent = _number(floor, "p2p concurrent floor")
                if concurrent is None:
                    raise value.error("p2p concurrent needs a floor: {floor: GB/s}")
        if not floors and path_floor is None and concurrent is None:
            raise node.error(f"p2p needs floors (one or more of {', '.join(FLOORS)}, or path: "
                             "a share of the path's limit) or concurrent: {floor: GB/s}")
        if concurrent is not None and probe in ("nvbandwidth", "file"):
            raise node.error("p2p concurrent needs probe: cuda (or auto): nvbandwidth and saved "
                             "outputs measure one pair at a time")
        tuning = _tuning(context)
        if between_sockets is not None:
            tuning = msgspec.structs.replace(tuning, between_sockets=between_sockets)
        return P2pSection(probe, path, size, tuple(sorted(floors.items())), margin, concurrent,
                          given.options, timeout, path_floor, tuning, node.file)

    def expand(self, section: P2pSection, facts: Facts) -> Sequence[Check]:
        found = facts.get(GPUS)
        gpus = tuple(g.address for g in found)
        numa = {g.address: g.numa_node for g in found}
        classes = {(a, b): classify(a, b, numa, facts.nvml) for a, b in permutations(gpus, 2)}
        by_path = section.path_floor is not None
        wanted = {"pairs": by_path or any(section.floor(c) is not None for c in classes.values()),
                  "h2d": section.floor("h2d") is not None,
                  "d2h": section.floor("d2h") is not None,
                  "ring": section.concurrent is not None and len(gpus) >= 2}
        measurer = Measurer(section, facts.host, gpus, wanted)
        # the target too: identical servers have the same GPU addresses, and under xdist the
        # measurement is shared by name with every worker of the run
        key = cache_key([facts.host.describe(), section.probe, section.path, section.size,
                         gpus, wanted])
        shared = SharedMeasurement(key, measurer.measure, facts.shared_dir)
        if wanted["pairs"]:  # a collective's ring stands on its hops' (nccl), measured once
            facts.offer(p2p_bandwidth(section.spec), shared.get)
        explainer = Explainer(found, facts.nvml, section.tuning, kernel=facts.kernel)
        checks: list[Check] = []

        def add(kind: str, key: str, floor: float | None, label: str, cls: str) -> None:
            path = section.path_floor if kind == "p2p" else None
            probe = RateProbe(shared, key, cls, floor, probe_reads(section), explainer, path,
                              label, section.warn_margin)
            checks.append(Check(kind, key, Floor(floor or 0.0, label, section.warn_margin),
                                section.options, probe, order=ORDER, slow=True,
                                measured=True))

        if not gpus or (len(gpus) == 1 and not (wanted["h2d"] or wanted["d2h"])):
            problem = ("no NVIDIA GPU under sys/bus/pci/devices" if not gpus else
                       f"one GPU ({gpus[0]}): no pairs to measure; add floors h2d/d2h to hold "
                       "its host link to a floor")
            low = min(f for _, f in section.floors) if section.floors else section.concurrent
            checks.append(Check("p2p", None, Floor(low or 0.0, "p2p"), section.options,
                                Unmeasurable(problem), order=ORDER, slow=True, measured=True))
            return checks
        for name in ("h2d", "d2h"):
            floor = section.floor(name)
            if floor is not None:
                for gpu in gpus:
                    add(f"p2p.{name}", f"{name}[{gpu}]", floor, name, name)
        lowest = min((f for c, f in section.floors if c in CLASSES), default=None)
        for (a, b), cls in classes.items():
            floor = section.floor(cls)
            if cls not in CLASSES and lowest is not None:  # a class floor it cannot be held to
                checks.append(Check("p2p", f"{a}->{b}", Floor(lowest, "unclassified"),
                                    section.options, Unmeasurable(cls), order=ORDER, slow=True,
                                    measured=True))
            elif floor is not None or by_path:
                add("p2p", f"{a}->{b}", floor, cls if floor is not None else "path",
                    cls if cls in CLASSES else "unclassified")
        if section.concurrent is not None:
            for i, a in enumerate(gpus):
                b = gpus[(i + 1) % len(gpus)]
                add("p2p.concurrent", f"ring:{a}->{b}", section.concurrent, "concurrent",
                    "concurrent")
        return [_rekey(c) for c in checks]


def _rekey(check: Check) -> Check:
    """Ids show the pair or the GPU alone: ``p2p.h2d[0000:01:00.0]``, ``p2p.concurrent[A->B]``."""
    key = check.key
    if key is not None and key.startswith(("h2d[", "d2h[")):
        key = key[4:-1]
    elif key is not None and key.startswith("ring:"):
        key = key[5:]
    subjects = {"gpus": key.replace("->", " ")} if key is not None else {}
    return msgspec.structs.replace(check, key=key, subjects=subjects)


def classify(a: str, b: str, numa: Mapping[str, int], nvml: NvmlSource) -> str:
    """``same_numa``/``cross_numa``, or the reason the pair cannot be classed."""
    one, other = numa.get(a, -1), numa.get(b, -1)
    if one >= 0 and other >= 0:
        return CLASSES[0] if one == other else CLASSES[1]
    try:
        level = nvml.get().topology(a, b)
    except NvmlUnavailable as exc:
        level, why = None, f"NVML unavailable: {exc}"
    except HostError as exc:  # NVML has no such GPU, or the call failed
        level, why = None, f"NVML cannot tell: {exc}"
    else:
        why = "NVML does not report their topology"
    if level is not None:
        return CLASSES[1] if level == "SYS" else CLASSES[0]
    return (f"cannot class the pair: sysfs numa_node is {one} and {other}, and {why}")


class Unmeasurable(NoFix, msgspec.Struct, frozen=True):
    problem: str

    def observe(self, host: Host) -> Observation:
        return Observation(None, problem=self.problem)


class RateProbe(NoFix, msgspec.Struct, frozen=True):
    measurement: SharedMeasurement
    key: str
    cls: str
    floor: float | None
    probe_reads: tuple[Request, ...] = ()
    """What choosing and running the probe reads (where nvbandwidth is, a recorded output)."""
    explainer: Explainer | None = None
    path_floor: PathFloor | None = None
    label: str = ""
    margin: float = 0.0

    def reads(self) -> Sequence[Request]:
        path = self.explainer.reads() if self.explainer is not None else ()
        return (*path, *(() if self.measurement.done else self.probe_reads))

    def observe(self, host: Host) -> Observation:
        if self.explainer is not None:
            self.explainer.prepare(host)  # before a measurement's command, from the batch
        measured = self.measurement.get()
        details: dict[str, object] = {"class": self.cls, "floor": self.floor,
                                      "probe": measured.source}
        if self.explainer is not None:  # what --gpuhost-topology's pairs take too
            details[BETWEEN_SOCKETS] = self.explainer.tuning.between_sockets
        evidence = [Evidence("measured by", measured.source)]
        evidence += [Evidence("note", note) for note in measured.notes]
        rate = measured.rates.get(self.key)
        if rate is None:
            return Observation(None, tuple(evidence), f"{measured.source} has no result for "
                               f"{self.key} (concurrent flows need probe: cuda)",
                               details=details)
        explained = self.explainer.explain(host, flow_of(self.key), rate.problem) \
            if self.explainer is not None else None
        if explained is not None:
            details.update(explained.details(rate.gbps))
            evidence += explained.evidence()
        if rate.gbps is None:
            return Observation(None, tuple(evidence), _no_rate(rate.problem, explained),
                               details={**details, "gbps": None})
        expect = None
        if self.path_floor is not None and explained is not None:
            expect = explained.floor(self.floor, self.label, self.margin, self.path_floor)
            details["floor"] = expect.floor
        shown = f"{rate.gbps:.2f}"
        evidence.insert(1 + len(measured.notes), Evidence(self.key, f"{shown} GB/s"))
        return Observation(shown, tuple(evidence), None, details={**details, "gbps": rate.gbps},
                           culprits=explained.culprits() if explained is not None else None,
                           expect=expect)


def _no_rate(problem: str | None, explained: Explained | None) -> str | None:
    """Why a pair has no rate, said first where its peer path is unsupported: a tool's own
    words (``nvbandwidth v0.8 reported N/A for device 0 -> 5``) do not say why."""
    unsupported = next((c for c in explained.causes if c.cause == "p2p_unsupported"), None) \
        if explained is not None else None
    if unsupported is None or problem is None or problem.startswith(NO_PEER):
        return problem
    return f"P2P is unsupported on this pair: {unsupported.words} ({problem})"


P2P_SHARE = 0.9


def p2p_floor(lowest: float) -> float | int:
    """90% of the lowest measurement, rounded down: to a whole GB/s, or to 0.1 below 1."""
    share = lowest * P2P_SHARE
    return math.floor(share) if share >= 1 else math.floor(share * 10) / 10


def _size_text(size: int) -> str | int:
    for unit, factor in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return size


def capture_p2p(model: P2pSection, records: Records) -> Captured:
    """The p2p section as captured: a floor per class at 90% of the lowest pair measured,
    rounded down (to a whole GB/s, or to 0.1 below 1), a path floor at 90% of the lowest share
    of its path's limit; the probe, size and margin as the spec had them."""
    from .capturing import Captured, when_false

    out = Captured()
    every = [r for kind in ("p2p", "p2p.h2d", "p2p.d2h", "p2p.concurrent")
             for r in records.get(kind, ())]
    if when_false(every, model.options):
        out.entries.update(_p2p_settings(model, dict(model.floors), model.concurrent,
                                         model.path_floor.fraction if model.path_floor else None))
        return out
    lone = [r for r in records.get("p2p", ()) if r.key is None]
    if lone:
        out.leave_out("p2p", lone[0].message)
        return out
    pairs = records.get("p2p", ())
    unclassed = [r for r in pairs if "class" not in r.details]
    floors: dict[str, float | int] = {}
    for name in FLOORS:
        if model.floor(name) is None:
            continue
        if name in CLASSES:
            found = [r for r in pairs if r.details.get("class") == name]
            if unclassed:
                out.leave_out(f"p2p floor {name}", f"{unclassed[0].key}: {unclassed[0].message}")
                continue
        else:
            found = list(records.get(f"p2p.{name}", ()))
        lowest = _lowest(found, f"p2p floor {name}", out)
        if lowest is not None:
            floors[name] = p2p_floor(lowest)
    concurrent = None
    if model.concurrent is not None:
        lowest = _lowest(list(records.get("p2p.concurrent", ())), "p2p concurrent", out)
        concurrent = p2p_floor(lowest) if lowest is not None else None
    usable = {name: value for name, value in floors.items() if value > 0}
    share = _path_share(model, pairs, out)
    if not usable and not concurrent and share is None:
        return out
    out.entries.update(_p2p_settings(model, usable, concurrent, share))
    return out


def _path_share(model: P2pSection, pairs: Sequence[CheckResult], out: Captured
                ) -> float | None:
    """``floors: path``: 90% of the lowest share of its path's limit a pair reached (of the
    limit the spec names: as negotiated, or as capable), rounded down to a hundredth."""
    if model.path_floor is None:
        return None
    name = "capable_fraction" if model.path_floor.capability else "fraction"
    missing = [r for r in pairs if not isinstance(r.details.get(name), (int, float))]
    if not pairs or missing:
        where = f"{missing[0].key}: {missing[0].message}" if missing else "no pair measured"
        out.leave_out("p2p floor path", where)
        return None
    share = math.floor(min(float(r.details[name]) for r in pairs) * P2P_SHARE * 100) / 100
    if share <= 0:
        out.leave_out("p2p floor path", "a pair measured next to nothing of its path's limit")
        return None
    return share


def _lowest(found: Sequence[CheckResult], label: str, out: Captured) -> float | None:
    from .capturing import problem

    why = problem(found)
    if why is not None:
        where = next((f"{r.key}: " for r in found if r.observed is None and r.key), "")
        out.leave_out(label, where + why)
        return None
    return min(float(str(r.observed)) for r in found)


def _p2p_settings(model: P2pSection, floors: Mapping[str, float | int],
                  concurrent: float | int | None, share: float | None = None
                  ) -> dict[str, Any]:
    from .capturing import options_of

    settings: dict[str, Any] = {
        "probe": f"file:{model.path}" if model.probe == "file" else model.probe,
        "size": _size_text(model.size)}
    path = model.path_floor if share is not None else None
    shares = {"path": share, **({"of": "capability"} if path.capability else {})} \
        if path is not None else {}
    hop = model.tuning.between_sockets
    stated = {"between_sockets": hop} if hop != SOCKET_HOP_GBPS else {}
    if floors or shares:
        settings["floors"] = {**floors, **shares, **stated}
    if concurrent:
        settings["concurrent"] = {"floor": concurrent}
    if model.warn_margin:
        settings["warn_margin"] = f"{model.warn_margin * 100:g}%"
    return {**settings, **options_of(model.options)}
