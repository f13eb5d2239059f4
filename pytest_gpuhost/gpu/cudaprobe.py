"""Our own bandwidth probe on cuda-python (the extra ``pytest-gpuhost[cuda]``), imported lazily.

Per ordered pair A->B (data flows A to B): peer access is checked and enabled both ways (a pair
without it fails rather than being timed as a copy staged through host memory), one warm-up copy,
then ``repeats`` timed ``cudaMemcpyPeerAsync(dst=B, src=A)`` copies between CUDA events on a
stream of the target B, so B's copy engine reads from A: the read that B's MaxReadReq limits, as
nvbandwidth's default device_to_device_memcpy_read_ce measures it. The rate is the median.
Host copies use pinned memory and ``cudaMemcpyAsync`` timed the same way. The concurrent ring
starts every GPU's copy to its neighbour at once, each on its own stream of the target, and times
each flow.

GPUs are mapped to CUDA ordinals by ``cudaDeviceGetPCIBusId``, never by position, so the probe
does not depend on ``CUDA_DEVICE_ORDER``.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from ..bounded import StillRunning, within
from ..host.clock import SYSTEM_CLOCK, Clock
from ..linux.pciaddr import normalize_address
from ..progress import report_progress
from .bandwidth import Measurements, Rate

INSTALL_HINT = ("install cuda-python: pip install 'pytest-gpuhost[cuda]' (from a checkout: "
                "pip install '.[cuda]')")


class CudaUnavailable(Exception):
    """cuda-python is missing or CUDA cannot start; the message says which."""


class CudaError(Exception):
    pass


class CudaHung(CudaError):
    """The measurement did not finish in time: a CUDA call that never returns (a GPU fallen off
    the bus blocks it in the kernel, where no signal ends it), or links far slower than
    expected. Its thread is left behind, a daemon, so the run and its exit go on."""


def measure_within(timeout: float, measure: Callable[[], Measurements], *,
                   clock: Clock = SYSTEM_CLOCK) -> Measurements:
    """``measure()`` in a thread of its own, waited for ``timeout`` seconds of ``clock``
    (``bounded.within``).

    The whole measurement runs in that one thread, not a thread per call: CUDA's current
    device (``cudaSetDevice``) belongs to the calling thread. cuda-python's bindings let go of
    the GIL in every CUDA call (``with nogil`` in cuda.bindings.runtime), so the wait ends even
    while a call is stuck. Progress lines still reach the terminal: the thread runs in a copy
    of this thread's context."""
    try:
        return within(timeout, measure, name="cuda-probe", clock=clock)
    except StillRunning:
        raise CudaHung(f"the measurement did not finish within {timeout:g} s: a CUDA call is "
                       "stuck (a GPU fallen off the bus: look for Xid 79 in the kernel log, or "
                       "try nvidia-smi) or the links are far slower than expected (try a "
                       "smaller size, or raise the p2p section's timeout: SECONDS); the probe "
                       "was given up on, its thread left behind") from None


def load_runtime() -> Any:
    """The CUDA runtime bindings: ``cuda.bindings.runtime`` (cuda-python >= 12.6) or the older
    ``cuda.cudart``."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise CudaUnavailable(f"cuda-python is not installed: {INSTALL_HINT}")


def cuda_available() -> bool:
    try:
        load_runtime()
    except CudaUnavailable:
        return False
    return True


class CudaBandwidth:
    def __init__(self, runtime: Any, size: int, *, repeats: int = 5, warmup: int = 1) -> None:
        self.rt = runtime
        self.size = size
        self.repeats = repeats
        self.warmup = warmup

    def _call(self, name: str, *args: Any) -> Any:
        result = getattr(self.rt, name)(*args)
        err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        if err != self.rt.cudaError_t.cudaSuccess:
            raise CudaError(f"{name} failed: {self._describe(err)}")
        return rest[0] if len(rest) == 1 else rest

    def _describe(self, err: Any) -> str:
        try:
            _, text = self.rt.cudaGetErrorString(err)
            shown = text.decode() if isinstance(text, bytes) else str(text)
            return f"{getattr(err, 'name', err)} ({shown})"
        except Exception:  # the error text is a courtesy; never mask the error itself
            return str(err)

    def ordinals(self) -> dict[str, int]:
        """sysfs address -> CUDA ordinal."""
        count = self._call("cudaGetDeviceCount")
        found = {}
        for ordinal in range(int(count)):
            raw = self._call("cudaDeviceGetPCIBusId", 32, ordinal)
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            found[normalize_address(text.split("\x00", 1)[0])] = ordinal
        return found

    def _gbps(self, milliseconds: Sequence[float]) -> float:
        return statistics.median(self.size / (ms / 1e3) / 1e9 for ms in milliseconds)

    def _timed(self, stream: Any, copy: Callable[[], None]) -> list[float]:
        start, stop = self._call("cudaEventCreate"), self._call("cudaEventCreate")
        try:
            for _ in range(self.warmup):
                copy()
            self._call("cudaStreamSynchronize", stream)
            times = []
            for _ in range(self.repeats):
                self._call("cudaEventRecord", start, stream)
                copy()
                self._call("cudaEventRecord", stop, stream)
                self._call("cudaEventSynchronize", stop)
                times.append(float(self._call("cudaEventElapsedTime", start, stop)))
            return times
        finally:
            self._call("cudaEventDestroy", start)
            self._call("cudaEventDestroy", stop)

    def _peer_problem(self, src: int, dst: int) -> str | None:
        for one, other in ((src, dst), (dst, src)):
            if not self._call("cudaDeviceCanAccessPeer", one, other):
                return (f"P2P access is not possible (cudaDeviceCanAccessPeer({one}, {other}) is "
                        "0): a copy would be staged through host memory")
        return None

    def _enable_peers(self, src: int, dst: int) -> None:
        for one, other in ((src, dst), (dst, src)):
            self._call("cudaSetDevice", one)
            err = self.rt.cudaDeviceEnablePeerAccess(other, 0)[0]
            if err not in (self.rt.cudaError_t.cudaSuccess,
                           self.rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
                raise CudaError(f"cudaDeviceEnablePeerAccess({other}) on device {one} failed: "
                                f"{self._describe(err)}")

    def _disable_peers(self, src: int, dst: int) -> None:
        for one, other in ((src, dst), (dst, src)):
            self._call("cudaSetDevice", one)
            self.rt.cudaDeviceDisablePeerAccess(other)

    def pair(self, src: int, dst: int) -> Rate:
        problem = self._peer_problem(src, dst)
        if problem:
            return Rate(None, problem)
        self._enable_peers(src, dst)
        buffers: list[tuple[int, Any]] = []
        try:
            self._call("cudaSetDevice", dst)
            target = self._call("cudaMalloc", self.size)
            buffers.append((dst, target))
            self._call("cudaSetDevice", src)
            source = self._call("cudaMalloc", self.size)
            buffers.append((src, source))
            self._call("cudaSetDevice", dst)  # the target's stream and events: B reads from A
            stream = self._call("cudaStreamCreate")
            try:
                times = self._timed(stream, lambda: self._call(
                    "cudaMemcpyPeerAsync", target, dst, source, src, self.size, stream))
            finally:
                self._call("cudaSetDevice", dst)
                self._call("cudaStreamDestroy", stream)
            return Rate(self._gbps(times))
        finally:
            for device, pointer in buffers:
                self._call("cudaSetDevice", device)
                self._call("cudaFree", pointer)
            self._disable_peers(src, dst)

    def host_copy(self, device: int, to_device: bool) -> Rate:
        kinds = self.rt.cudaMemcpyKind
        kind = kinds.cudaMemcpyHostToDevice if to_device else kinds.cudaMemcpyDeviceToHost
        self._call("cudaSetDevice", device)
        pinned = self._call("cudaMallocHost", self.size)
        try:
            memory = self._call("cudaMalloc", self.size)
            try:
                stream = self._call("cudaStreamCreate")
                dst, src = (memory, pinned) if to_device else (pinned, memory)
                try:
                    times = self._timed(stream, lambda: self._call(
                        "cudaMemcpyAsync", dst, src, self.size, kind, stream))
                finally:
                    self._call("cudaStreamDestroy", stream)
            finally:
                self._call("cudaFree", memory)
        finally:
            self._call("cudaFreeHost", pinned)
        return Rate(self._gbps(times))

    def ring(self, flows: Sequence[tuple[int, int]]) -> list[Rate]:
        """Every flow at once, each on its own stream; one rate per flow."""
        for src, dst in flows:
            problem = self._peer_problem(src, dst)
            if problem:
                return [Rate(None, f"the ring cannot run: {problem}")] * len(flows)
        for src, dst in flows:
            self._enable_peers(src, dst)
        allocated: list[tuple[int, str, Any]] = []
        try:
            legs = []
            for src, dst in flows:
                self._call("cudaSetDevice", dst)
                target = self._call("cudaMalloc", self.size)
                allocated.append((dst, "cudaFree", target))
                self._call("cudaSetDevice", src)
                source = self._call("cudaMalloc", self.size)
                allocated.append((src, "cudaFree", source))
                self._call("cudaSetDevice", dst)  # the target's stream: B reads from A
                stream = self._call("cudaStreamCreate")
                allocated.append((dst, "cudaStreamDestroy", stream))
                start, stop = self._call("cudaEventCreate"), self._call("cudaEventCreate")
                allocated += [(dst, "cudaEventDestroy", start), (dst, "cudaEventDestroy", stop)]
                legs.append((src, dst, source, target, stream, start, stop))
            times: list[list[float]] = [[] for _ in flows]
            for round_ in range(self.warmup + self.repeats):
                for src, dst, source, target, stream, start, _ in legs:
                    self._call("cudaSetDevice", dst)
                    self._call("cudaEventRecord", start, stream)
                    self._call("cudaMemcpyPeerAsync", target, dst, source, src, self.size, stream)
                for _, dst, _, _, stream, _, stop in legs:
                    self._call("cudaSetDevice", dst)
                    self._call("cudaEventRecord", stop, stream)
                for index, (_, _, _, _, _, start, stop) in enumerate(legs):
                    self._call("cudaEventSynchronize", stop)
                    if round_ >= self.warmup:
                        times[index].append(float(self._call("cudaEventElapsedTime", start, stop)))
            return [Rate(self._gbps(t)) for t in times]
        finally:
            for device, release, handle in reversed(allocated):
                self._call("cudaSetDevice", device)
                self._call(release, handle)
            for src, dst in flows:
                self._disable_peers(src, dst)

    def measure(self, gpus: Sequence[str], *, pairs: bool, h2d: bool, d2h: bool,
                ring: bool) -> Measurements:
        """Every wanted rate for ``gpus`` (sysfs addresses), serially, in one process."""
        ordinals = self.ordinals()
        rates: dict[str, Rate] = {}
        missing = Rate(None, "CUDA does not see this GPU (CUDA_VISIBLE_DEVICES?)")
        for gpu in gpus:
            for key, wanted, to_device in (("h2d", h2d, True), ("d2h", d2h, False)):
                if wanted:
                    rates[f"{key}[{gpu}]"] = (self.host_copy(ordinals[gpu], to_device)
                                              if gpu in ordinals else missing)
        if pairs:
            ordered = [(src, dst) for src in gpus for dst in gpus if src != dst]
            for done, (src, dst) in enumerate(ordered, 1):
                report_progress(f"cuda probe: pair {done} of {len(ordered)}: {src}->{dst}")
                both = src in ordinals and dst in ordinals
                rates[f"{src}->{dst}"] = (self.pair(ordinals[src], ordinals[dst])
                                          if both else missing)
        if ring and len(gpus) >= 2:
            flows = [(gpus[i], gpus[(i + 1) % len(gpus)]) for i in range(len(gpus))]
            if all(a in ordinals and b in ordinals for a, b in flows):
                measured = self.ring([(ordinals[a], ordinals[b]) for a, b in flows])
            else:
                measured = [missing] * len(flows)
            for (a, b), rate in zip(flows, measured, strict=True):
                rates[f"ring:{a}->{b}"] = rate
        source = (f"cuda probe (cudaMemcpyPeerAsync, {self.size} bytes, median of "
                  f"{self.repeats} after {self.warmup} warm-up)")
        return Measurements(source, rates)
