"""Collection reads the host O(1) per GPU and per CPU (x C-state), and nothing per check.

Host facts (the GPU list, the CPU list, the cpuidle state names) are read once per session while
the spec expands; values are read by the checks when they run. These tests count every host
operation of the expansion and of a whole ``--collect-only`` run as the host and the spec grow.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from pytest_gpuhost import builtin, plugin
from pytest_gpuhost.checks import Facts
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.spec import load_spec
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

STATES = ("POLL", "C1", "C2", "C3")


def build(root: Path, *, gpus: int, cpus: int) -> Path:
    host = FakeHost(root)
    for n in range(gpus):
        host.gpu(f"0000:{1 + 3 * n:02x}:00.0", max_read_request=4096)
    host.cpus(cpus, states=STATES)
    host.module("nvidia")
    host.infiniband()
    host.kmsg([(6, "Linux version 6.8.0")])
    return root


def spec_text(*, sysctls: int, pcie_keys: int, states: int, gpus: int) -> str:
    pcie = ["max_read_request: 4096", "max_payload: {min: 256}", "link_width: 16",
            "max_link_speed: '32.0 GT/s'"][:pcie_keys]
    lines = ["version: 1", "sysctl:"]
    lines += [f"  kernel.k{n}: {n}" for n in range(sysctls)]
    lines += ["gpus:", f"  count: {gpus}", "pcie:", *(f"  {line}" for line in pcie)]
    lines += ["cpuidle:", f"  disabled: [{', '.join(STATES[-states:])}]"]
    lines += ["modules:", "  nvidia: loaded", "  nouveau: absent",
              "  nvidia_peermem: {state: loaded, when: infiniband}", "dmesg:", "  since: boot"]
    return "\n".join(lines) + "\n"


def expansion_ops(tmp_path: Path, *, gpus: int, cpus: int, sysctls: int = 1, pcie_keys: int = 1,
                  states: int = 1) -> tuple[CountingHost, int]:
    """The host operations of expanding the spec into checks, and the number of checks."""
    name = f"g{gpus}-c{cpus}-s{sysctls}-p{pcie_keys}-st{states}"
    root = tmp_path / name / "host"
    if not root.exists():
        build(root, gpus=gpus, cpus=cpus)
    spec_path = tmp_path / name / "spec.yaml"
    spec_path.write_text(spec_text(sysctls=sysctls, pcie_keys=pcie_keys, states=states,
                                   gpus=gpus))
    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    spec = load_spec(spec_path, kinds, builtin.pytest_gpuhost_conditions())
    host = CountingHost(LocalHost(root))
    facts = Facts(host)
    checks = [check for section, model in spec.sections.items()
              for check in kinds[section].expand(model, facts)]
    return host, len(checks)


def test_collection_reads_nothing_per_check(tmp_path: Path) -> None:
    small, small_checks = expansion_ops(tmp_path, gpus=4, cpus=4)
    large, large_checks = expansion_ops(tmp_path, gpus=4, cpus=4, sysctls=200, pcie_keys=4,
                                        states=3)
    assert large_checks - small_checks == 199 + 3 * 4 + 2
    assert large.ops == small.ops  # 213 more checks, not one more host operation
    assert large.calls["write_text"] == large.calls["write_bytes"] == large.calls["run"] == 0


def test_collection_reads_each_file_once(tmp_path: Path) -> None:
    host, _ = expansion_ops(tmp_path, gpus=8, cpus=16, sysctls=20, pcie_keys=4, states=2)
    repeated = {op: n for op, n in host.ops.items() if n > 1}
    assert not repeated


@pytest.mark.parametrize(("axis", "sizes", "per_unit"), [
    ("gpus", (1, 4, 16), 5),  # the GPU's vendor, class, device; its audio function's vendor, class
    ("cpus", (2, 8, 32), 2 + len(STATES)),  # exists(cpuidle), listdir, one name per state
])
def test_collection_reads_grow_by_a_constant_per_gpu_and_cpu(
        tmp_path: Path, axis: str, sizes: tuple[int, ...], per_unit: int) -> None:
    fixed = {"gpus": 2, "cpus": 2}
    totals = []
    for size in sizes:
        host, _ = expansion_ops(tmp_path, **{**fixed, axis: size}, pcie_keys=4, states=2)
        totals.append(host.total)
    points = list(zip(sizes, totals, strict=True))
    steps = [(b - a) / (y - x) for (x, a), (y, b) in itertools.pairwise(points)]
    assert steps == [per_unit, per_unit]


def test_a_whole_collect_only_run_reads_only_the_expansion(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the plugin too (items, ids, markers, ordering): the same operations as the bare
    expansion, whatever the number of checks."""
    hosts: list[CountingHost] = []

    def counting(root: Path) -> CountingHost:
        hosts.append(CountingHost(LocalHost(root)))
        return hosts[-1]

    monkeypatch.setattr(plugin, "LocalHost", counting)
    root = build(tmp_path / "host", gpus=8, cpus=16)
    seen = []
    for sysctls in (1, 100):
        spec = pytester.path / f"spec{sysctls}.yaml"
        spec.write_text(spec_text(sysctls=sysctls, pcie_keys=4, states=2, gpus=8))
        result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                    "--collect-only", "-q")
        assert result.ret == pytest.ExitCode.OK
        result.stdout.fnmatch_lines([f"{sysctls + 1 + 32 + 2 + 3 + 1} tests collected*"])
        seen.append(hosts[-1].ops)
    bare, _ = expansion_ops(tmp_path, gpus=8, cpus=16, pcie_keys=4, states=2)
    assert seen[0] == seen[1] == bare.ops
