"""Keys on fake trees: the P2P path (ACS, ASPM, AER), boot settings with
reboot_required, THP, IOMMU groups, module parameters, NVML extras and C-state residency."""

from __future__ import annotations

import errno
import re
import subprocess
from pathlib import Path

import pytest

from pytest_gpuhost.checks.changes import ReplaceFile
from pytest_gpuhost.fix.journal import read_journal
from pytest_gpuhost.gpu.nvml import FakeGpu, FakeNvml
from pytest_gpuhost.host import HostError, LocalHost
from pytest_gpuhost.linux.cmdline import Parameter, grub_variables, grub_words, split_words
from pytest_gpuhost.linux.pciconfig import ConfigError
from pytest_gpuhost.linux.pciext import acs_control, extended_capabilities
from pytest_gpuhost.linux.pcitopo import TopologyError, bridge_path, resolve_link
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import SpecError, load_spec
from pytest_gpuhost.testing.fakehost import (
    ACS_KERNEL_DEFAULT,
    FakeHost,
    acs_body,
    config_space,
)

from ..runner import CONDITIONS, KINDS, open_run, run_spec


def switch_host(fake: FakeHost) -> FakeHost:
    """Two GPUs behind one PCIe switch, ACS at different offsets, a third GPU on a root port
    without ACS, and a NIC behind a port with ACS redirect that is on no GPU's path."""
    fake.bridge("0000:40:01.1", acs=ACS_KERNEL_DEFAULT, acs_offset=0x148)
    fake.bridge("0000:41:00.0", parent="0000:40:01.1", port_type=5, acs=None)
    fake.bridge("0000:42:08.0", parent="0000:41:00.0", port_type=6, acs=0x003D,
                acs_offset=0x220)
    fake.bridge("0000:42:10.0", parent="0000:41:00.0", port_type=6, acs=0x001D,
                acs_offset=0x2A0)
    fake.gpu("0000:43:00.0", parent="0000:42:08.0")
    fake.gpu("0000:44:00.0", parent="0000:42:10.0")
    fake.bridge("0000:80:01.1", acs=None)
    fake.gpu("0000:81:00.0", parent="0000:80:01.1")
    fake.bridge("0000:80:03.1", acs=ACS_KERNEL_DEFAULT)
    fake.pci_device("0000:91:00.0", vendor=0x15B3, device=0x1021, class_code=0x020700,
                    parent="0000:80:03.1")
    return fake


# --- pure parsers --------------------------------------------------------------------------------


def test_extended_capabilities_walk_from_0x100_with_acs_anywhere() -> None:
    config = config_space(vendor=0x1022, device=0x14AB, class_code=0x060400, bridge=True,
                          ext_caps=((0x100, 0x0001, bytes(8)), (0x3F0, 0x000D, acs_body(0x1D)),
                                    (0x200, 0x000B, bytes(4))))
    assert [(c.offset, c.cap_id) for c in extended_capabilities(config)] == [
        (0x100, 1), (0x3F0, 0xD), (0x200, 0xB)]
    acs = acs_control(config)
    assert acs is not None and (acs.offset, acs.value, acs.redirect) == (0x3F6, 0x1D, 0x0C)
    assert acs.without_redirect().value == 0x11  # SrcValid and UpstreamFwd stay
    assert acs_control(config_space(vendor=1, device=2, class_code=0x060400)) is None


@pytest.mark.parametrize(("caps", "error"), [
    (((0x100, 0x0001, b""), (0x100, 0x000D, b"")), "loops"),
    (((0x100, 0x0001, b""), (0x080, 0x000D, b"")), "below 0x100"),
])
def test_a_bad_extended_list_is_an_error_not_a_hang(caps: tuple[tuple[int, int, bytes], ...],
                                                    error: str) -> None:
    config = bytearray(config_space(vendor=1, device=2, class_code=0x060400))
    header = caps[0][1] | 1 << 16 | caps[1][0] << 20
    config[0x100:0x104] = header.to_bytes(4, "little")
    with pytest.raises(ConfigError, match=error):
        extended_capabilities(bytes(config))


def test_acs_of_a_64_byte_config_space_needs_root() -> None:
    with pytest.raises(ConfigError, match="need root"):
        acs_control(bytes(64))


def test_bridge_path_through_a_switch_from_the_sysfs_link() -> None:
    link = "sys/bus/pci/devices/0000:43:00.0"
    target = "../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:08.0/0000:43:00.0"
    assert bridge_path(link, target) == ("0000:42:08.0", "0000:41:00.0", "0000:40:01.1")
    assert resolve_link(link, "/../../sys/devices/x") == "sys/devices/x"  # stays in the root
    with pytest.raises(TopologyError):
        bridge_path(link, "../../../../../etc")


def test_cmdline_parsing_as_the_kernel_does() -> None:
    words = split_words('BOOT_IMAGE=/vmlinuz ro acpi_osi="Windows 2015" hugepagesz=1G '
                        "hugepages=32 hugepagesz=2M hugepages=1024 amd-pstate=passive "
                        "amd_pstate=active pci=realloc,noaer")
    assert "acpi_osi=Windows 2015" in words
    assert Parameter("amd_pstate=active").present(words)  # the last one is in force; - is _
    assert not Parameter("amd_pstate=passive").present(words)
    assert Parameter("hugepages=32").present(words)  # repeated: every occurrence counts
    assert Parameter("pci=noaer").present(words) and Parameter("pci=noaer").mentioned(words)
    assert not Parameter("pci=pcie_bus_perf").mentioned(words)


def test_grub_files_are_sourced_in_order_with_expansion() -> None:
    values, where = grub_variables([
        ("etc/default/grub", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet splash"\n'
                             "GRUB_CMDLINE_LINUX=''\nGRUB_DISTRIBUTOR=`lsb_release -i -s`\n"),
        ("etc/default/grub.d/50-x.cfg",
         'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX} iommu=pt"  # comment\n'
         'GRUB_CMDLINE_LINUX_DEFAULT="$(echo nope)"\n'),
    ])
    assert grub_words(values) == ["iommu=pt", "quiet", "splash"]
    assert where["GRUB_CMDLINE_LINUX"] == "etc/default/grub.d/50-x.cfg:1"


# --- pcie: acs_redirect, aspm, aer ---------------------------------------------------------------

ACS_SPEC = "version: 1\nname: t\npcie:\n  acs_redirect: 'off'\n"


def test_acs_one_check_per_bridge_on_a_gpu_path(fake: FakeHost) -> None:
    results = run_spec(ACS_SPEC, switch_host(fake).root)
    assert {k: (r.outcome.value, r.observed) for k, r in results.items()} == {
        "pcie.acs_redirect[0000:40:01.1]": ("failed", "on: ACSCtl 0x001d: ReqRedir+ "
                                                      "CmpltRedir+ EgressCtrl-"),
        "pcie.acs_redirect[0000:41:00.0]": ("passed", "off"),  # no ACS capability
        "pcie.acs_redirect[0000:42:08.0]": ("failed", "on: ACSCtl 0x003d: ReqRedir+ "
                                                      "CmpltRedir+ EgressCtrl+"),
        "pcie.acs_redirect[0000:42:10.0]": ("failed", "on: ACSCtl 0x001d: ReqRedir+ "
                                                      "CmpltRedir+ EgressCtrl-"),
        "pcie.acs_redirect[0000:80:01.1]": ("passed", "off"),
    }  # 0000:80:03.1 (the NIC's) is on no GPU's path: no check
    assert results["pcie.acs_redirect[0000:40:01.1]"].details["gpus"] == [
        "0000:43:00.0", "0000:44:00.0"]


def test_acs_fix_clears_only_rr_cr_ec_on_path_bridges_and_rollback_restores(
        fake: FakeHost, tmp_path: Path) -> None:
    switch_host(fake)
    config = {a: fake.root / "sys/bus/pci/devices" / a / "config"
              for a in ("0000:40:01.1", "0000:42:08.0", "0000:80:03.1")}
    before = {a: p.read_bytes() for a, p in config.items()}
    journal = tmp_path / "j.jsonl"
    results = run_spec(ACS_SPEC, fake.root, fix=True, journal=journal)
    assert results["pcie.acs_redirect[0000:42:08.0]"].outcome is Outcome.FIXED
    after = {a: p.read_bytes() for a, p in config.items()}
    assert after["0000:80:03.1"] == before["0000:80:03.1"]  # canary: byte for byte
    changed = [i for i in range(4096) if after["0000:42:08.0"][i] != before["0000:42:08.0"][i]]
    assert changed == [0x226]  # ACS Control's low byte, nothing else
    assert after["0000:42:08.0"][0x226] == 0x3D & ~0x2C  # SrcValid+ UpstreamFwd+ kept
    assert after["0000:40:01.1"][0x14E] == 0x11
    restored = run_spec(None, fake.root, rollback=journal)
    assert restored and all(r.outcome is Outcome.FIXED for r in restored.values()), restored
    assert {a: p.read_bytes() for a, p in config.items()} == before


def test_an_endpoint_in_a_gpus_sysfs_path_is_no_bridge_to_write_acs_on(fake: FakeHost) -> None:
    """A GPU behind Intel VMD has the VMD controller, an endpoint (header type 0), among the
    directories of its sysfs path. Its config space is no bridge's: its ACS Control (if it has
    one) is not the redirect a P2P path crosses, and nothing may be written there."""
    from pytest_gpuhost.testing.fakehost import bridge_caps, config_space

    vmd = config_space(vendor=0x8086, device=0x467F, class_code=0x010400, bridge=False,
                       ext_caps=bridge_caps(ACS_KERNEL_DEFAULT))
    fake.pci_device("0000:00:0e.0", vendor=0x8086, device=0x467F, class_code=0x010400,
                    config=vmd)
    fake.bridge("0000:01:06.0", parent="0000:00:0e.0", acs=ACS_KERNEL_DEFAULT)
    fake.gpu("0000:02:00.0", parent="0000:01:06.0")
    before = (fake.root / "sys/bus/pci/devices/0000:00:0e.0/config").read_bytes()
    results = run_spec(ACS_SPEC, fake.root, fix=True)
    endpoint = results["pcie.acs_redirect[0000:00:0e.0]"]
    assert endpoint.outcome is Outcome.SKIPPED
    assert endpoint.message.startswith("0000:00:0e.0 is no PCI bridge (header type 0): ")
    assert results["pcie.acs_redirect[0000:01:06.0]"].outcome is Outcome.FIXED  # the port
    assert (fake.root / "sys/bus/pci/devices/0000:00:0e.0/config").read_bytes() == before


def test_aspm_reads_link_control_and_fixes_through_link_files(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", aspm=2)
    link = fake.root / fake.pci_dir("0000:01:00.0") / "link"
    fake.file(f"{fake.pci_dir('0000:01:00.0')}/link/l1_aspm", "1\n")
    spec = "version: 1\npcie:\n  aspm: 'off'\n"
    [result] = run_spec(spec, fake.root).values()
    assert (result.outcome, result.observed) == (Outcome.FAILED, "L1")
    [fixed] = run_spec(spec, fake.root, fix=True).values()
    assert fixed.outcome is Outcome.FIX_FAILED  # the fake has no kernel to clear LnkCtl
    assert (link / "l1_aspm").read_text() == "0\n"


def test_aspm_without_link_files_is_not_fixable(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", aspm=3)
    [result] = run_spec("version: 1\npcie:\n  aspm: 'off'\n", fake.root).values()
    assert "pcie_aspm=off" in result.message


def test_aer_since_session_and_since_boot(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    fake.aer_counts("0000:01:00.0", "aer_dev_correctable", {"RxErr": 2})
    for since, outcome in (("session", Outcome.PASSED), ("boot", Outcome.FAILED)):
        [result] = run_spec(f"version: 1\npcie:\n  aer: {{since: {since}}}\n",
                            fake.root).values()
        assert result.outcome is outcome
    with open_run("version: 1\npcie:\n  aer: {since: boot}\n", fake.root) as running:
        fake.aer_counts("0000:01:00.0", "aer_dev_fatal", {"CmpltTO": 1})  # during the run
        [check] = running.checks
        result = running.run(check)
    assert result.observed == "correctable +2, fatal +1"


def test_no_aer_files_is_skipped_not_failed(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", aer=False)
    [result] = run_spec("version: 1\npcie:\n  aer: {since: boot}\n", fake.root).values()
    assert result.outcome is Outcome.SKIPPED and "no aer_dev_*" in result.message


# --- kernel: release and cmdline; reboot_required ------------------------------------------------

CMDLINE = ("version: 1\nname: t\nkernel:\n  release: {min: '6.8'}\n"
           "  cmdline: {has: [iommu=pt], lacks: [pci=pcie_bus_perf]}\n")


def test_kernel_release_compares_as_versions(fake: FakeHost) -> None:
    fake.cmdline("ro quiet")
    results = run_spec(CMDLINE, fake.root)
    assert results["kernel.release"].outcome is Outcome.PASSED  # 6.8.0-49-generic
    (fake.root / "proc/sys/kernel/osrelease").write_text("6.5.0-44-generic\n")
    assert run_spec(CMDLINE, fake.root)["kernel.release"].outcome is Outcome.FAILED


def test_cmdline_fix_persist_writes_a_dropin_then_reboot_required(fake: FakeHost) -> None:
    fake.cmdline("BOOT_IMAGE=/vmlinuz ro quiet pci=pcie_bus_perf").grub()
    grub = (fake.root / "etc/default/grub").read_text()
    results = run_spec(CMDLINE, fake.root, fix=True)
    assert results["kernel.cmdline[iommu=pt]"].outcome is Outcome.FAILED
    assert "--fix --fix-persist" in results["kernel.cmdline[iommu=pt]"].message
    results = run_spec(CMDLINE, fake.root, fix=True, persist=True)
    has = results["kernel.cmdline[iommu=pt]"]
    assert has.outcome is Outcome.REBOOT_REQUIRED
    assert "run `update-grub`, then reboot" in has.message
    dropin = (fake.root / "etc/default/grub.d/90-gpuhost-t.cfg").read_text()
    assert dropin.endswith('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT iommu=pt"\n')
    lacks = results["kernel.cmdline[pci=pcie_bus_perf]"]
    # running, but the boot configuration no longer has it: the next boot drops it
    assert lacks.outcome is Outcome.REBOOT_REQUIRED
    assert (fake.root / "etc/default/grub").read_text() == grub  # the user's file untouched
    again = run_spec(CMDLINE, fake.root)
    assert again["kernel.cmdline[iommu=pt]"].outcome is Outcome.REBOOT_REQUIRED


def test_systemd_boot_cmdline_is_the_administrators_file(fake: FakeHost) -> None:
    fake.cmdline("root=/dev/sda1 ro").file("etc/kernel/cmdline", "root=/dev/sda1 ro\n")
    fake.file("etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    results = run_spec(CMDLINE, fake.root, fix=True, persist=True)
    result = results["kernel.cmdline[iommu=pt]"]
    assert result.outcome is Outcome.FAILED
    assert "does not edit" in result.message and "proxmox-boot-tool refresh" in result.message
    assert (fake.root / "etc/kernel/cmdline").read_text() == "root=/dev/sda1 ro\n"
    (fake.root / "etc/kernel/cmdline").write_text("root=/dev/sda1 ro iommu=pt\n")
    result = run_spec(CMDLINE, fake.root)["kernel.cmdline[iommu=pt]"]
    assert result.outcome is Outcome.REBOOT_REQUIRED
    assert "etc/kernel/cmdline sets 'iommu=pt'" in result.message


# --- cpufreq -------------------------------------------------------------------------------------

CPUFREQ = ("version: 1\nname: t\ncpufreq:\n  driver: amd-pstate-epp\n  governor: performance\n"
           "  epp: performance\n  boost: 1\n")


def test_cpufreq_on_an_amd_pstate_epp_machine(fake: FakeHost) -> None:
    fake.cpufreq("amd-pstate-epp", policies=4, governor="powersave", epp="balance_performance",
                 boost="policy", boost_on=False)
    results = run_spec(CPUFREQ, fake.root)
    assert results["cpufreq.driver"].outcome is Outcome.PASSED
    assert results["cpufreq.epp"].observed == "balance_performance"
    fixed = run_spec(CPUFREQ, fake.root, fix=True)
    assert {k: r.outcome for k, r in fixed.items()} == {
        "cpufreq.boost": Outcome.FIXED, "cpufreq.driver": Outcome.PASSED,
        "cpufreq.epp": Outcome.FIXED, "cpufreq.governor": Outcome.FIXED}
    policy = fake.root / "sys/devices/system/cpu/cpufreq/policy3"
    assert (policy / "boost").read_text() == "1\n"


def test_cpufreq_on_acpi_cpufreq_epp_is_skipped_and_driver_is_boot_time(fake: FakeHost) -> None:
    fake.cpufreq("acpi-cpufreq", policies=2, governor="schedutil").grub()
    fake.cmdline("ro quiet")
    results = run_spec(CPUFREQ, fake.root, fix=True, persist=True)
    assert results["cpufreq.epp"].outcome is Outcome.SKIPPED
    assert "energy_performance_preference" in results["cpufreq.epp"].message
    driver = results["cpufreq.driver"]
    assert driver.outcome is Outcome.REBOOT_REQUIRED
    assert "amd_pstate=active" in (fake.root / "etc/default/grub.d/90-gpuhost-t.cfg").read_text()


def test_cpufreq_on_intel_pstate_boost_is_no_turbo(fake: FakeHost) -> None:
    fake.cpufreq("intel_pstate", policies=2, governor="powersave", epp="balance_power",
                 boost="intel", boost_on=False)
    results = run_spec("version: 1\ncpufreq:\n  boost: 1\n  governor: powersave\n", fake.root,
                  fix=True)
    assert results["cpufreq.boost"].outcome is Outcome.FIXED
    assert (fake.root / "sys/devices/system/cpu/intel_pstate/no_turbo").read_text() == "0\n"


def test_cpufreq_mixed_policies_name_the_cpus(fake: FakeHost) -> None:
    fake.cpufreq("acpi-cpufreq", policies=4, governor="performance")
    fake.file("sys/devices/system/cpu/cpufreq/policy2/scaling_governor", "powersave\n")
    [result] = run_spec("version: 1\ncpufreq:\n  governor: performance\n", fake.root).values()
    assert result.observed == "powersave on cpus 2; performance on cpus 0-1,3"


def test_cpufreq_a_policys_unreadable_value_is_an_error_not_a_policy_left_out(
        fake: FakeHost) -> None:
    """policy2's governor cannot be read: the check is an error naming it, never a pass over
    the policies that could be read (nor a fix that leaves policy2 as it is)."""
    fake.cpufreq("acpi-cpufreq", policies=4, governor="performance")
    governor = fake.root / "sys/devices/system/cpu/cpufreq/policy2/scaling_governor"
    governor.unlink()
    governor.mkdir()  # read: an error that is not "missing"
    [result] = run_spec("version: 1\ncpufreq:\n  governor: performance\n", fake.root).values()
    assert result.outcome is Outcome.ERROR
    assert "policy2/scaling_governor" in result.message


def test_cpufreq_policies_that_cannot_be_listed_are_an_error_not_a_vm_without_cpufreq(
        fake: FakeHost) -> None:
    fake.cpufreq("acpi-cpufreq", policies=2, governor="powersave")
    cpufreq = fake.root / "sys/devices/system/cpu/cpufreq"
    cpufreq.rename(fake.root / "sys/devices/system/cpu/elsewhere")
    cpufreq.symlink_to("cpufreq")  # ELOOP, where a confined container gets EACCES
    [result] = run_spec("version: 1\ncpufreq:\n  governor: performance\n", fake.root,
                   fix=True).values()
    assert result.outcome is Outcome.ERROR
    assert "cannot list" in result.message and "cpufreq" in result.message
    assert not (fake.root / "sys/devices/system/cpu/cpufreq").exists()  # nothing written
    governors = (fake.root / "sys/devices/system/cpu/elsewhere").glob("*/scaling_governor")
    assert {g.read_text() for g in governors} == {"powersave\n"}


def test_cpufreq_on_a_vm_without_cpufreq_is_skipped(fake: FakeHost) -> None:
    results = run_spec(CPUFREQ, fake.root)
    assert {r.outcome for r in results.values()} == {Outcome.SKIPPED}


# --- memory, iommu, module parameters ------------------------------------------------------------


def test_transparent_hugepage_fix_and_missing(fake: FakeHost) -> None:
    spec = "version: 1\nmemory:\n  transparent_hugepage: madvise\n"
    assert run_spec(spec, fake.root)["memory.transparent_hugepage"].outcome is Outcome.SKIPPED
    fake.transparent_hugepage("always")
    [result] = run_spec(spec, fake.root, fix=True).values()
    assert (result.outcome, result.before, result.after) == (Outcome.FIXED, "always", "madvise")


THP_ENABLED = "sys/kernel/mm/transparent_hugepage/enabled"


class ThpKernel(LocalHost):
    """transparent_hugepage/enabled as the kernel keeps it (mm/huge_memory.c enabled_store):
    it takes one mode's word (sysfs_streq: a trailing newline allowed), refuses anything else
    with EINVAL, and shows every mode with the selected one in brackets."""

    def write_text(self, path: str, text: str) -> None:
        if path != THP_ENABLED:
            super().write_text(path, text)
            return
        word = text.removesuffix("\n")
        modes = ("always", "madvise", "never")
        if word not in modes:
            raise HostError(f"cannot write {path}: Invalid argument (EINVAL)", errno.EINVAL)
        super().write_text(path, " ".join(f"[{m}]" if m == word else m for m in modes) + "\n")


def test_transparent_hugepage_rollback_writes_the_mode_the_kernel_takes(fake: FakeHost) -> None:
    """The original is recorded as the file reads (``[always] madvise never``), which the
    kernel refuses as a value: the rollback writes the selected word back."""
    fake.transparent_hugepage("always")
    journal = fake.root.parent / "j.jsonl"
    spec = "version: 1\nmemory:\n  transparent_hugepage: madvise\n"
    [fixed] = run_spec(spec, fake.root, fix=True, journal=journal, host=ThpKernel).values()
    assert fixed.outcome is Outcome.FIXED, fixed.message
    assert (fake.root / THP_ENABLED).read_text() == "always [madvise] never\n"
    [undo] = run_spec(None, fake.root, rollback=journal, host=ThpKernel).values()
    assert undo.outcome is Outcome.FIXED, undo.message
    assert (fake.root / THP_ENABLED).read_text() == "[always] madvise never\n"
    assert read_journal(journal).rolled_back


def test_iommu_groups_follow_the_links_and_reboot_required(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0").gpu("0000:81:00.0")
    fake.iommu_groups({"0000:01:00.0": "identity", "0000:81:00.0": "DMA-FQ"})
    fake.grub(linux_default="quiet iommu=pt").cmdline("ro quiet")
    results = run_spec("version: 1\niommu:\n  gpu_groups: identity\n", fake.root)
    assert results["iommu.gpu_groups[0000:01:00.0]"].outcome is Outcome.PASSED
    assert results["iommu.gpu_groups[0000:81:00.0]"].outcome is Outcome.REBOOT_REQUIRED


def test_iommu_off_is_skipped(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    [result] = run_spec("version: 1\niommu:\n  gpu_groups: identity\n", fake.root).values()
    assert result.outcome is Outcome.SKIPPED


MODULE = ("version: 1\nname: t\nmodules:\n  nvidia_uvm:\n    state: loaded\n"
          "    parameters: {uvm_disable_hmm: 'Y'}\n")


def test_module_parameter_from_sysfs_and_modprobe_d(fake: FakeHost) -> None:
    fake.module("nvidia_uvm").module_parameters("nvidia_uvm", {"uvm_disable_hmm": "N"})
    results = run_spec(MODULE, fake.root)
    assert results["module.parameter[nvidia_uvm.uvm_disable_hmm]"].outcome is Outcome.FAILED
    fake.file("etc/modprobe.d/nvidia.conf", "options nvidia_uvm uvm_disable_hmm=Y\n")
    result = run_spec(MODULE, fake.root)["module.parameter[nvidia_uvm.uvm_disable_hmm]"]
    assert result.outcome is Outcome.REBOOT_REQUIRED
    assert "etc/modprobe.d/nvidia.conf:1 sets 'Y'" in result.message


def test_module_parameter_fix_persist_writes_options(fake: FakeHost) -> None:
    fake.module("nvidia_uvm").module_parameters("nvidia_uvm", {"uvm_disable_hmm": "N"})
    result = run_spec(MODULE, fake.root, fix=True, persist=True)[
        "module.parameter[nvidia_uvm.uvm_disable_hmm]"]
    assert result.outcome is Outcome.REBOOT_REQUIRED
    assert (fake.root / "etc/modprobe.d/gpuhost-t-options.conf").read_text().endswith(
        "options nvidia_uvm uvm_disable_hmm=Y\n")


# --- NVML extras ---------------------------------------------------------------------------------

NVML = ("version: 1\ngpus:\n  power_limit: {min: 600}\n  ecc: enabled\n  bar1: {min: 96GiB}\n"
        "  kernel_module: open\n  driver_match: true\n")


def test_nvml_extras(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    fake.file("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "
                                            "570.124.06  Release Build\n")
    nvml = FakeNvml(driver="570.124.06", devices={"0000:01:00.0": FakeGpu(
        power_limit=450_000, ecc_current=False, ecc_pending=True, bar1_total=256 * 2**20)})
    results = run_spec(NVML, fake.root, nvml=nvml)
    assert {k: (r.outcome.value, r.observed) for k, r in results.items()} == {
        "gpus.nvml_inventory": ("passed", "0000:01:00.0"),
        "gpus.bar1[0000:01:00.0]": ("failed", "256 MiB"),
        "gpus.driver_match": ("passed", "match"),
        "gpus.ecc[0000:01:00.0]": ("reboot_required", "disabled"),
        "gpus.kernel_module[0000:01:00.0]": ("failed", "proprietary"),
        "gpus.power_limit[0000:01:00.0]": ("failed", "450"),
    }
    fixed = run_spec(NVML, fake.root, nvml=nvml, fix=True)
    assert fixed["gpus.power_limit[0000:01:00.0]"].outcome is Outcome.FIXED
    assert nvml.devices["0000:01:00.0"].power_limit == 600_000
    nvml.library = "13.580.95.05"
    assert run_spec(NVML, fake.root, nvml=nvml)["gpus.driver_match"].observed == (
        "library 580.95.05, kernel module 570.124.06")


def test_power_limit_outside_the_constraints_is_not_fixable(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    nvml = FakeNvml(devices={"0000:01:00.0": FakeGpu(power_limit=300_000,
                                                      power_limit_range=(150_000, 450_000))})
    [_, result] = run_spec("version: 1\ngpus:\n  power_limit: {min: 600}\n", fake.root, nvml=nvml,
                      fix=True).values()
    assert result.outcome is Outcome.FAILED and "outside what this GPU allows" in result.message


def test_ecc_fix_sets_the_pending_mode(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    nvml = FakeNvml(devices={"0000:01:00.0": FakeGpu(ecc_current=False, ecc_pending=False)})
    [_, result] = run_spec("version: 1\ngpus:\n  ecc: enabled\n", fake.root, nvml=nvml, fix=True,
                      persist=True).values()
    assert result.outcome is Outcome.REBOOT_REQUIRED
    assert nvml.devices["0000:01:00.0"].ecc_pending is True


# --- cpuidle: residency and names ----------------------------------------------------------------

RESIDENCY = "version: 1\ncpuidle:\n  disabled: [C2]\n  residency: {window: 10ms}\n"


def test_residency_sees_a_disabled_state_entered_during_the_window(fake: FakeHost) -> None:
    fake.cpus(4, disabled=["C2"])
    quiet = run_spec(RESIDENCY, fake.root, sleep=lambda s: None)
    assert quiet["cpuidle.residency[C2]"].outcome is Outcome.PASSED
    windows: list[float] = []

    def firmware_reenables(seconds: float) -> None:
        windows.append(seconds)
        fake.idle_counters("C2", usage=7, time_us=5200, cpus=[1, 3])

    results = run_spec(RESIDENCY, fake.root, sleep=firmware_reenables)
    assert windows == [0.01]  # the run's clock stood still since the batch: the whole window
    result = results["cpuidle.residency[C2]"]
    assert (result.outcome, result.observed) == (Outcome.FAILED, "entered on cpus 1,3")
    assert "usage +14, time +10400 us" in result.evidence[0]["raw"]


def test_residency_watches_only_the_cpus_where_the_state_is_disabled(fake: FakeHost) -> None:
    """A verify run before --fix: where C2 is still enabled, entering it is no override (and
    cpuidle[C2] says it is enabled); where it is disabled, growth is one."""
    fake.cpus(4, disabled=["C2"])
    for cpu in (0, 1):
        [disable] = [p.parent / "disable" for p in
                     fake.root.glob(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state*/name")
                     if p.read_text().strip() == "C2"]
        disable.write_text("0\n")

    def everyone_enters(seconds: float) -> None:
        fake.idle_counters("C2", usage=3, time_us=900, cpus=[0, 1, 3])

    result = run_spec(RESIDENCY, fake.root, sleep=everyone_enters)["cpuidle.residency[C2]"]
    assert (result.outcome, result.observed) == (Outcome.FAILED, "entered on cpus 3")
    assert "the 2 of 4 CPUs where it is disabled sampled" in result.evidence[0]["raw"]
    for cpu in (2, 3):
        [disable] = [p.parent / "disable" for p in
                     fake.root.glob(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state*/name")
                     if p.read_text().strip() == "C2"]
        disable.write_text("0\n")
    nowhere = run_spec(RESIDENCY, fake.root, sleep=everyone_enters)["cpuidle.residency[C2]"]
    assert nowhere.outcome is Outcome.SKIPPED
    assert "C2 is not disabled on any online CPU" in nowhere.message


def test_acs_redirect_with_no_bridge_above_the_gpus_is_one_skipped_record(fake: FakeHost) -> None:
    """A section that would expand to nothing says so instead of passing silently."""
    fake.gpu("0000:01:00.0").gpu("0000:02:00.0")  # on the root bus, as in a VM
    results = run_spec("version: 1\npcie:\n  acs_redirect: off\n", fake.root, fix=True)
    [result] = results.values()
    assert (result.id, result.outcome) == ("pcie.acs_redirect", Outcome.SKIPPED)
    assert "no PCI bridge between any of the 2 GPU(s) and the root bus" in result.message


def test_cpuidle_names_with_spaces_but_nothing_that_leaves_the_root(fake: FakeHost) -> None:
    fake.cpus(2, states=("snooze", "Shared Cede"))
    [result] = run_spec("version: 1\ncpuidle:\n  disabled: ['Shared Cede']\n", fake.root,
                   fix=True).values()
    assert (result.id, result.outcome) == ("cpuidle[Shared Cede]", Outcome.FIXED)
    for bad in ("../x", "C2; rm", " C2", "a'b"):
        with pytest.raises(SpecError, match=r"spec\.yaml:3"):
            run_spec(f"version: 1\ncpuidle:\n  disabled: [\"{bad}\"]\n", fake.root)


# --- spec errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "line", "message"), [
    ("kernel:\n  cmdline: {has: ['a b']}\n", 3, "one word"),
    ("kernel:\n  cmdline: {has: [x], lacks: [x]}\n", 3, "listed twice"),
    ("kernel:\n  releas: {min: '6.8'}\n", 3, "unknown key 'releas'"),
    ("cpufreq:\n  boost: 2\n", 3, "boost"),
    ("cpufreq:\n  turbo: 1\n", 3, "unknown key 'turbo'"),
    ("memory:\n  transparent_hugepage: sometimes\n", 3, "not one of always"),
    ("pcie:\n  acs_redirect: on\n", 3, "must be 'off'"),
    ("pcie:\n  aer: {since: yesterday}\n", 3, "session, boot"),
    ("modules:\n  nvidia_uvm: {state: loaded, parameters: {'a/b': 1}}\n", 3, "not allowed"),
    ("cpuidle:\n  disabled: [C2]\n  residency: {window: 2h}\n", 4, "window"),
    ("gpus:\n  bar1: {min: lots}\n", 3, "size"),
    ("iommu:\n  groups: identity\n", 3, "unknown key 'groups'"),
])
def test_new_keys_refuse_bad_values_with_file_and_line(tmp_path: Path, text: str, line: int,
                                                       message: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\n" + text)
    with pytest.raises(SpecError, match=re.escape(message)) as caught:
        load_spec(path, KINDS, CONDITIONS)
    assert caught.value.where == f"{path}:{line}"


SHELL_WORDS = ("x`touch${IFS}CANARY`", "x$(touch${IFS}CANARY)", "quiet$HOME", "a\\b",
               "a|b", "a&b", "a>CANARY")


@pytest.mark.parametrize("word", SHELL_WORDS)
def test_a_kernel_parameter_a_shell_would_act_on_is_a_spec_error(tmp_path: Path,
                                                                 word: str) -> None:
    """The grub.d drop-in is shell that update-grub sources as root (no injection)."""
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\nkernel:\n  cmdline:\n    has: [" + repr(word) + "]\n")
    with pytest.raises(SpecError, match="a character a shell acts on") as caught:
        load_spec(path, KINDS, CONDITIONS)
    assert caught.value.where == f"{path}:4"


def test_the_drop_in_planner_refuses_shell_words_and_odd_spec_names(fake: FakeHost) -> None:
    """Words reach the drop-in from several kinds (the command line, the cpufreq driver, module
    parameters): the planner itself refuses what a shell would act on, a spec name that is no
    plain file name, and our own drop-in edited to hold such a word."""
    from pytest_gpuhost.checks import CannotFix
    from pytest_gpuhost.checks.bootconfig import plan_dropin

    fake.cmdline("BOOT_IMAGE=/vmlinuz ro").grub()
    host = LocalHost(fake.root)
    for word in SHELL_WORDS:
        with pytest.raises(CannotFix, match="a shell acts on"):
            plan_dropin(host, "t", ["iommu=pt", word])
    with pytest.raises(CannotFix, match="not a plain word"):
        plan_dropin(host, "x$(id)", ["iommu=pt"])
    fake.file("etc/default/grub.d/90-gpuhost-t.cfg",
              'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT `touch CANARY`"\n')
    [change] = plan_dropin(host, "t", ["iommu=pt"]).changes  # a line that does more than
    assert isinstance(change, ReplaceFile) and change.new is not None  # assign is not kept
    assert "`" not in change.new and change.new.endswith('DEFAULT iommu=pt"\n')
    fake.file("etc/default/grub.d/90-gpuhost-t.cfg",
              'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT a%b>c"\n')
    with pytest.raises(CannotFix, match="fix or remove that file first"):
        plan_dropin(host, "t", ["iommu=pt"])
    assert not list(fake.root.rglob("*CANARY*"))


def test_the_drop_in_sourced_by_a_shell_gives_the_words_and_runs_nothing(
        fake: FakeHost, tmp_path: Path) -> None:
    """What update-grub does with our drop-in: ``.`` it in sh. The parameters come out as
    written (the ACS one with its ';'), and a canary beside it stays absent."""
    from pytest_gpuhost.checks.bootconfig import plan_dropin

    fake.cmdline("BOOT_IMAGE=/vmlinuz ro").grub()
    words = ["iommu=pt", "pci=disable_acs_redir=0000:00:01.1;0000:40:01.1", "amd_pstate=active"]
    plan = plan_dropin(LocalHost(fake.root), "t", words)
    [change] = plan.changes
    dropin = tmp_path / "90-gpuhost-t.cfg"
    assert isinstance(change, ReplaceFile) and change.new is not None
    dropin.write_text(change.new)
    out = subprocess.run(["sh", "-c", 'GRUB_CMDLINE_LINUX_DEFAULT="quiet"; . "$1"; '
                          'printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"', "sh", str(dropin)],
                         cwd=tmp_path, capture_output=True, text=True, check=True, timeout=10)
    assert out.stdout == "quiet iommu=pt 'pci=disable_acs_redir=0000:00:01.1;0000:40:01.1' " \
        "amd_pstate=active"  # GRUB's parser drops the single quotes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["90-gpuhost-t.cfg", "host"]


def test_a_boot_setting_written_meanwhile_is_reboot_required_not_refixed(fake: FakeHost) -> None:
    """Under xdist another worker's fix may write the drop-in between this check's observe and
    its fix: re-observed under the lock, it is reboot_required, and nothing is written again."""
    fake.cpufreq("acpi-cpufreq", policies=1).grub().cmdline("ro")

    class Racing(LocalHost):
        """The other worker writes the drop-in while this run waits for the lock."""

        def lock(self, path: str, timeout: float, holder: str) -> int:
            fake.file("etc/default/grub.d/90-gpuhost-t.cfg", 'GRUB_CMDLINE_LINUX_DEFAULT='
                      '"$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate=active"\n')
            return super().lock(path, timeout, holder)

    [result] = run_spec("version: 1\nname: t\ncpufreq:\n  driver: amd-pstate-epp\n", fake.root,
                        fix=True, persist=True, host=Racing).values()
    assert result.outcome is Outcome.REBOOT_REQUIRED and result.action is None
