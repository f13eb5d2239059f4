"""``--gpuhost-topology``: each target's GPUs as ``nvidia-smi topo -m`` draws them, read from
sysfs alone (no driver needed), with per GPU its NUMA node, link, MaxReadReq and IOMMU group
type, the ACS Control of every bridge on the GPUs' paths, and, where the run measured them,
each pair's GB/s and share of what its path carries; a P2P record's path and a collective's ring
as text, with the causes of each."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..linux.pcipath import LEGEND
from ..printable import one_line
from ..result import CheckResult
from . import RunInfo


def _shown(value: object) -> str:
    """A host value as one printable line (an IOMMU type or a host bridge name is the
    host's text: a terminal escape sequence in it is printed escaped, never obeyed)."""
    return one_line("-" if value is None else str(value))


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)
                      ).rstrip() for row in rows]


def _link(gpu: Mapping[str, Any]) -> str:
    if gpu.get("link") is None:
        return "-"
    idle = " (idle)" if gpu.get("idle") else ""
    return f"{gpu['link']}{idle} of {gpu['capable']}"


def _measured(topology: Mapping[str, Any], records: Sequence[CheckResult]) -> list[str]:
    addresses = [gpu["address"] for gpu in topology["gpus"]]
    rates = {r.key: r for r in records if r.kind == "p2p" and r.key in topology["pairs"]}
    if not rates:
        return []

    def cell(a: str, b: str) -> str:
        if a == b:
            return "X"
        record = rates.get(f"{a}->{b}")
        gbps = record.details.get("gbps") if record is not None else None
        if gbps is None:
            return "-"
        fraction = record.details.get("fraction") if record is not None else None
        return f"{gbps:.2f}" + (f" {fraction:.0%}" if fraction is not None else "")

    labels = [f"GPU{i}" for i in range(len(addresses))]
    rows = [["", *labels]] + [[labels[i], *(cell(a, b) for b in addresses)]
                              for i, a in enumerate(addresses)]
    return ["P2P measured, GB/s from row to column and its share of what the pair's path "
            "carries (a failure's share is of the spec's floor):",
            *_table(rows)]


def topology_lines(name: str, topology: Mapping[str, Any],
                   records: Sequence[CheckResult]) -> list[str]:
    """The view of one target (``records``: that target's)."""
    if "problem" in topology:
        return [f"topology of {_shown(name)}: {_shown(topology['problem'])}"]
    gpus = topology["gpus"]
    if not gpus:
        return [f"topology of {_shown(name)}: no NVIDIA GPU under sys/bus/pci/devices"]
    labels = [f"GPU{i}" for i in range(len(gpus))]
    rows = [["", *labels, "NUMA", "link", "MaxReadReq", "IOMMU"]]
    for label, gpu, classes in zip(labels, gpus, topology["matrix"], strict=True):
        rows.append([label, *classes, _shown(gpu["numa_node"]), _link(gpu),
                     _shown(gpu["max_read_request"]), _shown(gpu["iommu"])])
    lines = [f"topology of {_shown(name)} (from sysfs):", *_table(rows), ""]
    lines += [f"  {label}: {gpu['address']}" for label, gpu in zip(labels, gpus, strict=True)]
    lines += ["", "Legend:", "", *(f"  {key:<4} = {LEGEND[key]}" for key in
                                   ("X", "SYS", "NODE", "PHB", "PXB", "PIX")), ""]
    if topology["bridges"]:
        index = {gpu["address"]: label for label, gpu in zip(labels, gpus, strict=True)}
        lines.append("Bridges on the GPUs' paths (ACS redirect: ReqRedir, CmpltRedir, "
                     "EgressCtrl must be off):")
        lines += ["  " + line for line in _table([
            [b["address"], b["kind"], " ".join(index[g] for g in b["gpus"]),
             b["acs"] or _shown(b["problem"] or "no ACS capability")]
            for b in topology["bridges"]])]
        lines.append("")
    problems = sorted({p for gpu in gpus for p in gpu["problems"]})
    lines += [f"not read: {_shown(problem)}" for problem in problems]
    return lines + _measured(topology, records)


def path_text(details: Mapping[str, Any]) -> str | None:
    """A P2P or host-copy record's path as text (Allure attaches it): the bridges in the order
    data crosses them, with their ACS Control, the links, the limit and the causes, largest
    cost first; None for a record without a path."""
    path = details.get("path")
    if not isinstance(path, Mapping):
        return None
    lines = [f"PCIe path ({_shown(path['class'])}): {_shown(path['source'])} -> "
             f"{_shown(path['target'])}"]
    lines += ["  " + line for line in _table([
        [bridge["address"], bridge["role"], bridge["acs"] or "no ACS capability"]
        for bridge in path["bridges"]])] if path["bridges"] else []
    for link in path["links"]:
        aspm = f", ASPM {' '.join(link['aspm'])}" if link["aspm"] else ""
        idle = " (read idle)" if link["idle"] else ""
        lines.append(f"link {link['lower']} - {link['upper']}: {link['negotiated']}{idle} of "
                     f"{link['capable']}{aspm}")
    limit, gbps = details.get("limit_gbps"), details.get("gbps")
    if limit is not None:
        measured = f"; measured {gbps:.2f} GB/s, {details['fraction']:.0%} of what it carries" \
            if gbps is not None and details.get("fraction") is not None else ""
        lines.append(f"carries {limit:.2f} GB/s at MPS {path['max_payload']}{measured}")
    causes = details.get("explain") or []
    lines.append("limited by, largest cost first:" if causes else "nothing on the path limits it")
    lines += [f"  {c['cause']} at {_shown(c['at'])}: {_shown(c['observed'])} (expected "
              f"{c['expected']}): {c['effect']}; {c['remedy']}" for c in causes]
    lines += [f"not read: {_shown(problem)}" for problem in path["problems"]]
    return "\n".join(lines) + "\n"


def ring_text(details: Mapping[str, Any]) -> str | None:
    """A collective record's ring as text (Allure attaches it): what NCCL chose, each hop, the
    bound its slowest hop sets and the causes, largest cost first; None for a record without a
    ring."""
    ring = details.get("ring")
    if not isinstance(ring, list):
        return None
    transports = details.get("transports") or {}
    lines = [f"{_shown(details.get('collective'))} at {_shown(details.get('size'))} over "
             f"{_shown(details.get('gpus'))} GPUs: busbw {_shown(details.get('busbw'))} GB/s "
             f"({_shown(details.get('source'))})",
             f"NCCL {_shown(details.get('nccl_version'))}, {_shown(details.get('channels'))} "
             "channels, transports: " + (", ".join(f"{_shown(name)} x{count}" for name, count
                                                   in transports.items()) or "not printed")]
    env = details.get("env") or {}
    if env:
        lines.append("environment taken: " + ", ".join(f"{_shown(k)}={_shown(v)}"
                                                      for k, v in env.items()))
    lines += ["ring hops:", *(f"  {_shown(hop)}" for hop in ring)]
    limit = details.get("limit_gbps")
    if limit is not None:
        what = "the measured P2P bandwidth" if details.get("limit_by") == "measured" else \
            "the path"
        lines.append(f"bound: {limit:.2f} GB/s, {what} of {_shown(details.get('limit_hop'))}"
                     f"; reached {details.get('fraction') or 0:.0%} of it")
    causes = details.get("explain") or []
    lines.append("limited by, largest cost first:" if causes else "nothing found that limits it")
    lines += [f"  {c['cause']} at {_shown(c['at'])}: {_shown(c['observed'])} (expected "
              f"{_shown(c['expected'])}): {c['effect']}; {c['remedy']}" for c in causes]
    lines += [f"not judged: {_shown(note)}" for note in details.get("explain_notes") or ()]
    return "\n".join(lines) + "\n"


class TopologyView:
    """Writes each target's view to the terminal (``write_line``), after the summary."""

    def __init__(self, write_line: Callable[[str], None]) -> None:
        self.write_line = write_line

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        named = bool(info.targets)
        for name, topology in info.topologies:
            mine = [r for r in records if not named or r.target == name]
            self.write_line("")
            for line in topology_lines(name if named else info.root, topology, mine):
                self.write_line(line)
