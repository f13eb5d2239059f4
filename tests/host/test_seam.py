"""The Host seam whole: the optional half declared as small protocols (and what the run does
with each), every request type's wire form one row of a table that the agent answers, and the
injectable clock every wait and time stamp reads."""

from __future__ import annotations

import threading
import typing
from pathlib import Path

import pytest

from pytest_gpuhost.bounded import StillRunning, within
from pytest_gpuhost.checks.cpuidle import ResidencyProbe, find_idle_states
from pytest_gpuhost.config.settings import RawOptions, resolve
from pytest_gpuhost.gpu.nvml import default_factory
from pytest_gpuhost.host import (
    WIRE_FORMS,
    CachedHost,
    Closable,
    Connection,
    Glob,
    GpuQuery,
    HostError,
    Kmsg,
    Link,
    ListDir,
    LocalHost,
    PhaseCache,
    Read,
    Request,
    Stat,
    TargetLost,
    Which,
    agent,
    reply_from_wire,
    request_from_wire,
)
from pytest_gpuhost.host.remote import AgentHost, Traffic
from pytest_gpuhost.session import Target
from pytest_gpuhost.testing.clock import FakeClock
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

# -- the optional half ----------------------------------------------------------------------------


class Remote(LocalHost):
    """A host over a connection, on a fake tree: ``Connection`` and ``Closable``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.traffic = Traffic(round_trips=3, connections=1)
        self.spent = 1.5
        self.closed = 0
        self.gone: HostError | None = None

    @property
    def lost(self) -> HostError | None:
        return self.gone

    def close(self) -> None:
        self.closed += 1


def test_each_host_has_each_optional_protocol_whole_or_not_at_all(fake: FakeHost) -> None:
    local = LocalHost(fake.root)
    agent_host = AgentHost("test://x", ["true"], "/", name="x")  # never connected
    has = {name: {protocol.__name__ for protocol in (Closable, Connection, PhaseCache)
                  if isinstance(host, protocol)}
           for name, host in (("local", local), ("cached", CachedHost(local)),
                              ("agent", agent_host), ("counting", CountingHost(local)),
                              ("remote", Remote(fake.root)))}
    assert has == {"local": set(), "cached": {"PhaseCache"}, "agent": {"Closable", "Connection"},
                   "counting": set(), "remote": {"Closable", "Connection"}}


def _target(fake: FakeHost, host: LocalHost, tmp_path: Path) -> Target:
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    settings = resolve(RawOptions(invocation=tmp_path, ini_base=tmp_path, ini_name="the ini file",
                                  spec=(str(spec),), root=str(fake.root)))
    return Target("t", host, settings, {}, default_factory, None, url="test://t")


def test_a_connection_is_used_through_its_declared_members(fake: FakeHost,
                                                           tmp_path: Path) -> None:
    fake.sysctl("vm.swappiness", 10)
    host = Remote(fake.root)
    target = _target(fake, host, tmp_path)
    assert target.round_trips  # a re-read after a fix is batched for the phase
    exported = target.export()
    assert exported["spent"] == 1.5 and exported["lost"] is None
    target.seed({"lost": None, "spent": 2.0, "replies": []})  # a worker: the controller's time
    assert host.spent == 3.5
    info = target.info()
    assert (info.round_trips, info.connections, info.unreachable) == (3, 1, None)
    target.disconnect()
    assert host.closed == 1
    host.gone = TargetLost("lost the connection to test://t: reset")
    assert target.info().unreachable == "lost the connection to test://t: reset"
    target.close()
    assert host.closed == 2


def test_a_host_without_the_optional_half_is_read_live_and_costs_nothing(
        fake: FakeHost, tmp_path: Path) -> None:
    fake.sysctl("vm.swappiness", 10)
    target = _target(fake, LocalHost(fake.root), tmp_path)
    assert not target.round_trips
    assert target.export()["spent"] == 0.0
    target.seed({"lost": None, "spent": 2.0, "replies": []})  # nothing to add it to
    info = target.info()
    assert (info.round_trips, info.unreachable) == (None, None)
    target.disconnect()
    target.close()  # nothing to close: no error


# -- the wire table -------------------------------------------------------------------------------

REQUESTS: list[Request] = [
    Read("proc/sys/vm/swappiness"), Read("missing"), Stat("proc/sys/vm"), Stat("missing"),
    ListDir("proc/sys/vm"), Glob("proc/sys/vm/*"), Glob("proc/*", read=False),
    Glob("*", links=True), Kmsg(), Link("link"), Link("proc"), Which("tool"), Which("nothing"),
    GpuQuery()]


def test_every_request_type_has_one_wire_form_with_its_own_name() -> None:
    assert set(WIRE_FORMS) == set(typing.get_args(Request))
    names = [form.op for form in WIRE_FORMS.values()]
    assert sorted(names) == sorted(set(names))
    assert {type(r) for r in REQUESTS} == set(WIRE_FORMS)  # the list below covers them all
    with pytest.raises(ValueError, match="not a host request"):
        request_from_wire({"op": "format", "path": "dev/sda"})


def test_the_agent_answers_every_wire_form_as_this_machine_does(fake: FakeHost) -> None:
    """What a remote target's agent answers (``request.wire()`` in, ``reply_from_wire`` out)
    is what LocalHost answers in-process, for every request type."""
    fake.sysctl("vm.swappiness", 10).kmsg([(6, "hello")])
    fake.file("usr/bin/tool", "#!/bin/sh\n", mode=0o755)
    fake.file("proc/sys/vm/unreadable", "x", mode=0o000)
    (fake.root / "link").symlink_to("proc/sys/vm/swappiness")
    local = LocalHost(fake.root).batch(REQUESTS)
    root = agent.Root(str(fake.root))
    try:
        remote = [reply_from_wire(request, answer) for request, answer in zip(
            REQUESTS, agent.batch(root, [r.wire() for r in REQUESTS]), strict=True)]
    finally:
        root.close()
    for request, here, there in zip(REQUESTS, local, remote, strict=True):
        assert (there.value, str(there.error), getattr(there.error, "errno", None)) == (
            here.value, str(here.error), getattr(here.error, "errno", None)), request


# -- clocks ---------------------------------------------------------------------------------------


def test_the_cache_stamps_what_it_read_on_its_clock(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    clock = FakeClock()
    cache = CachedHost(LocalHost(fake.root), clock=clock)
    swappiness = Read("proc/sys/vm/swappiness")
    assert cache.fetched_at(swappiness) is None
    cache.prefetch([swappiness])
    clock.advance(5)
    assert cache.fetched_at(swappiness) == 1000.0
    cache.assume("proc/sys/vm/swappiness", b"60\n")
    assert cache.fetched_at(swappiness) == 1005.0
    assert cache.read_text("proc/sys/vm/swappiness") == "60\n"
    cache.forget([swappiness])
    assert cache.fetched_at(swappiness) is None


def test_a_residency_window_counts_from_the_phases_batch_on_the_caches_clock(
        fake: FakeHost) -> None:
    """The first sample of C-state counters is read with the phase's batch: the window runs
    while the other checks do, and only what is left of it is slept."""
    fake.cpus(2, disabled=("C2",))
    clock = FakeClock()
    cache = CachedHost(LocalHost(fake.root), clock=clock)
    slept: list[float] = []
    probe = ResidencyProbe("C2", find_idle_states(cache), 1.0, slept.append)
    cache.prefetch(probe.reads())
    clock.advance(0.25)  # the other checks of the phase
    assert probe.observe(cache).value == "no growth"
    assert slept == [0.75]
    cache.invalidate()  # nothing from the batch: the first sample is read now, the whole window
    probe.observe(cache)
    assert slept == [0.75, 1.0]
    probe.observe(LocalHost(fake.root))  # no cache: the same
    assert slept == [0.75, 1.0, 1.0]


def test_a_bounded_call_waits_on_the_clock_it_is_given() -> None:
    clock = FakeClock()
    assert within(30, lambda: 42, name="quick", clock=clock) == 42
    empty: dict[str, int] = {}
    with pytest.raises(KeyError):
        within(30, lambda: empty["x"], name="raising", clock=clock)
    assert clock.now() == 1000.0 and clock.waits == [30, 30]
    release = threading.Event()

    def stuck() -> None:
        clock.stall()
        release.wait()

    try:
        with pytest.raises(StillRunning, match="stuck did not return within 30 s"):
            within(30, stuck, name="stuck", clock=clock)
    finally:
        release.set()
    assert clock.now() == 1030.0  # the wait ran to its deadline on the clock, and no further
