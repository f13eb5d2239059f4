"""nccl: a collective's bus bandwidth (nccl-tests' ``busbw``, out of place) held to a floor at
each size the spec names, judged from a live run or a saved one, and explained.

One check per collective and size, ``nccl[all_reduce@1G]``::

    nccl:
      all_reduce: {gpus: all, bytes: 1G, min_busbw: 35}   # or min_busbw: {path: 0.7}
      env: {NCCL_MIN_NCHANNELS: "8"}

A live run is ``all_reduce_perf -b 1G -e 1G -g N`` on the target (``gpu/ncclrun.py``), one at a
time with the run's other measurements; ``repeat: N`` runs it N times and judges the median,
saying the spread, and a floor it fails is measured once more after ``pause`` seconds
(``retry: 1`` by default) before it fails, both values in the record. ``from: FILE`` judges a
saved output instead (a file of the machine that runs pytest, relative to the spec's folder),
with a warning where it is older than the host's last boot or its last ``--fix``. A row with
``#wrong`` above 0 fails whatever its bandwidth. Every record carries ``details.explain``
(``nccl_explain``) and the bound of its ring's slowest hop (``limit_gbps``, ``fraction``).
"""

from __future__ import annotations

import calendar
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..files import read_regular
from ..gpu.measure import measuring_alone
from ..gpu.nccltests import COLLECTIVES, NcclOutput, NcclOutputError, Row, parse_nccl_tests
from ..gpu.probes import collective_probe
from ..host import Glob, Host, HostError, Read, Request
from ..specmodel import EntryOptions, SpecContext, section
from ..specmodel.matchers import Verdict, parse_rate
from . import USERSPACE, Check, Evidence, Fact, Facts, NoFix, Observation
from .gpus import GPUS
from .nccl_explain import Bound, CollectiveExplainer, Judged
from .offers import p2p_bandwidth
from .p2p import ORDER as P2P_ORDER
from .p2p import _share, _tuning
from .p2p_explain import Explainer, Tuning

if TYPE_CHECKING:  # capture's module loads when a capture asks, the parsers with a measurement
    from ..gpu.bandwidth import Measurements
    from ..specmodel import Node
    from .capturing import Captured, Records

ORDER = P2P_ORDER + 100  # after the P2P measurements (a ring stands on their pairs), before dmesg
KEYS = (*COLLECTIVES, "env", "timeout", "channels", "pause", "tests_dir")
ENTRY_KEYS = ("gpus", "bytes", "min_busbw", "from", "repeat", "retry")
TIMEOUT_S = 600.0
"""How long one run may take (``timeout:``): 8 GPUs at 1G take seconds; a peer path that hangs
takes for ever, and NCCL's own watchdog does not end nccl-tests."""
PAUSE_S = 10.0
"""How long a failed floor waits before it is measured once more (``pause:``)."""
SAVED_LIMIT = 64 * 2**20
_SIZE = re.compile(r"(\d+)\s*([KMGkmg])?\Z")
_UNITS = {None: 1, "K": 2**10, "M": 2**20, "G": 2**30}
JOURNALS = "var/lib/pytest-gpuhost/journal"
"""Where ``--fix`` keeps its journals (``fix/state.py``), named by when they began."""
_STAMP = re.compile(r"(\d{8}T\d{6}Z)-")


class Collective(msgspec.Struct, frozen=True):
    name: str
    gpus: int | None
    """None: every GPU of the target."""
    sizes: tuple[tuple[str, int], ...]
    """(as nccl-tests' -b takes it, bytes)."""
    floor: float | None
    path_share: float | None
    source: str | None
    """``from:``: an absolute path of the machine that runs pytest."""
    repeat: int
    retry: int
    options: EntryOptions


class NcclSection(msgspec.Struct, frozen=True):
    collectives: tuple[Collective, ...]
    env: tuple[tuple[str, str], ...] = ()
    timeout: float = TIMEOUT_S
    channels: int | None = None
    pause: float = PAUSE_S
    tuning: Tuning = msgspec.field(default_factory=Tuning)
    """The spec's pcie and iommu keys, for the words of a remedy."""
    options: EntryOptions | None = None
    """The section's own (each collective's are its own, else these)."""
    tests_dir: str | None = None
    """nccl-tests' build directory, relative to the target's root (``/`` on a machine)."""
    spec: str = ""
    """The spec file it came from: where that spec's p2p section measures the pairs, each ring
    hop is bounded by its measurement too (``offers.p2p_bandwidth``)."""


def size_text(size: int) -> str:
    for unit, factor in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _size(node: Node) -> tuple[str, int]:
    text = node.text("nccl bytes").strip()
    match = _SIZE.fullmatch(text)
    if not match or int(match.group(1)) == 0:
        raise node.error(f"nccl bytes must be a positive size as nccl-tests' -b takes it (1G, "
                         f"256M, 512K or bytes), got {text!r}")
    size = int(match.group(1)) * _UNITS[match.group(2).upper() if match.group(2) else None]
    return size_text(size), size


def _count(node: Node, what: str, low: int) -> int:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise node.error(f"{what} must be a whole number >= {low}, got {node.kind_name()}")
    return value


def _seconds(node: Node, what: str) -> float:
    value = node.scalar() if not (node.is_mapping or node.is_sequence) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e9:
        raise node.error(f"{what} must be a number of seconds, got {node.kind_name()}")
    return float(value)


def _floor(node: Node, name: str) -> tuple[float | None, float | None]:
    """``min_busbw: 35`` (GB/s) or ``min_busbw: {path: 0.7}``: (GB/s, share of the bound)."""
    if node.is_mapping:
        share: float | None = None
        for key, value in node.mapping(f"nccl {name} min_busbw"):
            if key != "path":
                raise value.unknown_key(key, f"nccl {name} min_busbw", ("path",))
            share = _share(value)
            if not 0 < share <= 1:
                raise value.error(f"nccl {name} min_busbw path must be a share of the ring's "
                                  f"bound like 0.7 or 70% (0 < x <= 1), got {value.kind_name()}")
        if share is None:
            raise node.error(f"nccl {name} min_busbw needs path: SHARE (or a number of GB/s)")
        return None, share
    value = node.scalar()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            not math.isfinite(value) or value <= 0:
        raise node.error(f"nccl {name} min_busbw must be a positive number of GB/s or "
                         f"{{path: 0.7}}, got {node.kind_name()}")
    return float(value), None


def _inherit(own: EntryOptions, outer: EntryOptions) -> EntryOptions:
    """An entry's options, each it does not give taken from its section's."""
    return EntryOptions(own.where, own.why if own.why is not None else outer.why,
                        own.fix and outer.fix, own.when if own.when is not None else outer.when,
                        own.severity if own.severity != "normal" else outer.severity)


def _collective(name: str, node: Node, context: SpecContext, outer: EntryOptions
                ) -> Collective:
    given = section(node, f"nccl {name}", ENTRY_KEYS, context)
    gpus: int | None = None
    sizes: list[tuple[str, int]] = []
    floor = share = None
    source: str | None = None
    repeat, retry = 1, 1
    for key, value in given.values.items():
        if key == "gpus":
            if value.scalar() == "all":
                gpus = None
            else:
                gpus = _count(value, f"nccl {name} gpus (or all)", 2)
        elif key == "bytes":
            sizes = [_size(v) for v in value.sequence(f"nccl {name} bytes")] \
                if value.is_sequence else [_size(value)]
        elif key == "min_busbw":
            floor, share = _floor(value, name)
        elif key == "from":
            text = value.string(f"nccl {name} from").strip()
            if not text:
                raise value.error(f"nccl {name} from: needs a file, like results/{name}.txt")
            path = Path(text).expanduser()
            source = str(path if path.is_absolute() else
                         Path(context.folder or Path(node.file).absolute().parent) / path)
        elif key == "repeat":
            repeat = _count(value, f"nccl {name} repeat", 1)
        elif key == "retry":
            retry = _count(value, f"nccl {name} retry", 0)
    if not sizes:
        raise node.error(f"nccl {name} needs bytes: the size judged (1G, or a list)")
    if floor is None and share is None:
        raise node.error(f"nccl {name} needs min_busbw: GB/s (or {{path: 0.7}})")
    return Collective(name, gpus, tuple(dict.fromkeys(sizes)), floor, share, source, repeat,
                      retry, _inherit(given.options, outer))


def _env(node: Node) -> tuple[tuple[str, str], ...]:
    pairs = []
    for key, value in node.mapping("nccl env"):
        if not re.fullmatch(r"NCCL_[A-Z0-9_]+", key):
            raise value.key_error(f"nccl env names NCCL_* variables, got {key!r}")
        raw = value.scalar() if not (value.is_mapping or value.is_sequence) else None
        if raw is None or isinstance(raw, (bool, float)):
            raise value.error(f"nccl env {key} must be a string or a whole number, like \"8\"")
        pairs.append((key, str(raw)))
    return tuple(pairs)


def _directory(node: Node) -> str:
    """``tests_dir``: a directory of the target (absolute or not, it is under its root)."""
    text = node.string("nccl tests_dir").strip()
    parts = [part for part in text.split("/") if part not in ("", ".")]
    if not parts or ".." in parts or "\0" in text:
        raise node.error(f"nccl tests_dir must be a directory under the target's root, like "
                         f"/opt/nccl-tests/build, got {text!r}")
    return "/".join(parts)


class CollectiveFloor(msgspec.Struct, frozen=True):
    """The bus bandwidth must reach ``floor`` GB/s, and the collective return no wrong value;
    ``stale``: the saved output predates the host's state (a warning, or said with a
    failure)."""

    floor: float
    label: str
    wrong: int = 0
    stale: str | None = None

    def describe(self) -> str:
        return f">= {self.floor:g} GB/s ({self.label})"

    def judge(self, observed: str | None) -> Verdict:
        verdict = self._judge(observed)
        if self.stale is None:
            return verdict
        if verdict.ok:
            return Verdict(True, warning=self.stale)
        return Verdict(False, f"{verdict.reason} ({self.stale})")

    def _judge(self, observed: str | None) -> Verdict:
        if observed is None:
            return Verdict(False, "nothing was observed")
        if self.wrong:
            return Verdict(False, f"#wrong {self.wrong}: the collective returned wrong data "
                                  f"({self.label})")
        value = parse_rate(observed)
        if value < self.floor:
            return Verdict(False, f"{value:.2f} GB/s < floor {self.floor:g} GB/s "
                                  f"({self.label}), {value / self.floor:.0%} of it")
        return Verdict(True)

    def fix_value(self, observed: str | None) -> str | None:
        return None


class NcclKind:
    section = "nccl"
    scope = USERSPACE  # run where the benchmark runs
    measured = True

    @staticmethod
    def capture(model: NcclSection, records: Records) -> Captured:
        return capture_nccl(model, records)

    def facts(self, section: NcclSection) -> Sequence[Fact[Any]]:
        return [GPUS]

    def parse(self, node: Node, context: SpecContext) -> NcclSection:
        given = section(node, "nccl", KEYS, context)
        collectives = []
        env: tuple[tuple[str, str], ...] = ()
        timeout, pause, channels = TIMEOUT_S, PAUSE_S, None
        tests_dir: str | None = None
        for key, value in given.values.items():
            if key in COLLECTIVES:
                collectives.append(_collective(key, value, context, given.options))
            elif key == "env":
                env = _env(value)
            elif key == "timeout":
                timeout = _seconds(value, "nccl timeout")
                if timeout <= 0:
                    raise value.error("nccl timeout must be above 0 seconds")
            elif key == "pause":
                pause = _seconds(value, "nccl pause")
            elif key == "channels":
                channels = _count(value, "nccl channels", 1)
            elif key == "tests_dir":
                tests_dir = _directory(value)
        if not collectives:
            raise node.error(f"nccl needs a collective: one or more of {', '.join(COLLECTIVES)}")
        return NcclSection(tuple(collectives), env, timeout, channels, pause, _tuning(context),
                           given.options, tests_dir, node.file)

    def expand(self, section: NcclSection, facts: Facts) -> Sequence[Check]:
        found = facts.get(GPUS)
        gpus = tuple(g.address for g in found)
        explainer = Explainer(found, facts.nvml, section.tuning, kernel=facts.kernel)
        measured = facts.asked(p2p_bandwidth(section.spec))
        checks = []
        for entry in section.collectives:
            count = len(gpus) if entry.gpus is None else entry.gpus
            for text, size in entry.sizes:
                key = f"{entry.name}@{text}"
                label = f"{entry.name} busbw at {text}"
                floor = CollectiveFloor(entry.floor or 0.0, label)
                if count < 2 or count > len(gpus):
                    have = f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"
                    probe: Any = Unrunnable(f"{entry.name} needs at least 2 GPUs and at most "
                                            f"the target's {have}; the spec asks for {count}")
                else:
                    judged = Judged(dict(section.env), section.channels)
                    probe = NcclProbe(entry, text, size, count, section,
                                      CollectiveExplainer(explainer, gpus[:count], judged),
                                      facts.shared_dir, lambda s: facts.sleep(s), measured)
                checks.append(Check("nccl", key, floor, entry.options, probe, order=ORDER,
                                    subjects={"gpus": " ".join(gpus[:count])}, slow=True,
                                    measured=True))
        return checks


class Unrunnable(NoFix, msgspec.Struct, frozen=True):
    problem: str

    def observe(self, host: Host) -> Observation:
        raise HostError(self.problem)


class Taken(msgspec.Struct, frozen=True):
    """One judged measurement: each run's output parsed, the row judged, the median."""

    outputs: tuple[NcclOutput, ...]
    rows: tuple[Row, ...]
    busbw: float
    source: str


class NcclProbe(NoFix, msgspec.Struct, frozen=True):
    """Takes and judges one collective at one size."""

    entry: Collective
    text: str
    size: int
    gpus: int
    section: NcclSection
    explainer: CollectiveExplainer
    shared_dir: Path | None
    sleep: Callable[[float], None]
    """How the pause before a failed floor's second run is waited (a test's clock)."""
    p2p: Callable[[], Measurements | None] = lambda: None
    """The pairs' P2P bandwidth as the spec's p2p section measures it (once for both kinds),
    None where it measures none: each ring hop is bounded by it beside its path."""

    def reads(self) -> Sequence[Request]:
        own: tuple[Request, ...] = (Read("proc/stat"), Glob(f"{JOURNALS}/*.jsonl", read=False)) \
            if self.entry.source else collective_probe().reads(self.entry.name,
                                                               self.section.tests_dir)
        if self.entry.source is None and self.explainer.pairs.prepared:
            own = ()  # a run made the host forget the batch: what is left is read by the run
        return (*self.explainer.pairs.reads(), *own)

    def observe(self, host: Host) -> Observation:
        self.explainer.pairs.prepare(host)  # before a run's command, from the batch
        measured, unmeasured = self._measured()  # before the run: not under its lock
        if self.entry.source is not None:
            taken = self._take([self._saved()], f"recorded in {self.entry.source}")
            return self._judged(host, taken, (), _stale(host, self.entry.source), measured,
                                unmeasured)
        first = self._live(host)
        explained = self.explainer.explain(host, first.outputs[0], first.rows[0], measured)
        floor = self._floor(explained.limit)
        if self.entry.retry and not any(r.errors for r in first.rows) and first.busbw < floor:
            self.sleep(self.section.pause)
            second = self._live(host)
            return self._judged(host, second, (first.busbw, second.busbw), None, measured,
                                unmeasured)
        return self._judged(host, first, (), None, measured, unmeasured)

    def _measured(self) -> tuple[Measurements | None, str | None]:
        """The spec's P2P measurement (taken here if no p2p check took it yet), or why there is
        none: a failed measurement leaves each hop bounded by its path."""
        try:
            return self.p2p(), None
        except HostError as exc:
            return None, f"the p2p section's measurement failed ({exc}): each hop is bounded " \
                         "by its path alone"

    def _floor(self, limit: Bound | None) -> float:
        floor = self.entry.floor or 0.0
        if self.entry.path_share is not None:
            if limit is None:
                raise HostError("min_busbw path: needs the link registers of every hop of the "
                                "ring's path (see the p2p check's topology)")
            floor = max(floor, round(self.entry.path_share * limit.gbps, 2))
        return floor

    def _saved(self) -> str:
        path = Path(str(self.entry.source))
        try:
            return read_regular(path, SAVED_LIMIT).decode("utf-8", errors="replace")
        except OSError as exc:
            raise HostError(f"cannot read {path}: {exc.strerror}") from exc

    def _live(self, host: Host) -> Taken:
        probe = collective_probe()
        texts, shown = [], ""
        with measuring_alone(self.shared_dir):
            for _ in range(self.entry.repeat):
                ran = probe.run(host, self.entry.name, self.text, self.gpus,
                                dict(self.section.env), self.section.timeout,
                                self.section.tests_dir)
                if ran.returncode != 0:
                    try:
                        parse_nccl_tests(ran.text)
                    except NcclOutputError as exc:
                        raise HostError(f"{ran.shown} exited {ran.returncode}: {exc}") from None
                    raise HostError(f"{ran.shown} exited {ran.returncode}: "
                                    f"{ran.text.strip()[-300:]}")
                texts.append(ran.text)
                shown = ran.shown
        return self._take(texts, f"ran {shown}")

    def _take(self, texts: Sequence[str], source: str) -> Taken:
        outputs, rows = [], []
        for text in texts:
            try:
                output = parse_nccl_tests(text)
                other = output.collective_fits(self.entry.name)
                if other is not None:
                    raise NcclOutputError("other_collective", f"not an output of "
                                          f"{self.entry.name}: {other}")
                if output.ranks < 2:
                    raise NcclOutputError("one_rank", f"a run of {output.ranks} rank moves "
                                          "nothing over a link: its busbw is no link figure")
                rows.append(output.row(self.size))
            except NcclOutputError as exc:
                raise HostError(f"{source}: {exc} ({exc.reason})") from None
            outputs.append(output)
        busbw = statistics.median(r.busbw for r in rows)
        return Taken(tuple(outputs), tuple(rows), busbw, source)

    def _judged(self, host: Host, taken: Taken, attempts: tuple[float, ...],
                stale: str | None, measured: Measurements | None = None,
                unmeasured: str | None = None) -> Observation:
        output, row = taken.outputs[-1], taken.rows[-1]
        explained = self.explainer.explain(host, output, row, measured)
        if unmeasured is not None:
            explained = msgspec.structs.replace(explained, notes=(*explained.notes, unmeasured))
        floor = self._floor(explained.limit)
        wrong = sum(r.errors for r in taken.rows)
        label = f"{self.entry.name} busbw at {self.text}"
        bound = explained.limit
        if self.entry.path_share is not None and bound is not None and \
                floor > (self.entry.floor or 0.0):
            label = (f"{label}; path: {self.entry.path_share:.0%} of the ring's bound "
                     f"{bound.gbps:.2f} GB/s"
                     + (f", {bound.words()}" if bound.by == "measured" else ""))
        runs = [r.busbw for r in taken.rows]
        transports: dict[str, int] = {}
        for connection in output.connections:
            transports[connection.transport] = transports.get(connection.transport, 0) + 1
        details: dict[str, Any] = {
            "collective": self.entry.name, "bytes": self.size, "size": self.text,
            "gpus": self.gpus, "busbw": taken.busbw, "algbw": row.algbw, "wrong": wrong,
            "floor": floor, "source": taken.source, "runs": runs,
            "spread_gbps": round(max(runs) - min(runs), 2), "nccl_version": output.version,
            "env": output.environment(), "channels": output.channels,
            "transports": transports, **explained.details(taken.busbw)}
        if attempts:
            details["attempts"] = list(attempts)
        shown = f"{taken.busbw:.2f}"
        evidence = [Evidence("measured by", taken.source),
                    Evidence(f"{self.entry.name}@{self.text}", f"busbw {shown} GB/s"
                             + (f" (median of {len(runs)}: {', '.join(f'{r:.2f}' for r in runs)};"
                                f" spread {max(runs) - min(runs):.2f})" if len(runs) > 1 else "")
                             + (f", #wrong {wrong}" if wrong else ""))]
        if attempts:
            evidence.append(Evidence("retried", f"{attempts[0]:.2f} GB/s below the floor, "
                                                f"then {attempts[1]:.2f} GB/s after "
                                                f"{self.section.pause:g} s"))
        if stale:
            evidence.append(Evidence("stale", stale))
        expect = CollectiveFloor(floor, label, wrong, stale)
        return Observation(shown, (*evidence, *explained.evidence()), details=details,
                           culprits=explained.culprits(), expect=expect)


def _stale(host: Host, source: str) -> str | None:
    """Why a saved output predates the host's state (its last boot, its last --fix), or
    None."""
    try:
        written = Path(source).stat().st_mtime
    except OSError:
        return None
    [stat, journals] = host.batch([Read("proc/stat"), Glob(f"{JOURNALS}/*.jsonl", read=False)])
    said = []
    if stat.error is None:
        boot = next((line.split()[1] for line in stat.text().splitlines()
                     if line.startswith("btime ")), None)
        if boot is not None and boot.isdigit() and written < int(boot):
            said.append(f"the host's last boot ({_when(int(boot))})")
    if journals.error is None:
        stamps = [m.group(1) for path, _ in journals.matches()
                  if (m := _STAMP.match(path.rsplit("/", 1)[-1])) is not None]
        if stamps:
            fixed = calendar.timegm(time.strptime(max(stamps), "%Y%m%dT%H%M%SZ"))
            if written < fixed:
                said.append(f"the host's last --fix ({_when(fixed)})")
    if not said:
        return None
    return (f"{source} was written {_when(written)}, before {' and '.join(said)}: it predates "
            "the host's state")


def _when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def capture_nccl(model: NcclSection, records: Records) -> Captured:
    """The nccl section as captured: each collective's floor at 90% of the lowest bus
    bandwidth measured over its sizes, rounded down (a share of the ring's bound at 90% of the
    lowest share reached, to a hundredth), the rest as the spec had it. A collective that
    returned wrong data is left out: its bandwidth is no floor."""
    from .capturing import Captured, options_of, problem, when_false
    from .p2p import p2p_floor

    out = Captured()
    found = records.get("nccl", ())
    for entry in model.collectives:
        mine = [r for r in found if r.key is not None and r.key.split("@")[0] == entry.name]
        sizes = [text for text, _ in entry.sizes]
        settings: dict[str, Any] = {"gpus": "all" if entry.gpus is None else entry.gpus,
                                    "bytes": sizes[0] if len(sizes) == 1 else sizes}
        if when_false(mine, entry.options):
            floor: Any = {"path": entry.path_share} if entry.floor is None else entry.floor
        else:
            why = problem(mine) or next((f"{r.key}: #wrong {r.details['wrong']}" for r in mine
                                         if r.details.get("wrong")), None)
            if why is not None:
                out.leave_out(f"nccl {entry.name}", why)
                continue
            if entry.path_share is not None:
                shares = [v for r in mine if isinstance(v := r.details.get("fraction"),
                                                        (int, float))]
                if len(shares) < len(mine):
                    out.leave_out(f"nccl {entry.name}", "a ring's bound was not known")
                    continue
                floor = {"path": math.floor(min(shares) * 90) / 100}
            else:
                floor = p2p_floor(min(float(str(r.observed)) for r in mine))
        settings["min_busbw"] = floor
        if entry.source is not None:
            settings["from"] = entry.source
        if entry.repeat != 1:
            settings["repeat"] = entry.repeat
        if entry.retry != 1:
            settings["retry"] = entry.retry
        out.entries[entry.name] = {**settings, **options_of(entry.options)}
    if out.entries and model.env:
        out.entries["env"] = dict(model.env)
    for key, value, default in (("tests_dir", model.tests_dir, None),
                                ("timeout", model.timeout, TIMEOUT_S),
                                ("channels", model.channels, None),
                                ("pause", model.pause, PAUSE_S)):
        if out.entries and value != default:
            out.entries[key] = value
    return out
