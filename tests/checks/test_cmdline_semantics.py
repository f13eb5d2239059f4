"""A kernel parameter means what the program that acts on it reads. kmod reads every
``modprobe.blacklist=`` and splits it at commas; dracut acts on every ``rd.driver.pre=``; the
kernel's ``iommu=`` handler acts on each occurrence, option by option (``iommu=pt iommu=1`` is
passthrough); ``video=`` gives a driver the options of the last occurrence naming it; most
others are last-wins, their value whole. The same reading judges the running line, the next
boot's (reboot_required) and what a failure tells the operator to add. The command lines
below are written in the formats of the real samples in ../shared/data/real (proc_cmdline_*,
lscpu_grub_cmdline_*): a BOOT_IMAGE line and Debian's etc/default/grub."""

from __future__ import annotations

import pytest

from pytest_gpuhost.linux.cmdline import Parameter, merge_words, split_words
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.testing.fakehost import FakeHost

from ..runner import run_spec

GPU_NODE = ("BOOT_IMAGE=/boot/vmlinuz-6.8.0-49-generic root=UUID=0f3c2d1e-5a6b-4c7d-8e9f-"
            "a0b1c2d3e4f5 ro quiet splash modprobe.blacklist=nouveau,nvidiafb "
            "rd.driver.pre=vfio-pci rd.driver.pre=nvidia iommu=pt iommu=1 amd_iommu=on "
            "video=vesafb:off,efifb:off console=tty0 console=ttyS0,115200n8 "
            "isolcpus=2-15,18-31 default_hugepagesz=1G hugepagesz=1G hugepages=8 "
            "pci=realloc=off module_blacklist=nouveau,nvidiafb amd-pstate=passive "
            "amd_pstate=active")
"""A GPU node's /proc/cmdline: a blacklist as one comma list, dracut's pre-loads as two,
iommu= twice, both framebuffers in one video=."""



def spec(*has: str, lacks: tuple[str, ...] = ()) -> str:
    text = "version: 1\nname: t\nkernel:\n  cmdline:\n    has: [" + ", ".join(has) + "]\n"
    return text + ("    lacks: [" + ", ".join(lacks) + "]\n" if lacks else "")


@pytest.mark.parametrize("word", [
    "modprobe.blacklist=nouveau",             # kmod splits the list at commas
    "modprobe.blacklist=nvidiafb",
    "modprobe.blacklist=nvidiafb,nouveau",    # every item, in any order
    "rd.driver.pre=nvidia",                   # dracut reads every occurrence
    "rd.driver.pre=vfio-pci",
    "iommu=pt",                               # iommu=1 after it does not undo passthrough
    "video=vesafb:off",                       # vesafb's options: 'off,efifb:off'
    "console=ttyS0,115200n8",                 # every console counts; its comma is its own
    "console=tty0",
    "hugepages=8",
    "isolcpus=2-15,18-31",                    # one value, commas and all
    "pci=realloc=off",
    "module_blacklist=nvidiafb",              # the kernel's own list, the last one in force
    "amd_pstate=active",                      # last wins; '-' is '_'
    "quiet",
])
def test_a_real_line_holds_what_its_readers_read(word: str) -> None:
    assert Parameter(word).present(split_words(GPU_NODE)), word


@pytest.mark.parametrize(("word", "why"), [
    ("video=efifb:off", "no video= names efifb ('video=vesafb:off,efifb:off': the kernel takes "
                        "one driver per video=, DRIVER:OPTIONS, so the others in a comma list "
                        "are that driver's options): add video=efifb:off"),
    ("modprobe.blacklist=nouveau,nvidia_drm",
     "modprobe.blacklist= lists nouveau, nvidiafb, without nvidia_drm (kmod (modprobe) reads "
     "every modprobe.blacklist= as a comma list): add nvidia_drm to its modprobe.blacklist="),
    ("amd_pstate=passive", "the command line has 'amd_pstate=passive amd_pstate=active' (the "
                           "last one is in force), not 'amd_pstate=passive'"),
    ("isolcpus=2-15", "the command line has 'isolcpus=2-15,18-31', not 'isolcpus=2-15'"),
    ("iommu=nopt", "iommu= lists pt, 1, without nopt (the kernel reads every iommu= as a comma "
                   "list): add nopt to its iommu="),
    ("rd.driver.blacklist=nouveau", "the command line has no rd.driver.blacklist"),
])
def test_what_a_real_line_lacks_is_said_as_its_reader_reads_it(word: str, why: str) -> None:
    words = split_words(GPU_NODE)
    assert not Parameter(word).present(words)
    assert Parameter(word).why_not(words) == why


def test_lacks_reads_the_same_way() -> None:
    words = split_words(GPU_NODE)
    assert Parameter("modprobe.blacklist=nouveau").mentioned(words)  # an item of the list
    assert not Parameter("modprobe.blacklist=nvidia").mentioned(words)
    assert Parameter("video=vesafb:off").mentioned(words)
    assert not Parameter("video=efifb:off").mentioned(words)
    assert not Parameter("amd_pstate=passive").mentioned(words)  # set, but not in force
    assert Parameter("amd_pstate").mentioned(words)  # a bare key: any occurrence
    assert Parameter("module_blacklist=nvidiafb").mentioned(words)


def test_the_kernels_own_module_blacklist_is_the_last_one() -> None:
    words = split_words("ro module_blacklist=nouveau,nvidiafb module_blacklist=nvidia_drm")
    assert not Parameter("module_blacklist=nouveau").present(words)
    assert Parameter("module_blacklist=nvidia_drm").present(words)
    assert Parameter("module_blacklist=nouveau").to_add(words) == (
        "module_blacklist=nvidia_drm,nouveau",
        "add nouveau to its module_blacklist= list (the last module_blacklist= is in force: "
        "module_blacklist=nvidia_drm,nouveau)")


def test_a_video_option_for_every_driver_and_a_later_one_that_names_it() -> None:
    assert Parameter("video=efifb:1024x768").present(split_words("video=1024x768"))  # global
    words = split_words("video=efifb:off video=efifb:1024x768")
    assert Parameter("video=efifb:1024x768").present(words)  # the last naming efifb
    assert not Parameter("video=efifb:off").present(words)


def test_a_failure_never_asks_for_a_second_list(fake: FakeHost) -> None:
    """The message and the fix name the item to add to the existing modprobe.blacklist=, and
    the drop-in --fix-persist writes holds one list (its own items), which the next boot
    reads together with the administrator's: reboot_required, from the same reading."""
    fake.cmdline(GPU_NODE).grub(linux_default="quiet splash modprobe.blacklist=nouveau,nvidiafb")
    text = spec("modprobe.blacklist=nouveau", "modprobe.blacklist=nvidia_drm",
                "modprobe.blacklist=nvidia_modeset")
    results = run_spec(text, fake.root)
    kept = results["kernel.cmdline[modprobe.blacklist=nouveau]"]
    assert kept.outcome is Outcome.PASSED, kept.message
    drm = results["kernel.cmdline[modprobe.blacklist=nvidia_drm]"]
    assert drm.outcome is Outcome.FAILED
    assert drm.message.startswith("modprobe.blacklist= lists nouveau, nvidiafb, without "
                                  "nvidia_drm (kmod (modprobe) reads every "
                                  "modprobe.blacklist= as a comma list): add nvidia_drm to "
                                  "its modprobe.blacklist=")
    assert "add a second" not in drm.message and "modprobe.blacklist=nvidia_drm'" not in \
        drm.message
    results = run_spec(text, fake.root, fix=True, persist=True)
    for word in ("nvidia_drm", "nvidia_modeset"):
        record = results[f"kernel.cmdline[modprobe.blacklist={word}]"]
        assert record.outcome is Outcome.REBOOT_REQUIRED, record.message
    dropin = (fake.root / "etc/default/grub.d/90-gpuhost-t.cfg").read_text()
    assert dropin.endswith('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT '
                           'modprobe.blacklist=nvidia_drm,nvidia_modeset"\n')
    assert dropin.count("modprobe.blacklist=") == 1


def test_systemd_boot_is_told_to_extend_its_list(fake: FakeHost) -> None:
    fake.cmdline("root=/dev/sda1 ro modprobe.blacklist=nouveau")
    fake.file("etc/kernel/cmdline", "root=/dev/sda1 ro modprobe.blacklist=nouveau\n")
    fake.file("etc/kernel/proxmox-boot-uuids", "1234-ABCD\n")
    [record] = run_spec(spec("modprobe.blacklist=nvidiafb"), fake.root, fix=True,
                   persist=True).values()
    assert record.outcome is Outcome.FAILED
    assert "does not edit: add nvidiafb to its modprobe.blacklist= list there and run " \
           "`proxmox-boot-tool refresh`, then reboot" in record.message
    (fake.root / "etc/kernel/cmdline").write_text(
        "root=/dev/sda1 ro modprobe.blacklist=nouveau,nvidiafb\n")
    [record] = run_spec(spec("modprobe.blacklist=nvidiafb"), fake.root).values()
    assert record.outcome is Outcome.REBOOT_REQUIRED  # the next boot's list has it


@pytest.mark.parametrize(("running", "boot", "outcome"), [
    ("ro quiet iommu=pt iommu=1", None, Outcome.PASSED),
    ("ro quiet", "quiet iommu=pt iommu=1", Outcome.REBOOT_REQUIRED),
    ("ro quiet rd.driver.pre=vfio-pci", "quiet rd.driver.pre=vfio-pci rd.driver.pre=nvidia",
     Outcome.REBOOT_REQUIRED),
    ("ro quiet", "quiet video=vesafb:off,efifb:off", Outcome.FAILED),
])
def test_reboot_required_reads_the_next_boot_the_same_way(fake: FakeHost, running: str,
                                                          boot: str | None,
                                                          outcome: Outcome) -> None:
    fake.cmdline(running)
    if boot is not None:
        fake.grub(linux_default=boot)
    word = {"iommu": "iommu=pt", "rd.driver.pre": "rd.driver.pre=nvidia",
            "video": "video=efifb:off"}[(boot or running).split()[-1].split("=")[0]]
    [record] = run_spec(spec(word), fake.root).values()
    assert record.outcome is outcome, record.message


def test_a_dropin_joins_a_listed_parameters_items() -> None:
    assert merge_words(["iommu=pt", "modprobe.blacklist=nouveau"],
                       ["modprobe.blacklist=nvidiafb", "modprobe.blacklist=nouveau"]) == [
        "iommu=pt", "modprobe.blacklist=nouveau,nvidiafb"]
    assert merge_words(["pci=disable_acs_redir=0000:00:01.1", "pci=noaer"],
                       ["pci=disable_acs_redir=0000:00:03.1"]) == [
        "pci=disable_acs_redir=0000:00:03.1", "pci=noaer"]  # one pci= option replaced
    assert merge_words(["amd_pstate=passive"], ["amd_pstate=active"]) == ["amd_pstate=active"]
    assert merge_words(["console=tty0"], ["console=ttyS0,115200n8"]) == [
        "console=tty0", "console=ttyS0,115200n8"]


# -- module parameters: kmod's order, the kernel's bools ---------------------------------------

def modeset(value: str) -> str:
    return (f"version: 1\nname: t\nmodules:\n  nvidia_drm:\n    state: loaded\n"
            f"    parameters: {{modeset: '{value}'}}\n")


@pytest.mark.parametrize(("spec_value", "shown", "outcome"), [
    ("1", "Y", Outcome.PASSED),   # reboot_required forever before
    ("on", "Y", Outcome.PASSED),
    ("y", "Y", Outcome.PASSED),
    ("true", "Y", Outcome.PASSED),
    ("0", "N", Outcome.PASSED),
    ("off", "N", Outcome.PASSED),
    ("Y", "Y", Outcome.PASSED),
    ("1", "N", Outcome.FAILED),
    ("off", "Y", Outcome.FAILED),
])
def test_a_bool_parameter_compares_as_the_kernel_parses_it(
        fake: FakeHost, spec_value: str, shown: str, outcome: Outcome) -> None:
    fake.module("nvidia_drm").module_parameters("nvidia_drm", {"modeset": shown})
    [_, record] = run_spec(modeset(spec_value), fake.root).values()
    assert record.outcome is outcome, record.message


def test_a_bool_set_in_modprobe_d_is_reboot_required_until_it_reads_back_y(
        fake: FakeHost) -> None:
    fake.module("nvidia_drm").module_parameters("nvidia_drm", {"modeset": "N"})
    fake.file("etc/modprobe.d/nvidia-drm.conf", "options nvidia_drm modeset=1\n")
    [_, record] = run_spec(modeset("1"), fake.root).values()
    assert record.outcome is Outcome.REBOOT_REQUIRED
    fake.module_parameters("nvidia_drm", {"modeset": "Y"})  # after the reload
    [_, record] = run_spec(modeset("1"), fake.root).values()
    assert record.outcome is Outcome.PASSED


def test_integers_stay_integers(fake: FakeHost) -> None:
    fake.module("nvidia").module_parameters("nvidia", {"NVreg_EnableGpuFirmware": "1"})
    text = ("version: 1\nname: t\nmodules:\n  nvidia:\n    state: loaded\n"
            "    parameters: {NVreg_EnableGpuFirmware: '10'}\n")
    [_, record] = run_spec(text, fake.root).values()
    assert record.outcome is Outcome.FAILED  # 10 is no bool, and not 1


def test_the_command_line_wins_over_modprobe_d(fake: FakeHost) -> None:
    """kmod parses modprobe.d, then the kernel command line, and hands the options on in that
    order: nvidia-drm.modeset=0 on the command line beats modprobe.d's modeset=1, so the next
    load gets 0 (no reboot_required), and an options line of ours could not change it."""
    fake.module("nvidia_drm").module_parameters("nvidia_drm", {"modeset": "N"})
    fake.file("etc/modprobe.d/nvidia-drm.conf", "options nvidia_drm modeset=1\n")
    fake.cmdline("BOOT_IMAGE=/vmlinuz ro quiet nvidia-drm.modeset=0")
    [_, record, _modules_load_d] = run_spec(modeset("1"), fake.root, fix=True,
                                            persist=True).values()
    assert record.outcome is Outcome.FAILED
    assert "the kernel command line sets nvidia_drm.modeset=0, which kmod applies after " \
           "modprobe.d (the command line wins)" in record.message
    assert not (fake.root / "etc/modprobe.d/gpuhost-t-options.conf").exists()
    fake.cmdline("BOOT_IMAGE=/vmlinuz ro quiet nvidia-drm.modeset=1")
    fake.file("etc/modprobe.d/nvidia-drm.conf", "options nvidia_drm modeset=0\n")
    [_, record] = run_spec(modeset("1"), fake.root).values()
    assert record.outcome is Outcome.REBOOT_REQUIRED
    assert "proc/cmdline sets '1'" in record.message
