"""--gpuhost-capture: a spec from what the host holds now, which passes on that host.

Round trips on the example host after --fix and on every kind of tree the tests build, for the
keys of a spec and for the built-in catalog; then each capture rule, the dmesg patterns, the
header, and the file's safety (atomic, never over an existing file unless asked).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pytest_gpuhost.capture.catalog import CATALOG
from pytest_gpuhost.capture.writer import pick_target
from pytest_gpuhost.capture.yamltext import scalar
from pytest_gpuhost.checks import cpufreq, memory, nvml, pcie
from pytest_gpuhost.checks.dmesg import allow_patterns, generalize
from pytest_gpuhost.checks.gpuhealth import HEALTH_KEYS
from pytest_gpuhost.checks.kernel import KEYS as KERNEL_KEYS
from pytest_gpuhost.checks.p2p import FLOORS, p2p_floor
from pytest_gpuhost.config.settings import SettingsError
from pytest_gpuhost.gpu.nvml import FakeGpu, FakeNvml
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import load_spec
from pytest_gpuhost.testing.fakehost import (
    ACS_KERNEL_DEFAULT,
    FakeHost,
    blackwell8_untuned,
    nvbandwidth_text,
)

from ..checks.test_path_and_boot import switch_host
from ..conftest import BLACKWELL8, counts
from ..runner import CONDITIONS, KINDS, run_spec
from .capturing import round_trip

pytest_plugins = ["pytester"]


# -- the trees ----------------------------------------------------------------------------


def untuned(root: Path) -> None:
    blackwell8_untuned(root, cpus=8)


def fixed(root: Path) -> None:
    """The example box after --fix --fix-persist (boot-time values reboot_required)."""
    blackwell8_untuned(root, cpus=8)
    done = run_spec([BLACKWELL8], root, fix=True, persist=True)
    assert sum(r.outcome is Outcome.FIXED for r in done.records) > 30


def switch(root: Path) -> None:
    """GPUs behind a PCIe switch, ACS at several offsets, one bridge with redirect on."""
    fake = switch_host(FakeHost(root))
    fake.iommu_groups({"0000:43:00.0": "identity", "0000:44:00.0": "identity",
                       "0000:81:00.0": "DMA"})
    fake.cmdline("BOOT_IMAGE=/vmlinuz ro iommu=pt").grub(linux_default="iommu=pt")
    fake.kmsg([(4, "pcieport 0000:40:01.1: AER: Corrected error received: 0000:43:00.0")])


def intel(root: Path) -> None:
    """intel_idle with C1E and C6 disabled, intel_pstate with no_turbo, THP madvise."""
    fake = FakeHost(root)
    fake.cpus(4, states=("POLL", "C1", "C1E", "C6"), driver="intel_idle",
              disabled=("C1E", "C6"))
    fake.cpufreq("intel_pstate", policies=4, governor="performance", epp="performance",
                 boost="intel")
    fake.transparent_hugepage("madvise")
    fake.cmdline("BOOT_IMAGE=/vmlinuz ro intel_iommu=on iommu=pt").grub()
    fake.sysctls({"vm.swappiness": 1, "net.core.rmem_max": 67108864,
                  "net.ipv4.tcp_rmem": "4096\t87380\t67108864"})


def mixed_policies(root: Path) -> None:
    """amd-pstate-epp with per-policy boost, one policy's governor left at powersave."""
    fake = FakeHost(root)
    fake.cpufreq("amd-pstate-epp", policies=4, governor="performance", epp="performance",
                 boost="policy")
    fake.file("sys/devices/system/cpu/cpufreq/policy2/scaling_governor", "powersave\n")
    fake.cpus(4)


def pseries(root: Path) -> None:
    FakeHost(root).cpus(2, states=("snooze", "Shared Cede"), driver="pseries_idle",
                        disabled=("Shared Cede",))


def mixed_gpus(root: Path) -> None:
    """Four GPUs that differ: one trained at x8, one a Gen4 card, MaxReadReq 512 and 4096,
    NVML power limits and persistence that differ, one P2P pair not possible."""
    fake = FakeHost(root)
    gpus = ("0000:01:00.0", "0000:21:00.0", "0000:81:00.0", "0000:a1:00.0")
    for index, address in enumerate(gpus):
        fake.gpu(address, numa_node=index // 2, link_width=8 if index == 1 else 16,
                 max_link_speed="16.0" if index == 3 else "32.0",
                 max_read_request=4096 if index % 2 else 512)
    fake.module("nvidia").file("proc/driver/nvidia/version",
                               "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  "
                               "580.95.05  Release Build\n")
    fake.nvml(FakeNvml(devices={
        gpus[0]: FakeGpu(persistence_mode=True, power_limit=600_000),
        gpus[1]: FakeGpu(persistence_mode=False, power_limit=450_000, ecc_pending=False),
        gpus[2]: FakeGpu(persistence_mode=True, power_limit=575_500, bar1_total=96 * 2**30),
        gpus[3]: FakeGpu(persistence_mode=True, max_link_generation=4)},
        p2p={f"{gpus[0]}->{gpus[3]}": "not supported"}))
    rows: list[list[float | None]] = [[None if s == t else 40.0 + s * 3.3 + t * 0.7
                                       for t in range(4)] for s in range(4)]
    rows[0][3] = rows[3][0] = None  # peer access off for that pair
    fake.recorded_bandwidth("nvbandwidth.txt", nvbandwidth_text(
        {"device_to_device_memcpy_read_ce": ("memcpy CE GPU(row) -> GPU(column) bandwidth",
                                             [list(c) for c in zip(*rows, strict=True)])},
        devices=["GPU"] * 4))


NOISE = (
    "NVRM: Xid (PCI:0000:A1:00): 13, pid=4242, name=python3, Graphics Exception: ESR 0x41a4",
    "python3[4242]: segfault at 7f3a2c000000 ip 00007f3a4b2d1e0f sp 00007ffd error 4",
    "mlx5_core 0000:91:00.0: mlx5_pcie_event:301:(pid 812): PCIe slot advertised power 25W",
    "EXT4-fs (nvme0n1p2): warning: mounting fs with errors, running e2fsck is recommended",
    "usb 3-1.2: device descriptor read/64, error -71",
)


def noisy_log(root: Path) -> None:
    """A kernel log with PIDs, addresses, uppercase hex and continuation lines."""
    fake = FakeHost(root)
    fake.kmsg([(6, "Linux version 6.8.0-49-generic")])
    fake.kmsg([(3 if n % 2 else 4, text) for n, text in enumerate(NOISE)],
              continuation="DEVICE=+pci:0000:a1:00.0")
    fake.kmsg([(4, "vxlan: non-ECT from 10.233.64.17 with TOS=0x2")])


def builtin_modules(root: Path) -> None:
    """A kernel without loadable modules: no proc/modules, nvidia built in."""
    fake = FakeHost(root)
    fake.module("nvidia", state="builtin")
    fake.file("lib/modules/6.8.0-49-generic/modules.builtin", "kernel/drivers/video/nvidia.ko\n")
    (root / "proc/modules").unlink()


def container(root: Path) -> None:
    """An LXC/Docker-like view: only net sysctls, no cpufreq or cpuidle, one GPU, no NVML."""
    fake = FakeHost(root)
    fake.file(".dockerenv", "")
    fake.sysctls({"net.core.rmem_max": 212992, "net.core.somaxconn": 4096})
    fake.gpu("0000:17:00.0", exp_cap=0x68, audio=False)
    fake.module("nvidia", used_by="nvidia_uvm,").module("nvidia_uvm")
    fake.module_parameters("nvidia_uvm", {"uvm_disable_hmm": "Y"})


def many(root: Path) -> None:
    """The collection-reads tree: numbered sysctls, GPUs on two nodes, InfiniBand."""
    fake = FakeHost(root)
    fake.sysctls({f"kernel.k{n}": n for n in range(5)})
    for n in range(3):
        fake.gpu(f"0000:{1 + n:02x}:00.0", max_read_request=4096, numa_node=n % 2, audio=False)
    fake.cpus(4, states=("POLL", "C1", "C2", "C3"), disabled=("C2", "C3"))
    fake.module("nvidia").infiniband().kmsg([(6, "Linux version 6.8.0")])


TREES: dict[str, Callable[[Path], None]] = {
    "empty": lambda root: None, "untuned": untuned, "fixed": fixed, "switch": switch,
    "intel": intel, "mixed-policies": mixed_policies, "pseries": pseries,
    "mixed-gpus": mixed_gpus, "noisy-log": noisy_log, "builtin-modules": builtin_modules,
    "container": container, "many": many,
}


@pytest.fixture(params=sorted(TREES))
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    root = tmp_path / "host"
    FakeHost(root)
    TREES[request.param](root)
    return root


def _kept(text: str) -> dict[str, Any]:
    """The captured spec as YAML loads it (its values are whatever the file holds)."""
    loaded = yaml.safe_load(text)
    assert isinstance(loaded, dict)
    return loaded


# -- round trips ----------------------------------------------------------------------------


def test_the_catalog_capture_passes_on_the_host_it_came_from(tree: Path, tmp_path: Path) -> None:
    text, verified = round_trip(tree, tmp_path)
    assert verified.bad() == []
    assert verified.records, "the captured spec checks something"
    assert "for the keys of the built-in catalog" in text


def test_a_spec_capture_passes_on_the_host_it_came_from(tree: Path, tmp_path: Path) -> None:
    text, verified = round_trip(tree, tmp_path, [BLACKWELL8])
    assert verified.bad() == []
    assert f"for the keys of {BLACKWELL8}" in text


def test_the_example_host_after_fix_round_trips_through_pytest(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """The whole story on the bundled box: --fix, capture the tuned box, hold it to that."""
    shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml")
    common = (f"--gpuhost-root={example_host}", "-p", "no:cacheprovider")
    fix = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", "--fix", "--fix-persist",
                             *common)
    assert counts(fix)["fixed"] == 45 + 6  # the checks, and the six persistence files
    capture = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", "--gpuhost-capture=golden.yaml",
                                 *common)
    assert capture.ret == pytest.ExitCode.TESTS_FAILED  # the box still fails blackwell8
    golden = pytester.path / "golden.yaml"
    assert oct(golden.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in pytester.path.iterdir() if p.name.startswith(".golden")] == []
    verify = pytester.runpytest("--gpuhost-spec=golden.yaml", *common)
    assert verify.ret == pytest.ExitCode.OK, verify.stdout.str()[-3000:]
    assert counts(verify) == {"passed": 245}
    spec = _kept(golden.read_text())
    assert spec["modules"]["nvidia_peermem"] == {
        "state": "absent", "when": "infiniband",
        "why": "GPUDirect RDMA between the GPUs and the InfiniBand NICs"}
    assert spec["pcie"]["acs_redirect"]["value"] == "off"
    assert spec["p2p"]["floors"] == {"same_numa": 47, "cross_numa": 36}


def test_a_catalog_capture_under_xdist_is_written_by_the_controller(
        pytester: pytest.Pytester, example_host: Path) -> None:
    capture = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-capture=all.yaml",
                                 "-n", "2", "-p", "no:cacheprovider")
    assert capture.ret == pytest.ExitCode.OK, capture.stdout.str()[-2000:]
    outcomes = counts(capture)
    assert outcomes["passed"] > 200 and set(outcomes) == {"passed", "skipped"}
    verify = pytester.runpytest("--gpuhost-spec=all.yaml", f"--gpuhost-root={example_host}",
                                "-n", "2", "-p", "no:cacheprovider")
    assert verify.ret == pytest.ExitCode.OK, verify.stdout.str()[-3000:]


# -- the rules ------------------------------------------------------------------------------


def test_values_follow_the_rules_for_switches_buffers_links_and_p2p(tmp_path: Path) -> None:
    root = tmp_path / "host"
    intel(root)
    mixed_gpus(root)  # a FakeHost starts proc/modules afresh: after intel's tree
    spec = tmp_path / "spec.yaml"
    spec.write_text("version: 1\n"
                    "sysctl:\n  vm.swappiness: {value: 10, why: keep weights in RAM}\n"
                    "  net.core.rmem_max: 16777216\n  net.ipv4.tcp_rmem: {min: 4096}\n"
                    "gpus: {power_limit: 600, persistence_mode: enabled, max_link_generation: 5,"
                    " bar1: {min: 96GiB}, count: 4}\n"
                    "pcie: {link_width: 16, max_link_speed: '32.0 GT/s', max_read_request: 4096}\n"
                    "p2p: {probe: auto, floors: {same_numa: 45, cross_numa: 32}}\n"
                    "modules: {nouveau: absent, nvidia: loaded, nvidia_drm: loaded}\n")
    text, verified = round_trip(root, tmp_path, [spec])
    assert verified.bad() == []
    got = _kept(text)
    assert got["sysctl"] == {"net.core.rmem_max": {"min": 67108864},  # a buffer: a floor
                             "net.ipv4.tcp_rmem": "4096 87380 67108864",  # no order: exact
                             # the host holds 1, not the 10 the why argued for: no why
                             "vm.swappiness": 1}
    gpus = got["gpus"]
    assert gpus["power_limit"] == {"min": 450}
    assert gpus["bar1"] == {"min": "96 GiB"}
    assert gpus["count"] == 4
    assert gpus["max_link_generation"] == {"one_of": [5, 4]}
    assert "persistence_mode" not in gpus
    assert "gpus.persistence_mode: the values differ (enabled, disabled)" in text
    assert got["pcie"] == {"link_width": {"one_of": [16, 8]},  # as trained, GPU by GPU
                           "max_link_speed": {"one_of": ["32.0 GT/s", "16.0 GT/s"]},
                           "max_read_request": {"one_of": [512, 4096]}}
    assert got["modules"] == {"nouveau": "absent", "nvidia": "loaded", "nvidia_drm": "absent"}
    # 90% of the slowest same-socket pair (40.7 GB/s), rounded down; the pair with peer access
    # off cannot pass any floor, so its class is left out, saying which pair.
    assert got["p2p"]["floors"] == {"same_numa": 36}
    assert "# left out: p2p floor cross_numa: 0000:01:00.0->0000:a1:00.0: nothing was read: " \
           "P2P is unsupported on this pair: NVML's P2P read status (not supported)" in text


def test_a_path_floor_is_90_percent_of_the_lowest_share_measured(tmp_path: Path) -> None:
    """The untuned example: its pairs read 37.7% (across sockets, of the 45 GB/s the hop
    between them carries) to 50.5% (of the 57.61 GB/s Gen5 x16 carries) of their paths; a spec
    that states the hop between sockets keeps it in the capture."""
    root = tmp_path / "host"
    untuned(root)
    for of, share in (("negotiated", 0.33), ("capability", 0.33)):
        spec = tmp_path / f"{of}.yaml"
        spec.write_text(f"version: 1\np2p: {{floors: {{path: 0.85, of: {of}}}}}\n")
        text, verified = round_trip(root, tmp_path, [spec], name=f"{of}-captured.yaml")
        assert verified.bad() == []
        floors = _kept(text)["p2p"]["floors"]
        assert floors == ({"path": share} if of == "negotiated" else
                          {"path": share, "of": "capability"})
    spec = tmp_path / "board.yaml"
    spec.write_text("version: 1\np2p: {floors: {path: 0.85, between_sockets: 51}}\n")
    text, verified = round_trip(root, tmp_path, [spec], name="board-captured.yaml")
    assert verified.bad() == []
    # 16.96 GB/s of 51: 33.3%, 90% of it 0.29
    assert _kept(text)["p2p"]["floors"] == {"path": 0.29, "between_sockets": 51}


def test_p2p_floors_are_90_percent_of_the_lowest_pair_rounded_down() -> None:
    assert p2p_floor(41.07) == 36  # 36.963
    assert p2p_floor(46.21) == 41  # 41.589
    assert p2p_floor(40.0) == 36  # exactly 36.0: stays 36
    assert p2p_floor(1.0) == 0.9 and p2p_floor(0.5) == 0.4


def test_whys_come_from_the_spec_and_the_catalog(tmp_path: Path) -> None:
    root = tmp_path / "host"
    untuned(root)
    text, _ = round_trip(root, tmp_path)
    catalog = _kept(CATALOG.read_text())
    got = _kept(text)
    for key, entry in got["sysctl"].items():
        assert entry["why"] == catalog["sysctl"][key]["why"]
    text, _ = round_trip(root, tmp_path, [BLACKWELL8], name="spec.yaml")
    # the spec's why argued for identity: never copied onto the DMA-FQ the host holds
    assert _kept(text)["iommu"]["gpu_groups"] == "DMA-FQ"
    kept = [key for section in _kept(text).values() if isinstance(section, dict)
            for key, value in section.items() if isinstance(value, dict) and "why" in value]
    assert kept  # a value the host holds as the spec asked keeps its why


def test_the_header_says_host_kernel_driver_gpus_date_and_command(tmp_path: Path) -> None:
    root = tmp_path / "host"
    untuned(root)
    (root / "proc/sys/kernel/hostname").write_text("gpu-node-07\n")
    text, _ = round_trip(root, tmp_path, [BLACKWELL8])
    header = text.split("version: 1", 1)[0]
    for shown in ("host: gpu-node-07", "kernel: 6.5.0-44-generic", "driver: 580.95.05",
                  "GPUs: 8 x NVIDIA 10de:2bb5", "command: pytest (tests/runner.py)",
                  "what target local held then"):
        assert shown in header
    assert re.search(r"on \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", header)
    assert all(line.startswith("#") for line in header.strip().splitlines())


def test_cmdline_parameters_are_captured_as_present_or_absent(tmp_path: Path) -> None:
    root = tmp_path / "host"
    intel(root)
    text, verified = round_trip(root, tmp_path)
    assert verified.bad() == []
    cmdline = _kept(text)["kernel"]["cmdline"]
    assert cmdline["has"] == ["intel_iommu=on", "iommu=pt"]
    assert cmdline["lacks"] == ["amd_pstate=active", "pci=pcie_bus_perf", "pcie_aspm=off"]


def test_what_cannot_pass_as_it_is_is_left_out_with_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "host"
    switch(root)
    mixed_policies(root)
    text, verified = round_trip(root, tmp_path)
    assert verified.bad() == []
    got = _kept(text)
    assert "acs_redirect" not in got["pcie"]
    assert re.search(r"# left out: pcie\.acs_redirect: on: .* at 0000:\w\w:\w\w\.\w", text)
    assert "cpufreq.governor: the policies differ: powersave on cpus 2; performance" in text
    assert "governor" not in got["cpufreq"]


def test_module_states_parameters_and_builtins(tmp_path: Path) -> None:
    root = tmp_path / "host"
    container(root)
    builtin_modules(tmp_path / "other")
    text, verified = round_trip(root, tmp_path)
    assert verified.bad() == []
    got = _kept(text)["modules"]
    assert got["nvidia_uvm"] == {
        "state": "loaded", "parameters": {"uvm_disable_hmm": "Y"},
        "why": _kept(CATALOG.read_text())["modules"]["nvidia_uvm"]["why"]}
    assert got["nouveau"]["state"] == "absent"
    assert "module.parameter[nvidia_uvm.uvm_disable_hmm]" not in text
    text, _ = round_trip(tmp_path / "other", tmp_path, name="other.yaml")
    assert _kept(text)["modules"]["nvidia"]["state"] == "loaded"


# -- dmesg patterns -------------------------------------------------------------------------


def test_dmesg_patterns_allow_the_records_they_came_from(tmp_path: Path) -> None:
    root = tmp_path / "host"
    noisy_log(root)
    text, verified = round_trip(root, tmp_path)
    assert verified["dmesg"].outcome is Outcome.PASSED
    allow = _kept(text)["dmesg"]["allow"]
    assert len(allow) == len(NOISE) + 1  # each kind of record once; the vxlan one too
    for record in [*NOISE, "vxlan: non-ECT from 10.233.64.17 with TOS=0x2"]:
        assert [bool(re.search(pattern, record)) for pattern in allow].count(True) == 1, record
    # The application's Xid 13 is allowed by a pattern that keeps its code: never Xid 79.
    hardware = NOISE[0].replace("): 13, pid=4242", "): 79, pid=17")
    assert not any(re.search(pattern, hardware) for pattern in allow)


@pytest.mark.parametrize(("record", "kin", "stranger"), [
    ("NVRM: Xid (PCI:0000:A1:00): 13, pid=4242, name=python3",
     "NVRM: Xid (PCI:0000:c1:00): 79, pid=17, name=python3",
     "NVRM: Xid (PCI:0000:A1:00): 13, pid=4242, name=sh"),
    ("python3[4242]: segfault at 7f3a2c000000 ip 00007f3a4b2d1e0f sp 00007ffd error 4",
     "python3[9]: segfault at ffff88810a2b3c4d ip 00007f00000000aa sp 00007ffe error 6",
     "python3[9]: general protection fault ip 00007f00000000aa sp 00007ffe error 6"),
    ("vxlan: non-ECT from 10.233.64.17 with TOS=0x2", "vxlan: non-ECT from 10.1.2.3 with TOS=0xA",
     "vxlan: non-ECT from 10.1.2.3 with TOS=0x2 (dropped)"),
    ("a.b*c+d? [e] {f} (g) | ^h $i \\j", "a.b*c+d? [e] {f} (g) | ^h $i \\j",
     "aXb*c+d? [e] {f} (g) | ^h $i \\j"),
    ("mlx5_core 0000:91:00.0: link aa:bb:cc:dd:ee:0f up", "mlx5_core 0000:17:00.1: link "
     "00:11:22:33:44:55 up", "mlx4_core 0000:17:00.1: link 00:11:22:33:44:55 up"),
])
def test_a_pattern_generalizes_numbers_addresses_and_pids_and_nothing_else(
        record: str, kin: str, stranger: str) -> None:
    pattern = re.compile(generalize(record))
    assert pattern.search(record) and pattern.search(kin)
    assert not pattern.search(stranger)
    for other in ("", "x", " ".join(NOISE), record + " and more", "prefix " + record):
        assert not pattern.search(other), other


def test_records_already_allowed_get_no_pattern() -> None:
    existing = [re.compile("vxlan: non-ECT from .* with TOS=0x2")]
    texts = ["vxlan: non-ECT from 10.0.0.1 with TOS=0x2", "usb 3-1: error -71",
             "usb 3-2: error -71", "usb 3-1: error -110"]
    assert allow_patterns(texts, existing) == [r"^usb \d+-\d+: error -\d+$"]


# -- the file -------------------------------------------------------------------------------


def test_an_existing_file_is_refused_with_exit_4_naming_the_option(
        pytester: pytest.Pytester, example_host: Path) -> None:
    target = pytester.path / "golden.yaml"
    target.write_text("keep me\n")
    result = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-capture=golden.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpuhost-capture=golden.yaml: the file exists; pass "
                                 "--gpuhost-capture-overwrite to replace it*"])
    assert target.read_text() == "keep me\n"
    again = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-capture=golden.yaml",
                               "--gpuhost-capture-overwrite", "-p", "no:cacheprovider")
    assert again.ret == pytest.ExitCode.OK
    assert target.read_text().startswith("# Captured by pytest-gpuhost")


def test_a_run_that_checked_nothing_writes_nothing(pytester: pytest.Pytester,
                                                  example_host: Path) -> None:
    result = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-capture=none.yaml",
                                "-k", "no_such_check", "-p", "no:cacheprovider")
    assert "--gpuhost-capture=none.yaml: no check ran on target local, so there is nothing to " \
           "capture; nothing was written" in result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not (pytester.path / "none.yaml").exists()


def test_a_file_that_appears_during_the_run_is_not_replaced(tmp_path: Path) -> None:
    root = tmp_path / "host"
    many(root)
    settings_run = run_spec([BLACKWELL8], root, workdir=tmp_path)  # warm: same tree, no capture
    assert settings_run.records
    target = tmp_path / "late.yaml"

    original = os.link

    def late_link(src: str, dst: str) -> None:
        Path(dst).write_text("written meanwhile\n")
        original(src, dst)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "link", late_link)
        with pytest.raises(Exception, match="the file appeared during the run; nothing was "
                                            "written"):
            run_spec([BLACKWELL8], root, workdir=tmp_path, capture="late.yaml")
    assert target.read_text() == "written meanwhile\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".late")] == []


def test_overwrite_writes_a_fifo_in_place_and_never_replaces_it_with_a_file(
        tmp_path: Path) -> None:
    """--gpuhost-capture-overwrite replaces a file, but a FIFO (or a character device, as
    /dev/null is) is written as it is, as every report is: never swapped for a new file."""
    import stat
    import threading

    root = tmp_path / "host"
    many(root)
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    try:
        run_spec([BLACKWELL8], root, workdir=tmp_path, capture="pipe.yaml", overwrite=True)
    finally:
        if reader.is_alive():  # unblock the reader whatever happened
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError as exc:  # ENXIO: no reader holds it open: it has just finished
                if exc.errno != errno.ENXIO:
                    raise
        reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"# Captured by pytest-gpuhost")


@pytest.mark.parametrize(("args", "message"), [
    (["--gpuhost-capture=x.yaml", "--gpuhost-capture-from=node7"],
     "--gpuhost-capture-from=node7: no such target; the targets are: local"),
    (["--gpuhost-capture-from=local"], "--gpuhost-capture-from goes with --gpuhost-capture"),
    (["--gpuhost-capture-overwrite"], "--gpuhost-capture-overwrite goes with --gpuhost-capture"),
    (["--gpuhost-capture=x.yaml", "--fix"], "--fix needs a spec: --gpuhost-capture without one "
                                            "observes the built-in catalog"),
    (["--gpuhost-capture=x.yaml", "--gpuhost-rollback"], "--gpuhost-capture does not go with "
                                                        "--gpuhost-rollback"),
])
def test_usage_errors_name_the_option(pytester: pytest.Pytester, example_host: Path,
                                      args: list[str], message: str) -> None:
    result = pytester.runpytest(f"--gpuhost-root={example_host}", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    assert not (pytester.path / "x.yaml").exists()


def test_the_golden_target_is_the_one_named_or_the_only_one() -> None:
    assert pick_target(["local"], None) == "local"
    assert pick_target(["a", "b"], "b") == "b"
    with pytest.raises(ValueError, match="2 targets \\(a, b\\): name the golden one with "
                                         "--gpuhost-capture-from=TARGET"):
        pick_target(["a", "b"], None)
    with pytest.raises(ValueError, match="no such target; the targets are: a, b"):
        pick_target(["a", "b"], "c")


def test_capture_keeps_only_the_chosen_targets_records(tmp_path: Path) -> None:
    """Records of another target (a remote one) never leak into the local capture."""
    from pytest_gpuhost.capture.writer import record_target
    from pytest_gpuhost.result import CheckResult

    mine = CheckResult("sysctl[a]", "sysctl", "a", "1", "1", Outcome.PASSED, "")
    theirs = CheckResult("sysctl[a]", "sysctl", "a", "1", "2", Outcome.PASSED, "",
                         target="node02")
    assert [record_target(r) for r in (mine, theirs)] == ["local", "node02"]


def test_strings_that_yaml_would_misread_are_quoted() -> None:
    assert [scalar(v) for v in ("off", "Y", "0x2", "1.10", "6.8", "madvise", "DMA-FQ", "0",
                                "16777216", "007", "true", "a b")] == [
        '"off"', '"Y"', '"0x2"', '"1.10"', '"6.8"', "madvise", "DMA-FQ", "0", "16777216",
        '"007"', '"true"', '"a b"']
    for value in ("off", "Y", "0x2", "1.10", "007", "true", "madvise", "0"):
        assert str(yaml.safe_load(f"k: {scalar(value)}")["k"]) == value


# -- the catalog ----------------------------------------------------------------------------


def test_the_catalog_names_every_key_the_kinds_know_each_with_a_why() -> None:
    spec = load_spec(CATALOG, KINDS, CONDITIONS)
    assert set(spec.sections) == set(KINDS), \
        "every built-in kind has its section in capture/catalog.yaml (docs/adding-a-kind.md)"
    catalog = _kept(CATALOG.read_text())
    expected = {"kernel": set(KERNEL_KEYS), "cpufreq": set(cpufreq.KEYS),
                "memory": set(memory.KEYS), "iommu": {"gpu_groups"},
                # a model is the host's own, not a default: a spec names it
                "gpus": {"count", *nvml.KEYS, *(set(HEALTH_KEYS) - {"model"})},
                "pcie": {*pcie.KEYS, *pcie.PATH_KEYS}}
    for section, keys in expected.items():
        assert set(catalog[section]) == keys, section
    assert set(catalog["p2p"]["floors"]) == set(FLOORS)
    assert "concurrent" in catalog["p2p"]
    assert "residency" in catalog["cpuidle"]
    assert {"parameters", "state"} <= set(catalog["modules"]["nvidia_uvm"])

    def whys(node: object, where: str) -> None:
        if isinstance(node, dict) and ("value" in node or "min" in node or "max" in node
                                        or "state" in node or "name" in node):
            assert node.get("why"), f"{where} has no why"
        elif isinstance(node, dict):
            for key, value in node.items():
                whys(value, f"{where}.{key}")
        elif isinstance(node, list):
            for item in node:
                whys(item, where)

    for section in ("sysctl", "kernel", "cpufreq", "memory", "iommu", "gpus", "pcie",
                    "cpuidle", "modules"):
        whys(catalog[section], section)
    for section in ("p2p", "dmesg"):
        assert catalog[section]["why"]
    assert catalog["kernel"]["cmdline"]["why"]


def test_a_catalog_run_judges_nothing_and_fixes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "host"
    untuned(root)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    done = run_spec((), root, workdir=tmp_path, capture="all.yaml")
    assert {r.outcome for r in done.records} == {Outcome.PASSED, Outcome.SKIPPED}
    assert done["sysctl[vm.swappiness]"].observed == "60"
    assert done["sysctl[vm.swappiness]"].expected == "any value (capture)"
    missing = done["sysctl[vm.zone_reclaim_mode]"]
    assert missing.outcome is Outcome.SKIPPED and "does not exist" in missing.message
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    with pytest.raises(SettingsError, match="--fix needs a spec"):
        run_spec((), root, workdir=tmp_path, capture="again.yaml", fix=True)


class LabKind:
    """A plugin's kind with no capture."""

    section = "lab"


def test_a_section_whose_kind_has_no_capture_says_so_naming_the_kind(tmp_path: Path) -> None:
    from pytest_gpuhost.capture.writer import capture_text

    spec = load_spec(BLACKWELL8, KINDS, CONDITIONS)
    sections = dict(spec.sections)
    sections["lab"] = object()
    fake = type(spec)(spec.path, spec.name, spec.version, sections)
    text = capture_text([(str(BLACKWELL8), fake)], [], name="x", header_lines=["h"],
                        kinds={**KINDS, "lab": LabKind()})
    assert "# lab: nothing captured" in text
    assert ("left out: lab: its check kind tests.capture.test_capture.LabKind has no capture, "
            "so nothing of it is captured (docs/adding-a-kind.md)") in text
    assert "left out: sysctl[vm.swappiness]: no check of it ran (nothing here it applies to, " \
           "or it was deselected)" in text


def test_acs_redirect_on_stays_out_and_bridges_without_acs_pass(tmp_path: Path) -> None:
    root = tmp_path / "host"
    fake = FakeHost(root)
    fake.bridge("0000:80:01.1", acs=None)
    fake.gpu("0000:81:00.0", parent="0000:80:01.1")
    fake.bridge("0000:40:01.1", acs=ACS_KERNEL_DEFAULT & ~0x0C)
    fake.gpu("0000:41:00.0", parent="0000:40:01.1")
    text, verified = round_trip(root, tmp_path)
    assert verified.bad() == []
    assert _kept(text)["pcie"]["acs_redirect"]["value"] == "off"


def test_capture_allows_an_application_xid_and_never_a_hardware_one(tmp_path: Path) -> None:
    fake = FakeHost(tmp_path / "host")
    fake.kmsg([(4, "NVRM: Xid (PCI:0000:41:00): 13, pid=4242, name=python3, Graphics SM"),
               (3, "NVRM: Xid (PCI:0000:81:00): 79, pid='<unknown>', name=<unknown>, GPU has "
                   "fallen off the bus.")])
    spec = tmp_path / "dmesg.yaml"
    spec.write_text("version: 1\ndmesg: {}\n")
    text, verified = round_trip(fake.root, tmp_path, [spec])
    assert _kept(text)["dmesg"]["allow"] == [
        r"^NVRM: Xid \(PCI:[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\): 13, pid=\d+, "
        r"name=python3, Graphics SM$"]  # the code kept: it allows no other Xid
    lines = text.splitlines()
    why = lines.index("  # left out: dmesg: Xid 79 (GPU has fallen off the bus) on 0000:81:00.0 "
                      "is hardware, never allowed: reboot, then service if it repeats")
    assert lines[why + 1].startswith(r"  # left out: allow: - '^NVRM: Xid \(PCI:")
    assert "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus\\.$'" in \
        lines[why + 1]
    result = verified["dmesg"]
    assert result.outcome is Outcome.FAILED  # the hardware Xid still fails the captured spec
    assert result.warnings == ()  # and the application's is allowed: not even a warning
