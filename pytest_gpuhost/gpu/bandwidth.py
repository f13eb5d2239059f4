"""Bandwidth measurements and the parsers of the reference tools' outputs (no I/O here).

A ``Measurements`` maps a key to a ``Rate`` (GB/s = 10^9 bytes/s, or the reason there is none):
``A->B`` for a P2P copy from GPU A to GPU B, ``h2d[A]`` / ``d2h[A]`` for host copies, and
``ring:A->B`` for one flow of the concurrent ring. GPUs are sysfs PCI addresses.

Parsed outputs: nvbandwidth text (v0.2 prints ``0.00`` on the diagonal and for a pair it could
not measure, v0.8 ``N/A``; a test it skips is ``Running NAME.`` then ``Waived: MSG`` in v0.8, a
``Waiving NAME.`` line in old versions; ``Error: MSG`` / ``Not Found: MSG`` is a test with no
result), nvbandwidth ``-j`` JSON (cells are strings) and cuda-samples p2pBandwidthLatencyTest.
The tools number GPUs by CUDA ordinal; where the output names a GPU's bus id it is used, else
ordinal i is the i-th GPU in PCI address order (the probe runs nvbandwidth with
``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that holds on a mixed box too).

Direction: the labels do not give it, the test does (nvbandwidth testcases_ce.cpp). The read test
stores M[row][col] = a copy from the column GPU's buffer into the row GPU's, run by the row GPU
(it reads): data flows column -> row. The write test stores M[row][col] = a copy from row to
column, run by the row GPU (it writes): data flows row -> column. p2pBandwidthLatencyTest's rows
are the sources. Matrices are re-keyed (source, target) by test name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..linux.pciaddr import normalize_address

P2P_TESTS = ("device_to_device_memcpy_read_ce", "device_to_device_memcpy_write_ce")
"""nvbandwidth's unidirectional P2P tests, in the order they are preferred (reads first: they are
what a small MaxReadReq, ACS or a downtrained link slows down most)."""
H2D_TEST = "host_to_device_memcpy_ce"
D2H_TEST = "device_to_host_memcpy_ce"


class ParseError(ValueError):
    """An output that is not in the format it claims to be."""


class Rate(msgspec.Struct, frozen=True):
    gbps: float | None
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"gbps": self.gbps} if self.problem is None else {"problem": self.problem}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rate:
        gbps = data.get("gbps")
        return cls(float(gbps) if gbps is not None else None, data.get("problem"))


class Measurements(msgspec.Struct, frozen=True):
    source: str
    """How they were obtained, for the evidence: ``nvbandwidth v0.8 text (FILE)``."""
    rates: Mapping[str, Rate]
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "notes": list(self.notes),
                "rates": {k: r.as_dict() for k, r in self.rates.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurements:
        return cls(str(data["source"]), {k: Rate.from_dict(v) for k, v in data["rates"].items()},
                   tuple(data.get("notes", ())))


Matrix = dict[tuple[int, int], float | None]


class ToolOutput(msgspec.Struct):
    """What a reference tool printed, by CUDA ordinal."""

    tool: str
    devices: dict[int, str] = msgspec.field(default_factory=dict)
    """ordinal -> sysfs address, where the output names the bus id."""
    matrices: dict[str, Matrix] = msgspec.field(default_factory=dict)
    """test name -> {(source, target): GB/s or None for N/A}; host tests: {(0, gpu): ...}."""
    waived: set[str] = msgspec.field(default_factory=set)
    problems: dict[str, str] = msgspec.field(default_factory=dict)
    """test name -> why it has no result (``Waived: MSG``, ``Error: MSG``, a truncated table)."""
    unmeasured: set[tuple[str, int, int]] = msgspec.field(default_factory=set)
    """(test, source, target) cells printed as 0.00 off the diagonal: not measured."""
    no_peer: set[tuple[int, int]] = msgspec.field(default_factory=set)
    """Pairs whose peer access the output says is off: p2pBandwidthLatencyTest's ``CANNOT
    Access Peer`` lines and the 0 cells of its ``P2P Connectivity Matrix`` (a host where P2P is
    off may print no CANNOT line while the matrix says 0: its "P2P=Enabled" copies were staged
    through host memory)."""


def _cell(text: str) -> float | None:
    if text.upper() == "N/A":
        return None
    try:
        return float(text)
    except ValueError:
        raise ParseError(f"not a bandwidth cell: {text!r}") from None


_DEVICE = re.compile(r"Device (\d+): .*?(?:\(([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
                     r"(?:\.\d)?\))?\s*$")
_ROW = re.compile(r"\s*(\d+)((?:\s+(?:-?\d+(?:\.\d+)?|N/A))+)\s*$")
_HEADER = re.compile(r"\s*(?:D\\D\s+)?(\d+(?:\s+\d+)*)\s*$")


def _read_matrix(lines: Sequence[str], start: int) -> tuple[Matrix, int]:
    """Rows after the column header at ``start``; returns the matrix and the next line index.
    An output that ends at the title or the header (cut short) gives an empty matrix."""
    if start >= len(lines):
        return {}, start
    header = _HEADER.match(lines[start])
    if header is None:
        raise ParseError(f"line {start + 1}: expected a row of column numbers")
    columns = [int(c) for c in header.group(1).split()]
    matrix: Matrix = {}
    index = start + 1
    while index < len(lines):
        row = _ROW.match(lines[index])
        if row is None:
            break
        cells = row.group(2).split()
        if len(cells) != len(columns):
            raise ParseError(f"line {index + 1}: {len(cells)} cells under {len(columns)} columns")
        for column, cell in zip(columns, cells, strict=True):
            matrix[(int(row.group(1)), column)] = _cell(cell)
        index += 1
    return matrix, index


def _is_p2p(test: str) -> bool:
    return test.startswith("device_to_device") or test == P2P_SAMPLE_MATRIX


def _store(output: ToolOutput, test: str, matrix: Matrix) -> None:
    """Key ``matrix`` (as printed, (row, column)) by (source, target) for ``test``; a 0.00 off
    the diagonal of a P2P matrix is a pair that was not measured."""
    if not matrix:
        output.problems.setdefault(test, "the output ends before the matrix rows (cut short)")
        return
    if test.startswith("device_to_device") and "_read_" in test:
        matrix = {(column, row): value for (row, column), value in matrix.items()}
    if _is_p2p(test):
        for (source, target), value in list(matrix.items()):
            if source != target and value == 0.0:
                matrix[(source, target)] = None
                output.unmeasured.add((test, source, target))
    output.matrices[test] = matrix


_STATUS = re.compile(r"(Waived|Error|Not Found): ?(.*)$")


def parse_nvbandwidth_text(text: str) -> ToolOutput:
    lines = text.splitlines()
    version = re.search(r"nvbandwidth Version: (\S+)", text)
    output = ToolOutput(f"nvbandwidth {version.group(1)}" if version else "nvbandwidth")
    running: str | None = None
    pending: Matrix | None = None
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        device = _DEVICE.match(line)
        if device and device.group(2):
            output.devices[int(device.group(1))] = normalize_address(device.group(2) + ".0")
        if match := re.match(r"Running (\w+)\.?$", line):
            running, pending = match.group(1), None
        elif match := re.match(r"Waiving (\w+)\.?$", line):  # before v0.8
            output.waived.add(match.group(1))
            output.problems.setdefault(match.group(1), "waived")
        elif (status := _STATUS.match(line)) and running is not None:  # v0.8
            if status.group(1) == "Waived":
                output.waived.add(running)
            output.problems[running] = f"{status.group(1)}: {status.group(2)}".rstrip(": ")
            running = None
        elif line.startswith("memcpy ") and "bandwidth" in line:
            pending, index = _read_matrix(lines, index + 1)
            if running is not None:
                _store(output, running, pending)
                running, pending = None, None
            continue
        elif (match := re.match(r"SUM (\w+)", line)) and pending is not None:
            _store(output, match.group(1), pending)
            pending = None
        index += 1
    if not output.matrices and not output.problems:
        raise ParseError("no nvbandwidth result matrix ('memcpy ... bandwidth (GB/s)') found")
    return output


def parse_nvbandwidth_json(text: str) -> ToolOutput:
    start = text.find("{")
    if start < 0:
        raise ParseError("no JSON object in the output")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
        root = data["nvbandwidth"]
        cases = root["testcases"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ParseError(f"not nvbandwidth -j JSON: {exc}") from None
    version = root.get("version") or root.get("git_version")
    output = ToolOutput(f"nvbandwidth {version}" if version else "nvbandwidth")
    for case in cases:
        name, status = str(case.get("name")), str(case.get("status", ""))
        if status.lower() == "waived":
            output.waived.add(name)
            output.problems[name] = "waived"
            continue
        matrix_rows = case.get("bandwidth_matrix")
        if matrix_rows is None:
            if status:
                output.problems[name] = status
            continue
        matrix = {(r, c): _cell(str(cell)) for r, row in enumerate(matrix_rows)
                  for c, cell in enumerate(row)}
        _store(output, name, matrix)
    return output


_CUDA_SAMPLE_DEVICE = re.compile(r"Device: (\d+), .*pciBusID: ([0-9a-fA-F]+), pciDeviceID: "
                                 r"([0-9a-fA-F]+), pciDomainID:\s*([0-9a-fA-F]+)")
P2P_SAMPLE_MATRIX = "p2pBandwidthLatencyTest unidirectional P2P=Enabled"


def parse_p2p_bandwidth_latency_test(text: str) -> ToolOutput:
    output = ToolOutput("p2pBandwidthLatencyTest")
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index].strip()
        if device := _CUDA_SAMPLE_DEVICE.search(line):
            ordinal, bus, dev, domain = device.groups()
            output.devices[int(ordinal)] = f"{int(domain, 16):04x}:{int(bus, 16):02x}:" \
                                           f"{int(dev, 16):02x}.0"
        elif peer := re.match(r"Device=(\d+) CANNOT Access Peer Device=(\d+)", line):
            output.no_peer.add((int(peer.group(1)), int(peer.group(2))))
        elif line.startswith("P2P Connectivity Matrix"):
            connectivity, index = _read_matrix(lines, index + 1)
            output.no_peer |= {pair for pair, value in connectivity.items()
                               if pair[0] != pair[1] and value == 0}
            continue
        elif line.startswith("Unidirectional P2P=Enabled Bandwidth"):
            matrix, index = _read_matrix(lines, index + 1)
            if matrix:
                _store(output, P2P_SAMPLE_MATRIX, matrix)
            continue
        index += 1
    if P2P_SAMPLE_MATRIX not in output.matrices:
        raise ParseError("no 'Unidirectional P2P=Enabled Bandwidth Matrix' in the output")
    return output


def parse_output(text: str) -> ToolOutput:
    """Any of the three formats, told apart by their content."""
    if text.lstrip().startswith("{") or '"nvbandwidth"' in text[:200]:
        return parse_nvbandwidth_json(text)
    if "P2P=Enabled" in text or "P2P (Peer-to-Peer)" in text:
        return parse_p2p_bandwidth_latency_test(text)
    return parse_nvbandwidth_text(text)


def to_measurements(output: ToolOutput, gpus: Sequence[str], source: str) -> Measurements:
    """Rates by sysfs address for every ordered pair and every GPU's host copies."""
    ordinal: dict[str, int] = {}
    notes: list[str] = []
    if output.devices:
        ordinal = {address: index for index, address in output.devices.items()}
        unknown = [a for a in gpus if a not in ordinal]
        if unknown:
            notes.append(f"the output names no GPU at {', '.join(unknown)}")
    else:
        ordinal = {address: index for index, address in enumerate(gpus)}
        notes.append("the output names no bus ids: CUDA ordinal i taken as the i-th GPU in "
                     "PCI address order")
    rates: dict[str, Rate] = {}
    p2p = next((t for t in (*P2P_TESTS, P2P_SAMPLE_MATRIX) if t in output.matrices), None)
    for source_gpu in gpus:
        for target in gpus:
            if source_gpu != target:
                rates[f"{source_gpu}->{target}"] = _pair_rate(output, p2p, ordinal,
                                                              source_gpu, target)
    for key, test in (("h2d", H2D_TEST), ("d2h", D2H_TEST)):
        for gpu in gpus:
            rates[f"{key}[{gpu}]"] = _host_rate(output, test, ordinal.get(gpu))
    tests = f": {p2p}" if p2p and p2p != P2P_SAMPLE_MATRIX else ""
    return Measurements(f"{output.tool} ({source}){tests}", rates, tuple(notes))


def _pair_rate(output: ToolOutput, test: str | None, ordinal: Mapping[str, int],
               source: str, target: str) -> Rate:
    if test is None:
        waived = [t for t in P2P_TESTS if t in output.waived]
        if waived:
            why = output.problems.get(waived[0], "waived")
            shown = f" ({why})" if why != "waived" else ""
            return Rate(None, f"{output.tool} waived {waived[0]}{shown}: P2P is not available "
                              "between these GPUs")
        failed = [t for t in P2P_TESTS if t in output.problems]
        if failed:
            return Rate(None, f"{output.tool} gave no {failed[0]} result: "
                              f"{output.problems[failed[0]]}")
        return Rate(None, f"the {output.tool} output has no P2P results "
                          f"({' or '.join(P2P_TESTS)})")
    if source not in ordinal or target not in ordinal:
        return Rate(None, f"the {output.tool} output does not name this GPU pair")
    row, column = ordinal[source], ordinal[target]
    if (row, column) in output.no_peer:
        staged = output.matrices[test].get((row, column))
        shown = f" (its {staged:.2f} GB/s is a copy staged through host memory)" if staged else ""
        return Rate(None, f"P2P access is not possible: device {row} CANNOT access peer device "
                          f"{column} (the output's peer access lines or P2P Connectivity "
                          f"Matrix){shown}")
    if (row, column) not in output.matrices[test]:
        return Rate(None, f"{test} has no cell ({row}, {column}): the output lists fewer GPUs")
    value = output.matrices[test][(row, column)]
    if (test, row, column) in output.unmeasured:
        return Rate(None, f"{output.tool} reported 0.00 for device {row} -> {column}: the pair "
                          "was not measured")
    if value is None:
        return Rate(None, f"{output.tool} reported N/A for device {row} -> {column}")
    return Rate(value)


def _host_rate(output: ToolOutput, test: str, column: int | None) -> Rate:
    if test in output.waived:
        return Rate(None, f"{output.tool} waived {test}")
    if test not in output.matrices and test in output.problems:
        return Rate(None, f"{output.tool} gave no {test} result: {output.problems[test]}")
    if test not in output.matrices:
        return Rate(None, f"the {output.tool} output has no {test} results")
    value = output.matrices[test].get((0, column)) if column is not None else None
    if value is None:
        return Rate(None, f"{test} has no value for this GPU")
    return Rate(value)
