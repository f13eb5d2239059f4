"""The envelope's host half on a fake tree: new kernel log records since the window opened,
the AER counters of each GPU and each bridge on its path, the host checks at both ends, the
benchmark's process tree; and a whole window around a benchmark."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

from pytest_gpuhost.checks.gpus import find_gpus
from pytest_gpuhost.envelope.facts import HW_SLOWDOWN
from pytest_gpuhost.envelope.hostside import HostHalf, process_tree
from pytest_gpuhost.envelope.window import Envelope
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.specmodel.envelope import DEFAULTS
from pytest_gpuhost.testing.clock import FakeClock
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

from .fakegpus import A, FakeGpus

ROOT_PORT = "0000:40:01.1"
XID = "NVRM: Xid (PCI:0000:41:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


def gpu_host(fake: FakeHost) -> LocalHost:
    fake.bridge(ROOT_PORT)
    fake.gpu(A, parent=ROOT_PORT, audio=False)
    for address in (A, ROOT_PORT):
        fake.aer_counts(address, "aer_dev_correctable", {"RxErr": 0})
        fake.aer_counts(address, "aer_dev_fatal", {"Undefined": 0})
    fake.kmsg([(6, "Linux version 6.8.0"), (3, "NVRM: Xid (PCI:0000:41:00): 79, old one")])
    return LocalHost(fake.root)


def test_the_host_half_holds_only_what_happened_in_the_window(fake: FakeHost) -> None:
    host = gpu_host(fake)
    values = {"sysctl[kernel.numa_balancing]": "0"}
    half = HostHalf(host, state=lambda: dict(values))
    half.open()
    fake.kmsg([(6, "eth0: link up"), (3, XID),
               (3, "pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0")])
    fake.aer_counts(ROOT_PORT, "aer_dev_correctable", {"RxErr": 500})
    values["sysctl[kernel.numa_balancing]"] = "1"
    window = half.close()
    assert window.kernel_log == (
        XID, "pcieport 0000:40:01.1: AER: Corrected error received: 0000:41:00.0")
    zero = {"aer_dev_correctable": 0, "aer_dev_nonfatal": 0, "aer_dev_fatal": 0}
    assert window.before.aer == {A: zero, ROOT_PORT: zero}  # the GPU and its root port
    assert window.after.aer[ROOT_PORT]["aer_dev_correctable"] == 500
    assert (window.before.state, window.after.state) == (
        {"sysctl[kernel.numa_balancing]": "0"}, {"sysctl[kernel.numa_balancing]": "1"})
    assert window.errors == ()


def test_what_cannot_be_read_is_a_line_not_an_exception(fake: FakeHost) -> None:
    def broken() -> Mapping[str, str | None]:
        raise OSError("the spec's checks could not be observed")

    half = HostHalf(LocalHost(fake.root), state=broken)
    half.open()
    window = half.close()
    assert "the host checks: the spec's checks could not be observed" in window.errors
    assert any(line.startswith("the kernel log: ") for line in window.errors)  # no dev/kmsg


def test_the_process_tree_follows_children_files(fake: FakeHost) -> None:
    fake.file("proc/100/task/100/children", "101 102 ")
    fake.file("proc/100/task/105/children", "103")
    fake.file("proc/102/task/102/children", "104\n")
    fake.file("proc/200/task/200/children", "201")
    assert process_tree(LocalHost(fake.root), [100]) == {100, 101, 102, 103, 104}
    assert process_tree(LocalHost(fake.root), [999]) == {999}


def test_a_window_around_a_benchmark_judges_what_moved_while_it_ran(fake: FakeHost) -> None:
    host = gpu_host(fake)
    fake.file("proc/100/task/100/children", "101")
    clock = FakeClock()
    gpus = FakeGpus(A)
    values = {"sysctl[kernel.numa_balancing]": "0"}
    ran = threading.Event()
    with Envelope(host, limits=DEFAULTS, sampler=gpus, state=lambda: dict(values),
                  roots=lambda: [100], clock=clock) as envelope:
        gpus.set(A, reasons=HW_SLOWDOWN, processes={101: "worker", 48113: "python3"})
        clock.advance(12.1)
        values["sysctl[kernel.numa_balancing]"] = "1"
        ran.set()
    assert ran.is_set()
    assert envelope.valid is False
    assert envelope.reasons[0].startswith(f"{A}: HW slowdown ")
    assert f"{A}: pid 48113 (python3) on the GPU, not the benchmark's" in envelope.reasons
    assert "sysctl[kernel.numa_balancing] changed during the run: 0 -> 1" in envelope.reasons
    assert not any("pid 101" in reason for reason in envelope.reasons)
    assert envelope.verdict is not None and envelope.verdict["sampler"] == "fake GPUs"

    gpus.set(A, reasons=0, processes={101: "worker"})
    with Envelope(host, sampler=gpus, state=lambda: dict(values), roots=lambda: [100],
                  clock=clock) as same:
        clock.advance(12.1)
    assert same.valid, same.reasons


def test_without_a_sampler_the_host_half_holds_and_the_verdict_says_what_is_missing(
        fake: FakeHost) -> None:
    host = gpu_host(fake)
    with Envelope(host, without="no NVML library nor nvidia-smi on this host",
                  clock=FakeClock()) as envelope:
        fake.kmsg([(3, XID)])
    verdict = envelope.close()
    assert verdict["missing"] == ["the GPU half (no NVML library nor nvidia-smi on this host)"]
    assert envelope.reasons == [f"{A}: Xid 79 during the run (hardware): GPU has fallen off "
                                "the bus."]


def test_a_benchmark_in_a_container_is_never_its_own_stray_process(
        fake: FakeHost, tmp_path: Path) -> None:
    """The GPUs' host names the container's processes by its own pids; their innermost pid
    (``NSpid``) is the one the benchmark's tree has in the container."""
    host = gpu_host(fake)
    container = FakeHost(tmp_path / "ct")
    container.file("proc/42/task/42/children", "43")
    fake.file("proc/48113/status", "Name:\tpython3\nNSpid:\t48113\t43\n")
    fake.file("proc/50000/status", "Name:\tpython3\nNSpid:\t50000\t77\n")
    gpus = FakeGpus(A)
    with Envelope(host, sampler=gpus, roots=lambda: [42], runs_on=LocalHost(container.root),
                  clock=FakeClock()) as envelope:
        gpus.set(A, processes={48113: "python3", 50000: "python3"})
    assert envelope.reasons == [f"{A}: pid 50000 (python3) on the GPU, not the benchmark's"]


def test_on_a_kernel_without_nspid_a_benchmark_in_a_container_is_matched_by_its_cgroup(
        fake: FakeHost, tmp_path: Path) -> None:
    """Before Linux 4.1 ``/proc/PID/status`` has no ``NSpid``; those kernels have no cgroup
    namespace either, so the container reads its processes' cgroups as the host names them:
    a process on the GPU in the benchmark's cgroup (or below it) is the benchmark's; one in
    another container's, or the host's own, is not."""
    host = gpu_host(fake)
    container = FakeHost(tmp_path / "ct")
    container.file("proc/42/task/42/children", "43")
    v1 = "4:devices:/lxc/101\n1:name=systemd:/lxc/101/system.slice/serve.service\n"
    container.file("proc/42/cgroup", v1)
    container.file("proc/43/cgroup", v1)
    status = "Name:\tpython3\nPid:\t{0}\nPPid:\t1\n"
    for pid, cgroup in ((48113, v1),  # the benchmark's worker, as the host numbers it
                        (48114, v1.replace("serve.service", "serve.service/gpu")),  # below
                        (50000, v1.replace("101", "102")),  # another container's
                        (50001, "4:devices:/\n1:name=systemd:/user.slice\n")):  # the host's
        fake.file(f"proc/{pid}/status", status.format(pid))
        fake.file(f"proc/{pid}/cgroup", cgroup)
    gpus = FakeGpus(A)
    with Envelope(host, sampler=gpus, roots=lambda: [42], runs_on=LocalHost(container.root),
                  clock=FakeClock()) as envelope:
        gpus.set(A, processes={48113: "python3", 48114: "python3", 50000: "python3",
                               50001: "python3"})
    assert envelope.reasons == [f"{A}: pid 50000 (python3) on the GPU, not the benchmark's",
                                f"{A}: pid 50001 (python3) on the GPU, not the benchmark's"]


def test_a_benchmark_in_a_root_cgroup_matches_no_process_by_cgroup(
        fake: FakeHost, tmp_path: Path) -> None:
    """A cgroup namespace shows the container its root (``0::/``), below which every process
    of the host is: the cgroup says nothing there, and a process without ``NSpid`` is not
    taken for the benchmark's."""
    host = gpu_host(fake)
    container = FakeHost(tmp_path / "ct")
    container.file("proc/42/cgroup", "0::/\n")
    fake.file("proc/50000/status", "Name:\tpython3\nPid:\t50000\n")
    fake.file("proc/50000/cgroup", "0::/lxc.payload.101\n")
    gpus = FakeGpus(A)
    with Envelope(host, sampler=gpus, roots=lambda: [42], runs_on=LocalHost(container.root),
                  clock=FakeClock()) as envelope:
        gpus.set(A, processes={50000: "python3"})
    assert envelope.reasons == [f"{A}: pid 50000 (python3) on the GPU, not the benchmark's"]


def test_each_end_of_the_host_half_is_one_round_trip(fake: FakeHost) -> None:
    """The kernel log and the AER counters of every device are read in one batch at each end
    (one round trip on a remote target); the GPUs' paths come from the run's collection."""
    host = gpu_host(fake)
    found = find_gpus(host)
    counted = CountingHost(host)
    half = HostHalf(counted, known=lambda: found)
    half.open()
    opened = dict(counted.calls)
    fake.kmsg([(3, XID)])
    counted.calls.clear()
    window = half.close()
    assert (opened, dict(counted.calls)) == ({"batch": 1}, {"batch": 1})
    assert window.kernel_log == (XID,) and set(window.after.aer) == {A, ROOT_PORT}
