"""Reads are batched by phase: a run asks its host a constant number of times.

Collection reads every kind's facts in one batch and running the checks reads every observed
value in one batch per rank (a read after a fix is live), so the number of host calls (a batch is
one call, one round trip to a remote host) does not grow with the GPUs, the CPUs or the checks.
These tests count every call through a wrapping host made by the host hook, the way a plugin
would wrap one.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from pytest_gpuhost.config.settings import Settings
from pytest_gpuhost.host import Host, LocalHost
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, counts

STATES = ("POLL", "C1", "C2", "C3")


class Counting:
    """A plugin that makes every run's host a CountingHost around the local one."""

    def __init__(self) -> None:
        self.hosts: list[CountingHost] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_gpuhost_make_host(self, url: str, settings: Settings) -> Host:
        self.hosts.append(CountingHost(LocalHost(settings.root)))
        return self.hosts[-1]

    @property
    def calls(self) -> Counter[str]:
        [host] = self.hosts
        return host.calls


def build(root: Path, *, gpus: int, cpus: int, sysctls: int) -> Path:
    host = FakeHost(root)
    host.sysctls({f"kernel.k{n}": n for n in range(sysctls)})
    addresses = []
    for n in range(gpus):  # eight GPUs behind each root port, as on a switched board
        port = f"0000:{n // 8 * 16:02x}:01.1"
        if n % 8 == 0:
            host.bridge(port, numa_node=n // 8 % 2, acs=0)
        addresses.append(f"0000:{n // 8 * 16 + 1:02x}:{n % 8:02x}.0")
        host.gpu(addresses[-1], max_read_request=4096, numa_node=n // 8 % 2, audio=False,
                 parent=port)
    host.iommu_groups(dict.fromkeys(addresses, "identity"))
    host.cpus(cpus, states=STATES, disabled=["C2", "C3"])
    host.cpufreq("amd-pstate-epp", policies=cpus, governor="performance", epp="performance")
    host.cmdline("BOOT_IMAGE=/vmlinuz ro iommu=pt amd_pstate=active").grub()
    host.transparent_hugepage("madvise")
    host.module("nvidia").module("nvidia_uvm")
    host.module_parameters("nvidia_uvm", {"uvm_disable_hmm": "Y"})
    host.infiniband()
    host.kmsg([(6, "Linux version 6.8.0")])
    return root


def spec_text(*, sysctls: int, gpus: int) -> str:
    lines = ["version: 1", "sysctl:"]
    lines += [f"  kernel.k{n}: {n}" for n in range(sysctls)]
    lines += ["gpus:", f"  count: {gpus}", "pcie:", "  max_read_request: 4096",
              "  max_payload: {min: 256}", "  link_width: 16", "  max_link_speed: '32.0 GT/s'",
              "  acs_redirect: off", "  aspm: off", "  aer: {since: session}",
              "cpuidle:", "  disabled: [C2, C3]", "  residency: {window: 10ms}",
              "cpufreq:", "  driver: amd-pstate-epp", "  governor: performance",
              "  epp: performance",
              "kernel:", "  release: {min: '6.8'}",
              "  cmdline: {has: [iommu=pt, amd_pstate=active], lacks: [pci=pcie_bus_perf]}",
              "memory:", "  transparent_hugepage: madvise",
              "iommu:", "  gpu_groups: identity",
              "modules:", "  nvidia: loaded", "  nouveau: absent",
              "  nvidia_uvm: {state: loaded, parameters: {uvm_disable_hmm: 'Y'}}",
              "  nvidia_peermem: {state: loaded, when: infiniband}",
              "dmesg:", "  since: session"]
    return "\n".join(lines) + "\n"


def calls_of(pytester: pytest.Pytester, tmp_path: Path, *, gpus: int, cpus: int,
             sysctls: int = 10, collect_only: bool = False) -> tuple[Counter[str], int]:
    root = build(tmp_path / f"g{gpus}-c{cpus}-s{sysctls}", gpus=gpus, cpus=cpus,
                 sysctls=sysctls)
    spec = tmp_path / f"g{gpus}-c{cpus}-s{sysctls}.yaml"
    spec.write_text(spec_text(sysctls=sysctls, gpus=gpus))
    plugin = Counting()
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-root={root}", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args, *(["--collect-only"] if collect_only else []),
                                plugins=[plugin])
    checks = sum(counts(result).values()) if not collect_only else 0
    return plugin.calls, checks


@pytest.mark.parametrize("axis", ["gpus", "cpus"])
def test_collection_asks_the_host_a_constant_number_of_times(
        pytester: pytest.Pytester, tmp_path: Path, axis: str) -> None:
    sizes = {"gpus": (1, 8, 64), "cpus": (16, 128, 512)}[axis]
    seen = [calls_of(pytester, tmp_path, collect_only=True,
                     **{"gpus": 8, "cpus": 16, axis: size})[0] for size in sizes]
    assert seen[0] == seen[1] == seen[2]
    assert sum(seen[0].values()) <= 2  # the facts in one batch (and the host's own name)


@pytest.mark.parametrize("axis", ["gpus", "cpus", "sysctls"])
def test_a_verify_run_asks_the_host_a_constant_number_of_times(
        pytester: pytest.Pytester, tmp_path: Path, axis: str) -> None:
    sizes = {"gpus": (1, 8, 64), "cpus": (16, 128, 512), "sysctls": (1, 30, 300)}[axis]
    shapes = [{"gpus": 8, "cpus": 16, "sysctls": 10, axis: size} for size in sizes]
    runs = [calls_of(pytester, tmp_path, gpus=shape["gpus"], cpus=shape["cpus"],
                     sysctls=shape["sysctls"]) for shape in shapes]
    calls = [c for c, _ in runs]
    checks = [n for _, n in runs]
    assert len(set(checks)) == (1 if axis == "cpus" else 3)  # more GPUs or sysctls: more checks
    assert calls[0] == calls[1] == calls[2]
    # facts, one batch of every observation, the live second sample of each disabled C-state
    # that residency watches (C2 and C3: its window runs while the other checks do), and one
    # live read of the log for dmesg
    assert calls[0]["batch"] == 3 + 2
    assert sum(calls[0].values()) - calls[0]["batch"] <= 1


def test_the_example_host_through_a_counting_host_gives_the_same_outcomes(
        pytester: pytest.Pytester, example_host: Path, tmp_path: Path) -> None:
    """A wrapping host changes nothing but the counting."""
    other = tmp_path / "copy"
    import shutil

    shutil.copytree(example_host, other, symlinks=True)
    args = ["-p", "no:cacheprovider", f"--gpuhost-spec={BLACKWELL8}", "--fix"]
    plain = pytester.runpytest(*args, f"--gpuhost-root={example_host}",
                               "--gpuhost-report=plain.json")
    plugin = Counting()
    counted = pytester.runpytest(*args, f"--gpuhost-root={other}",
                                 "--gpuhost-report=counted.json", plugins=[plugin])
    assert counts(plain) == counts(counted)

    def outcomes(name: str) -> dict[str, str]:
        report = json.loads((pytester.path / name).read_text())
        return {check["id"]: check["outcome"] for check in report["checks"]}

    assert outcomes("plain.json") == outcomes("counted.json")
    assert plugin.calls["batch"] >= 2


def test_after_a_fix_on_this_machine_a_check_reads_only_its_own_files(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A fix makes every later read live. On a remote target the pending checks' reads are
    batched again (one round trip); on this machine, where a read costs no round trip, a
    check then reads only its own files: the reads of a --fix of N wrong sysctls grow like N,
    not like N squared."""
    requests = []
    for sysctls in (20, 80):
        root = FakeHost(tmp_path / f"h{sysctls}").sysctls(
            {f"kernel.k{n}": 1 for n in range(sysctls)}).root
        spec = tmp_path / f"s{sysctls}.yaml"
        spec.write_text("version: 1\nsysctl:\n" +
                        "".join(f"  kernel.k{n}: 2\n" for n in range(sysctls)))
        plugin = Counting()
        result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                    "--fix", "-p", "no:cacheprovider", plugins=[plugin])
        assert counts(result)["fixed"] == sysctls
        [host] = plugin.hosts
        requests.append(host.requests)
    assert requests[1] < 5 * requests[0]  # 4x the fixes; quadratic would be 16x
