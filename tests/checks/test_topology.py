"""The GPU topology from sysfs alone: real layouts (a PCIe switch with four GPUs, two sockets,
GPUs behind two switch levels) classed as ``nvidia-smi topo -m`` classes them on machines laid
out the same way, and ``--gpuhost-topology``'s view and JSON."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuhost.checks.gpus import find_gpus
from pytest_gpuhost.checks.p2p_path import read_path_facts
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import FIXTURES
from ..test_example_host import PROXMOX_HOST
from .test_p2p_explain import A, B, C, D, build

pytest_plugins = ["pytester"]


def topo_matrix(text: str) -> list[list[str]]:
    """The GPU x GPU block of ``nvidia-smi topo -m`` output (either of its layouts: padded with
    spaces, or tab-separated with `` X `` on the diagonal)."""
    rows = [line for line in text.splitlines() if re.match(r"GPU\d+\s", line)]
    return [line.split()[1:len(rows) + 1] for line in rows]


def matrix_of(root: Path) -> list[list[str]]:
    host = LocalHost(root)
    matrix: list[list[str]] = read_path_facts(host, find_gpus(host)).topology()["matrix"]
    return matrix


def switch_4gpu(fake: FakeHost) -> None:
    """One root port, a switch: its upstream port and a downstream port per GPU."""
    fake.bridge("0000:40:01.1", acs=0)
    fake.bridge("0000:41:00.0", parent="0000:40:01.1", port_type=5, acs=None)
    for n in range(4):
        port = f"0000:42:{n * 8:02x}.0"
        fake.bridge(port, parent="0000:41:00.0", port_type=6, acs=0)
        fake.gpu(f"0000:{0x43 + n:02x}:00.0", parent=port, audio=False)


def two_sockets(fake: FakeHost) -> None:
    """Socket 0: two root ports of host bridge pci0000:00 and one of pci0000:40; socket 1:
    pci0000:80 with a GPU and the NIC."""
    for port, gpu, node in (("0000:00:01.0", "0000:01:00.0", 0), ("0000:00:03.0", "0000:02:00.0",
                            0), ("0000:40:01.0", "0000:41:00.0", 0),
                            ("0000:80:01.0", "0000:81:00.0", 1)):
        fake.bridge(port, acs=0, numa_node=node)
        fake.gpu(gpu, parent=port, numa_node=node, audio=False)
    fake.bridge("0000:80:03.0", acs=0, numa_node=1)
    fake.pci_device("0000:82:00.0", vendor=0x15B3, device=0x1021, class_code=0x020700,
                    numa_node=1, parent="0000:80:03.0")


def two_levels(fake: FakeHost) -> None:
    """Per socket: root port, a switch with two downstream ports, each leading to a second
    switch with two GPUs."""
    for socket, base in ((0, 0x00), (1, 0x80)):
        root, top = f"0000:{base:02x}:02.0", f"0000:{base + 1:02x}:00.0"
        fake.bridge(root, acs=0, numa_node=socket)
        fake.bridge(top, parent=root, port_type=5, acs=None, numa_node=socket)
        for branch in range(2):
            down = f"0000:{base + 2:02x}:{branch * 8:02x}.0"
            bus = base + 3 + branch * 4
            second, ports = f"0000:{bus:02x}:00.0", f"0000:{bus + 1:02x}"
            fake.bridge(down, parent=top, port_type=6, acs=0, numa_node=socket)
            fake.bridge(second, parent=down, port_type=5, acs=None, numa_node=socket)
            for leaf in range(2):
                port = f"{ports}:{leaf * 8:02x}.0"
                fake.bridge(port, parent=second, port_type=6, acs=0, numa_node=socket)
                fake.gpu(f"0000:{bus + 2 + leaf:02x}:00.0", parent=port, numa_node=socket,
                         audio=False)


@pytest.mark.parametrize(("layout", "fixture"), [
    (switch_4gpu, "nvidia_smi_topo_m_switch_4gpu.txt"),
    (two_sockets, "nvidia_smi_topo_m_2socket_4gpu.txt"),
    (two_levels, "nvidia_smi_topo_m_2level_8gpu.txt"),
])
def test_classes_match_nvidia_smi_topo_m_of_the_same_layout(
        fake: FakeHost, layout: Callable[[FakeHost], object], fixture: str) -> None:
    layout(fake)
    expected = topo_matrix((FIXTURES / fixture).read_text())
    assert len(expected) in (4, 8) and all(len(row) == len(expected) for row in expected)
    assert matrix_of(fake.root) == expected


def test_the_topology_has_each_gpus_link_and_each_bridges_acs(tmp_path: Path) -> None:
    fake = build(tmp_path / "host", narrow=True, acs=True, read_request=True, iommu=True)
    host = LocalHost(fake.root)
    topology = read_path_facts(host, find_gpus(host)).topology()
    gpus = {gpu["address"]: gpu for gpu in topology["gpus"]}
    assert gpus[B] == {"address": B, "numa_node": 0, "link": "Gen5 x16", "capable": "Gen5 x16",
                       "idle": False, "max_read_request": 512, "max_payload": 256,
                       "iommu": "identity", "problems": []}
    assert gpus[A]["iommu"] == "DMA"
    bridges = {b["address"]: b for b in topology["bridges"]}
    assert bridges["0000:00:03.1"] == {
        "address": "0000:00:03.1", "kind": "root port", "gpus": [C],
        "acs": "ACSCtl 0x001d: ReqRedir+ CmpltRedir+ EgressCtrl-", "redirect": True,
        "problem": None}
    assert bridges["0000:01:00.0"]["gpus"] == [A, B] and bridges["0000:01:00.0"]["acs"] is None
    # as capable, the hop between sockets (45 GB/s) is narrower than the x16 links
    assert topology["pairs"][f"{A}->{D}"] == {"class": "SYS", "limit_gbps": 28.81,
                                              "capable_gbps": 45.0}


def test_gpuhost_topology_prints_the_view_and_reports_it(pytester: pytest.Pytester,
                                                         tmp_path: Path) -> None:
    fake = build(tmp_path / "host", acs=True)
    pytester.makefile(".yaml", spec="version: 1\np2p: {floors: {same_numa: 1, cross_numa: 1}}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--gpuhost-topology",
                                "--gpuhost-report=out.json", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    result.stdout.fnmatch_lines([
        f"topology of {fake.root} (from sysfs):",
        "      GPU0  GPU1  GPU2  GPU3  NUMA  link                  MaxReadReq  IOMMU",
        "GPU0  X     PIX   PHB   SYS   0     Gen5 x16 of Gen5 x16  4096        identity",
        "GPU3  SYS   SYS   SYS   X     1     Gen5 x16 of Gen5 x16  4096        identity",
        f"  GPU0: {A}",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "Bridges on the GPUs' paths*",
        "  0000:00:03.1  root port               GPU2       ACSCtl 0x001d: ReqRedir+ "
        "CmpltRedir+ EgressCtrl-",
        "  0000:01:00.0  switch upstream port    GPU0 GPU1  no ACS capability",
        "P2P measured, GB/s from row to column and its share of what the pair's path carries "
        "(a failure's share is of the spec's floor):",
        "GPU0  X          41.00 71%  42.00 73%   43.00 96%",  # of the hop between sockets
    ])
    report = json.loads((pytester.path / "out.json").read_text())
    assert list(report["topology"]) == ["local"]
    assert report["topology"]["local"]["matrix"][0] == ["X", "PIX", "PHB", "SYS"]


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_the_topology_s_pairs_carry_the_hop_between_sockets_the_spec_states(
        pytester: pytest.Pytester, tmp_path: Path, xdist: tuple[str, ...]) -> None:
    """``between_sockets: 51``: the JSON topology's cross-socket pairs are limited by 51 GB/s,
    as the records and the terminal's matrix are, not by the default 45; every pair's
    ``limit_gbps`` is its record's."""
    fake = build(tmp_path / "host")
    pytester.makefile(".yaml", spec="version: 1\np2p: {floors: {same_numa: 1, cross_numa: 1, "
                      "between_sockets: 51}}\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", f"--gpuhost-root={fake.root}", "--gpuhost-topology",
        "--gpuhost-report=out.json", "-p", "no:cacheprovider", *xdist)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["GPU0  X          41.00 71%  42.00 73%  43.00 84%"])
    report = json.loads((pytester.path / "out.json").read_text())
    topology = report["topology"]["local"]
    assert topology["between_sockets_gbps"] == 51.0
    assert topology["pairs"][f"{A}->{D}"] == {"class": "SYS", "limit_gbps": 51.0,
                                              "capable_gbps": 51.0}
    records = {c["key"]: c["details"] for c in report["checks"] if c["kind"] == "p2p"}
    assert len(records) == 12
    assert {key: pair["limit_gbps"] for key, pair in topology["pairs"].items()} == \
        {key: details["limit_gbps"] for key, details in records.items()}
    assert {details["between_sockets_gbps"] for details in records.values()} == {51.0}


def test_a_containers_host_s_topology_carries_the_hop_its_containers_spec_states(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A container's pairs are explained by its host's paths: the host's topology (the one
    with the link registers) takes the figure the container's spec states, and its pairs
    carry what the container's records say they do."""
    root = tmp_path / "pve"
    shutil.copytree(PROXMOX_HOST, root, symlinks=True)
    pytester.makefile(".yaml", spec="version: 1\np2p: {floors: {same_numa: 1, cross_numa: 1, "
                      "between_sockets: 51}}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={root}", "--gpuhost-target=lxc://101",
                                "--gpuhost-topology", "--gpuhost-report=out.json",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    report = json.loads((pytester.path / "out.json").read_text())
    host = report["topology"]["local"]
    assert host["between_sockets_gbps"] == 51.0
    records = {c["key"]: c["details"] for c in report["checks"]
               if c["kind"] == "p2p" and c["target"] == "lxc-101"}
    assert len(records) == 56
    assert {key: pair["limit_gbps"] for key, pair in host["pairs"].items()} == \
        {key: details["limit_gbps"] for key, details in records.items()}
    assert {pair["limit_gbps"] for pair in host["pairs"].values()
            if pair["class"] == "SYS"} == {51.0}


def test_a_host_value_in_the_view_is_printed_escaped(pytester: pytest.Pytester,
                                                     tmp_path: Path) -> None:
    fake = build(tmp_path / "host")
    (fake.root / "sys/kernel/iommu_groups/0/type").write_text("DMA\x1b[2J\n")
    pytester.makefile(".yaml", spec="version: 1\np2p: {floors: {same_numa: 1}}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--gpuhost-topology",
                                "-p", "no:cacheprovider", "-k", "nothing")
    assert "\x1b[2J" not in result.stdout.str()
    result.stdout.fnmatch_lines(["GPU0 *4096        DMA\\x1b[2J"])


def test_gpuhost_topology_needs_a_spec(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gpuhost-topology", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpuhost-topology needs a spec*"])


def test_allure_attaches_each_pairs_path(pytester: pytest.Pytester, tmp_path: Path) -> None:
    from ..reports.test_reports import allure_results, attachment

    fake = build(tmp_path / "host", acs=True, narrow=True)
    pytester.makefile(".yaml", spec="version: 1\np2p: {floors: {same_numa: 1, cross_numa: 1}}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}",
                                "--alluredir=allure-results", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=12)
    out = pytester.path / "allure-results"
    pair = allure_results(out)[f"p2p[{C}->{A}]"]
    assert attachment(out, pair, "PCIe path") == "\n".join([
        f"PCIe path (PHB): {C} -> {A}",
        "  0000:00:03.1  root port of the source                  ACSCtl 0x001d: ReqRedir+ "
        "CmpltRedir+ EgressCtrl-",
        "  0000:00:01.1  root port of the target                  ACSCtl 0x0000: ReqRedir- "
        "CmpltRedir- EgressCtrl-",
        "  0000:01:00.0  switch upstream port above the target    no ACS capability",
        "  0000:02:00.0  switch downstream port above the target  ACSCtl 0x0000: ReqRedir- "
        "CmpltRedir- EgressCtrl-",
        f"link {C} - 0000:00:03.1: Gen5 x16 of Gen5 x16",
        "link 0000:01:00.0 - 0000:00:01.1: Gen5 x8 of Gen5 x16",
        f"link {A} - 0000:02:00.0: Gen5 x16 of Gen5 x16",
        "carries 28.81 GB/s at MPS 256; measured 42.00 GB/s, 146% of what it carries",
        "limited by, largest cost first:",
        "  link_downtrained at 0000:01:00.0 - 0000:00:01.1: Gen5 x8 (expected Gen5 x16): leaves "
        "the path 28.81 of 57.61 GB/s; reseat the card and check the riser and slot (hardware: "
        "no setting fixes it)",
        "  acs_redirect at 0000:00:03.1: ACSCtl 0x001d: ReqRedir+ CmpltRedir+ EgressCtrl- "
        "(expected ReqRedir- CmpltRedir- EgressCtrl-): sends this pair through the root "
        "complex; add pcie: {acs_redirect: off} to the spec and --fix clears it", ""])


def test_the_readme_shows_a_failing_pairs_explanation_and_the_topology(
        pytester: pytest.Pytester, example_host: Path) -> None:
    from ..test_docs import DEMO_ROOT, README, block_with, demo_args, demo_steps, sample_patterns

    *copy, run = demo_steps("-m gpuhost_slow --gpuhost-topology")
    assert copy == ['rm -rf "${demo:?}/host"', "cp -r examples/hosts/blackwell8-untuned $demo/host"]
    args = demo_args(run)
    result = pytester.runpytest(*(arg.replace(DEMO_ROOT, str(example_host)) for arg in args))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    sample = block_with(README, "gpuhost check p2p[0000:01:00.0->0000:81:00.0]")
    result.stdout.fnmatch_lines(sample_patterns(sample, example_host))
    # the reference quotes the same pair's message, its failure's headline
    [message] = block_with(README.parent / "docs" / "reference.md",
                           "17.12 GB/s < floor").splitlines()
    assert message in result.stdout.lines
