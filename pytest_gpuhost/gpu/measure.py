"""Measure once per session: the first check to need the numbers measures every pair, serially,
under a file lock in the directory shared with the xdist workers; the others read the result.

Without xdist there is one process and the result is kept in memory. A failed measurement is
kept too, so each check reports the same reason instead of trying again.

``Measurer`` takes the measurement with the section's probe: ``cuda`` (ours, cuda-python),
``nvbandwidth`` (the binary, ``-j``), ``file:PATH`` (a saved output; a relative PATH is under
the host root, an absolute one is read as is) and ``auto``: on ``/``, cuda if cuda-python is
installed, else nvbandwidth if found; on any other root (a fake tree) an ``nvbandwidth`` under
the root, else a recorded output in ``var/lib/pytest-gpuhost/``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..files import write_atomically
from ..host import CommandTimeout, Host, HostError, Read, Request, Which
from ..progress import report_progress

if TYPE_CHECKING:  # the parsers and the CUDA probe load when a measurement is taken or read
    from .bandwidth import Measurements

LOCK_NAME = "p2p-measure.lock"
RECORDED_DIR = "var/lib/pytest-gpuhost"
RECORDED = ("nvbandwidth.json", "nvbandwidth.txt", "p2pBandwidthLatencyTest.txt")
NVBANDWIDTH_ENV = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
SLOW_HINT = ("links slower than expected make it slower (try a smaller size, or raise the p2p "
             "section's timeout: SECONDS); if a GPU fell off the bus, the kernel log says so "
             "(Xid 79)")


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
        with open(self._shared_dir / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one measurement at a time across all workers
            try:
                if cache.exists():
                    data: dict[str, Any] = json.loads(cache.read_text())
                    return data
                record = self._take()
                write_atomically(cache, json.dumps(record))
                return record
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def probe_reads(section: ProbeSettings) -> tuple[Request, ...]:
    """The host reads of choosing the probe (``auto``) and of a saved output under the root."""
    if section.probe == "file":
        relative = section.path is not None and not Path(section.path).is_absolute()
        return (Read(section.path),) if relative and section.path else ()
    if section.probe == "nvbandwidth":
        return (Which("nvbandwidth"),)
    if section.probe == "auto":
        return (Which("nvbandwidth"), *(Read(f"{RECORDED_DIR}/{name}") for name in RECORDED))
    return ()


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
        from .cudaprobe import INSTALL_HINT as CUDA_INSTALL_HINT
        from .cudaprobe import cuda_available

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
        from .bandwidth import Measurements, ParseError, parse_output, to_measurements

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
        from .bandwidth import (
            D2H_TEST,
            H2D_TEST,
            P2P_TESTS,
            ParseError,
            parse_output,
            to_measurements,
        )

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
        from .cudaprobe import (
            CudaBandwidth,
            CudaError,
            CudaUnavailable,
            load_runtime,
            measure_within,
        )

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
