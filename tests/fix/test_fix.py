"""Fix safety: dry run, journal, rollback, persistence, locks, and bad situations on fake trees."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from glob import escape
from pathlib import Path

import pytest

from pytest_gpuhost.checks import Check
from pytest_gpuhost.checks.changes import (
    Change,
    Command,
    Plan,
    ReplaceFile,
    WriteBytes,
    WriteText,
    from_dict,
    to_dict,
)
from pytest_gpuhost.checks.gpus import Gpu
from pytest_gpuhost.checks.modules import ModuleProbe, ModuleState
from pytest_gpuhost.checks.pcie import MaxReadRequestProbe
from pytest_gpuhost.checks.sysctl import SysctlProbe, read_boot_config
from pytest_gpuhost.engine import RunOptions, run_check
from pytest_gpuhost.fix.fixer import Fixer, FixError
from pytest_gpuhost.fix.journal import Journal, latest_journal, read_journal
from pytest_gpuhost.fix.locking import LockTimeout, RootLock
from pytest_gpuhost.fix.state import StateFile, StateStore
from pytest_gpuhost.host import HostError, LocalHost, Reply, Request
from pytest_gpuhost.linux.sysfs import bracketed
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact, Integer
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, counts, snapshot

FIX = RunOptions(fix=True)
STATE = "var/lib/pytest-gpuhost"


def host_state(root: Path) -> dict[str, tuple[bytes, int]]:
    """The host's files, leaving out pytest-gpuhost's own state (journal, locks)."""
    return {path: value for path, value in snapshot(root).items() if not path.startswith(STATE)}


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


# --- changes and the journal --------------------------------------------------------------------


@pytest.mark.parametrize("change", [
    WriteText("proc/sys/vm/swappiness", "60\n", "10\n"),
    WriteBytes("sys/bus/pci/devices/0000:01:00.0/config", 0x80, "3729", "3759"),
    Command(("modprobe", "nvidia_uvm"), ("modprobe", "-r", "nvidia_uvm"), "absent", "loaded"),
    ReplaceFile("etc/sysctl.d/90-gpuhost-x.conf", None, "vm.swappiness = 10\n"),
])
def test_changes_round_trip_and_undo(change: Change) -> None:
    assert from_dict(json.loads(json.dumps(to_dict(change)))) == change
    assert change.undo().undo() == change


def test_a_crash_cut_line_does_not_lose_the_journal(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.jsonl", "spec")
    first = journal.record("sysctl[a]", "sysctl", "a", WriteText("proc/sys/a", "1\n", "0\n"))
    journal.outcome(first, None)
    journal.record("sysctl[b]", "sysctl", "b", WriteText("proc/sys/b", "1\n", "0\n"))
    with (tmp_path / "j.jsonl").open("a") as out:
        out.write('{"event": "applied", "id": "')  # the process died mid-write
    contents = read_journal(tmp_path / "j.jsonl")
    assert [(e.check, e.state) for e in contents.entries] == [("sysctl[a]", "applied"),
                                                             ("sysctl[b]", "pending")]
    assert contents.damaged_lines == 1 and not contents.rolled_back


def newest(root: Path) -> Path | None:
    """The newest journal to roll back under ``root``, as a file of this machine."""
    found = latest_journal(root)
    return found.host.local_path(found.path) if found is not None else None


def test_latest_journal_skips_rolled_back_ones(tmp_path: Path) -> None:
    directory = tmp_path / STATE / "journal"
    older = directory / "20261201T000000Z-a-1.jsonl"
    newer = directory / "20261202T000000Z-a-2.jsonl"
    for path in (older, newer):
        Journal(path, "a").record("x", "sysctl", "x", WriteText("proc/sys/x", "1\n", "0\n"))
    assert newest(tmp_path) == newer
    Journal(newer, "a").close_rollback(1, 0)
    assert newest(tmp_path) == older
    retried = Journal(directory / "20261203T000000Z-a-3.jsonl", "a")  # nothing but a failure
    retried.outcome(retried.record("m", "module", "m", Command(("modprobe", "m"),
                                                               ("modprobe", "-r", "m"),
                                                               "absent", "loaded")), "exit 1")
    assert newest(tmp_path) == older


# --- locks --------------------------------------------------------------------------------------


def test_a_held_lock_times_out_naming_its_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from pathlib import Path
            from pytest_gpuhost.fix.locking import RootLock
            RootLock(Path({str(tmp_path / 'run.lock')!r}), "run").acquire(1)
            print("held", flush=True)
            time.sleep(30)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LockTimeout) as excinfo:
            RootLock(tmp_path / "run.lock", "run").acquire(0.2)
        assert f"holds the run lock {tmp_path / 'run.lock'} (waited 0.2 s): pid {holder.pid}" in \
            str(excinfo.value)
    finally:
        holder.kill()
        holder.wait()
    lock = RootLock(tmp_path / "run.lock", "run")
    lock.acquire(1)  # the kernel dropped the dead holder's lock: nothing stale is left
    assert lock.held
    lock.release()


def test_a_second_fix_run_waits_for_the_first_and_says_who_holds_it(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    lock = RootLock(example_host / STATE / "run.lock", "run")
    lock.acquire(1)
    try:
        before = host_state(example_host)
        blocked = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                     "--fix", "--gpuhost-lock-timeout=0.2")
        assert blocked.ret == pytest.ExitCode.INTERRUPTED
        blocked.stdout.fnmatch_lines([f"*another pytest-gpuhost run holds the run lock *run.lock "
                                      f"(waited 0.2 s): pid {os.getpid()} *"])
        shown = blocked.stdout.str()
        assert "_pytest.outcomes.Exit" not in shown and "Traceback" not in shown
        # the holder's command line starts with its program's name
        program = os.path.basename(sys.argv[0])
        assert f": {program}" in (example_host / STATE / "run.lock").read_text()
        assert host_state(example_host) == before  # nothing was written while locked out
        verify = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}")
        assert verify.ret == pytest.ExitCode.TESTS_FAILED  # verifying needs no lock
    finally:
        lock.release()


@pytest.mark.parametrize("layout", ["rhel", "none"])
def test_the_udev_rule_runs_the_targets_own_setpci_or_is_not_written(
        pytester: pytest.Pytester, spec: Path, example_host: Path, layout: str) -> None:
    """udev runs a RUN program by its absolute path, and one that is not there fails at boot
    where nobody looks: MaxReadReq would go back to 512 after every reboot. The rule names
    where the target keeps setpci (RHEL and Fedora: /usr/sbin; the example, like Debian and
    Proxmox: /usr/bin); a target without pciutils gets no rule, and the message says why."""
    shutil.rmtree(example_host / "sys/class/infiniband")
    setpci = example_host / "usr/bin/setpci"
    if layout == "rhel":
        setpci.rename(example_host / "usr/sbin/setpci")
    else:
        setpci.unlink()
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix",
                       "--fix-persist", "--gpuhost-report=r.json")
    rules = example_host / "etc/udev/rules.d/90-gpuhost-blackwell8.rules"
    if layout == "rhel":
        assert ('ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="0000:81:00.0", '
                'RUN+="/usr/sbin/setpci -s $kernel CAP_EXP+8.w=5000:7000"') in rules.read_text()
        assert "/usr/bin/setpci" not in rules.read_text()
        return
    assert not rules.exists()
    report = json.loads((pytester.path / "r.json").read_text())
    [refused] = [c for c in report["checks"]
                 if c["id"] == "persist[etc/udev/rules.d/90-gpuhost-blackwell8.rules]"]
    assert refused["outcome"] == "failed"
    assert refused["message"].startswith(
        "etc/udev/rules.d/90-gpuhost-blackwell8.rules is not written: MaxReadReq is set at "
        "boot by setpci, and the target has none in /usr/sbin, /usr/bin, /sbin, /bin: install "
        "pciutils there, then run --fix-persist again"), refused["message"]
    assert (example_host / "etc/sysctl.d/90-gpuhost-blackwell8.conf").exists()  # the others


def test_setpci_is_found_only_as_an_executable_file(fake: FakeHost) -> None:
    from pytest_gpuhost.fix.persist import command_paths

    host = LocalHost(fake.root)
    assert command_paths(host, ["setpci"]) == {"setpci": None}
    fake.file("usr/sbin/setpci", "#!/bin/sh\n", mode=0o644)  # not executable
    (fake.root / "usr/bin/setpci").mkdir(parents=True)  # a directory
    assert command_paths(host, ["setpci"]) == {"setpci": None}
    fake.file("bin/setpci", "#!/bin/sh\n", mode=0o755)
    assert command_paths(host, ["setpci"]) == {"setpci": "/bin/setpci"}
    fake.file("usr/sbin/setpci", "#!/bin/sh\n", mode=0o755)
    # the first directory wins
    assert command_paths(host, ["setpci"]) == {"setpci": "/usr/sbin/setpci"}


# --- dry run ------------------------------------------------------------------------------------


def test_dry_run_reports_the_plan_and_writes_nothing(pytester: pytest.Pytester, spec: Path,
                                                     example_host: Path) -> None:
    before = snapshot(example_host)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--gpuhost-dry-run", "--fix-persist",
                                "--gpuhost-report=plan.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # P2P has no fixer; boot-time checks plan their drop-ins (--fix-persist is on); of the 6
    # persistence files, the 2 of lines the kinds supply (tmpfiles.d, grub.d) are skipped: a
    # kind's lines hold the values right now, and none of theirs is before the fix
    assert counts(result) == {"passed": 129, "failed": 57, "would_fix": 62, "skipped": 4}
    assert snapshot(example_host) == before  # not even a journal or a lock file
    result.stdout.fnmatch_lines([
        "--gpuhost-dry-run: 62 fixes planned (188 changes); nothing was written",
        escape("  WOULD_FIX  sysctl[vm.swappiness]: '60' != '10'; would write '10' to "
               "proc/sys/vm/swappiness"),
    ])
    result.stdout.fnmatch_lines([
        escape("  WOULD_FIX  cpuidle[C2]: 'enabled on cpus 0-63' != 'disabled'; would write 1 "
               "to cpuidle/C2/disable on those 64 CPUs"),
        "      write sys/devices/system/cpu/cpu0/cpuidle/state2/disable: '0' -> '1'",
    ])
    # D7: the 56 slow pairs are the ACS redirect the plan clears: said, not left as a mystery
    result.stdout.fnmatch_lines(["  (56 p2p checks failed as measured before the planned "
                                 "changes; a real --fix measures after them)"])
    data = json.loads((pytester.path / "plan.json").read_text())
    assert data["dry_run"] is True and data["journal"] is None
    assert data["summary"]["would_fix"] == 62
    checks_by_id = {c["id"]: c for c in data["checks"]}
    acs = checks_by_id["pcie.acs_redirect[0000:00:01.1]"]
    assert acs["plan"] == [{"change": "write sys/bus/pci/devices/0000:00:01.1/config @0x14e: "
                                      "1d00 -> 1100", "type": "write_bytes",
                            "path": "sys/bus/pci/devices/0000:00:01.1/config", "offset": 0x14E,
                            "old": "1d00", "new": "1100", "never_set": 0}]  # RR, CR cleared
    cmdline = checks_by_id["kernel.cmdline[iommu=pt]"]
    assert cmdline["outcome"] == "would_fix"
    assert cmdline["plan"][0]["path"] == "etc/default/grub.d/90-gpuhost-blackwell8.cfg"
    checks = {c["id"]: c for c in data["checks"]}
    mrrs = checks["pcie.max_read_request[0000:81:00.0]"]
    assert mrrs["outcome"] == "would_fix"
    assert mrrs["plan"] == [{"change": "write sys/bus/pci/devices/0000:81:00.0/config @0x80: "
                                       "3729 -> 3759", "type": "write_bytes",
                             "path": "sys/bus/pci/devices/0000:81:00.0/config", "offset": 128,
                             "old": "3729", "new": "3759", "never_set": 0x8000}]
    assert checks["module[nvidia_uvm]"]["plan"][0]["argv"] == ["modprobe", "--", "nvidia_uvm"]
    persisted = checks["persist[etc/sysctl.d/90-gpuhost-blackwell8.conf]"]
    assert persisted["outcome"] == "would_fix"
    assert persisted["plan"][0]["old"] is None  # would create it


def test_dry_run_needs_fix(pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--gpuhost-dry-run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuhost-dry-run only makes sense with --fix"])


# --- journal and rollback -----------------------------------------------------------------------


def test_fix_journals_every_change_and_rollback_restores_the_originals(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    untuned = host_state(example_host)
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                               "--fix", "--fix-persist")
    fixed.stdout.fnmatch_lines(["--fix: 45 of 46 fixes applied",
                                "--fix-persist: 6 of 6 files written",
                                "journal: *.jsonl (undo: --gpuhost-rollback=*.jsonl "
                                f"--gpuhost-root={example_host})"])
    [undo] = [line.split("(undo: ", 1)[1].rstrip(")").split() for line in fixed.stdout.lines
              if line.startswith("journal: ")]
    [journal] = (example_host / STATE / "journal").glob("*-blackwell8-*.jsonl")
    contents = read_journal(journal)
    first = contents.entries[0]
    assert (first.check, first.spec, first.state) == ("sysctl[kernel.nmi_watchdog]",
                                                     "blackwell8", "applied")
    assert first.change == WriteText("proc/sys/kernel/nmi_watchdog", "1\n", "0\n")
    assert first.time.endswith("Z")
    states = {e.check: e.state for e in contents.entries}
    assert states["module[nvidia_peermem]"] == "failed"
    # sysctls, MaxReadReq, persistence mode, power limit per GPU, ACS per root port, C2 and
    # the governor per CPU, modprobes, THP, the drop-ins of two kernel parameters and one
    # module option (the driver and IOMMU checks found theirs there already), files
    assert len(contents.entries) == 9 + 8 + 8 + 8 + 8 + 64 + 64 + 2 + 1 + 2 + 1 + 6

    rollback = pytester.runpytest(*undo, "-v")  # the options the summary printed, as they are
    assert rollback.ret == pytest.ExitCode.OK
    assert counts(rollback) == {"passed": 1, "fixed": 180}  # the failed modprobe changed nothing
    rollback.stdout.fnmatch_lines(["--gpuhost-rollback: 180 of 181 changes restored, 1 already "
                                   "held its original",
                                   "rollback: *.jsonl is closed"])
    order = [line.split("rollback[", 1)[1] for line in rollback.stdout.lines
             if "::rollback[" in line and (" FIXED " in line or " PASSED " in line)]
    assert len(order) == 181
    assert order[0].startswith("persist[etc/udev/rules.d/90-gpuhost-blackwell8.rules]")
    assert order[-1].startswith("sysctl[kernel.nmi_watchdog] proc/sys/kernel/nmi_watchdog #1]")
    restored = host_state(example_host)
    changed = {p for p in set(restored) | set(untuned) if restored.get(p, (None,))[0] !=
               untuned.get(p, (None,))[0]}
    # the kernel's own log of the failed peermem load, and THP: a rollback writes back the
    # word the kernel takes ("always"), which a kernel shows as "[always] madvise never" and a
    # fake tree as written
    assert changed == {"dev/kmsg", "sys/kernel/mm/transparent_hugepage/enabled"}
    thp = example_host / "sys/kernel/mm/transparent_hugepage/enabled"
    assert bracketed(untuned["sys/kernel/mm/transparent_hugepage/enabled"][0].decode()) == \
        thp.read_text().strip()
    nvml = example_host / STATE / "nvml/0000:81:00.0/persistence_mode"  # recorded NVML state
    assert nvml.read_text() == "Disabled\n"
    again = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-rollback")
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["ERROR: no journal to roll back under *journal (every one there "
                                "is rolled back already); pass --gpuhost-rollback=FILE"])


def test_a_partial_rollback_run_again_finishes_what_is_left(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    """An admin's edit and a changed sysctl stop the first rollback; once both are put back,
    the rerun restores those two alone: what the first restored (the GRUB drop-in, written
    twice in the fix) the journal records, and it is not judged again."""
    untuned = host_state(example_host)
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                               "--fix", "--fix-persist", "-p", "no:cacheprovider")
    assert fixed.ret == pytest.ExitCode.TESTS_FAILED  # nvidia_peermem cannot load there
    persisted = example_host / "etc/sysctl.d/90-gpuhost-blackwell8.conf"
    written = persisted.read_text()
    persisted.write_text(written + "vm.dirty_ratio = 7\n")  # an admin's line
    swappiness = example_host / "proc/sys/vm/swappiness"
    swappiness.write_text("30\n")  # another tool's value
    args = (f"--gpuhost-root={example_host}", "--gpuhost-rollback", "-p", "no:cacheprovider")
    first = pytester.runpytest(*args)
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(first) == {"fixed": 178, "passed": 1, "failed": 2}
    first.stdout.fnmatch_lines(["--gpuhost-rollback: 178 of 181 changes restored, 1 already "
                                "held its original, 2 not (below)",
                                "rollback: *.jsonl is still open*"])
    [journal] = (example_host / STATE / "journal").glob("*.jsonl")
    assert sum(entry.restored for entry in read_journal(journal).entries) == 179
    persisted.write_text(written)  # both put back as the fix left them
    swappiness.write_text("10\n")
    again = pytester.runpytest(*args, "-v")
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()
    assert counts(again) == {"fixed": 2}
    again.stdout.fnmatch_lines(["*2 of 2 changes restored*179 restored by an earlier rollback*",
                                "rollback: *.jsonl is closed"])
    restored = host_state(example_host)
    changed = {p for p in set(restored) | set(untuned) if restored.get(p, (None,))[0] !=
               untuned.get(p, (None,))[0]}
    assert changed == {"dev/kmsg", "sys/kernel/mm/transparent_hugepage/enabled"}


def test_a_run_that_crashed_mid_fix_can_still_be_rolled_back(
        pytester: pytest.Pytester, spec: Path, example_host: Path) -> None:
    pytester.makeconftest("""
        import os
        from pytest_gpuhost.host import LocalHost

        real = LocalHost.write_text
        writes = []

        def dying(self, path, text):
            writes.append(path)
            if len(writes) == 4:
                os._exit(9)  # killed between the journal line and the write
            real(self, path, text)

        LocalHost.write_text = dying
    """)
    crashed = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                            f"--gpuhost-root={example_host}", "--fix")
    assert crashed.ret == 9
    [journal] = (example_host / STATE / "journal").glob("*.jsonl")
    entries = read_journal(journal).entries
    assert [e.state for e in entries] == ["applied", "applied", "applied", "pending"]
    (pytester.path / "conftest.py").unlink()
    rollback = pytester.runpytest(f"--gpuhost-root={example_host}",
                                  f"--gpuhost-rollback={journal}")
    assert counts(rollback) == {"passed": 1, "fixed": 3}  # the pending one was never written
    assert (example_host / "proc/sys/kernel/perf_event_paranoid").read_text() == "4\n"
    assert (example_host / "proc/sys/kernel/numa_balancing").read_text() == "1\n"


# --- persistence --------------------------------------------------------------------------------


def test_fix_persist_writes_files_that_make_it_stick(pytester: pytest.Pytester, spec: Path,
                                                     example_host: Path) -> None:
    shutil.rmtree(example_host / "sys/class/infiniband")
    (example_host / "proc/sys/kernel/osrelease").write_text("6.8.0-49-generic\n")
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix", "--fix-persist"]
    first = pytester.runpytest(*args)
    assert counts(first) == {"passed": 187, "fixed": 51, "skipped": 2, "reboot_required": 12}
    etc = example_host / "etc"
    dropin = (etc / "default/grub.d/90-gpuhost-blackwell8.cfg").read_text()
    assert dropin.endswith('GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT amd_pstate='
                           "active iommu=pt 'pci=disable_acs_redir=0000:00:01.1;0000:20:01.1;"
                           "0000:40:01.1;0000:60:01.1;0000:80:01.1;0000:a0:01.1;0000:c0:01.1;"
                           "0000:e0:01.1'\"\n")  # quoted: GRUB's parser splits at ';'
    assert (etc / "default/grub").read_text().count("GRUB_CMDLINE") == 2  # the user's, untouched
    assert (etc / "modprobe.d/gpuhost-blackwell8-options.conf").read_text().endswith(
        "options nvidia_uvm uvm_disable_hmm=Y\n")
    tmpfiles = (etc / "tmpfiles.d/gpuhost-blackwell8.conf").read_text()
    assert ("w /sys/devices/system/cpu/cpufreq/policy*/scaling_governor - - - - performance\n"
            in tmpfiles)
    assert "w /sys/kernel/mm/transparent_hugepage/enabled - - - - madvise\n" in tmpfiles
    sysctl = (etc / "sysctl.d/90-gpuhost-blackwell8.conf").read_text()
    assert sysctl.startswith("# Written by pytest-gpuhost --fix-persist from spec blackwell8 "
                             "(blackwell8.yaml).\n")
    assert "vm.swappiness = 10\n" in sysctl and "net.core.rmem_max = 16777216\n" in sysctl
    assert (etc / "modules-load.d/gpuhost-blackwell8.conf").read_text().endswith(
        "nvidia\nnvidia_uvm\n")
    assert "blacklist nouveau\ninstall nouveau /bin/false\n" in (
        etc / "modprobe.d/gpuhost-blackwell8.conf").read_text()
    rules = (etc / "udev/rules.d/90-gpuhost-blackwell8.rules").read_text()
    assert ('ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="0000:81:00.0", '
            'RUN+="/usr/bin/setpci -s $kernel CAP_EXP+8.w=5000:7000"') in rules
    assert "case $$(cat $$d/name) in C2) echo 1 > $$d/disable;; esac" in rules
    assert not [p for p in etc.rglob(".*")]  # no temporary file left behind
    persisted = host_state(example_host)
    second = pytester.runpytest(*args)
    assert counts(second) == {"passed": 238, "skipped": 2, "reboot_required": 12}
    second.stdout.fnmatch_lines(["--fix: 0 of 0 fixes applied",
                                 "--fix-persist: 0 of 0 files written"])
    assert host_state(example_host) == persisted  # unchanged files are not rewritten


def test_a_rollback_dry_run_previews_what_the_rollback_does(pytester: pytest.Pytester,
                                                            spec: Path,
                                                            example_host: Path) -> None:
    """The GRUB drop-in is written once per boot-time fix, each journaled: its older entries
    are undone after its newer ones restored what they left. The preview sees that too (it
    once said 'edited since the fix' of the older ones, which the rollback then restored)."""
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                               "--fix", "--fix-persist")
    assert fixed.ret == pytest.ExitCode.TESTS_FAILED  # nvidia_peermem cannot load there
    tuned = host_state(example_host)
    preview = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-rollback",
                                 "--gpuhost-dry-run", "-p", "no:cacheprovider")
    assert host_state(example_host) == tuned  # a dry run writes nothing
    planned = counts(preview)  # passed: the load of nvidia_peermem that failed is undone
    assert planned == {"would_fix": 180, "passed": 1}
    rolled = pytester.runpytest(f"--gpuhost-root={example_host}", "--gpuhost-rollback",
                                "-p", "no:cacheprovider")
    assert counts(rolled) == {"fixed": 180, "passed": 1}


def test_persist_keeps_a_higher_value_than_the_minimum(pytester: pytest.Pytester,
                                                       fake: FakeHost) -> None:
    fake.sysctl("net.core.rmem_max", 67108864)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  net.core.rmem_max: {min: 16777216}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                                "--fix-persist")
    assert result.ret == pytest.ExitCode.OK
    assert (fake.root / "etc/sysctl.d/90-gpuhost-spec.conf").read_text().endswith(
        "net.core.rmem_max = 67108864\n")


def test_a_value_that_boot_configuration_would_set_back_is_reported(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    fake.file("usr/lib/sysctl.d/10-distro.conf", "vm.swappiness = 30\n")
    fake.file("etc/sysctl.d/10-distro.conf", "# the admin's copy hides the vendor's\n"
                                             "vm.swappiness=60\n")
    fake.file("etc/sysctl.d/99-late.conf", "-net.core.rmem_max = 1\n")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    assert counts(result) == {"fixed": 1}
    result.stdout.fnmatch_lines([escape(
        "  WILL REVERT sysctl[vm.swappiness]: etc/sysctl.d/10-distro.conf:2 sets "
        "'60' on the next boot or `sysctl --system`")])
    fake.file("etc/sysctl.conf", "vm.swappiness = 10\n")  # applied last: it wins
    clean = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert "will revert" not in clean.stdout.str()


def test_boot_configuration_order(fake: FakeHost, host: LocalHost) -> None:
    fake.file("lib/sysctl.d/50-a.conf", "vm.a = 1\n")
    fake.file("run/sysctl.d/50-a.conf", "vm.a = 2\n")  # hides lib's 50-a.conf
    fake.file("usr/lib/sysctl.d/60-b.conf", "vm.a = 3\nnet.ipv4.conf.eth0/100.rp_filter = 2\n")
    fake.file("etc/sysctl.d/notes.txt", "vm.a = 9\n")  # not a .conf file
    assert read_boot_config(host) == {
        "proc/sys/vm/a": ("3", "usr/lib/sysctl.d/60-b.conf:1"),
        "proc/sys/net/ipv4/conf/eth0.100/rp_filter": ("2", "usr/lib/sysctl.d/60-b.conf:2"),
    }


# --- bad situations -----------------------------------------------------------------------------


class Refusing(LocalHost):
    """A host whose writes fail with one errno, as a container or a locked-down kernel does."""

    def __init__(self, root: Path, code: int, *, privileged: bool = True) -> None:
        super().__init__(root)
        self.code = code
        self._privileged = privileged

    def privileged(self) -> bool:
        return self._privileged

    def _write(self, path: str, data: bytes, offset: int, *, truncate: bool) -> None:
        raise HostError(f"cannot write {self.path(path)}: {os.strerror(self.code)}", self.code)


def sysctl_check() -> Check:
    return Check("sysctl", "net.core.rmem_max", Exact("16777216", Auto()),
                 EntryOptions(where="spec.yaml:3"), SysctlProbe("proc/sys/net/core/rmem_max"))


def test_read_only_proc_sys_in_a_container(fake: FakeHost) -> None:
    fake.sysctl("net.core.rmem_max", 212992)
    result = run_check(sysctl_check(), Refusing(fake.root, errno.EROFS), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert result.message.startswith("apply failed: read-only: this sysctl is not namespaced in a "
                                     "container (cannot write ")
    assert result.after == "212992"


@pytest.mark.parametrize("container", [False, True])
def test_a_read_only_namespaced_sysctl_is_set_in_the_containers_configuration(
        fake: FakeHost, container: bool) -> None:
    """kernel.shmmax is the IPC namespace's: the host cannot set it for the container, so the
    message names the container's own configuration, never the host (nor 'not namespaced')."""
    fake.sysctl("kernel.shmmax", 33554432)
    if container:
        fake.file("proc/1/environ", b"container=lxc\0")
    check = Check("sysctl", "kernel.shmmax", Exact("68719476736", Auto()),
                  EntryOptions(where="spec.yaml:3"), SysctlProbe("proc/sys/kernel/shmmax"))
    result = run_check(check, Refusing(fake.root, errno.EROFS), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert result.message.startswith(
        "apply failed: read-only here: kernel.shmmax is this container's own (its IPC, UTS or "
        "network namespace), not its host's: set it in the container's configuration "
        "(LXC: lxc.sysctl.kernel.shmmax; Docker: --sysctl; Kubernetes: securityContext.sysctls)")
    assert "on the host" not in result.message and "not namespaced" not in result.message


def test_not_root(fake: FakeHost) -> None:
    fake.sysctl("net.core.rmem_max", 212992)
    result = run_check(sysctl_check(), Refusing(fake.root, errno.EACCES, privileged=False), {},
                       FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert "permission denied: --fix needs root; run it with sudo" in result.message


def test_kernel_lockdown_refuses_config_space_writes(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", max_read_request=512)
    fake.file("sys/kernel/security/lockdown", "none [integrity] confidentiality\n")
    check = Check("pcie.max_read_request", "0000:01:00.0", Exact("4096", Integer()),
                  EntryOptions(where="spec.yaml:3"), MaxReadRequestProbe(Gpu("0000:01:00.0", "")))
    result = run_check(check, Refusing(fake.root, errno.EPERM), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert "kernel lockdown (integrity) refuses PCI config-space writes from user space" in \
        result.message


def test_a_modprobe_that_exits_0_but_prints_an_error(fake: FakeHost) -> None:
    fake.file("usr/sbin/modprobe", "#!/bin/sh\necho \"modprobe: ERROR: could not insert "
                                   "'nvidia_peermem': Unknown symbol in module\" >&2\nexit 0\n",
              mode=0o755)
    check = Check("module", "nvidia_peermem", Exact("loaded", ModuleState()),
                  EntryOptions(where="spec.yaml:3"), ModuleProbe("nvidia_peermem"))
    result = run_check(check, LocalHost(fake.root), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert result.message == ("modprobe -- nvidia_peermem, but read back 'absent': 'absent' != "
                              "'loaded'; it printed: modprobe: ERROR: could not insert "
                              "'nvidia_peermem': Unknown symbol in module")


def test_a_failed_change_is_journaled_as_failed(fake: FakeHost, tmp_path: Path) -> None:
    fake.sysctl("net.core.rmem_max", 212992)
    journal = Journal(tmp_path / "j.jsonl", "spec")
    fixer = Fixer(Refusing(fake.root, errno.EROFS), journal, run_lock=None, apply_lock=None,
                  lock_timeout=1)
    run_check(sysctl_check(), fixer.host, {}, FIX, fixer)
    [entry] = read_journal(tmp_path / "j.jsonl").entries
    assert entry.state == "failed"


def test_a_fix_run_under_xdist_shares_one_journal(pytester: pytest.Pytester, spec: Path,
                                                  example_host: Path) -> None:
    result = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                           f"--gpuhost-root={example_host}", "--fix", "-n", "2",
                                           "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["--fix: 45 of 46 fixes applied"])
    [journal] = (example_host / STATE / "journal").glob("*.jsonl")
    entries = read_journal(journal).entries
    assert len(entries) == 9 + 8 + 8 + 8 + 8 + 64 + 64 + 2 + 1
    assert len({e.id.split("-")[0] for e in entries}) == 2  # both workers wrote to it



class Recording(LocalHost):
    """A host that says, in order, what reached its disk: journal appends (synced or not, how
    many lines) and writes; the second write of a plan may be refused."""

    def __init__(self, root: Path, refuse: str | None = None) -> None:
        super().__init__(root)
        self.events: list[tuple[str, ...]] = []
        self.refuse = refuse

    def append_file(self, path: str, data: bytes, *, sync: bool = True) -> None:
        self.events.append(("append", "synced" if sync else "not synced",
                            str(data.count(b"\n"))))
        super().append_file(path, data, sync=sync)

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        self.events.append(("batch", str(len(requests))))
        return super().batch(requests)

    def _write(self, path: str, data: bytes, offset: int, *, truncate: bool) -> None:
        self.events.append(("write", path))
        if path == self.refuse:
            raise HostError(f"cannot write {self.path(path)}: refused", errno.EPERM)
        super()._write(path, data, offset, truncate=truncate)


def three_writes() -> Plan:
    return Plan("disable C2 on CPUs 0-2", tuple(
        WriteText(f"sys/devices/system/cpu/cpu{n}/cpuidle/state2/disable", "0\n", "1\n")
        for n in range(3)))


def test_a_fix_journals_all_its_changes_durably_before_the_first_is_made(
        fake: FakeHost) -> None:
    """One fsync for the change lines of a fix, before any change; then the changes; then
    what they left, read back in one batch (one round trip to a remote target, not one a
    change); then the outcome lines in one write, made durable by the next fix's fsync, not by
    one of their own, and the last fix's by one fsync when the run ends."""
    fake.cpus(3, states=("POLL", "C1", "C2"))
    host = Recording(fake.root)
    journal = Journal(StateStore.of(host).new_journal("spec"), "spec")
    fixer = Fixer(host, journal, run_lock=None, apply_lock=None, lock_timeout=1)
    fixer.apply("cpuidle[C2]", "cpuidle", "C2", three_writes())
    assert host.events[0] == ("append", "synced", "3")
    assert host.events[1:] == [*(("write", f"sys/devices/system/cpu/cpu{n}/cpuidle/state2/"
                                  "disable") for n in range(3)),
                               ("batch", "3"), ("append", "not synced", "3")]
    fixer.close()  # the end of the run: no next fix, so one fsync of nothing new
    fixer.close()
    assert host.events[6:] == [("append", "synced", "0")]
    entries = read_journal(journal.path).entries
    assert [e.state for e in entries] == ["applied"] * 3
    assert [e.read_back for e in entries] == [b"1\n"] * 3


def test_a_read_back_that_fails_leaves_the_changes_applied_without_it(fake: FakeHost) -> None:
    """The writes were made; what they left cannot be read (a remote target lost just after
    them): the fix is applied and journaled so, with no read-back value, never an exception
    in place of the fix's own outcome."""
    fake.cpus(3, states=("POLL", "C1", "C2"))

    class LostAfterWrites(Recording):
        def batch(self, requests: Sequence[Request]) -> list[Reply]:
            if any(e[0] == "write" for e in self.events):
                raise HostError("lost the connection to the target", errno.ECONNRESET)
            return super().batch(requests)

    host = LostAfterWrites(fake.root)
    journal = Journal(StateStore.of(host).new_journal("spec"), "spec")
    fixer = Fixer(host, journal, run_lock=None, apply_lock=None, lock_timeout=1)
    fixer.apply("cpuidle[C2]", "cpuidle", "C2", three_writes())
    fixer.close()
    entries = read_journal(fake.root / journal.path.path).entries
    assert [(e.state, e.read_back) for e in entries] == [("applied", None)] * 3


def test_changes_after_a_refused_one_are_journaled_as_not_made(fake: FakeHost,
                                                                tmp_path: Path) -> None:
    fake.cpus(3, states=("POLL", "C1", "C2"))
    refused = "sys/devices/system/cpu/cpu1/cpuidle/state2/disable"
    journal = Journal(tmp_path / "j.jsonl", "spec")
    fixer = Fixer(Recording(fake.root, refuse=refused), journal, run_lock=None,
                  apply_lock=None, lock_timeout=1)
    with pytest.raises(FixError):
        fixer.apply("cpuidle[C2]", "cpuidle", "C2", three_writes())
    entries = read_journal(tmp_path / "j.jsonl").entries
    assert [e.state for e in entries] == ["applied", "failed", "failed"]
    assert (fake.root / "sys/devices/system/cpu/cpu2/cpuidle/state2/disable").read_text() == \
        "0\n"  # never attempted


# --- what a review found: each a case that once crashed, lied or overwrote ----------------------


def fix_once(pytester: pytest.Pytester, spec: Path, root: Path, *extra: str) -> Path:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}", "--fix",
                                *extra)
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    [journal] = (root / STATE / "journal").glob("*.jsonl")
    return journal


def test_an_existing_journal_file_is_refused(pytester: pytest.Pytester, spec: Path,
                                             example_host: Path) -> None:
    (pytester.path / "mine.jsonl").write_text("")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--gpuhost-journal=mine.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuhost-journal=mine.jsonl: the file exists; a "
                                 "journal records one run: name a new file"])


def test_a_root_where_the_lock_cannot_be_made_stops_cleanly(pytester: pytest.Pytester,
                                                            spec: Path,
                                                            example_host: Path) -> None:
    (example_host / STATE / "run.lock").mkdir(parents=True)  # a lock that cannot be opened
    before = host_state(example_host)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix")
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*cannot take the run lock *run.lock: Is a directory*"])
    assert "Traceback" not in result.stdout.str()
    assert host_state(example_host) == before


def test_a_held_lock_at_persistence_time_exits_2(pytester: pytest.Pytester, fake: FakeHost
                                                 ) -> None:
    fake.sysctl("vm.swappiness", 10)  # already right: the first write would be persistence
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    lock = RootLock(fake.root / STATE / "run.lock", "run")
    lock.acquire(1)
    try:
        result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                                    "--fix-persist", "--gpuhost-lock-timeout=0.2")
    finally:
        lock.release()
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["--fix-persist: nothing written: another pytest-gpuhost run "
                                 "holds the run lock*"])
    assert not (fake.root / "etc").exists()


@pytest.mark.parametrize("flag", ["--fix-persist", "--gpuhost-journal=x.jsonl"])
def test_rollback_refuses_flags_it_cannot_honour(pytester: pytest.Pytester, fake: FakeHost,
                                                 flag: str) -> None:
    result = pytester.runpytest(f"--gpuhost-root={fake.root}", "--gpuhost-rollback", flag)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {flag.split('=')[0]} does not go with "
                                 "--gpuhost-rollback*"])


@pytest.mark.parametrize(("line", "message"), [
    ("[1, 2]", "not a journal record"),
    ('{"event": "change", "id": "1-1", "time": "t"}', "a change record without a usable"),
])
def test_a_hand_edited_journal_names_the_line(pytester: pytest.Pytester, fake: FakeHost,
                                              line: str, message: str) -> None:
    journal = pytester.path / "edited.jsonl"
    journal.write_text('{"event": "rolled_back_not", "time": "t"}\n' + line + "\n")
    result = pytester.runpytest(f"--gpuhost-root={fake.root}",
                                f"--gpuhost-rollback={journal}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}:2: {message}*"])


def test_rollback_leaves_what_was_changed_since_the_fix(pytester: pytest.Pytester, spec: Path,
                                                        example_host: Path) -> None:
    shutil.rmtree(example_host / "sys/class/infiniband")
    journal = fix_once(pytester, spec, example_host, "--fix-persist")
    (example_host / "proc/sys/vm/swappiness").write_text("5\n")  # the operator, since
    persisted = example_host / "etc/sysctl.d/90-gpuhost-blackwell8.conf"
    persisted.write_text(persisted.read_text() + "vm.overcommit_memory = 1\n")
    config = example_host / "sys/bus/pci/devices/0000:81:00.0/config"
    data = bytearray(config.read_bytes())
    data[0x80] = (data[0x80] & 0x1F) | (2 << 5)  # MaxPayload 512 since (DevCtl bits 7:5)
    config.write_bytes(bytes(data))
    result = pytester.runpytest(f"--gpuhost-root={example_host}",
                                f"--gpuhost-rollback={journal}", "-rA")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert (example_host / "proc/sys/vm/swappiness").read_text() == "5\n"
    assert "vm.overcommit_memory = 1" in persisted.read_text()
    result.stdout.fnmatch_lines(["*changed since the fix (now '5', the fix left '10'): left as "
                                 "it is*"])
    result.stdout.fnmatch_lines(["*90-gpuhost-blackwell8.conf was edited since the fix: left as "
                                 "it is*"])
    restored = config.read_bytes()
    assert restored[0x80:0x82] == bytes([(0x37 & 0x1F) | (2 << 5), 0x29])  # MRRS back, MPS kept
    rollback = read_journal(journal)
    assert not rollback.rolled_back  # still open: two changes are not back


def test_the_verify_hint_matches_what_fix_would_do(pytester: pytest.Pytester,
                                                   fake: FakeHost) -> None:
    fake.sysctl("kernel.core_pattern", "core").module("nouveau", state="builtin")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  kernel.core_pattern: {match: "
                                    "'[|].*'}\nmodules:\n  nouveau: absent\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    out = result.stdout.str()
    assert "'core' does not match /[|].*/ (not fixable: 'matches /[|].*/' names no single " \
           "value to write)" in out
    assert "(not fixable: nouveau is built into the kernel and cannot be unloaded)" in out
    assert "run with --fix" not in out


def test_a_skip_points_at_the_spec(pytester: pytest.Pytester, fake: FakeHost) -> None:
    pytester.makefile(".yaml", spec="version: 1\nmodules:\n  nvidia_peermem: "
                                    "{state: loaded, when: infiniband}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-rs")
    result.stdout.fnmatch_lines(["SKIPPED [1] spec.yaml:3: when: infiniband is false: no RDMA "
                                 "device under sys/class/infiniband"])


def test_a_change_knows_the_bits_its_restore_must_never_set(fake: FakeHost) -> None:
    """The FLR guard belongs to the Device Control change, not to every restored register:
    a restore of DevCtl never sets bit 15; a restore of another register restores it."""
    from pytest_gpuhost.fix.journal import JournalContents, JournalEntry
    from pytest_gpuhost.fix.rollback import rollback_checks
    from pytest_gpuhost.gpu.nvml import FakeNvml, NvmlSource

    config = fake.file("sys/bus/pci/devices/0000:01:00.0/config", bytes(0x100))
    config.write_bytes(bytes(0x80) + (0x1000).to_bytes(2, "little") + bytes(0x7E))
    path = "sys/bus/pci/devices/0000:01:00.0/config"

    def restore(never_set: int) -> tuple[Outcome, int]:
        change = WriteBytes(path, 0x80, (0x9000).to_bytes(2, "little").hex(),
                            (0x1000).to_bytes(2, "little").hex(), never_set)
        entry = JournalEntry("1", "t", "s", "c", "pcie.max_read_request", "k", change, "applied")
        [check] = rollback_checks(JournalContents(StateFile.local(fake.root / "j.jsonl"), (entry,),
                                                  False, 0),
                                  "j", NvmlSource(lambda: FakeNvml()))
        result = run_check(check, LocalHost(fake.root), {}, FIX)
        data = config.read_bytes()[0x80:0x82]
        config.write_bytes(bytes(0x80) + (0x1000).to_bytes(2, "little") + bytes(0x7E))
        return result.outcome, int.from_bytes(data, "little")

    outcome, devctl = restore(0x8000)  # an original with FLR set is never written back
    assert devctl & 0x8000 == 0 and outcome is Outcome.FIX_FAILED
    assert restore(0) == (Outcome.FIXED, 0x9000)  # another register's bit 15 is restored
