"""The ``file:PATH`` probe: a saved output of nvbandwidth or p2pBandwidthLatencyTest (a relative
PATH is under the host root, an absolute one is read as is). Under ``auto`` it is here where the
root is not this machine (a fake tree) and holds a recorded output."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ..files import read_regular
from ..host import HostError, Read
from .probe import RECORDED, RECORDED_DIR

SAVED_LIMIT = 64 * 2**20
"""Bytes of a saved output read from this machine (a tool's whole output is far less)."""

if TYPE_CHECKING:
    from ..host import Request
    from .bandwidth import Measurements
    from .probe import Measuring, ProbeSettings

STALE = ("a saved output: it does not change with --fix; re-measure with probe cuda or "
         "nvbandwidth to see a fix's effect")


class SavedOutput:
    def reads(self, section: ProbeSettings) -> tuple[Request, ...]:
        relative = section.path is not None and not Path(section.path).is_absolute()
        return (Read(section.path),) if relative and section.path else ()

    def auto_reads(self) -> tuple[Request, ...]:
        return tuple(Read(f"{RECORDED_DIR}/{name}") for name in RECORDED)

    def here(self, measuring: Measuring) -> str | None:
        if measuring.real:
            return None
        return next((f"{RECORDED_DIR}/{name}" for name in RECORDED
                     if measuring.host.exists(f"{RECORDED_DIR}/{name}")), None)

    def measure(self, measuring: Measuring, source: str | None) -> Measurements:
        from .bandwidth import Measurements, ParseError, parse_output, to_measurements

        assert source is not None
        if Path(source).is_absolute():
            try:
                text = read_regular(Path(source), SAVED_LIMIT).decode("utf-8", errors="replace")
            except OSError as exc:
                raise HostError(f"cannot read {source}: {exc.strerror}") from exc
        else:
            text = measuring.host.read_text(source)
        try:
            output = parse_output(text)
        except ParseError as exc:
            raise HostError(f"{source}: {exc}") from exc
        measured = to_measurements(output, measuring.gpus, f"recorded in {source}")
        return Measurements(measured.source, measured.rates, (*measured.notes, STALE))
