"""Measure once per session: the first check to need the numbers measures every pair, serially,
under a file lock in the directory shared with the xdist workers; the others read the result.

Without xdist there is one process and the result is kept in memory. A failed measurement is
kept too, so each check reports the same reason instead of trying again.

``Measurer`` takes the measurement with the section's probe, found by name in ``probes.PROBES``:
``cuda`` (ours, cuda-python), ``nvbandwidth`` (the binary, ``-j``), ``file:PATH`` (a saved
output; a relative PATH is under the host root, an absolute one is read as is) and ``auto``: the
first of them that is here (on ``/``, cuda if cuda-python is installed, else nvbandwidth if
found; on any other root (a fake tree) an ``nvbandwidth`` under the root, else a recorded output
in ``var/lib/pytest-gpuhost/``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import write_atomically
from ..host import Host, HostError, Request
from .nvbandwidthrun import NVBANDWIDTH_ENV as NVBANDWIDTH_ENV
from .nvbandwidthrun import SLOW_HINT as SLOW_HINT
from .probe import RECORDED as RECORDED
from .probe import RECORDED_DIR as RECORDED_DIR
from .probe import ProbeSettings as ProbeSettings
from .probes import PROBES, every_probe, probe_named

if TYPE_CHECKING:  # the parsers and the CUDA probe load when a measurement is taken or read
    from .bandwidth import Measurements

LOCK_NAME = "p2p-measure.lock"


class MeasurementFailed(HostError):
    """The measurement could not be taken; every check that needs it ends in error with this."""


def cache_key(parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


class SharedMeasurement:
    def __init__(self, key: str, measure: Callable[[], Measurements],
                 shared_dir: Path | None) -> None:
        self.key = key
        self._measure = measure
        self._shared_dir = shared_dir
        self._result: Measurements | None = None
        self._error: str | None = None
        self.measured_here = False
        """Whether this process took the measurement (rather than reading another's)."""

    @property
    def done(self) -> bool:
        """Whether this process has the numbers (or the reason there are none) already."""
        return self._result is not None or self._error is not None

    def get(self) -> Measurements:
        if self._result is None and self._error is None:
            record = self._shared() if self._shared_dir is not None else self._take()
            if "error" in record:
                self._error = str(record["error"])
            else:
                from .bandwidth import Measurements

                self._result = Measurements.from_dict(record)
        if self._error is not None:
            raise MeasurementFailed(self._error)
        assert self._result is not None
        return self._result

    def _take(self) -> dict[str, Any]:
        self.measured_here = True
        try:
            return self._measure().as_dict()
        except HostError as exc:
            return {"error": str(exc)}

    def _shared(self) -> dict[str, Any]:
        assert self._shared_dir is not None
        cache = self._shared_dir / f"p2p-{self.key}.json"
        with measuring_alone(self._shared_dir):
            if cache.exists():
                data: dict[str, Any] = json.loads(cache.read_text())
                return data
            record = self._take()
            write_atomically(cache, json.dumps(record))
            return record


@contextlib.contextmanager
def measuring_alone(shared_dir: Path | None) -> Iterator[None]:
    """One measurement at a time across all the run's xdist workers (a P2P measurement, a
    collective's run): the lock file in the directory they share; nothing to hold without."""
    if shared_dir is None:
        yield
        return
    with open(shared_dir / LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def probe_reads(section: ProbeSettings) -> tuple[Request, ...]:
    """The host reads of choosing the probe (``auto``) and of a saved output under the root."""
    if section.probe == "auto":
        return tuple(read for probe in every_probe() for read in probe.auto_reads())
    return probe_named(section.probe).reads(section) if section.probe in PROBES else ()


class Measurer:
    """Resolves the spec's probe on this host and takes every wanted measurement."""

    def __init__(self, section: ProbeSettings, host: Host, gpus: tuple[str, ...],
                 wanted: Mapping[str, bool]) -> None:
        self.section = section
        self.host = host
        self.gpus = gpus
        self.wanted = dict(wanted)

    @property
    def real(self) -> bool:
        return self.host.local_machine()

    def measure(self) -> Measurements:
        if self.section.probe != "auto":
            return probe_named(self.section.probe).measure(self, self.section.path)
        for probe in every_probe():  # the first that can measure here
            source = probe.here(self)
            if source is not None:
                return probe.measure(self, source)
        if not self.real:
            raise HostError(f"probe auto: the host root {self.host.describe()} is not this "
                            "machine and has no nvbandwidth under it nor a recorded output in "
                            f"{RECORDED_DIR}/ ({', '.join(RECORDED)})")
        from .cudaprobe import INSTALL_HINT as CUDA_INSTALL_HINT

        raise HostError(f"probe auto found no way to measure: {CUDA_INSTALL_HINT}, or put "
                        "nvbandwidth on PATH")
