"""The parser of nccl-tests' text output (2.x) and of the NCCL INFO lines a run prints with it (no
I/O here).

What the test prints: a header (``# nThread 1 nGpus 8 minBytes ... iters: 20 ... validation: 1
graph: 0``), newer versions a ``# Collective test starting: all_reduce_perf`` line before it,
the devices (``#  Rank  0 Group  0 Pid 123 on HOST device  0 [0x01] NAME``, the bus id as
``[0x01]`` or ``[0000:01:00]``), one row per size (size, count, type, redop, root, then the
out-of-place and in-place ``time algbw busbw #wrong``; ``#wrong`` is ``N/A`` where a test has
no in-place check), ``# Out of bounds values : N OK|FAILED`` and ``# Avg bus bandwidth : X``.

What NCCL prints with ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,GRAPH`` (each line
``HOST:PID:TID [DEV] NCCL INFO ...``): its version (``NCCL version 2.21.5+cuda12.4``), each
variable it took (``NCCL_P2P_LEVEL set by environment to PIX.``), its rings
(``Channel 00/02 :    0   1   2``), its trees (``Trees [0] 1/-1/-1->0->-1``), each connection
and its transport (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``, ``via P2P/CUMEM/read``,
``via SHM/direct/direct``, ``[send] via NET/IB/0``) and the channel count
(``2 coll channels, 0 collnet channels, ...``).

A row with ``#wrong`` above 0 is a collective that returned wrong data. An output cut short
(no ``# Avg bus bandwidth``) is ``truncated``; one that says a test failed (``Test NCCL
failure``, ``Test CUDA failure``, ``Test failure``) ``died``: ``NcclOutputError.reason`` says
which, and ``row`` a missing size.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall",
               "sendrecv")
"""The collectives the nccl section judges: each is nccl-tests' ``NAME_perf``."""
ROOTED = ("broadcast", "reduce")
"""Collectives whose rows have a root (>= 0); the others print -1."""
NO_OP = ("all_gather", "broadcast", "alltoall")
"""Collectives whose rows have no reduction (``none``); the others name one (``sum``)."""
REASONS = ("no_row", "truncated", "other_collective", "died", "not_nccl_tests", "one_rank")

_HEADER = re.compile(r"#\s*nThread\s+(\d+)\s+nGpus\s+(\d+)\s+minBytes\s+(\d+)\s+maxBytes\s+(\d+)"
                     r".*?(?<!warmup )iters:\s*(\d+).*?validation:\s*(\d+)(?:.*?graph:\s*(\d+))?")
_STARTING = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_DEVICE = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+"
                     r"(\d+)\s+\[([^\]]*)\]\s*(.*)")
_NUMBER = r"(N/A|[-+0-9.eE]+)"
_ROW = re.compile(r"\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)" + (r"\s+" + _NUMBER) * 8
                  + r"\s*\Z")
_ENV = re.compile(r"(NCCL_\w+) set by environment to (.*?)\.?\s*\Z")
_VERSION = re.compile(r"NCCL version (\S+)")
_RING = re.compile(r"Channel (\d+)/(\d+)\s*:\s*((?:\d+\s*)+)\Z")
_CONNECTION = re.compile(r"Channel (\d+)(?:/\d+)?\s*:\s*(\d+)\[([0-9a-fA-Fx]+)\]\s*->\s*(\d+)"
                         r"\[([0-9a-fA-Fx]+)\](?:\s*\[(send|receive)\])?\s+via\s+(\S+)")
_CHANNELS = re.compile(r"(\d+) coll channels")
_TREES = re.compile(r"Trees((?:\s*\[\d+\]\s*\S+)+)")
_DIED = ("Test NCCL failure", "Test CUDA failure", "Test failure", "NCCL WARN")
_DIED_FIRST = _DIED[:3]


class NcclOutputError(ValueError):
    """An output that cannot be judged; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Device(msgspec.Struct, frozen=True):
    rank: int
    host: str
    device: int
    bus: str
    """As printed: ``0x01`` or ``0000:01:00``."""
    name: str

    @property
    def bus_number(self) -> int | None:
        """The PCI bus number of the bus id printed, None where it is not one."""
        text = self.bus.strip()
        try:
            if ":" in text:
                return int(text.split(":")[1], 16)
            return int(text, 16)
        except (ValueError, IndexError):
            return None


class Row(msgspec.Struct, frozen=True):
    size: int
    count: int
    type: str
    redop: str
    root: int
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None
    """``#wrong`` out of place (None: ``N/A``)."""
    in_time_us: float | None
    in_algbw: float | None
    in_busbw: float | None
    in_wrong: int | None

    @property
    def errors(self) -> int:
        """Wrong values out of place and in place."""
        return (self.wrong or 0) + (self.in_wrong or 0)


class Connection(msgspec.Struct, frozen=True):
    channel: int
    source: int
    target: int
    """Ranks."""
    transport: str
    """``P2P/IPC``, ``P2P/CUMEM/read``, ``SHM/direct/direct``, ``NET/IB/0/GDRDMA``."""
    direction: str | None = None
    """``send`` or ``receive`` for a connection to another node."""

    @property
    def kind(self) -> str:
        """``P2P``, ``SHM``, ``NET``, ``COLLNET`` ...: the transport's first word."""
        return self.transport.split("/", 1)[0].upper()


class NcclOutput(msgspec.Struct, frozen=True):
    test: str | None
    """The binary's name where it says it (``all_reduce_perf``), else None."""
    threads: int
    gpus: int
    min_bytes: int
    max_bytes: int
    iters: int
    validation: bool
    graph: int | None
    devices: tuple[Device, ...]
    rows: tuple[Row, ...]
    out_of_bounds: int | None
    avg_busbw: float | None
    version: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    """``NCCL_*`` variables NCCL took from the environment, in the order it said so."""
    channels: int | None = None
    """``N coll channels``, else the rings' ``/N``."""
    rings: tuple[tuple[int, ...], ...] = ()
    """Each channel's ring, as ranks."""
    trees: tuple[str, ...] = ()
    connections: tuple[Connection, ...] = ()

    @property
    def ranks(self) -> int:
        return len(self.devices) or self.threads * self.gpus

    def environment(self) -> dict[str, str]:
        return dict(self.env)

    def row(self, size: int) -> Row:
        """The row of that size; NcclOutputError (``no_row``) naming the sizes there are."""
        for row in self.rows:
            if row.size == size:
                return row
        sizes = ", ".join(str(r.size) for r in self.rows) or "none"
        raise NcclOutputError("no_row", f"no row at {size} bytes (rows: {sizes})")

    def collective_fits(self, collective: str) -> str | None:
        """None where the output can be of ``collective``; else what says it is another."""
        if self.test is not None:
            name = self.test.rsplit("/", 1)[-1].removesuffix("_perf")
            return None if name == collective else f"it is {self.test}'s output"
        for row in self.rows:
            rooted, no_op = row.root >= 0, row.redop == "none"
            if rooted != (collective in ROOTED) or no_op != (collective in NO_OP):
                return (f"its rows have redop {row.redop} and root {row.root}, which "
                        f"{collective} never prints")
        return None


def _failed(line: str) -> bool:
    """A line that says the test failed (not a warning of NCCL's)."""
    return any(said in line for said in _DIED_FIRST)


def _number(text: str) -> float | None:
    return None if text == "N/A" else float(text)


def _count(text: str) -> int | None:
    return None if text == "N/A" else int(float(text))


def _row(match: re.Match[str]) -> Row:
    g = match.groups()
    out = (float(g[5]), float(g[6]), float(g[7]))
    return Row(int(g[0]), int(g[1]), g[2], g[3], int(g[4]), out[0], out[1], out[2],
               _count(g[8]), _number(g[9]), _number(g[10]), _number(g[11]), _count(g[12]))


class _Info:
    """What the INFO lines say, gathered as they come."""

    def __init__(self) -> None:
        self.version: str | None = None
        self.env: dict[str, str] = {}
        self.channels: int | None = None
        self.ring_count: int | None = None
        self.rings: dict[int, tuple[int, ...]] = {}
        self.trees: list[str] = []
        self.connections: dict[tuple[int, int, int, str | None], Connection] = {}

    def take(self, text: str) -> None:
        if text.startswith("Channel"):
            if " via " in text:
                self._connection(text)
                return
            ring = _RING.match(text)
            if ring is not None:
                self.ring_count = int(ring.group(2))
                self.rings.setdefault(int(ring.group(1)),
                                      tuple(int(r) for r in ring.group(3).split()))
            return
        if text.startswith("NCCL_"):
            env = _ENV.match(text)
            if env is not None:
                self.env.setdefault(env.group(1), env.group(2).strip())
            return
        if text.startswith("Trees"):
            trees = _TREES.match(text)
            if trees is not None:
                self.trees.append(trees.group(1).strip())
            return
        if self.channels is None and "coll channels" in text:
            channels = _CHANNELS.match(text)
            if channels is not None:
                self.channels = int(channels.group(1))
            return
        if self.version is None and text.startswith("NCCL version"):
            self.version = _VERSION.match(text).group(1)  # type: ignore[union-attr]  # startswith

    def _connection(self, text: str) -> None:
        """``Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0``: split, not a regular expression
        (a 32-channel run on 8 GPUs prints thousands)."""
        words = text.split()
        try:
            arrow = words.index("->")
            via = words.index("via", arrow)
            channel = int(words[1].split("/", 1)[0])
            source = int(words[arrow - 1].split("[", 1)[0])
            target = int(words[arrow + 1].split("[", 1)[0])
        except (ValueError, IndexError):
            found = _CONNECTION.match(text)  # an unusual spacing
            if found is None:
                return
            g = found.groups()
            channel, source, target, via, words = int(g[0]), int(g[1]), int(g[3]), 0, ["", g[6]]
            direction = g[5]
        else:
            direction = words[via - 1][1:-1] if words[via - 1] in ("[send]", "[receive]") \
                else None
        if via + 1 >= len(words):
            return
        key = (channel, source, target, direction)
        if key not in self.connections:
            self.connections[key] = Connection(channel, source, target, words[via + 1],
                                               direction)


class _Reader:
    """The test's own lines, gathered as they come."""

    def __init__(self) -> None:
        self.header: re.Match[str] | None = None
        self.test: str | None = None
        self.devices: list[Device] = []
        self.rows: list[Row] = []
        self.out_of_bounds: int | None = None
        self.avg: float | None = None
        self.died: str | None = None

    def comment(self, stripped: str) -> None:
        if self.header is None and "nThread" in stripped:
            self.header = _HEADER.match(stripped)
        elif "Rank" in stripped and "device" in stripped:
            device = _DEVICE.match(stripped)
            if device is not None:
                g = device.groups()
                self.devices.append(Device(int(g[0]), g[3], int(g[4]), g[5], g[6].strip()))
        elif stripped.startswith("# Out of bounds values"):
            value = stripped.split(":", 1)[1].split()
            self.out_of_bounds = int(value[0]) if value and value[0].isdigit() else None
        elif stripped.startswith("# Avg bus bandwidth"):
            value = stripped.split(":", 1)[1].split()
            self.avg = float(value[0]) if value else None
        elif self.test is None and "Collective test starting" in stripped:
            starting = _STARTING.match(stripped)
            self.test = starting.group(1) if starting is not None else None

    def other(self, line: str, stripped: str) -> None:
        failed = any(said in stripped for said in _DIED_FIRST)
        if failed or (self.died is None and " NCCL WARN " in line):
            if self.died is None or not _failed(self.died):
                self.died = stripped  # a test's failure line says more than a warning before it
        elif stripped[0].isdigit():
            found = _ROW.match(line)
            if found is not None:
                self.rows.append(_row(found))

    def output(self, info: _Info) -> NcclOutput:
        died, rows = self.died, self.rows
        if self.header is None:
            if died is not None:
                raise NcclOutputError("died", f"the run died before its header: {died[:300]}")
            raise NcclOutputError("not_nccl_tests", "not an nccl-tests output: no '# nThread "
                                                    "... nGpus ...' header")
        if self.avg is None:
            if died is not None and _failed(died):
                raise NcclOutputError("died", f"the run died after {len(rows)} rows: "
                                              f"{died[:300]}")
            raise NcclOutputError("truncated", f"the output is cut short after {len(rows)} "
                                               "rows: no '# Avg bus bandwidth' line")
        g = self.header.groups()
        channels = info.channels if info.channels is not None else info.ring_count
        return NcclOutput(self.test, int(g[0]), int(g[1]), int(g[2]), int(g[3]), int(g[4]),
                          g[5] == "1", int(g[6]) if g[6] is not None else None,
                          tuple(self.devices), tuple(rows), self.out_of_bounds, self.avg,
                          info.version, tuple(info.env.items()), channels,
                          tuple(info.rings[c] for c in sorted(info.rings)), tuple(info.trees),
                          tuple(info.connections.values()))


def parse_nccl_tests(text: str) -> NcclOutput:
    """The output of one nccl-tests run. NcclOutputError: not nccl-tests' output
    (``not_nccl_tests``), a run that said it failed (``died``), or one cut short
    (``truncated``)."""
    reader, info = _Reader(), _Info()
    for line in text.splitlines():
        at = line.find(" NCCL INFO ")
        if at >= 0:
            info.take(line[at + 11:].strip())
            continue
        stripped = line.strip()
        if not stripped:
            continue
        if stripped[0] == "#":
            reader.comment(stripped)
        elif stripped.startswith("NCCL version"):
            info.take(stripped)
        else:
            reader.other(line, stripped)
    return reader.output(info)


def rank_addresses(output: NcclOutput, gpus: Sequence[str]) -> dict[int, str]:
    """Each rank's GPU, a sysfs PCI address of ``gpus``: by the bus id the device line prints,
    else (no such bus among them) the CUDA device number as the i-th GPU in PCI order (the run
    sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
    by_bus: dict[int, str] = {}
    for gpu in gpus:
        try:
            by_bus.setdefault(int(gpu.split(":")[1], 16), gpu)
        except (ValueError, IndexError):
            continue
    found: dict[int, str] = {}
    for device in output.devices:
        bus = device.bus_number
        if bus is not None and bus in by_bus:
            found[device.rank] = by_bus[bus]
        elif 0 <= device.device < len(gpus):
            found[device.rank] = gpus[device.device]
    if not output.devices:
        found = dict(enumerate(gpus[:output.ranks]))
    return found
