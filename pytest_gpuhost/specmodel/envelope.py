"""The spec's ``envelope:`` section: the limits a benchmark's window is judged by, each a share
or a rate of that window with a default taken from an anchor (DCGM's budgets, GPUd's rate).

A limit is never "any": a GPU that spent 0.5% of a run in hardware slowdown under the 1% limit
keeps the run valid (DCGM failing a run for "0.0 seconds" of thermal violation is what the field
complains of, NVIDIA/DCGM#242 and #285). The counts of errors (uncorrected ECC, a pending row
remap, a new Xid) have limits of their own, which default to none new.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec

from .specfile import closest

if TYPE_CHECKING:
    from .yamlfile import Node

SECTION = "envelope"
XID_CLASSES = ("off", "hardware", "any")
"""What ``xid:`` may say, from the most lenient: no Xid makes a run invalid; a new Xid of the
hardware class (every Xid but those a program causes itself, ``APPLICATION_XIDS``); any new
Xid."""
STATES = ("unchanged", "ignored")
"""``state: unchanged``: the host's checks read the same after the run as before it."""


class Limits(msgspec.Struct, frozen=True):
    """The envelope's limits (``docs/benchmarks.md`` names each default's anchor)."""

    sample_every: float = 1.0
    """Seconds between samples during the run; 0: a sample before and after only."""
    slowdown: float = 0.01
    """Share of the run a GPU may spend in any HW, thermal or power-brake slowdown (GPUd
    flags 0.6 hardware-slowdown events a minute, about 1% of a minute at one second each)."""
    power_cap: float = 0.05
    """Share of the run a GPU may spend held by its software power cap."""
    clocks: float = 0.90
    """The median SM clock while the GPU is busy, as a share of its max, at least."""
    other_processes: int = 0
    """Compute processes on a GPU that are not the benchmark's."""
    ecc_uncorrected: int = 0
    """Uncorrected (volatile) ECC errors new during the run, per GPU."""
    remapped_rows_pending: bool = False
    """Whether a row remap pending after the run is allowed."""
    pcie_replays: int = 80
    """PCIe replays new during the run, per GPU (DCGM's budget for its diagnostic)."""
    aer_correctable: int = 480
    """Correctable AER errors new during the run, per device (DCGM's budget)."""
    aer_uncorrectable: int = 0
    """Non-fatal and fatal AER errors new during the run, per device."""
    xid: str = "hardware"
    """A new Xid of this class or worse makes the run invalid (``XID_CLASSES``)."""
    state: str = "unchanged"
    """Whether the host's checks must read after the run as before it (``STATES``)."""


DEFAULTS = Limits()
KEYS = tuple(Limits.__struct_fields__)
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(ms|s|m)?\s*")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}


def seconds(text: str) -> float:
    """``1s``, ``500ms``, ``2m``, ``0``, ``1.5`` -> seconds; ValueError for anything else."""
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is no duration like 1s, 500ms or 0")
    return float(match.group(1)) * _UNIT[match.group(2)]


def _share(node: Node, key: str) -> float:
    value = node.scalar()
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise node.error(f"envelope: {key} is a share of the run, a number from 0 to 1 "
                         f"(0.01 is 1%), got {node.kind_name()}")
    return float(value)


def _count(node: Node, key: str) -> int:
    value = node.scalar()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise node.error(f"envelope: {key} is a count, a whole number from 0, "
                         f"got {node.kind_name()}")
    return value


def _word(node: Node, key: str, words: tuple[str, ...]) -> str:
    value = node.string(f"envelope: {key}")
    if value not in words:
        raise node.error(f"envelope: {key} {value!r} is none of: {', '.join(words)}"
                         f"{closest(value, words)}")
    return value


def _duration(node: Node) -> float:
    value = node.scalar()
    if isinstance(value, bool):
        raise node.error("envelope: sample_every is a duration like 1s, 500ms or 0, "
                         f"got {node.kind_name()}")
    try:
        every = float(value) if isinstance(value, int | float) else seconds(str(value))
    except ValueError as exc:
        raise node.error(f"envelope: sample_every: {exc}") from None
    if every < 0:
        raise node.error("envelope: sample_every is a duration from 0 (0: before and after only)")
    return every


SHARES = ("slowdown", "power_cap", "clocks")
COUNTS = ("other_processes", "ecc_uncorrected", "pcie_replays", "aer_correctable",
          "aer_uncorrectable")


def parse_limits(node: Node) -> Limits:
    """The section's limits, every key not given at its default (a bare ``envelope:``: all of
    them); an unknown key, or a value of the wrong kind, is a SpecError at its line."""
    if not node.is_mapping and not node.is_sequence and node.scalar() is None:
        return DEFAULTS
    given: dict[str, object] = {}
    for key, value in node.mapping("the envelope section"):
        if key not in KEYS:
            raise value.unknown_key(key, "the envelope section", KEYS)
        if key == "sample_every":
            given[key] = _duration(value)
        elif key in SHARES:
            given[key] = _share(value, key)
        elif key in COUNTS:
            given[key] = _count(value, key)
        elif key == "remapped_rows_pending":
            given[key] = value.boolean("envelope: remapped_rows_pending")
        elif key == "xid":
            given[key] = _word(value, key, XID_CLASSES)
        else:
            given[key] = _word(value, key, STATES)
    return msgspec.structs.replace(DEFAULTS, **given)
