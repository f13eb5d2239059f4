"""Each check kind on fake trees: what it reads, how it judges, and what its fix writes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_gpuhost.checks.gpus import find_gpus
from pytest_gpuhost.host import HostError, LocalHost
from pytest_gpuhost.linux.cpulist import fold_cpu_list, parse_cpu_list
from pytest_gpuhost.linux.kmsg import parse_records
from pytest_gpuhost.linux.pciaddr import normalize_address
from pytest_gpuhost.linux.pciconfig import device_control
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.testing.fakehost import FakeHost, config_space

from ..runner import open_run, run_spec


def outcomes(results: Mapping[str, CheckResult]) -> dict[str, str]:
    return {key: result.outcome.value for key, result in results.items()}


# --- sysctl -------------------------------------------------------------------------------------

SYSCTL_SPEC = """\
    version: 1
    sysctl:
      vm.swappiness: 10
      net.core.rmem_max: {min: 16777216}
      net.ipv4.tcp_rmem: "4096 87380 16777216"
      net.ipv4.conf.eth0/100.rp_filter: 2
      kernel.not_here: 1
"""


def test_sysctl_reads_proc_sys_directly(fake: FakeHost) -> None:
    fake.sysctls({"vm.swappiness": 10, "net.core.rmem_max": 33554432,
                  "net.ipv4.tcp_rmem": "4096\t87380\t16777216"})
    fake.file("proc/sys/net/ipv4/conf/eth0.100/rp_filter", "2\n")
    results = run_spec(SYSCTL_SPEC, fake.root)
    assert outcomes(results) == {
        "sysctl[kernel.not_here]": "failed",
        "sysctl[net.core.rmem_max]": "passed",
        "sysctl[net.ipv4.conf.eth0/100.rp_filter]": "passed",
        "sysctl[net.ipv4.tcp_rmem]": "passed",
        "sysctl[vm.swappiness]": "passed",
    }
    missing = results["sysctl[kernel.not_here]"]
    assert "proc/sys/kernel/not_here does not exist" in missing.message
    assert results["sysctl[net.ipv4.tcp_rmem]"].observed == "4096\t87380\t16777216"  # as read


def test_sysctl_fix_writes_reads_back_and_never_creates(fake: FakeHost) -> None:
    fake.sysctls({"vm.swappiness": 60, "net.core.rmem_max": 212992,
                  "net.ipv4.tcp_rmem": "4096\t131072\t6291456"})
    fake.file("proc/sys/net/ipv4/conf/eth0.100/rp_filter", "0\n")
    results = run_spec(SYSCTL_SPEC, fake.root, fix=True)
    assert outcomes(results) == {
        "sysctl[kernel.not_here]": "failed",
        "sysctl[net.core.rmem_max]": "fixed",
        "sysctl[net.ipv4.conf.eth0/100.rp_filter]": "fixed",
        "sysctl[net.ipv4.tcp_rmem]": "fixed",
        "sysctl[vm.swappiness]": "fixed",
    }
    assert (fake.root / "proc/sys/net/core/rmem_max").read_text() == "16777216\n"
    assert (fake.root / "proc/sys/net/ipv4/conf/eth0.100/rp_filter").read_text() == "2\n"
    swappiness = results["sysctl[vm.swappiness]"]
    assert (swappiness.before, swappiness.after) == ("60", "10")
    assert swappiness.action == "write '10' to proc/sys/vm/swappiness"
    assert not (fake.root / "proc/sys/kernel/not_here").exists()
    assert "a fix never creates it" in results["sysctl[kernel.not_here]"].message


# --- gpus and pcie ------------------------------------------------------------------------------


def test_only_nvidia_display_functions_are_gpus(fake: FakeHost, host: LocalHost) -> None:
    fake.gpu("0000:81:00.0")  # and its audio function .1
    fake.gpu("0000:01:00.0", audio=False)
    fake.pci_device("0000:05:00.0", vendor=0x10DE, device=0x22A3, class_code=0x068000)  # NVSwitch
    fake.pci_device("0000:06:00.0", vendor=0x10DE, device=0x20B5, class_code=0x030200)  # 3D
    fake.pci_device("0000:07:00.0", vendor=0x1002, device=0x74A1, class_code=0x038000)  # AMD
    assert [g.address for g in find_gpus(host)] == ["0000:01:00.0", "0000:06:00.0",
                                                    "0000:81:00.0"]


def _unreadable(fake: FakeHost, address: str, name: str) -> None:
    path = fake.root / f"sys/bus/pci/devices/{address}/{name}"
    path.unlink()
    path.mkdir()  # read: EISDIR, an error that is not "missing"


def test_a_pci_device_whose_vendor_cannot_be_read_makes_the_gpu_list_an_error(
        fake: FakeHost, host: LocalHost) -> None:
    fake.gpu("0000:01:00.0", audio=False)
    fake.pci_device("0000:07:00.0", vendor=0x1002, device=0x74A1, class_code=0x038000)
    _unreadable(fake, "0000:07:00.0", "vendor")
    with pytest.raises(HostError, match=r"^whether PCI device 0000:07:00.0 is a GPU is unknown: "
                                        r"cannot read .*/0000:07:00.0/vendor: it is a directory"):
        find_gpus(host)


def test_a_gpus_unreadable_model_or_numa_node_is_unknown_not_a_missing_gpu(
        fake: FakeHost, host: LocalHost) -> None:
    fake.gpu("0000:01:00.0", audio=False, numa_node=1)
    fake.gpu("0000:02:00.0", audio=False, numa_node=1)
    _unreadable(fake, "0000:02:00.0", "device")
    _unreadable(fake, "0000:02:00.0", "numa_node")
    gpus = find_gpus(host)
    assert [(g.address, g.device_id, g.numa_node) for g in gpus] == [
        ("0000:01:00.0", "0x2bb5", 1), ("0000:02:00.0", "unknown", -1)]


def test_a_gpus_unreadable_link_is_an_error_not_a_gpu_without_bridges() -> None:
    """A GPU whose sysfs link (where it sits) or iommu_group link cannot be read would pass
    as one with no bridge above it (ACS skipped) or no IOMMU: the GPU list is an error."""
    from pytest_gpuhost.checks.gpus import _parse_gpus
    from pytest_gpuhost.host import Reply

    base = "sys/bus/pci/devices/0000:01:00.0"
    attributes = [Reply([(f"{base}/{name}", value)]) for name, value in (
        ("vendor", b"0x10de\n"), ("class", b"0x030000\n"), ("device", b"0x2bb5\n"),
        ("numa_node", b"0\n"))]
    link = "../../../devices/pci0000:00/0000:00:01.1/0000:01:00.0"
    broken = HostError(f"cannot read the link {base}: Input/output error", 5)
    fine = Reply([(base, link)])
    group = Reply([(f"{base}/iommu_group", "../../../kernel/iommu_groups/7")])
    [gpu] = _parse_gpus([*attributes, fine, group])
    assert (gpu.link, gpu.iommu_group) == (link, "../../../kernel/iommu_groups/7")
    with pytest.raises(HostError, match=r"^where GPU 0000:01:00\.0 sits on the bus is "
                                        r"unknown: cannot read the link"):
        _parse_gpus([*attributes, Reply([(base, broken)]), group])
    with pytest.raises(HostError, match=r"^the IOMMU group of GPU 0000:01:00\.0 is unknown"):
        _parse_gpus([*attributes, fine, Reply([(f"{base}/iommu_group", broken)])])
    missing = HostError("gone", 2)  # removed between the glob and the read: no IOMMU group
    [gpu] = _parse_gpus([*attributes, fine, Reply([(f"{base}/iommu_group", missing)])])
    assert gpu.iommu_group is None


def test_the_gpu_list_error_is_its_askers_only(fake: FakeHost) -> None:
    """Facts read in one batch: the GPUs' error goes to each kind that asks for them, every
    time it asks; the CPU list of the same batch is read as usual."""
    from pytest_gpuhost.checks import Facts
    from pytest_gpuhost.checks.cpuidle import IDLE_STATES
    from pytest_gpuhost.checks.gpus import GPUS

    fake.gpu("0000:01:00.0", audio=False)
    fake.cpus(2)
    _unreadable(fake, "0000:01:00.0", "class")
    facts = Facts(LocalHost(fake.root))
    facts.prime([GPUS, IDLE_STATES])
    for _ in range(2):
        with pytest.raises(HostError, match=r"whether NVIDIA device 0000:01:00\.0 is a GPU"):
            facts.get(GPUS)
    assert list(facts.get(IDLE_STATES).cpus) == [0, 1]


def test_nvml_addresses_are_normalized_to_sysfs_form() -> None:
    assert normalize_address("00000000:81:00.0") == "0000:81:00.0"
    assert normalize_address("0000:C1:00.0") == "0000:c1:00.0"


PCIE_SPEC = """\
    version: 1
    gpus:
      count: 2
    pcie:
      max_read_request: 4096
      max_payload: {min: 256}
      link_width: 16
      max_link_speed: "32.0 GT/s"
"""


def test_pcie_checks_one_per_gpu_per_key(fake: FakeHost) -> None:
    fake.gpu("0000:81:00.0", max_read_request=4096, exp_cap=0x60)
    fake.gpu("0000:01:00.0", max_read_request=512, max_payload=128, link_width=8,
             max_link_speed="16.0")
    results = run_spec(PCIE_SPEC, fake.root)
    assert outcomes(results) == {
        "gpu_count": "passed",
        "pcie.link_width[0000:01:00.0]": "failed",
        "pcie.link_width[0000:81:00.0]": "passed",
        "pcie.max_link_speed[0000:01:00.0]": "failed",
        "pcie.max_link_speed[0000:81:00.0]": "passed",
        "pcie.max_payload[0000:01:00.0]": "failed",
        "pcie.max_payload[0000:81:00.0]": "passed",
        "pcie.max_read_request[0000:01:00.0]": "failed",
        "pcie.max_read_request[0000:81:00.0]": "passed",
    }
    assert list(results)[1:3] == ["pcie.link_width[0000:01:00.0]", "pcie.link_width[0000:81:00.0]"]
    speed = results["pcie.max_link_speed[0000:01:00.0]"]
    assert speed.observed == "16.0 GT/s PCIe"
    assert results["pcie.max_read_request[0000:01:00.0]"].evidence[0]["source"] == \
        "sys/bus/pci/devices/0000:01:00.0/config @0x80"


def test_max_read_request_fix_is_a_read_modify_write(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", max_read_request=512, max_payload=256)
    config_path = fake.root / "sys/bus/pci/devices/0000:01:00.0/config"
    before = config_path.read_bytes()
    results = run_spec("version: 1\npcie:\n  max_read_request: 4096\n", fake.root, fix=True)
    result = results["pcie.max_read_request[0000:01:00.0]"]
    assert (result.outcome, result.before, result.after) == (Outcome.FIXED, "512", "4096")
    after = config_path.read_bytes()
    changed = [i for i in range(len(before)) if before[i] != after[i]]
    assert changed == [0x81]  # only the high byte of DevCtl at cap 0x78 + 8
    assert device_control(after).value == 0x5937
    assert "0x2937 -> 0x5937" in (result.action or "")


def test_no_gpus_is_a_failure_not_an_empty_test_list(fake: FakeHost) -> None:
    results = run_spec(PCIE_SPEC, fake.root)
    assert outcomes(results)["gpu_count"] == "failed"
    assert results["pcie.max_read_request"].message.startswith("no NVIDIA GPU")
    assert {r.outcome for r in results.values()} == {Outcome.FAILED}


def test_truncated_config_space_is_an_error_that_says_root(fake: FakeHost) -> None:
    short = config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000)[:64]
    fake.pci_device("0000:01:00.0", vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                    config=short)
    result = run_spec("version: 1\npcie:\n  max_read_request: 4096\n", fake.root, fix=True)[
        "pcie.max_read_request[0000:01:00.0]"]
    assert result.outcome is Outcome.ERROR
    assert "need root" in result.message


# --- cpuidle ------------------------------------------------------------------------------------

CPUIDLE_SPEC = "version: 1\ncpuidle:\n  disabled: [C2, C6]\n"


def test_cpu_lists_parse_and_fold() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert fold_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert fold_cpu_list([5]) == "5"


def test_cpuidle_by_state_name_over_every_online_cpu(fake: FakeHost) -> None:
    fake.cpus(8, states=("POLL", "C1", "C2"), disabled=())
    (fake.root / "sys/devices/system/cpu/cpu3/cpuidle/state2/disable").write_text("1\n")
    results = run_spec(CPUIDLE_SPEC, fake.root)
    c2, c6 = results["cpuidle[C2]"], results["cpuidle[C6]"]
    assert c2.observed == "enabled on cpus 0-2,4-7"
    assert c2.evidence[0]["raw"] == "1 of 8 CPUs disabled; enabled on cpus 0-2,4-7"
    assert c6.outcome is Outcome.FAILED
    assert c6.message == "no cpuidle state named 'C6' on any online CPU (driver acpi_idle: C1, " \
                         "C2, POLL)"


def test_cpuidle_fix_writes_only_the_enabled_ones(fake: FakeHost) -> None:
    fake.cpus(4, states=("POLL", "C1", "C2"))
    online = fake.root / "sys/devices/system/cpu/online"
    online.write_text("0-2\n")  # cpu3 offline: left alone
    disable = fake.root / "sys/devices/system/cpu/cpu1/cpuidle/state2/disable"
    disable.write_text("1\n")
    mtime = disable.stat().st_mtime_ns
    result = run_spec("version: 1\ncpuidle:\n  disabled: [C2]\n", fake.root, fix=True)[
        "cpuidle[C2]"]
    assert result.outcome is Outcome.FIXED
    assert result.action == "write 1 to cpuidle/C2/disable on cpus 0,2"
    assert disable.stat().st_mtime_ns == mtime
    assert (fake.root / "sys/devices/system/cpu/cpu3/cpuidle/state2/disable").read_text() == "0\n"


def test_state_index_may_differ_between_cpus(fake: FakeHost) -> None:
    fake.cpus(2, states=("POLL", "C1", "C2"))
    cpu1 = fake.root / "sys/devices/system/cpu/cpu1/cpuidle"
    (cpu1 / "state1/name").write_text("C2\n")  # a hybrid CPU with another order
    (cpu1 / "state2/name").write_text("C1\n")
    (cpu1 / "state1/disable").write_text("1\n")
    (fake.root / "sys/devices/system/cpu/cpu0/cpuidle/state2/disable").write_text("1\n")
    assert run_spec("version: 1\ncpuidle:\n  disabled: [C2]\n", fake.root)[
        "cpuidle[C2]"].outcome is Outcome.PASSED


def test_a_cpus_unreadable_state_name_is_an_error_not_a_cpu_without_the_state(
        fake: FakeHost) -> None:
    """cpu2's state2/name cannot be read: whether its C2 is disabled is unknown, so the check
    is an error naming the file, never a pass over the other CPUs."""
    fake.cpus(4, states=("POLL", "C1", "C2"), disabled=("C2",))
    state = fake.root / "sys/devices/system/cpu/cpu2/cpuidle/state2"
    (state / "disable").write_text("0\n")
    (state / "name").unlink()
    (state / "name").mkdir()  # read: EISDIR, an error that is not "missing"
    spec = "version: 1\ncpuidle:\n  disabled: [C2]\n  residency: {window: 1ms}\n"
    results = run_spec(spec, fake.root)
    for key in ("cpuidle[C2]", "cpuidle.residency[C2]"):
        assert results[key].outcome is Outcome.ERROR, key
        assert "cpu2/cpuidle/state2/name" in results[key].message, key


def test_cpuidle_residency_with_an_unreadable_disable_file_is_an_error(fake: FakeHost) -> None:
    """The residency check samples where the state is disabled; a ``disable`` file it cannot
    read is an error, not a CPU (or, for every CPU, a whole check) quietly left out."""
    fake.cpus(2, states=("POLL", "C1", "C2"), disabled=("C2",))
    for cpu in (0, 1):
        disable = fake.root / f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state2/disable"
        disable.unlink()
        disable.mkdir()
    spec = "version: 1\ncpuidle:\n  disabled: [C2]\n  residency: {window: 1ms}\n"
    result = run_spec(spec, fake.root)["cpuidle.residency[C2]"]
    assert result.outcome is Outcome.ERROR
    assert "state2/disable" in result.message


# --- modules ------------------------------------------------------------------------------------

MODULES_SPEC = """\
    version: 1
    modules:
      nvidia: loaded
      nouveau: absent
      nvidia-uvm: loaded
      ext4: loaded
      crc32c: loaded
      nvidia_peermem: {state: loaded, when: infiniband}
"""


def test_modules_loaded_builtin_absent_and_conditional(fake: FakeHost) -> None:
    fake.module("nvidia").module("ext4", state="builtin")
    fake.file("lib/modules/6.8.0-49-generic/modules.builtin",
              "kernel/fs/ext4/ext4.ko\nkernel/crypto/crc32c_generic.ko\nkernel/lib/crc32c.ko\n")
    (fake.root / "sys/module/ext4/parameters/.keep").unlink()
    (fake.root / "sys/module/ext4/parameters").rmdir()
    (fake.root / "sys/module/ext4").rmdir()
    results = run_spec(MODULES_SPEC, fake.root)
    assert outcomes(results) == {
        "module[crc32c]": "passed",
        "module[ext4]": "passed",
        "module[nouveau]": "passed",
        "module[nvidia]": "passed",
        "module[nvidia-uvm]": "failed",
        "module[nvidia_peermem]": "skipped",
    }
    assert results["module[ext4]"].observed == "builtin"
    assert results["module[ext4]"].evidence[0]["raw"] == "kernel/fs/ext4/ext4.ko"
    assert results["module[nvidia_peermem]"].message == \
        "when: infiniband is false: no RDMA device under sys/class/infiniband"


def test_builtin_module_seen_through_sys_module(fake: FakeHost) -> None:
    fake.module("crc32c", state="builtin")
    result = run_spec("version: 1\nmodules:\n  crc32c: loaded\n", fake.root)["module[crc32c]"]
    assert (result.outcome, result.observed) == (Outcome.PASSED, "builtin")


def test_module_fix_runs_modprobe_from_the_root(fake: FakeHost) -> None:
    fake.module("nvidia").module("nouveau").infiniband()
    fake.modprobe(available=("nvidia", "nvidia_uvm", "nouveau", "nvidia_peermem"),
                  failures={"nvidia_peermem": {"stderr": "modprobe: ERROR: could not insert "
                                               "'nvidia_peermem': Invalid argument", "kmsg": []}})
    results = run_spec(MODULES_SPEC.replace("      ext4: loaded\n      crc32c: loaded\n", ""),
                       fake.root, fix=True)
    assert outcomes(results) == {
        "module[nouveau]": "fixed",
        "module[nvidia]": "passed",
        "module[nvidia-uvm]": "fixed",
        "module[nvidia_peermem]": "fix_failed",
    }
    assert results["module[nouveau]"].action == "modprobe -r -- nouveau"
    peermem = results["module[nvidia_peermem]"]
    assert peermem.message == ("apply failed: modprobe -- nvidia_peermem exited 1: modprobe: "
                               "ERROR: could not insert 'nvidia_peermem': Invalid argument")
    assert "nvidia_uvm 16384" in (fake.root / "proc/modules").read_text()


def test_builtin_module_cannot_be_made_absent(fake: FakeHost) -> None:
    fake.module("nouveau", state="builtin")
    result = run_spec("version: 1\nmodules:\n  nouveau: absent\n", fake.root, fix=True)[
        "module[nouveau]"]
    assert result.outcome is Outcome.FAILED
    assert "built into the kernel" in result.message


# --- dmesg --------------------------------------------------------------------------------------


def test_kmsg_records_and_continuations() -> None:
    records, malformed = parse_records([
        "6,1,100,-;hello", " SUBSYSTEM=pci", " DEVICE=+pci:0000:01:00.0", "garbage",
        "11,2,200,-;usb 1-1: device descriptor read error",  # facility 1 (user), level 3
        "4,3,300,c;text; with a semicolon",
    ])
    assert malformed == 1
    assert [(r.seq, r.level, r.facility) for r in records] == [(1, 6, 0), (2, 3, 1), (3, 4, 0)]
    assert records[2].text == "text; with a semicolon"


DMESG_SPEC = """\
    version: 1
    dmesg:
      allow: ['vxlan: non-ECT from .* with TOS=0x2']
"""


def test_dmesg_judges_levels_and_allows_noise(fake: FakeHost) -> None:
    fake.kmsg([(6, "NVRM: loading NVIDIA UNIX Open Kernel Module"),
               (4, "vxlan: non-ECT from 10.233.64.17 with TOS=0x2"),
               (5, "audit: type=1400 audit(1.0:2): apparmor=STATUS")])
    result = run_spec(DMESG_SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.PASSED
    fake.kmsg([(3, "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."),
               (2, "pcieport 0000:00:01.1: AER: Uncorrected (Fatal) error received")])
    result = run_spec(DMESG_SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert result.observed == "2"
    assert result.message.startswith(  # the Xid first, with what to do; then the others
        "0000:01:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it repeats; "
        "2 kernel log record(s) at emerg, alert, crit, err, warn since boot, 1 allowed pattern: "
        "first [")
    shown = [e["raw"] for e in result.evidence[1:]]
    assert shown[0].endswith("err    NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.")
    assert "crit   pcieport" in shown[1]


def test_dmesg_since_session_ignores_records_before_collection(fake: FakeHost) -> None:
    fake.kmsg([(3, "old error from before the session")])
    spec = "version: 1\ndmesg: {since: session}\n"
    assert run_spec(spec, fake.root)["dmesg"].outcome is Outcome.PASSED
    with open_run(spec, fake.root) as running:
        fake.kmsg([(3, "new error during the session")])  # after collection
        [check] = running.checks
        result = running.run(check)
    assert result.outcome is Outcome.FAILED
    assert result.evidence[1]["raw"].endswith("new error during the session")


def test_a_kernel_without_loadable_modules(fake: FakeHost) -> None:
    (fake.root / "proc/modules").unlink()  # CONFIG_MODULES=n: a microVM's kernel, say
    fake.module("crc32c", state="builtin")
    results = run_spec("version: 1\nmodules:\n  crc32c: loaded\n  nvidia: loaded\n", fake.root)
    assert results["module[crc32c]"].outcome is Outcome.PASSED
    nvidia = results["module[nvidia]"]
    assert (nvidia.outcome, nvidia.observed) == (Outcome.FAILED, "absent")
    assert nvidia.evidence[0]["raw"] == "absent: this kernel has no loadable module support"


def test_a_directory_a_glob_must_list_but_cannot_fails_the_glob(
        fake: FakeHost, host: LocalHost, tmp_path: Path) -> None:
    """A CPU whose cpuidle directory cannot be listed (EACCES in a confined container; here a
    link that loops: ELOOP) is not a CPU without C-states: leaving it out would pass
    cpuidle[C2] on the others, and --fix would disable it on those alone."""
    fake.cpus(4)
    cpu = fake.root / "sys/devices/system/cpu"
    (cpu / "cpu2/cpuidle").rename(tmp_path / "cpu2-cpuidle")
    (cpu / "cpu2/cpuidle").symlink_to("cpuidle")
    (cpu / "cpu3/cpuidle").rename(tmp_path / "cpu3-cpuidle")  # missing: no C-states there
    before = {p: p.read_bytes() for p in cpu.rglob("disable")}
    with pytest.raises(HostError, match=r"cannot list .*cpu2/cpuidle: .*\(ELOOP\)"):
        host.glob("sys/devices/system/cpu/cpu*/cpuidle/state*/name")
    [result] = run_spec("version: 1\ncpuidle:\n  disabled: [C2]\n", fake.root,
                        fix=True).values()
    assert result.outcome is Outcome.ERROR and "cpu2/cpuidle" in result.message
    assert {p: p.read_bytes() for p in cpu.rglob("disable")} == before  # nothing fixed
    (cpu / "cpu2/cpuidle").unlink()  # now missing too: CPUs 0 and 1 have C-states
    names = host.glob("sys/devices/system/cpu/cpu*/cpuidle/state*/name")
    assert {path.split("/")[4] for path, _ in names} == {"cpu0", "cpu1"}


def test_pci_devices_that_cannot_be_listed_make_the_gpu_checks_errors(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """Not '0 GPUs' (a failure that blames the hardware) nor a GPU section with nothing to
    check: the GPU list is unknown, and each check that needs it says why."""
    fake.gpu("0000:01:00.0").gpu("0000:02:00.0").sysctl("vm.swappiness", 10)
    devices = fake.root / "sys/bus/pci/devices"
    devices.rename(fake.root / "sys/bus/pci/elsewhere")
    devices.symlink_to("devices")  # ELOOP, where a confined container gets EACCES
    spec = pytester.makefile(".yaml", spec="version: 1\ngpus:\n  count: 2\npcie:\n"
                                           "  max_read_request: 4096\nsysctl:\n"
                                           "  vm.swappiness: 10\n")
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={fake.root}",
                       "-p", "no:cacheprovider", "--gpuhost-report=r.json")
    report = json.loads((pytester.path / "r.json").read_text())
    seen = {c["id"]: (c["outcome"], c["message"]) for c in report["checks"]}
    assert seen.pop("sysctl[vm.swappiness]")[0] == "passed"
    assert sorted(seen) == ["gpu_count", "pcie"]
    for outcome, message in seen.values():
        assert outcome == "error"
        assert re.match(r"the PCI devices are unknown: cannot list .*/sys/bus/pci/devices: "
                        r".*\(ELOOP\)", message), message
