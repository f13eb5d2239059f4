"""--fix-persist only merges what the kinds supply: their lines go into the file of their target,
with the commands they run found on the target; a refused line, an unknown command or a control
character keeps its whole file unwritten, saying why, and leaves the other files alone."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pytest_gpuhost.checks import BootCommand, PersistLine
from pytest_gpuhost.fix.persist import LineSupply, Unsafe, persistence_files
from pytest_gpuhost.result import CheckResult, Outcome

ETHTOOL = BootCommand("ethtool", "ethtool", "the ring sizes")


def _supply(*lines: PersistLine) -> list[LineSupply]:
    def persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
        return list(lines)

    return [persistence]


def _files(*lines: PersistLine, tools: dict[str, str | None] | None = None
           ) -> dict[str, str | Unsafe]:
    return persistence_files("lab", "lab.yaml", [], supplies=_supply(*lines), tools=tools)


def test_lines_of_several_kinds_go_into_their_files_in_the_kinds_order() -> None:
    files = _files(PersistLine("udev", 'KERNEL=="eth0", ATTR{mtu}="9000"'),
                   PersistLine("tmpfiles", "w /sys/kernel/x - - - - 1"),
                   PersistLine("udev", 'KERNEL=="ib0", ATTR{mtu}="4092"'))
    rules = files["etc/udev/rules.d/90-gpuhost-lab.rules"]
    assert isinstance(rules, str)
    assert rules.startswith("# Written by pytest-gpuhost --fix-persist from spec lab (lab.yaml).")
    assert rules.endswith('KERNEL=="eth0", ATTR{mtu}="9000"\nKERNEL=="ib0", ATTR{mtu}="4092"\n')
    assert str(files["etc/tmpfiles.d/gpuhost-lab.conf"]).endswith(
        " rather than this file.\nw /sys/kernel/x - - - - 1\n")
    assert set(files) == {"etc/udev/rules.d/90-gpuhost-lab.rules",
                          "etc/tmpfiles.d/gpuhost-lab.conf"}


def test_a_refused_line_keeps_its_file_unwritten_and_no_other() -> None:
    files = _files(PersistLine("sysctl", "vm.swappiness = 10"),
                   PersistLine.refuse("sysctl", "sysctl key 'a b': not a key"),
                   PersistLine("modules-load", "nvidia"))
    refused = files["etc/sysctl.d/90-gpuhost-lab.conf"]
    assert isinstance(refused, Unsafe) and str(refused) == "sysctl key 'a b': not a key"
    assert str(files["etc/modules-load.d/gpuhost-lab.conf"]).endswith("\nnvidia\n")


@pytest.mark.parametrize("text", ["w /x - - - - 1\nw /etc/shadow - - - - x", "w /x\x1b[2J",
                                  "w /x\u2028"])
def test_a_line_with_a_control_character_is_refused_whoever_supplies_it(text: str) -> None:
    [refused] = _files(PersistLine("tmpfiles", text)).values()
    assert isinstance(refused, Unsafe)
    assert str(refused).startswith("a tmpfiles.d line holds a control character: ")


def test_a_command_a_line_runs_is_named_by_its_path_on_the_target_or_the_file_is_refused() -> None:
    line = PersistLine("udev", 'RUN+="{ethtool} -G $kernel rx 8192"', runs=ETHTOOL)
    found = _files(line, tools={"ethtool": "/usr/sbin/ethtool"})
    assert str(found["etc/udev/rules.d/90-gpuhost-lab.rules"]).endswith(
        'RUN+="/usr/sbin/ethtool -G $kernel rx 8192"\n')
    without_host = _files(line)  # where Debian and Proxmox keep it
    assert str(without_host["etc/udev/rules.d/90-gpuhost-lab.rules"]).endswith(
        'RUN+="/usr/bin/ethtool -G $kernel rx 8192"\n')
    [missing] = _files(line, tools={"ethtool": None}).values()
    assert isinstance(missing, Unsafe)
    assert str(missing) == ("the ring sizes is set at boot by ethtool, and the target has none "
                            "in /usr/sbin, /usr/bin, /sbin, /bin: install ethtool there, then "
                            "run --fix-persist again")


def test_a_line_for_a_file_there_is_none_of_is_a_plugins_bug_said_at_once() -> None:
    with pytest.raises(ValueError, match=r"a persistence line for 'grub': the files are "
                                         r"sysctl, modules-load, modprobe, udev, tmpfiles, "
                                         r"cmdline"):
        PersistLine("grub", "GRUB_CMDLINE_LINUX=x")


def test_the_builtin_kinds_keep_the_values_read_back_or_planned() -> None:
    """A dry run's would_fix keeps what its plan writes (sysctl: the text; MaxReadReq: the
    size its Device Control bits say), a fixed one what was read back."""
    from pytest_gpuhost.checks.pcie import PcieKind
    from pytest_gpuhost.checks.sysctl import SysctlKind

    planned = CheckResult("sysctl[vm.swappiness]", "sysctl", "vm.swappiness", "10", "60",
                          Outcome.WOULD_FIX, "", plan=({"type": "write_text", "new": "10\n"},))
    fixed = CheckResult("sysctl[net.core.rmem_max]", "sysctl", "net.core.rmem_max",
                        ">= 16777216", "33554432", Outcome.FIXED, "")
    mrrs = CheckResult("pcie.max_read_request[0000:81:00.0]", "pcie.max_read_request",
                       "0000:81:00.0", "4096", "512", Outcome.WOULD_FIX, "",
                       plan=({"type": "write_bytes", "new": "5f50"},))
    assert [line.text for line in SysctlKind.persistence([planned, fixed])] == [
        "vm.swappiness = 10", "net.core.rmem_max = 33554432"]
    [rule] = PcieKind.persistence([mrrs])
    assert rule.runs is not None and rule.runs.name == "setpci"
    assert "CAP_EXP+8.w=5000:7000" in rule.text
