"""The host checks at a window's start are the values the run already read (its checks'
records, then the last window's end), read again only where it read none; at its end they
are read live, and the next window starts from them; each end is one batch with the kernel
log and the AER counters (one round trip on a remote target)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import msgspec

from pytest_gpuhost.checks.sysctl import sysctl_path
from pytest_gpuhost.host import Host, Kmsg, LocalHost, Read, Reply, Request
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
KMSG = "the kernel log"


class Batches(LocalHost):
    """This machine at a root, keeping the sysctls each batch read, after ``KMSG`` where it
    read the kernel log too (one batch: one round trip on a remote target)."""

    batches: ClassVar[list[list[str]]] = []

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        read = [r.path for r in requests if isinstance(r, Read) and "proc/sys/" in r.path]
        self.batches.append([KMSG, *read] if any(isinstance(r, Kmsg) for r in requests)
                            else read)
        return super().batch(requests)


def no_gpus(host: Host) -> str:
    return "no GPUs in this test"


def test_the_start_is_what_the_run_read_and_the_end_one_batch(
        runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 1, "vm.swappiness": 10})
    fake.kmsg([(6, "Linux version 6.8.0")])
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
    # the start read only what the run had not: swappiness; the end both; each end one
    # batch with the kernel log (and the AER counters: no GPUs here)
    assert first == [[KMSG, sysctl_path("vm.swappiness")],
                     [KMSG, sysctl_path("kernel.numa_balancing"), sysctl_path("vm.swappiness")]]
    assert reasons == [f"{NUMA} changed during the run: 1 -> 0",
                       f"{SWAPPINESS} changed during the run: 10 -> 60"]
    # the next window starts where this one ended: nothing read at its start, nothing changed
    assert Batches.batches == [[KMSG], [KMSG, sysctl_path("kernel.numa_balancing"),
                                        sysctl_path("vm.swappiness")]]
    assert second.valid, second.reasons


def test_without_what_the_run_read_both_ends_are_read(runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 0, "vm.swappiness": 10})
    fake.kmsg([(6, "Linux version 6.8.0")])
    Batches.batches = []
    both = [sysctl_path("kernel.numa_balancing"), sysctl_path("vm.swappiness")]
    with runner.open(SPEC, host=Batches) as running:
        Batches.batches.clear()
        with open_envelope(running.session, no_gpus) as envelope:
            fake.sysctl("kernel.numa_balancing", 1)
    assert Batches.batches == [[KMSG, *both], [KMSG, *both]]
    assert envelope.reasons == [f"{NUMA} changed during the run: 0 -> 1"]


def test_a_value_the_run_could_not_read_is_read_at_the_start(
        runner: Runner, fake: FakeHost) -> None:
    fake.sysctls({"kernel.numa_balancing": 0, "vm.swappiness": 10})
    fake.kmsg([(6, "Linux version 6.8.0")])
    Batches.batches = []
    with runner.open(SPEC, host=Batches) as running:
        records = [running.run(c) for c in running.checks if c.id in (NUMA, SWAPPINESS)]
        unread = [msgspec.structs.replace(r, observed=None) if r.id == SWAPPINESS else r
                  for r in records]
        Batches.batches.clear()
        with open_envelope(running.session, no_gpus, known=KnownState(lambda: unread)) as one:
            pass
    assert Batches.batches[0] == [KMSG, sysctl_path("vm.swappiness")]
    assert one.valid, one.reasons
