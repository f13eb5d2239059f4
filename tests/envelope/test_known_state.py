"""The host checks at a window's start are the values the run already read (its checks'
records, then the last window's end), read again only where it read none; at its end they
are read live, in one batch, and the next window starts from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import msgspec

from pytest_gpuhost.checks.sysctl import sysctl_path
from pytest_gpuhost.host import Host, LocalHost, Read, Reply, Request
from pytest_gpuhost.session.envelopes import KnownState, open_envelope
from pytest_gpuhost.testing.fakehost import FakeHost
from tests.runner import Runner

SPEC = """\
version: 1
envelope:
  sample_every: 0
sysctl:
  kernel.numa_balancing: 0
  vm.swappiness: 10
"""
NUMA, SWAPPINESS = "sysctl[kernel.numa_balancing]", "sysctl[vm.swappiness]"


class Batches(LocalHost):
    """This machine at a root, keeping the paths each batch read (one batch: one round trip
    on a remote target)."""

    batches: ClassVar[list[list[str]]] = []

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        read = [r.path for r in requests if isinstance(r, Read) and "proc/sys/" in r.path]
        if read:
            self.batches.append(read)
        return super().batch(requests)


def no_gpus(host: Host) -> str:
    return "no GPUs in this test"


def test_the_start_is_what_the_run_read_and_the_end_one_batch(
        runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 1, "vm.swappiness": 10})
    Batches.batches = []
    with runner.open(SPEC, host=Batches) as running:
        [numa] = [running.run(c) for c in running.checks if c.id == NUMA]  # as the gate did
        assert numa.observed == "1"
        fake.sysctl("kernel.numa_balancing", 0)  # set back after the check, before the window
        Batches.batches.clear()
        known = KnownState(lambda: [numa])
        with open_envelope(running.session, no_gpus, known=known) as envelope:
            fake.sysctl("vm.swappiness", 60)
        reasons = envelope.reasons
        first = list(Batches.batches)
        Batches.batches.clear()
        with open_envelope(running.session, no_gpus, known=known) as second:
            pass
    # the start read only what the run had not: swappiness; the end both, in one batch
    assert first == [[sysctl_path("vm.swappiness")],
                     [sysctl_path("kernel.numa_balancing"), sysctl_path("vm.swappiness")]]
    assert reasons == [f"{NUMA} changed during the run: 1 -> 0",
                       f"{SWAPPINESS} changed during the run: 10 -> 60"]
    # the next window starts where this one ended: nothing read at its start, nothing changed
    assert Batches.batches == [[sysctl_path("kernel.numa_balancing"),
                                sysctl_path("vm.swappiness")]]
    assert second.valid, second.reasons


def test_without_what_the_run_read_both_ends_are_read(runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 0, "vm.swappiness": 10})
    Batches.batches = []
    both = [sysctl_path("kernel.numa_balancing"), sysctl_path("vm.swappiness")]
    with runner.open(SPEC, host=Batches) as running:
        Batches.batches.clear()
        with open_envelope(running.session, no_gpus) as envelope:
            fake.sysctl("kernel.numa_balancing", 1)
    assert Batches.batches == [both, both]
    assert envelope.reasons == [f"{NUMA} changed during the run: 0 -> 1"]


def test_a_value_the_run_could_not_read_is_read_at_the_start(
        runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 0, "vm.swappiness": 10})
    Batches.batches = []
    with runner.open(SPEC, host=Batches) as running:
        records = [running.run(c) for c in running.checks if c.id in (NUMA, SWAPPINESS)]
        unread = [msgspec.structs.replace(r, observed=None) if r.id == SWAPPINESS else r
                  for r in records]
        Batches.batches.clear()
        with open_envelope(running.session, no_gpus, known=KnownState(lambda: unread)) as one:
            pass
    assert Batches.batches[0] == [sysctl_path("vm.swappiness")]
    assert one.valid, one.reasons
