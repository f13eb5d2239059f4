"""p2p: GPU-to-GPU bandwidth, measured once per session and held to a floor per topology class.

One check per ordered pair (``p2p[0000:01:00.0->0000:81:00.0]``), classed ``same_numa`` or
``cross_numa`` by the GPUs' sysfs ``numa_node`` (NVML's topology where sysfs says -1); ``h2d`` and
``d2h`` floors add one check per GPU, ``concurrent`` one per flow of a ring in which every GPU
sends to its neighbour at once. The checks run after every other check but dmesg, so under
``--fix`` a live probe sees the fixed MaxReadReq. Every p2p check is slow (marked
``gpuhost_slow``): a health check with a deadline leaves them out.

Probes: ``cuda`` (ours, cuda-python), ``nvbandwidth`` (the binary, ``-j``), ``file:PATH`` (a saved
output; a relative PATH is under the host root, an absolute one is read as is) and ``auto``: on
``/``, cuda if cuda-python is installed, else nvbandwidth if found; on any other root (a fake
tree) an ``nvbandwidth`` under the root, else a recorded output in ``var/lib/pytest-gpuhost/``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import permutations
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..gpu.bandwidth import (
    D2H_TEST,
    H2D_TEST,
    P2P_TESTS,
    Measurements,
    ParseError,
    parse_output,
    to_measurements,
)
from ..gpu.cudaprobe import INSTALL_HINT as CUDA_INSTALL_HINT
from ..gpu.cudaprobe import (
    CudaBandwidth,
    CudaError,
    CudaUnavailable,
    cuda_available,
    load_runtime,
    measure_within,
)
from ..gpu.measure import SharedMeasurement, cache_key
from ..gpu.nvml import NvmlSource, NvmlUnavailable
from ..host import CommandTimeout, Host, HostError, Read, Request, Which
from ..progress import report_progress
from ..spec import EntryOptions, Node, SpecContext, section
from ..spec.matchers import Floor
from . import USERSPACE, Check, Evidence, Fact, Facts, NoFix, Observation
from .gpus import GPUS

if TYPE_CHECKING:  # capture's module loads when a capture asks
    from .capturing import Captured, Records

ORDER = 5_000  # after the checks whose fixes change bandwidth (pcie), before dmesg
RECORDED_DIR = "var/lib/pytest-gpuhost"
RECORDED = ("nvbandwidth.json", "nvbandwidth.txt", "p2pBandwidthLatencyTest.txt")
PROBES = ("auto", "cuda", "nvbandwidth", "file:PATH")
CLASSES = ("same_numa", "cross_numa")
FLOORS = (*CLASSES, "h2d", "d2h")
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


@dataclass(frozen=True)
class P2pSection:
    probe: str
    path: str | None
    size: int
    floors: tuple[tuple[str, float], ...]
    warn_margin: float
    concurrent: float | None
    options: EntryOptions
    timeout: float = MEASURE_TIMEOUT_S

    def floor(self, name: str) -> float | None:
        return dict(self.floors).get(name)


def _number(node: Node, what: str) -> float:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise node.error(f"{what} must be a positive number of GB/s, got {node.kind_name()}")
    return float(value)


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


def _margin(node: Node) -> float:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            fraction = float(value.strip()[:-1]) / 100
        except ValueError:
            fraction = -1.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        fraction = float(value)
    else:
        fraction = -1.0
    if not 0 <= fraction < 1:
        raise node.error(f"p2p warn_margin must be a percentage like 5% (or a fraction "
                         f"0 <= x < 1), got {node.kind_name()}")
    return fraction


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
        from .p2p_capture import capture_p2p

        return capture_p2p(model, records)

    def facts(self, section: P2pSection) -> Sequence[Fact[Any]]:
        return [GPUS]

    def parse(self, node: Node, context: SpecContext) -> P2pSection:
        given = section(node, "p2p", KEYS, context)
        probe, path, size, margin = "auto", None, 256 * 2**20, 0.0
        floors: dict[str, float] = {}
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
                for name, floor in value.mapping("p2p floors"):
                    if name not in FLOORS:
                        raise floor.key_error(f"unknown floor {name!r} in p2p floors; expected "
                                              f"one of: {', '.join(FLOORS)}")
                    floors[name] = _number(floor, f"p2p floor {name}")
            elif key == "concurrent":
                for name, floor in value.mapping("p2p concurrent"):
                    if name != "floor":
                        raise floor.unknown_key(name, "p2p concurrent", ("floor",))
                    concurrent = _number(floor, "p2p concurrent floor")
                if concurrent is None:
                    raise value.error("p2p concurrent needs a floor: {floor: GB/s}")
        if not floors and concurrent is None:
            raise node.error(f"p2p needs floors (one or more of {', '.join(FLOORS)}) or "
                             "concurrent: {floor: GB/s}")
        if concurrent is not None and probe in ("nvbandwidth", "file"):
            raise node.error("p2p concurrent needs probe: cuda (or auto): nvbandwidth and saved "
                             "outputs measure one pair at a time")
        options = given.options
        return P2pSection(probe, path, size, tuple(sorted(floors.items())), margin, concurrent,
                          options, timeout)

    def expand(self, section: P2pSection, facts: Facts) -> Sequence[Check]:
        found = facts.get(GPUS)
        gpus = tuple(g.address for g in found)
        numa = {g.address: g.numa_node for g in found}
        classes = {(a, b): classify(a, b, numa, facts.nvml) for a, b in permutations(gpus, 2)}
        wanted = {"pairs": any(section.floor(c) is not None for c in classes.values()),
                  "h2d": section.floor("h2d") is not None,
                  "d2h": section.floor("d2h") is not None,
                  "ring": section.concurrent is not None and len(gpus) >= 2}
        measurer = Measurer(section, facts.host, gpus, wanted)
        # the target too: identical servers have the same GPU addresses, and under xdist the
        # measurement is shared by name with every worker of the run
        key = cache_key([facts.host.describe(), section.probe, section.path, section.size,
                         gpus, wanted])
        shared = SharedMeasurement(key, measurer.measure, facts.shared_dir)
        checks: list[Check] = []

        def add(kind: str, key: str | None, floor: float, label: str, cls: str) -> None:
            expect = Floor(floor, label, section.warn_margin)
            checks.append(Check(kind, key, expect, section.options,
                                RateProbe(shared, key or "", cls, floor, probe_reads(section)),
                                order=ORDER, slow=True, measured=True))

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
        for (a, b), cls in classes.items():
            floor = section.floor(cls)
            if floor is not None:
                add("p2p", f"{a}->{b}", floor, cls, cls)
            elif cls not in CLASSES:
                lowest = min((f for c, f in section.floors if c in CLASSES), default=None)
                if lowest is not None:
                    checks.append(Check("p2p", f"{a}->{b}", Floor(lowest, "unclassified"),
                                        section.options, Unmeasurable(cls), order=ORDER,
                                        slow=True, measured=True))
        if section.concurrent is not None:
            for i, a in enumerate(gpus):
                b = gpus[(i + 1) % len(gpus)]
                add("p2p.concurrent", f"ring:{a}->{b}", section.concurrent, "concurrent",
                    "concurrent")
        return [_rekey(c) for c in checks]


def probe_reads(section: P2pSection) -> tuple[Request, ...]:
    """The host reads of choosing the probe (``auto``) and of a saved output under the root."""
    if section.probe == "file":
        relative = section.path is not None and not Path(section.path).is_absolute()
        return (Read(section.path),) if relative and section.path else ()
    if section.probe == "nvbandwidth":
        return (Which("nvbandwidth"),)
    if section.probe == "auto":
        return (Which("nvbandwidth"), *(Read(f"{RECORDED_DIR}/{name}") for name in RECORDED))
    return ()


def _rekey(check: Check) -> Check:
    """Ids show the pair or the GPU alone: ``p2p.h2d[0000:01:00.0]``, ``p2p.concurrent[A->B]``."""
    key = check.key
    if key is not None and key.startswith(("h2d[", "d2h[")):
        key = key[4:-1]
    elif key is not None and key.startswith("ring:"):
        key = key[5:]
    subjects = {"gpus": key.replace("->", " ")} if key is not None else {}
    return dataclasses.replace(check, key=key, subjects=subjects)


NVBANDWIDTH_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
SLOW_HINT = ("links slower than expected make it slower (try a smaller size, or raise the p2p "
             "section's timeout: SECONDS); if a GPU fell off the bus, the kernel log says so "
             "(Xid 79)")


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


@dataclass(frozen=True)
class Unmeasurable(NoFix):
    problem: str

    def observe(self, host: Host) -> Observation:
        return Observation(None, problem=self.problem)


@dataclass(frozen=True)
class RateProbe(NoFix):
    measurement: SharedMeasurement
    key: str
    cls: str
    floor: float
    probe_reads: tuple[Request, ...] = ()
    """What choosing and running the probe reads (where nvbandwidth is, a recorded output)."""

    def reads(self) -> Sequence[Request]:
        return () if self.measurement.done else self.probe_reads

    def observe(self, host: Host) -> Observation:
        measured = self.measurement.get()
        details: dict[str, object] = {"class": self.cls, "floor": self.floor,
                                      "probe": measured.source}
        evidence = [Evidence("measured by", measured.source)]
        evidence += [Evidence("note", note) for note in measured.notes]
        rate = measured.rates.get(self.key)
        if rate is None:
            return Observation(None, tuple(evidence), f"{measured.source} has no result for "
                               f"{self.key} (concurrent flows need probe: cuda)",
                               details=details)
        if rate.gbps is None:
            return Observation(None, tuple(evidence), rate.problem,
                               details={**details, "gbps": None})
        shown = f"{rate.gbps:.2f}"
        evidence.append(Evidence(self.key, f"{shown} GB/s"))
        return Observation(shown, tuple(evidence), None, details={**details, "gbps": rate.gbps})


class Measurer:
    """Resolves the spec's probe on this host and takes every wanted measurement."""

    def __init__(self, section: P2pSection, host: Host, gpus: tuple[str, ...],
                 wanted: Mapping[str, bool]) -> None:
        self.section = section
        self.host = host
        self.gpus = gpus
        self.wanted = dict(wanted)

    @property
    def real(self) -> bool:
        return self.host.local_machine()

    def measure(self) -> Measurements:
        probe = self.section.probe
        if probe == "file":
            assert self.section.path is not None
            return self.from_file(self.section.path)
        if probe == "cuda":
            return self.cuda()
        if probe == "nvbandwidth":
            return self.nvbandwidth()
        if self.real and cuda_available():
            return self.cuda()
        if self.host.which("nvbandwidth") is not None:
            return self.nvbandwidth()
        if not self.real:
            for name in RECORDED:
                if self.host.exists(f"{RECORDED_DIR}/{name}"):
                    return self.from_file(f"{RECORDED_DIR}/{name}")
            raise HostError(f"probe auto: the host root {self.host.describe()} is not this "
                            "machine and has no nvbandwidth under it nor a recorded output in "
                            f"{RECORDED_DIR}/ ({', '.join(RECORDED)})")
        raise HostError(f"probe auto found no way to measure: {CUDA_INSTALL_HINT}, or put "
                        "nvbandwidth on PATH")

    def from_file(self, path: str) -> Measurements:
        if Path(path).is_absolute():
            try:
                text = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError as exc:
                raise HostError(f"cannot read {path}: {exc.strerror}") from exc
        else:
            text = self.host.read_text(path)
        try:
            output = parse_output(text)
        except ParseError as exc:
            raise HostError(f"{path}: {exc}") from exc
        measured = to_measurements(output, self.gpus, f"recorded in {path}")
        stale = ("a saved output: it does not change with --fix; re-measure with probe cuda or "
                 "nvbandwidth to see a fix's effect")
        return Measurements(measured.source, measured.rates, (*measured.notes, stale))

    def nvbandwidth(self) -> Measurements:
        tests = ([P2P_TESTS[0]] if self.wanted["pairs"] else []) + \
                ([H2D_TEST] if self.wanted["h2d"] else []) + \
                ([D2H_TEST] if self.wanted["d2h"] else [])
        argv = ["nvbandwidth", "-j", "-b", str(max(1, self.section.size // 2**20))]
        for test in tests:
            argv += ["-t", test]
        # CUDA ordinal i = the i-th GPU in PCI order, our mapping when the output names no bus ids.
        report_progress(f"running {' '.join(argv)} (every pair, serially; this takes a while)")
        try:
            done = self.host.run(argv, env=NVBANDWIDTH_ENV, timeout=self.section.timeout)
        except CommandTimeout:
            raise HostError(f"{' '.join(argv)} did not finish within {self.section.timeout:g} "
                            f"s and was killed: {SLOW_HINT}") from None
        if done.returncode != 0:
            raise HostError(f"{done.shown} exited {done.returncode}: "
                            f"{(done.stderr or done.stdout).strip()[-500:]}")
        try:
            output = parse_output(done.stdout)
        except ParseError as exc:
            raise HostError(f"{done.shown} printed no usable JSON: {exc}") from exc
        return to_measurements(output, self.gpus, "ran " + done.shown)

    def cuda(self) -> Measurements:
        if not self.real:
            raise HostError(f"probe cuda measures this machine, but the host root "
                            f"{self.host.describe()} is not it")
        try:
            runtime = load_runtime()
            probe = CudaBandwidth(runtime, self.section.size)
            return measure_within(self.section.timeout, lambda: probe.measure(
                self.gpus, pairs=self.wanted["pairs"], h2d=self.wanted["h2d"],
                d2h=self.wanted["d2h"], ring=self.wanted["ring"]))
        except (CudaUnavailable, CudaError) as exc:
            raise HostError(f"probe cuda: {exc}") from exc
