"""What a bandwidth probe is: a way to take the p2p section's measurement, one module each, found
by name in ``probes.PROBES`` (as kinds, reports and schemes are found).

A probe is named by the spec (``probe: cuda``) or chosen under ``auto``: the first probe of the
registry that is ``here`` takes the measurement. What it reads of the host to choose and to take
it is declared (``reads``, ``auto_reads``), so a run reads it with every other check's reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..host import Host, Request
    from .bandwidth import Measurements

RECORDED_DIR = "var/lib/pytest-gpuhost"
RECORDED = ("nvbandwidth.json", "nvbandwidth.txt", "p2pBandwidthLatencyTest.txt")
"""Saved outputs a fake tree may hold, which ``auto`` reads where the root is not this machine."""


class ProbeSettings(Protocol):
    """What taking a measurement needs of the p2p section."""

    @property
    def probe(self) -> str: ...

    @property
    def path(self) -> str | None: ...

    @property
    def size(self) -> int: ...

    @property
    def timeout(self) -> float: ...


class Measuring(Protocol):
    """A measurement to take (``measure.Measurer``): the section, the host, its GPUs in PCI
    order, and which of the pairs, host copies and the concurrent ring are wanted."""

    @property
    def section(self) -> ProbeSettings: ...

    @property
    def host(self) -> Host: ...

    @property
    def gpus(self) -> tuple[str, ...]: ...

    @property
    def wanted(self) -> Mapping[str, bool]: ...

    @property
    def real(self) -> bool:
        """Whether the host is this machine (a probe that runs here can measure it)."""


class BandwidthProbe(Protocol):
    """One way to measure; HostError says why it could not."""

    def reads(self, section: ProbeSettings) -> tuple[Request, ...]:
        """The host reads of using it where the spec names it."""

    def auto_reads(self) -> tuple[Request, ...]:
        """The host reads of asking, under ``auto``, whether it is ``here``."""

    def here(self, measuring: Measuring) -> str | None:
        """Under ``auto``: what it would measure from on this host (a saved output's path, or
        its own name), None where it cannot measure here."""

    def measure(self, measuring: Measuring, source: str | None) -> Measurements:
        """The measurement (``source``: a saved output's path, for a probe that reads one)."""
