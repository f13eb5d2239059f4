"""The cuda probe's logic on a fake CUDA runtime: peer access, warm-up, events, median, rings."""

from __future__ import annotations

import enum
import threading
import types
from typing import Any

import pytest

from pytest_gpuhost.gpu.bandwidth import Measurements
from pytest_gpuhost.gpu.cudaprobe import (
    CudaBandwidth,
    CudaError,
    CudaHung,
    CudaUnavailable,
    load_runtime,
    measure_within,
)
from pytest_gpuhost.testing.clock import FakeClock

from ..conftest import ended_within

MiB = 2**20


class Err(enum.Enum):
    cudaSuccess = 0
    cudaErrorPeerAccessAlreadyEnabled = 704


class FakeRuntime:
    """Copies take size / rate seconds on their stream; events record the stream's clock."""

    cudaError_t = Err
    cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2)

    def __init__(self, rates: dict[tuple[Any, Any], list[float]], no_peer: set[tuple[int, int]]
                 ) -> None:
        self.rates = {k: list(v) for k, v in rates.items()}
        self.no_peer = no_peer
        self.device = 0
        self.peers: set[tuple[int, int]] = set()
        self.clock: dict[int, float] = {}
        self.events: dict[int, float] = {}
        self.log: list[str] = []
        self._ids = iter(range(1, 10_000))
        self.live: set[int] = set()
        self.owner: dict[int, int] = {}
        """stream or event -> the device current when it was created."""

    def _new(self) -> int:
        handle = next(self._ids)
        self.live.add(handle)
        return handle

    def cudaGetDeviceCount(self) -> tuple[Err, int]:
        return Err.cudaSuccess, 2

    def cudaDeviceGetPCIBusId(self, length: int, device: int) -> tuple[Err, bytes]:
        return Err.cudaSuccess, [b"0000:01:00.0", b"0000:81:00.0"][device] + b"\0" * 20

    def cudaSetDevice(self, device: int) -> tuple[Err]:
        self.device = device
        return (Err.cudaSuccess,)

    def cudaDeviceCanAccessPeer(self, one: int, other: int) -> tuple[Err, int]:
        return Err.cudaSuccess, int((one, other) not in self.no_peer)

    def cudaDeviceEnablePeerAccess(self, peer: int, flags: int) -> tuple[Err]:
        self.peers.add((self.device, peer))
        return (Err.cudaSuccess,)

    def cudaDeviceDisablePeerAccess(self, peer: int) -> tuple[Err]:
        self.peers.discard((self.device, peer))
        return (Err.cudaSuccess,)

    def cudaMalloc(self, size: int) -> tuple[Err, int]:
        return Err.cudaSuccess, self._new()

    cudaMallocHost = cudaMalloc

    def cudaFree(self, pointer: int) -> tuple[Err]:
        self.live.remove(pointer)
        return (Err.cudaSuccess,)

    cudaFreeHost = cudaFree
    cudaStreamDestroy = cudaFree
    cudaEventDestroy = cudaFree

    def cudaStreamCreate(self) -> tuple[Err, int]:
        stream = self._new()
        self.clock[stream] = 0.0
        self.owner[stream] = self.device
        return Err.cudaSuccess, stream

    def cudaEventCreate(self) -> tuple[Err, int]:
        event = self._new()
        self.owner[event] = self.device
        return Err.cudaSuccess, event

    def cudaEventRecord(self, event: int, stream: int) -> tuple[Err]:
        assert self.owner[event] == self.owner[stream], "event and stream on different devices"
        self.events[event] = self.clock[stream]
        return (Err.cudaSuccess,)

    def cudaEventSynchronize(self, event: int) -> tuple[Err]:
        return (Err.cudaSuccess,)

    cudaStreamSynchronize = cudaEventSynchronize

    def cudaEventElapsedTime(self, start: int, stop: int) -> tuple[Err, float]:
        return Err.cudaSuccess, self.events[stop] - self.events[start]

    def _copy(self, key: tuple[Any, Any], size: int, stream: int) -> tuple[Err]:
        rates = self.rates[key]
        rate = rates.pop(0) if len(rates) > 1 else rates[0]
        self.clock[stream] += size / (rate * 1e9) * 1e3
        self.log.append(f"copy {key} on device {self.owner[stream]}")
        return (Err.cudaSuccess,)

    def cudaMemcpyPeerAsync(self, dst: int, dst_dev: int, src: int, src_dev: int, size: int,
                            stream: int) -> tuple[Err]:
        assert (src_dev, dst_dev) in self.peers and (dst_dev, src_dev) in self.peers
        return self._copy((src_dev, dst_dev), size, stream)

    def cudaMemcpyAsync(self, dst: int, src: int, size: int, kind: int, stream: int
                        ) -> tuple[Err]:
        return self._copy(("h2d" if kind == 1 else "d2h", self.device), size, stream)

    def cudaGetErrorString(self, err: Err) -> tuple[Err, bytes]:
        return Err.cudaSuccess, b"error"


GPUS = ["0000:01:00.0", "0000:81:00.0"]


def test_pairs_are_the_median_after_a_warm_up_and_peer_access_is_undone() -> None:
    # The warm-up copy is slow (1.0 GB/s) and must not count; then 5 timed copies.
    runtime = FakeRuntime({(0, 1): [1.0, 50.0, 52.0, 10.0, 51.0, 53.0],
                           (1, 0): [1.0, 40.0]}, set())
    measured = CudaBandwidth(runtime, 256 * MiB).measure(GPUS, pairs=True, h2d=False,
                                                         d2h=False, ring=False)
    assert measured.rates["0000:01:00.0->0000:81:00.0"].gbps == pytest.approx(51.0)
    assert measured.rates["0000:81:00.0->0000:01:00.0"].gbps == pytest.approx(40.0)
    assert runtime.peers == set() and runtime.live == set()  # everything released
    # Each copy runs on the target's stream: B's copy engine reads from A (what MaxReadReq limits).
    assert set(runtime.log) == {"copy (0, 1) on device 1", "copy (1, 0) on device 0"}
    assert "median of 5 after 1 warm-up" in measured.source


def test_a_pair_without_peer_access_fails_and_is_never_copied() -> None:
    runtime = FakeRuntime({(1, 0): [30.0]}, {(0, 1)})
    measured = CudaBandwidth(runtime, MiB).measure(GPUS, pairs=True, h2d=False, d2h=False,
                                                   ring=False)
    for key in ("0000:01:00.0->0000:81:00.0", "0000:81:00.0->0000:01:00.0"):
        rate = measured.rates[key]
        assert rate.gbps is None and "cudaDeviceCanAccessPeer(0, 1) is 0" in str(rate.problem)
    assert runtime.log == []


def test_host_copies_and_the_concurrent_ring() -> None:
    runtime = FakeRuntime({("h2d", 0): [55.0], ("h2d", 1): [54.0], ("d2h", 0): [56.0],
                           ("d2h", 1): [57.0], (0, 1): [21.0], (1, 0): [22.0]}, set())
    measured = CudaBandwidth(runtime, 64 * MiB, repeats=3).measure(
        GPUS, pairs=False, h2d=True, d2h=True, ring=True)
    assert measured.rates["h2d[0000:81:00.0]"].gbps == pytest.approx(54.0)
    assert measured.rates["d2h[0000:01:00.0]"].gbps == pytest.approx(56.0)
    assert measured.rates["ring:0000:01:00.0->0000:81:00.0"].gbps == pytest.approx(21.0)
    assert measured.rates["ring:0000:81:00.0->0000:01:00.0"].gbps == pytest.approx(22.0)
    assert runtime.live == set()
    ring = {line for line in runtime.log if not line.startswith(("copy ('h2d'", "copy ('d2h'"))}
    assert ring == {"copy (0, 1) on device 1", "copy (1, 0) on device 0"}


def test_without_cuda_python_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime", "cuda.cudart"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(CudaUnavailable) as error:
        load_runtime()
    assert str(error.value) == ("cuda-python is not installed: install cuda-python: pip install "
                                "'pytest-gpuhost[cuda]' (from a checkout: pip install '.[cuda]')")


def test_each_pair_is_reported_as_it_is_measured() -> None:
    from pytest_gpuhost.progress import progress_to

    runtime = FakeRuntime({(0, 1): [1.0, 50.0], (1, 0): [1.0, 40.0]}, set())
    lines: list[str] = []
    with progress_to(lines.append):
        CudaBandwidth(runtime, MiB).measure(GPUS, pairs=True, h2d=False, d2h=False, ring=False)
    assert lines == ["cuda probe: pair 1 of 2: 0000:01:00.0->0000:81:00.0",
                     "cuda probe: pair 2 of 2: 0000:81:00.0->0000:01:00.0"]


class StuckRuntime(FakeRuntime):
    """A GPU fallen off the bus: a synchronize that never returns (until the test lets go);
    the wait for it runs out on ``clock``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__({(0, 1): [50.0], (1, 0): [40.0]}, set())
        self.release = threading.Event()
        self.waits_on = clock

    def cudaEventSynchronize(self, event: int) -> tuple[Err]:
        self.waits_on.stall()
        self.release.wait()
        return (Err.cudaSuccess,)


def test_a_cuda_call_that_never_returns_is_given_up_at_the_timeout() -> None:
    clock = FakeClock()
    runtime = StuckRuntime(clock)
    try:
        error = ended_within(60, lambda: measure_within(0.5, lambda: CudaBandwidth(
            runtime, MiB).measure(GPUS, pairs=True, h2d=False, d2h=False, ring=False),
            clock=clock), "the cuda probe")
        assert isinstance(error, CudaHung)
        assert str(error).startswith("the measurement did not finish within 0.5 s: a CUDA call "
                                     "is stuck")
        assert "raise the p2p section's timeout" in str(error)
        assert clock.waits == [0.5] and clock.now() == 1000.5  # the timeout on the clock
    finally:
        runtime.release.set()


def test_a_bounded_measurement_reports_progress_and_its_errors() -> None:
    from pytest_gpuhost.progress import progress_to

    runtime = FakeRuntime({(0, 1): [1.0, 50.0], (1, 0): [1.0, 40.0]}, set())
    lines: list[str] = []
    with progress_to(lines.append):
        measured = measure_within(10, lambda: CudaBandwidth(runtime, MiB).measure(
            GPUS, pairs=True, h2d=False, d2h=False, ring=False))
    assert measured.rates["0000:81:00.0->0000:01:00.0"].gbps == pytest.approx(40.0)
    assert len(lines) == 2

    def fails() -> Measurements:
        raise CudaError("cudaMalloc failed: out of memory")

    with pytest.raises(CudaError, match="out of memory"):
        measure_within(10, fails)
