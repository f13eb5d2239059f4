"""Why a collective's bus bandwidth is what it is: what NCCL chose (transports, channels, the
environment it took) and the P2P causes on its ring's hops, each named at its place, largest
estimated cost first, with the bound its slowest hop sets.

It stands on the explainer of a pair (``p2p_explain``): a ring hop is a GPU-to-GPU flow whose
path facts were read in the run's batch. Causes of its own:

- ``nccl_wrong``: the collective returned wrong data (``#wrong`` above 0): a failure whatever
  its bandwidth.
- ``nccl_transport``: ring neighbours that talk over SHM (host memory) or NET where the GPUs
  could use P2P, and what made NCCL choose so: ``NCCL_P2P_DISABLE``, an ``NCCL_P2P_LEVEL``
  tighter than the pair's path class, P2P unsupported on the pair (NVML), a topology file
  (``NCCL_TOPO_FILE``), else NCCL's own default on this platform.
- ``nccl_channels``: fewer channels than the links need (the section's ``channels``, else the
  spec's ``NCCL_MIN_NCHANNELS``, else 8: on 8 GPUs over PCIe NCCL's 2 leave links idle),
  naming ``NCCL_MAX_NCHANNELS``, ``NCCL_MIN_NCHANNELS`` or NCCL's default.
- ``nccl_env``: an ``NCCL_*`` setting the run took that the spec does not expect, and an
  expected one it did not take.

Estimated costs, for the order only: wrong data 100%, a hop over SHM 50%, too few channels 41%
at 2 of 8 (22.2 against 37.6 GB/s, the public 8x RTX PRO 6000 figures), an unexpected setting
5%; a hop's path causes cost what they cost the pair. A ring all-reduce cannot beat its slowest
hop: ``limit_gbps`` is what that hop carries, ``fraction`` the share of it reached. A hop carries
what its path's links allow (the P2P limit of the path), or, where the spec's p2p section
measures the pairs (offered as ``offers.p2p_bandwidth``, measured once for both), the lower of
that and its measured P2P bandwidth; ``limit_by`` says which (``path`` or ``measured``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..gpu.nccltests import NcclOutput, Row, rank_addresses
from ..host import Host
from . import Evidence
from .p2p_explain import Cause, Explainer, Flow

if TYPE_CHECKING:  # the parsers load when a measurement is taken
    from ..gpu.bandwidth import Measurements

CAUSES = ("nccl_wrong", "nccl_transport", "p2p_unsupported", "link_downtrained",
          "nccl_channels", "acs_redirect", "max_read_request", "cross_socket",
          "iommu_translated", "aspm", "nccl_env")
"""Every cause a collective's record may name; ties of cost are broken in this order."""
LOSS = {"nccl_wrong": 1.0, "nccl_transport": 0.5, "nccl_channels": 0.41, "nccl_env": 0.05}
PCIE_CHANNELS = 8
"""The channels a ring over PCIe needs where the spec says no other number."""
DEFAULT_CHANNELS = 2
"""NCCL's default on the public 8x RTX PRO 6000 board, where LOSS["nccl_channels"] was read."""
LEVELS = {"LOC": 0, "NVL": 1, "NVB": 2, "PIX": 3, "PXB": 4, "PXN": 5, "PHB": 6, "NODE": 6,
          "SYS": 7}
"""NCCL's path classes, tightest first (nvidia-smi's NODE is NCCL's PHB): P2P is used on a pair
whose class is at most ``NCCL_P2P_LEVEL``."""
CROSSING = ("the board decides it: a ring over both sockets crosses their interconnect twice; "
            "hold it to a floor that allows for that, or run the job on one socket's GPUs")
OWN = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
"""Variables the check itself sets to read NCCL's choices: never a cause."""


class Judged(msgspec.Struct, frozen=True):
    """What the spec expects of the run's NCCL (for the words of the causes)."""

    env: Mapping[str, str]
    channels: int | None = None


class HopLimit(msgspec.Struct, frozen=True):
    """What one ring hop (``A->B``) carries: its path's P2P limit and, where the spec's p2p
    section measures the pair, its measured P2P bandwidth (None where unknown)."""

    hop: str
    path: float | None
    measured: float | None = None

    @property
    def bound(self) -> tuple[float, str] | None:
        """(GB/s, ``path`` or ``measured``): the lower of the two known, None where neither is."""
        known = [(value, by) for value, by in ((self.measured, "measured"), (self.path, "path"))
                 if value is not None]
        return min(known, key=lambda k: k[0]) if known else None


class Bound(msgspec.Struct, frozen=True):
    """What the ring cannot exceed: its slowest hop's bound."""

    gbps: float
    hop: str
    by: str
    """``path`` (its path's P2P limit) or ``measured`` (its P2P bandwidth as the p2p section
    measured it, where that is lower; on a tie, the measurement)."""

    def words(self) -> str:
        """``the path of A->B`` or ``the measured P2P bandwidth of A->B``."""
        return f"the {'measured P2P bandwidth' if self.by == 'measured' else 'path'} of " \
               f"{self.hop}"


class CollectiveExplained(msgspec.Struct, frozen=True):
    causes: tuple[Cause, ...]
    hops: tuple[tuple[str, str], ...]
    limit: Bound | None
    """The slowest hop's bound, None where a hop's is unknown."""
    notes: tuple[str, ...] = ()
    hop_limits: tuple[HopLimit, ...] = ()

    def culprits(self) -> str | None:
        """The top cause in words, then the others by name (the failure's first line)."""
        if not self.causes:
            return None
        top, rest = self.causes[0], self.causes[1:]
        names = list(dict.fromkeys(c.cause for c in rest))
        more = f" (and {len(rest)} more: {', '.join(names)})" if rest else ""
        return top.words + more

    def details(self, busbw: float | None) -> dict[str, Any]:
        bound = self.limit
        details: dict[str, Any] = {
            "limit_gbps": round(bound.gbps, 2) if bound is not None else None,
            "limit_hop": bound.hop if bound is not None else None,
            "limit_by": bound.by if bound is not None else None,
            "fraction": round(busbw / bound.gbps, 3) if bound is not None and busbw else None,
            "ring": [f"{a}->{b}" for a, b in self.hops],
            "hop_limits": {h.hop: {"path_gbps": _rounded(h.path),
                                   "measured_gbps": _rounded(h.measured)}
                           for h in self.hop_limits},
            "explain": [c.as_dict() for c in self.causes]}
        if self.notes:
            details["explain_notes"] = list(self.notes)
        return details

    def evidence(self) -> tuple[Evidence, ...]:
        shown = [Evidence(f"explain: {c.cause}", f"{c.at}: {c.observed} (expected "
                                                  f"{c.expected}): {c.effect}")
                 for c in self.causes]
        bound = self.limit
        if bound is not None:
            slowest = next(h for h in self.hop_limits if h.hop == bound.hop)
            beside = f" (its path carries {slowest.path:.2f})" \
                if bound.by == "measured" and slowest.path is not None else \
                f" (measured {slowest.measured:.2f})" if slowest.measured is not None else ""
            what = "measured P2P bandwidth" if bound.by == "measured" else "path"
            shown.insert(0, Evidence("ring bound", f"{bound.gbps:.2f} GB/s, the {what} of its "
                                                   f"slowest hop {bound.hop}{beside}"))
        return tuple(shown) + tuple(Evidence("explain: not judged", n) for n in self.notes)


def _rounded(value: float | None) -> float | None:
    return round(value, 2) if value is not None else None


def ring_hops(output: NcclOutput, ranks: Mapping[int, str]) -> tuple[tuple[str, str], ...]:
    """Each ring's neighbours as GPU pairs, once each, in the order the rings give them (rank
    order where the output prints no ring)."""
    rings = output.rings or (tuple(sorted(ranks)),)
    hops: dict[tuple[str, str], None] = {}
    for ring in rings:
        for i, source in enumerate(ring):
            target = ring[(i + 1) % len(ring)]
            if source != target and source in ranks and target in ranks:
                hops[(ranks[source], ranks[target])] = None
    return tuple(hops)


class CollectiveExplainer:
    """Explains one run's row on one host, from the pair explainer's facts of the same batch."""

    def __init__(self, pairs: Explainer, gpus: Sequence[str], judged: Judged) -> None:
        self.pairs = pairs
        self.gpus = tuple(gpus)
        self.judged = judged

    def explain(self, host: Host, output: NcclOutput, row: Row,
                measured: Measurements | None = None) -> CollectiveExplained:
        """``measured``: the pairs' P2P bandwidth as the spec's p2p section measured it, which
        bounds each hop beside its path."""
        facts = self.pairs.prepare(host)
        notes: list[str] = []
        machines = sorted({d.host for d in output.devices})
        if len(machines) > 1:  # this target's GPUs are one machine's: not the others'
            ranks: dict[int, str] = {}
            notes.append(f"a run over {len(machines)} machines ({', '.join(machines[:4])}): "
                         "its hops are not this target's paths, and are not explained")
        else:
            ranks = rank_addresses(output, self.gpus)
        hops = ring_hops(output, ranks)
        if not output.rings and ranks:
            notes.append("the output prints no ring (NCCL_DEBUG=INFO): its hops are taken in "
                         "rank order")
        env = output.environment()
        causes: list[Cause] = []
        if row.errors:
            causes.append(_wrong(row))
        named: set[str] = set()
        causes += self._transports(output, ranks, env, named, lambda a, b: facts.pair(a, b).level)
        causes += self._channels(output, env, named, notes)
        limit: Bound | None = None
        unknown = False
        unmeasured: list[str] = []
        limits: list[HopLimit] = []
        places: dict[tuple[str, str], tuple[Cause, list[str]]] = {}
        for source, target in hops:
            explained = self.pairs.explain(host, Flow("ring", source, target))
            found = explained.path.limit()
            hop = f"{source}->{target}"
            rate = measured.rates.get(hop) if measured is not None else None
            if measured is not None and (rate is None or rate.gbps is None):
                unmeasured.append(hop if rate is None or not rate.problem else
                                  f"{hop} ({rate.problem})")
            limits.append(HopLimit(hop, found[0] if found is not None else None,
                                   rate.gbps if rate is not None else None))
            bound = limits[-1].bound
            if bound is None:
                unknown = True
            elif limit is None or bound[0] < limit.gbps:
                limit = Bound(bound[0], hop, bound[1])
            for cause in explained.causes:
                kept = places.setdefault((cause.cause, cause.at), (cause, []))
                kept[1].append(f"{source}->{target}")
            notes += explained.notes
        for cause, on in places.values():
            more = f" and {len(on) - 1} more" if len(on) > 1 else ""
            if cause.cause == "cross_socket":  # a pair's words name the pair's floors
                cause = msgspec.structs.replace(
                    cause, remedy=CROSSING, subject=f"the ring's hop {on[0]} ({cause.observed})")
            causes.append(msgspec.structs.replace(cause, at=f"{cause.at} (hop {on[0]}{more})"))
        causes += self._env(output, env, named)
        order = {id(c): i for i, c in enumerate(causes)}
        ranked = sorted(causes, key=lambda c: (-c.loss, CAUSES.index(c.cause), order[id(c)]))
        if unmeasured:
            notes.append(f"{measured.source if measured is not None else 'p2p'} has no rate "
                         f"for the ring's {'hop' if len(unmeasured) == 1 else 'hops'} "
                         f"{', '.join(unmeasured)}: bounded by the path alone")
        if unknown:
            limit = None
            notes.append("the ring's bound needs the link registers of every hop's path"
                         + (" or its measured P2P bandwidth" if measured is not None else ""))
        return CollectiveExplained(tuple(ranked), hops, limit, tuple(dict.fromkeys(notes)),
                                   tuple(limits))

    def _transports(self, output: NcclOutput, ranks: Mapping[int, str], env: Mapping[str, str],
                    named: set[str], level_of: Callable[[str, str], str]) -> list[Cause]:
        """A cause per reason that ring neighbours do not talk P2P."""
        hosts = {d.rank: d.host for d in output.devices}
        off: dict[tuple[str, str], tuple[str, str]] = {}
        for connection in output.connections:
            a, b = ranks.get(connection.source), ranks.get(connection.target)
            if a is None or b is None or connection.kind not in ("SHM", "NET"):
                continue
            if hosts.get(connection.source) != hosts.get(connection.target):
                continue  # another node: the network is its only way
            off.setdefault((a, b), (connection.transport, level_of(a, b)))
        by_reason: dict[str, list[tuple[str, str, str, str]]] = {}
        for (a, b), (transport, level) in off.items():
            reason = self._why_not_p2p(a, b, level, env)
            by_reason.setdefault(reason, []).append((a, b, transport, level))
        total = sum(1 for c in output.connections if c.source in ranks and c.target in ranks)
        causes = []
        for reason, pairs in by_reason.items():
            transports = sorted({t for _, _, t, _ in pairs})
            levels = sorted({lv for *_, lv in pairs}, key=lambda lv: LEVELS.get(lv, 9))
            why, remedy, subject = self._words(reason, levels, env)
            named.update(v for v in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_TOPO_FILE")
                         if v == reason)
            kind = transports[0].split("/")[0].upper()
            through = "host memory (SHM)" if kind == "SHM" else "the network (NET)"
            causes.append(Cause(
                "nccl_transport", ", ".join(f"{a}->{b}" for a, b, _, _ in pairs),
                f"{', '.join(transports)} on {len(pairs)} ring "
                f"{'pair' if len(pairs) == 1 else 'pairs'} (of {total} connections): {why}",
                "P2P", f"sends ring traffic through {through} instead of GPU to GPU", remedy,
                LOSS["nccl_transport"], subject))
        return causes

    def _why_not_p2p(self, a: str, b: str, level: str, env: Mapping[str, str]) -> str:
        """What made NCCL leave a pair without P2P: the variable that says so, ``nvml`` (P2P
        unsupported on the pair), or ``default`` (NCCL's own choice)."""
        if env.get("NCCL_P2P_DISABLE", "").strip() not in ("", "0"):
            return "NCCL_P2P_DISABLE"
        wanted = env.get("NCCL_P2P_LEVEL", "").strip().upper()
        if wanted in LEVELS and level in LEVELS and LEVELS[level] > LEVELS[wanted]:
            return "NCCL_P2P_LEVEL"
        if self.pairs.p2p_status(a, b) != "ok":
            return "nvml"
        return "NCCL_TOPO_FILE" if env.get("NCCL_TOPO_FILE") else "default"

    def _words(self, reason: str, levels: Sequence[str], env: Mapping[str, str]
               ) -> tuple[str, str, str]:
        """(why, remedy, the cause as a sentence begins) of a reason for the pairs' classes."""
        classes = ", ".join(levels)
        loosest = "PHB" if levels[-1] == "NODE" else levels[-1]
        if reason == "NCCL_P2P_DISABLE":
            value = env["NCCL_P2P_DISABLE"]
            return (f"NCCL_P2P_DISABLE={value}", "unset NCCL_P2P_DISABLE in the job's "
                    "environment (it is for debugging a peer path)",
                    f"NCCL_P2P_DISABLE={value}")
        if reason == "NCCL_P2P_LEVEL":
            wanted = env["NCCL_P2P_LEVEL"].strip().upper()
            return (f"NCCL_P2P_LEVEL={wanted} is tighter than the pairs' paths ({classes})",
                    f"unset NCCL_P2P_LEVEL, or set it to {loosest} or looser (SYS allows "
                    "every PCIe pair)", f"NCCL_P2P_LEVEL={wanted} on {classes} pairs")
        if reason == "nvml":
            return ("P2P is unsupported on the pair (NVML's P2P read status)",
                    "enable P2P: the GPU model and driver must support it, and the platform's "
                    "firmware allow it (ACS, IOMMU, Above 4G Decoding)", "P2P unsupported")
        if reason == "NCCL_TOPO_FILE":
            topo = env["NCCL_TOPO_FILE"]
            return (f"the topology file NCCL_TOPO_FILE={topo}", "check the topology file "
                    "against this board (nvidia-smi topo -m), or unset NCCL_TOPO_FILE",
                    f"the topology file {topo}")
        return (f"NCCL's default P2P level stops short of the pairs' paths ({classes})",
                f"set NCCL_P2P_LEVEL={loosest} where the p2p section measures these pairs' P2P "
                "well (a switch board: 30.3 -> 39.3 GB/s with SYS on 8x RTX PRO 6000)",
                f"NCCL's default on {classes} pairs")

    def _channels(self, output: NcclOutput, env: Mapping[str, str], named: set[str],
                  notes: list[str]) -> list[Cause]:
        if output.channels is None:
            notes.append("the output prints no channel count (NCCL_DEBUG=INFO)")
            return []
        expected = self.judged.env.get("NCCL_MIN_NCHANNELS", "")
        needed = self.judged.channels or (int(expected) if expected.isdigit() else
                                          PCIE_CHANNELS)
        have = output.channels
        if have >= needed:
            return []
        most, least = env.get("NCCL_MAX_NCHANNELS", ""), env.get("NCCL_MIN_NCHANNELS", "")
        if most.isdigit() and int(most) < needed:
            named.add("NCCL_MAX_NCHANNELS")
            why, remedy = (f"NCCL_MAX_NCHANNELS={most} caps them",
                           f"raise NCCL_MAX_NCHANNELS to {needed} or unset it")
        elif least:
            named.add("NCCL_MIN_NCHANNELS")
            why, remedy = (f"NCCL_MIN_NCHANNELS={least} asks for too few",
                           f"set NCCL_MIN_NCHANNELS={needed} in the job's environment")
        else:
            why, remedy = ("NCCL's default on this topology",
                           f"set NCCL_MIN_NCHANNELS={needed} in the job's environment (and in "
                           "the nccl section's env: a live run sets it, a saved one is held "
                           "to it)")
        share = (1 - have / needed) / (1 - DEFAULT_CHANNELS / PCIE_CHANNELS)
        return [Cause("nccl_channels", "the run's channels", f"{have} coll channels: {why}",
                      f">= {needed}", "leaves the links part idle: too few rings in flight",
                      remedy, min(0.9, LOSS["nccl_channels"] * share),
                      f"{have} channels of {needed} ({why})")]

    def _env(self, output: NcclOutput, env: Mapping[str, str], named: set[str]) -> list[Cause]:
        causes = []
        wanted = self.judged.env
        for name, value in env.items():
            if name in OWN or name in named or wanted.get(name) == value:
                continue
            expected = f"{name}={wanted[name]}" if name in wanted else \
                "not set (the nccl section's env does not name it)"
            causes.append(Cause("nccl_env", name, f"{name}={value}", expected,
                                "makes NCCL choose otherwise than the spec describes",
                                f"unset {name} in the job's environment, or add it to the nccl "
                                "section's env where it is meant", LOSS["nccl_env"],
                                f"{name}={value}, which the spec does not expect,"))
        said = bool(output.version or env or output.connections)
        for name, value in wanted.items():
            if name not in env and said and name not in named:
                causes.append(Cause("nccl_env", name, "not set", f"{name}={value}",
                                    "leaves out a setting the spec expects",
                                    f"set {name}={value} in the job's environment (a live run "
                                    "sets the section's env itself)", LOSS["nccl_env"],
                                    f"{name}, expected {value} but not set,"))
        return causes


def _wrong(row: Row) -> Cause:
    where = [f"{n} out of place" for n in (row.wrong,) if n] + \
        [f"{n} in place" for n in (row.in_wrong,) if n]
    return Cause("nccl_wrong", f"{row.size} bytes", f"#wrong {', '.join(where)}", "#wrong 0",
                 "returned wrong data: its bandwidth means nothing",
                 "look for Xid and AER errors (the dmesg and pcie checks), then reseat or "
                 "replace the GPU the errors follow", LOSS["nccl_wrong"],
                 f"the collective's wrong values ({', '.join(where)})")
