"""The background sampler: a sample before, one per interval of the injected clock, one after;
it never blocks the benchmark, stops at once, and a stuck sample is left behind."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from pytest_gpuhost.envelope.facts import GpuFacts
from pytest_gpuhost.envelope.sampling import STOP_WAIT_S, Sampling
from pytest_gpuhost.testing.clock import FakeClock

from .fakegpus import A, FakeGpus


class Counted(FakeGpus):
    """Sets ``taken`` after each sample, so that a test waits on the sample, not on time."""

    def __init__(self) -> None:
        super().__init__(A)
        self.taken = threading.Semaphore(0)

    def sample(self) -> Mapping[str, GpuFacts]:
        try:
            return super().sample()
        finally:
            self.taken.release()


def test_samples_come_one_an_interval_and_the_stop_takes_the_last() -> None:
    clock = FakeClock()
    gpus = Counted()
    sampling = Sampling(gpus, 1.0, clock=clock)
    sampling.start()
    assert gpus.taken.acquire(timeout=60)  # the one before, in the caller's thread
    for _ in range(3):
        clock.advance(1.0)
        assert gpus.taken.acquire(timeout=60)
    samples = sampling.stop()
    assert [s.at for s in samples] == [1000.0, 1001.0, 1002.0, 1003.0, 1003.0]
    assert not sampling.left_behind
    assert len(clock.waits) >= 3


def test_at_zero_there_is_no_thread_only_before_and_after() -> None:
    clock = FakeClock()
    gpus = FakeGpus(A)
    sampling = Sampling(gpus, 0, clock=clock)
    sampling.start()
    clock.advance(30)
    assert [s.at for s in sampling.stop()] == [1000.0, 1030.0]
    assert gpus.calls == 2 and clock.waits == []


def test_a_failing_sampler_is_a_line_of_each_sample_not_an_exception() -> None:
    gpus = FakeGpus(A)
    gpus.error = RuntimeError("NVML Shared Library Not Found")
    sampling = Sampling(gpus, 0, clock=FakeClock())
    sampling.start()
    assert [s.error for s in sampling.stop()] == ["NVML Shared Library Not Found"] * 2


class Stuck(FakeGpus):
    """The second sample never comes back (a GPU fallen off the bus), until released."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(A)
        self.clock = clock
        self.inside = threading.Event()
        self.release = threading.Event()

    def sample(self) -> Mapping[str, GpuFacts]:
        if self.calls == 1:
            self.calls += 1
            self.clock.stall()  # the stop's wait for it runs out
            self.inside.set()
            self.release.wait(60)
            return {}
        return super().sample()


def test_a_stuck_sample_is_left_behind_and_the_stop_does_not_ask_again() -> None:
    clock = FakeClock()
    gpus = Stuck(clock)
    sampling = Sampling(gpus, 1.0, clock=clock)
    sampling.start()
    clock.advance(1.0)
    assert gpus.inside.wait(60)
    try:
        samples = sampling.stop()
    finally:
        gpus.release.set()
    assert sampling.left_behind
    assert samples[-1].error == f"a sample did not come back within {STOP_WAIT_S:g} s; " \
                                "it was left behind"
    assert gpus.calls == 2  # the stop asked nothing of the stuck sampler
