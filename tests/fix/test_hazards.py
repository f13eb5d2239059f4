"""Safety first: each case that once wrote the wrong place, lost an undo, hung or
gave a traceback, on fake trees, with canaries outside the tree where anything is written."""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import resource
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.checks import Check
from pytest_gpuhost.checks.changes import Change, Plan, ReplaceFile, WriteBytes, WriteText
from pytest_gpuhost.checks.modules import ModuleProbe, ModuleState
from pytest_gpuhost.checks.sysctl import SysctlProbe
from pytest_gpuhost.engine import RunOptions, run_check
from pytest_gpuhost.fix.fixer import Fixer, FixError
from pytest_gpuhost.fix.journal import (
    JOURNAL_DIR,
    Journal,
    JournalContents,
    JournalEntry,
    JournalError,
    latest_journal,
    read_journal,
)
from pytest_gpuhost.fix.rollback import AFTER_REBOOT, refuse_foreign, rollback_checks
from pytest_gpuhost.fix.state import StateFile
from pytest_gpuhost.gpu.nvml import Nvml, NvmlSource
from pytest_gpuhost.host import HostError, HostIdentity, LocalHost
from pytest_gpuhost.linux.cpulist import parse_cpu_list
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact
from pytest_gpuhost.testing.fakehost import FakeHost, config_space

from ..conftest import counts, snapshot
from ..runner import run_spec

STATE = "var/lib/pytest-gpuhost"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file outside every host tree: no run may change it."""
    path = tmp_path / "outside" / "canary"
    path.parent.mkdir()
    path.write_text("untouched\n")
    return path


def unchanged(root: Path, before: dict[str, tuple[bytes, int]], canary: Path) -> bool:
    """The tree is as it was, bar pytest-gpuhost's own state, and the canary is intact."""
    after = {p: v for p, v in snapshot(root).items() if not p.startswith(STATE)}
    return after == {p: v for p, v in before.items() if not p.startswith(STATE)} and \
        canary.read_text() == "untouched\n"


# --- 5. a capability pointer outside 0x40..0xFF is an error, never a write ---------------------


@pytest.mark.parametrize(("pointer", "words"), [
    (0x08, "the capability pointer at 0x34 is 0x08, inside the 64-byte header"),
    (0xFC, "Device Control at 0xfc would reach 0x105, past the standard capabilities"),
])
def test_fix_never_writes_through_a_bad_capability_pointer(
        pytester: pytest.Pytester, fake: FakeHost, canary: Path, pointer: int,
        words: str) -> None:
    config = bytearray(config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000))
    config[0x34] = pointer
    config[pointer:pointer + 2] = bytes([0x10, 0x00])  # reads like the PCIe capability
    fake.pci_device("0000:01:00.0", vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                    config=bytes(config))
    pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n")
    before = snapshot(fake.root)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"errors": 1}
    assert words in result.stdout.str()
    assert unchanged(fake.root, before, canary)


# --- helpers for fix-then-rollback runs -----------------------------------------------------------


def fix_run(pytester: pytest.Pytester, root: Path, spec: str, *extra: str
            ) -> tuple[pytest.RunResult, Path]:
    """A --fix run of ``spec`` on ``root``; the journal it wrote."""
    (pytester.path / "spec.yaml").write_text(spec)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={root}", "--fix", *extra)
    journals = sorted((root / JOURNAL_DIR).glob("*.jsonl"))
    assert journals, result.stdout.str()
    return result, journals[-1]


def rollback_run(pytester: pytest.Pytester, root: Path | None, journal: Path | None,
                 *extra: str) -> pytest.RunResult:
    args = [f"--gpuhost-root={root}"] if root is not None else []
    args.append(f"--gpuhost-rollback={journal}" if journal is not None else "--gpuhost-rollback")
    return pytester.runpytest(*args, *extra)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- 4. a journal is rolled back only on the host it changed -------------------------------------


def test_the_journal_opens_with_the_identity_of_what_it_changed(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    header = lines(journal)[0]
    assert header["event"] == "journal" and header["spec"] == "spec"
    assert header["identity"] == {"root": os.path.realpath(fake.root), "hostname": None,
                                  "machine_id": None, "boot_id": None}
    assert str(header["tool"]).startswith("pytest-gpuhost ")
    assert read_journal(journal).identity == LocalHost(fake.root).identity()


def test_rollback_refuses_the_journal_of_another_root(
        pytester: pytest.Pytester, tmp_path: Path, canary: Path) -> None:
    tree_a = FakeHost(tmp_path / "a").sysctl("vm.swappiness", 60)
    tree_b = FakeHost(tmp_path / "b").sysctl("vm.swappiness", 10)  # what A's fix left, too
    _, journal = fix_run(pytester, tree_a.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    journal_before, b_before = journal.read_bytes(), snapshot(tree_b.root)
    result = rollback_run(pytester, tree_b.root, journal)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    a, b = os.path.realpath(tree_a.root), os.path.realpath(tree_b.root)
    result.stderr.fnmatch_lines([f"ERROR: {journal}: the journal of root {a}; this host is root "
                                 f"{b}: it is rolled back only there: pass --gpuhost-root={a}"])
    assert journal.read_bytes() == journal_before  # A's journal is not marked closed
    assert unchanged(tree_b.root, b_before, canary)
    assert (tree_b.root / "proc/sys/vm/swappiness").read_text() == "10\n"


def refuse_every_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should a refusal ever fail, no write or command of the run in this process reaches the
    machine the tests run on."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise HostError("this test must not change the machine it runs on")

    for name in ("_write", "replace_file", "remove", "run"):
        monkeypatch.setattr(LocalHost, name, refuse)


def test_forgetting_the_root_never_applies_a_fake_trees_journal_to_this_machine(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.sysctl("vm.swappiness", 60)
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    refuse_every_change(monkeypatch)
    result = rollback_run(pytester, None, journal)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}: the journal of root "
                                 f"{os.path.realpath(fake.root)}; this host is root /*: pass "
                                 f"--gpuhost-root={os.path.realpath(fake.root)}"])


def no_nvml() -> Nvml:
    """NVML for a rollback that has no NVML setting to restore: never opened."""
    raise AssertionError("a rollback of files and sysctls opened NVML")


def _identity(root: str = "/", machine: str | None = "m1", boot: str | None = "b1",
              hostname: str | None = "gpu-07") -> HostIdentity:
    return HostIdentity(root, hostname, machine, boot)


def _contents(identity: HostIdentity | None, *changes: Change,
              path: Path = Path("/var/lib/pytest-gpuhost/journal/x.jsonl")) -> JournalContents:
    entries = tuple(JournalEntry(f"1-{n}", "t", "s", "c", "sysctl", None, change, "applied", n)
                    for n, change in enumerate(changes, 1))
    return JournalContents(StateFile.local(path), entries, False, 0, identity)


SYSCTL_CHANGE = WriteText("proc/sys/vm/swappiness", "60\n", "10\n")
FILE_CHANGE = ReplaceFile("etc/sysctl.d/90-gpuhost-s.conf", None, "vm.swappiness = 10\n")


def test_the_real_root_of_another_machine_is_refused() -> None:
    journal = _contents(_identity(machine="m1"), SYSCTL_CHANGE)
    with pytest.raises(JournalError, match=r"machine-id m1.*this host is root /, hostname "
                                           r"gpu-07, machine-id m2.*another machine"):
        refuse_foreign(journal, _identity(machine="m2"))
    refuse_foreign(journal, _identity(machine="m1"))  # the same machine, the same boot
    no_ids = _contents(_identity(machine=None), SYSCTL_CHANGE)
    with pytest.raises(JournalError, match="no machine-id to compare, and the hostnames differ"):
        refuse_foreign(no_ids, _identity(machine=None, hostname="gpu-08"))


def test_after_a_reboot_runtime_changes_are_refused_unless_asked_for() -> None:
    journal = _contents(_identity(boot="b1"), FILE_CHANGE, SYSCTL_CHANGE)
    with pytest.raises(JournalError) as excinfo:
        refuse_foreign(journal, _identity(boot="b2"))
    message = str(excinfo.value)
    assert "the host has rebooted since (boot id b1 then, b2 now)" in message
    assert "1 runtime change(s)" in message and f"pass {AFTER_REBOOT}" in message
    refuse_foreign(journal, _identity(boot="b2"), after_reboot=True)
    files_only = _contents(_identity(boot="b1"), FILE_CHANGE)  # files survive a reboot
    refuse_foreign(files_only, _identity(boot="b2"))


def test_a_rollback_after_a_reboot_is_refused_then_done_when_asked(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.sysctl("vm.swappiness", 60)

    def booted(boot: str) -> None:  # a machine whose boot id the test decides
        monkeypatch.setattr(LocalHost, "identity", lambda self: HostIdentity(
            os.path.realpath(self.root), "gpu-07", "m1", boot))

    booted("boot-1")
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    booted("boot-2")
    refused = rollback_run(pytester, fake.root, journal)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*the host has rebooted since (boot id boot-1 then, boot-2 "
                                  f"now)*pass {AFTER_REBOOT} to restore them anyway*"])
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    done = rollback_run(pytester, fake.root, journal, AFTER_REBOOT)
    assert done.ret == pytest.ExitCode.OK
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_the_after_reboot_flag_needs_a_rollback(pytester: pytest.Pytester, fake: FakeHost
                                                ) -> None:
    (pytester.path / "spec.yaml").write_text("version: 1\nsysctl: {vm.swappiness: 10}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", AFTER_REBOOT)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {AFTER_REBOOT} only makes sense with "
                                 "--gpuhost-rollback"])


def _old_journal(path: Path) -> Path:
    """A journal as pytest-gpuhost wrote it before the identity header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"event": "change", "id": "1-1", "time": "t", "spec": "s",
                                "check": "sysctl[vm.swappiness]", "kind": "sysctl",
                                "key": "vm.swappiness", "change": {
                                    "type": "write_text", "path": "proc/sys/vm/swappiness",
                                    "old": "60\n", "new": "10\n"}}) + "\n"
                    + json.dumps({"event": "applied", "id": "1-1", "time": "t",
                                  "error": None}) + "\n")
    return path


def test_an_old_journal_rolls_back_only_on_the_root_that_holds_it(
        pytester: pytest.Pytester, tmp_path: Path, canary: Path) -> None:
    tree_a = FakeHost(tmp_path / "a").sysctl("vm.swappiness", 10)
    tree_b = FakeHost(tmp_path / "b").sysctl("vm.swappiness", 10)
    journal = _old_journal(tree_a.root / JOURNAL_DIR / "20260101T000000Z-s-1.jsonl")
    b_before = snapshot(tree_b.root)
    refused = rollback_run(pytester, tree_b.root, journal)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"ERROR: {journal}: a journal without the identity of the "
                                  "host it changed (written before pytest-gpuhost recorded it)*"
                                  f"it lies under the root {os.path.realpath(tree_a.root)}: pass "
                                  f"--gpuhost-root={os.path.realpath(tree_a.root)}"])
    assert unchanged(tree_b.root, b_before, canary)
    elsewhere = _old_journal(tmp_path / "mine.jsonl")
    lost = rollback_run(pytester, tree_a.root, elsewhere)
    assert lost.ret == pytest.ExitCode.USAGE_ERROR
    lost.stderr.fnmatch_lines(["*so the host it changed cannot be told*"])
    done = rollback_run(pytester, tree_a.root, None)  # the default finds it under A
    assert done.ret == pytest.ExitCode.OK
    assert (tree_a.root / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert read_journal(journal).rolled_back


# --- 6. only a last line without its newline is a crash; other damage refuses the journal -----


def _two_change_journal(pytester: pytest.Pytester, fake: FakeHost) -> Path:
    fake.sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 20})
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10, "
                                              "vm.dirty_ratio: 5}\n")
    return journal


@pytest.mark.parametrize("damage", ["cut in the middle", "bad last line with its newline"])
def test_a_damaged_line_refuses_the_journal_and_writes_nothing(
        pytester: pytest.Pytester, fake: FakeHost, canary: Path, damage: str) -> None:
    journal = _two_change_journal(pytester, fake)
    records = journal.read_text().splitlines(keepends=True)
    if damage == "cut in the middle":
        number = 3  # the first change's outcome line, cut short
        records[number - 1] = records[number - 1][:20] + "\n"
    else:
        number = len(records) + 1
        records.append('{"event": "applied", "id": \n')
    journal.write_text("".join(records))
    before, journal_before = snapshot(fake.root), journal.read_bytes()
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}:{number}: a damaged journal line (*)*; only "
                                 "the last line can have been cut short by a crash: repair or "
                                 "remove this line by hand (nothing was rolled back)"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert journal.read_bytes() == journal_before
    assert unchanged(fake.root, before, canary)


def test_a_damaged_older_journal_stops_the_default_rollback_naming_it(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    journal = _two_change_journal(pytester, fake)
    journal.write_text(journal.read_text().replace('"event": "change"', '"event": "change"\x00'
                                                   , 1))
    result = rollback_run(pytester, fake.root, None)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}:2: a damaged journal line*"])


def test_a_last_line_cut_short_by_a_crash_is_still_a_crash(pytester: pytest.Pytester,
                                                           fake: FakeHost) -> None:
    journal = _two_change_journal(pytester, fake)
    with journal.open("a") as out:
        out.write('{"event": "applied", "id": "')  # no newline: the writer died mid-line
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["journal: 1 line(s) cut short by a crash were skipped"])
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"
    # the closing record is a line of its own: the journal reads as closed, not damaged
    lines = journal.read_text().splitlines()
    assert lines[-2] == '{"event": "applied", "id": "'
    assert json.loads(lines[-1])["event"] == "rolled_back"
    assert read_journal(journal).rolled_back
    again = rollback_run(pytester, fake.root, None)  # the default rollback reads it as closed
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    assert "every one there is rolled back already" in again.stderr.str()
    assert "damaged" not in again.stdout.str() + again.stderr.str()


# --- 7. the rollback guard compares as the matcher does, and knows the value read back ---------


def test_a_multi_value_sysctl_the_kernel_shows_with_tabs_is_rolled_back(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("net.ipv4.tcp_rmem", "4096\t131072\t6291456")
    _, journal = fix_run(pytester, fake.root,
                         'version: 1\nsysctl: {net.ipv4.tcp_rmem: "4096 87380 16777216"}\n')
    path = fake.root / "proc/sys/net/ipv4/tcp_rmem"
    assert path.read_text() == "4096 87380 16777216\n"
    path.write_text("4096\t87380\t16777216\n")  # as the kernel shows what was written
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert counts(result) == {"fixed": 1}
    assert path.read_text() == "4096\t131072\t6291456\n"


class Clamping(LocalHost):
    """A kernel that clamps: writing 500 to vm.dirty_ratio leaves 100."""

    def write_text(self, path: str, text: str) -> None:
        super().write_text(path, "100\n" if text == "500\n" else text)


def test_a_value_the_kernel_clamped_is_rolled_back_and_said_so(fake: FakeHost) -> None:
    fake.sysctl("vm.dirty_ratio", 20)
    journal_path = fake.root / JOURNAL_DIR / "j.jsonl"
    host = Clamping(fake.root)
    fixer = Fixer(host, Journal(journal_path, "spec", host.identity()), run_lock=None,
                  apply_lock=None, lock_timeout=1)
    check = Check("sysctl", "vm.dirty_ratio", Exact("500", Auto()),
                  EntryOptions(where="spec.yaml:2"), SysctlProbe("proc/sys/vm/dirty_ratio"))
    fixed = run_check(check, host, {}, RunOptions(fix=True), fixer)
    assert fixed.outcome is Outcome.FIX_FAILED
    assert fixed.message.endswith("(wrote '500', read back '100': the kernel or device clamped "
                                  "or rounded it)")
    contents = read_journal(journal_path)
    assert contents.entries[0].read_back == b"100\n"
    [undo] = rollback_checks(contents, "j.jsonl", NvmlSource(no_nvml))
    restored = run_check(undo, LocalHost(fake.root), {}, RunOptions(fix=True))
    assert restored.outcome is Outcome.FIXED, restored.message
    assert (fake.root / "proc/sys/vm/dirty_ratio").read_text() == "20\n"


# --- 8. an original that is not UTF-8 comes back byte for byte --------------------------------


def test_a_non_utf8_original_is_restored_as_its_bytes(pytester: pytest.Pytester,
                                                      fake: FakeHost) -> None:
    fake.file("proc/sys/kernel/hostname", b"gpu-n\xf6de\n")
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {kernel.hostname: gpu-07}\n")
    [change] = [line for line in lines(journal) if line["event"] == "change"]
    recorded = change["change"]
    assert isinstance(recorded, dict) and recorded["old"] == "gpu-n\ufffdde\n"  # old readers
    assert base64.b64decode(str(recorded["old_base64"])) == b"gpu-n\xf6de\n"
    result = rollback_run(pytester, fake.root, journal, "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK
    assert (fake.root / "proc/sys/kernel/hostname").read_bytes() == b"gpu-n\xf6de\n"
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert (record["outcome"], record["before"], record["after"]) == ("fixed", "gpu-07",
                                                                      "gpu-n\\xf6de")


class Lossy(LocalHost):
    """A writer that loses bytes as the old rollback did (U+FFFD in place of 0xf6)."""

    def write_text(self, path: str, text: str) -> None:
        super().write_text(path, text.encode("utf-8", "surrogateescape")
                           .decode("utf-8", "replace"))


def test_a_restore_that_lost_bytes_is_never_reported_restored(fake: FakeHost,
                                                              tmp_path: Path) -> None:
    fake.file("proc/sys/kernel/hostname", b"gpu-07\n")
    journal = Journal(tmp_path / "j.jsonl", "spec")
    journal.record("sysctl[kernel.hostname]", "sysctl", "kernel.hostname", WriteText.of_bytes(
        "proc/sys/kernel/hostname", b"gpu-n\xf6de\n", b"gpu-07\n"))
    [undo] = rollback_checks(read_journal(tmp_path / "j.jsonl"), "j.jsonl", NvmlSource(no_nvml))
    result = run_check(undo, Lossy(fake.root), {}, RunOptions(fix=True))
    assert result.outcome is Outcome.FIX_FAILED
    assert (result.expected, result.after) == ("gpu-n\\xf6de", "gpu-n\ufffdde")


def test_a_replaced_persistence_file_keeps_its_mode_and_rollback_restores_it(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """A persistence file that was there before the fix (an earlier --fix-persist, made
    private since by its administrator) is replaced with the mode it had, and a rollback
    puts back its content and its mode, not a world-readable copy."""
    fake.sysctl("vm.swappiness", 10)
    persisted = fake.file("etc/sysctl.d/90-gpuhost-spec.conf", "vm.swappiness = 20\n",
                          mode=0o600)
    result, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n",
                              "--fix-persist")
    assert "vm.swappiness = 10" in persisted.read_text(), result.stdout.str()
    assert persisted.stat().st_mode & 0o7777 == 0o600
    undone = rollback_run(pytester, fake.root, journal)
    assert undone.ret == pytest.ExitCode.OK, undone.stdout.str()
    assert persisted.read_text() == "vm.swappiness = 20\n"
    assert persisted.stat().st_mode & 0o7777 == 0o600


def test_a_replaced_persistence_file_that_is_not_utf8_is_restored_byte_for_byte(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """An original persistence file with bytes that are not UTF-8 (a comment an editor saved
    in Latin-1) is journaled as its bytes, and a rollback restores exactly those, not U+FFFD in
    their place; while the file holds what the fix wrote, it is restored."""
    fake.sysctl("vm.swappiness", 10)
    original = b"# r\xe9glage du noyau\nvm.swappiness = 20\n"
    persisted = fake.root / "etc/sysctl.d/90-gpuhost-spec.conf"
    persisted.parent.mkdir(parents=True, exist_ok=True)
    persisted.write_bytes(original)
    result, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n",
                              "--fix-persist")
    assert "vm.swappiness = 10" in persisted.read_text(), result.stdout.str()
    undone = rollback_run(pytester, fake.root, journal)
    assert undone.ret == pytest.ExitCode.OK, undone.stdout.str()
    assert persisted.read_bytes() == original


# --- 9. a command that times out leaves its change unknown, offered by rollback ----------------

HANGING_MODPROBE = """#!/bin/sh
# Loads the module, leaves a child behind, then hangs past the fixer's timeout (for good: the
# timeout is what ends it, however slow the machine; loading takes far less than the timeout).
for name; do :; done
case " $* " in
  *" -r "*) grep -v "^$name " "$GPUHOST_ROOT/proc/modules" > "$GPUHOST_ROOT/m.tmp"
            cat "$GPUHOST_ROOT/m.tmp" > "$GPUHOST_ROOT/proc/modules"; exit 0;;
esac
echo "$name 16384 0 - Live 0x0000000000000000" >> "$GPUHOST_ROOT/proc/modules"
sleep 600 &
echo $! > "$GPUHOST_ROOT/child.pid"
exec sleep 600
"""


def _gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for a reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_modprobe_that_times_out_is_unknown_and_its_child_is_killed(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.file("usr/sbin/modprobe", HANGING_MODPROBE, mode=0o755)
    journal_path = fake.root / JOURNAL_DIR / "20261202T000000Z-spec-1.jsonl"
    host = LocalHost(fake.root)
    fixer = Fixer(host, Journal(journal_path, "spec", host.identity()), run_lock=None,
                  apply_lock=None, lock_timeout=1, command_timeout=3)
    check = Check("module", "nvidia", Exact("loaded", ModuleState()),
                  EntryOptions(where="spec.yaml:3"), ModuleProbe("nvidia"))
    result = run_check(check, host, {}, RunOptions(fix=True), fixer)
    assert result.outcome is Outcome.FIX_FAILED
    assert result.message.startswith("apply failed: the state is unknown: modprobe -- nvidia did "
                                     "not finish in 3 s; its process group was killed")
    assert result.after == "loaded"  # it did load the module before it hung
    child = int((fake.root / "child.pid").read_text())
    assert _gone(child)
    [entry] = read_journal(journal_path).entries
    assert entry.state == "unknown"
    found = latest_journal(fake.root)  # something to undo
    assert found is not None and found.host.local_path(found.path) == journal_path
    rollback = rollback_run(pytester, fake.root, None)
    assert rollback.ret == pytest.ExitCode.OK
    assert counts(rollback) == {"fixed": 1}
    assert "nvidia " not in (fake.root / "proc/modules").read_text()


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """RLIMIT_FSIZE at ``limit`` bytes: a write(2) that crosses it is cut short there, and one
    past it fails with EFBIG (SIGXFSZ is ignored: Python ignores it), as a full disk cuts one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_journal_write_cut_short_makes_no_change_and_leaves_a_readable_journal(
        fake: FakeHost) -> None:
    """The change lines of a fix must be in the journal before any change is made: a write
    that the file system cut short (a full /var) is a journal error, the changes are not made,
    and the journal keeps no piece of a line that a later line would be glued onto."""
    for cpu in range(8):
        fake.file(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state2/disable", "0\n")
    fake.sysctl("vm.swappiness", 60)
    journal_path = fake.root / JOURNAL_DIR / "j.jsonl"
    host = LocalHost(fake.root)
    fixer = Fixer(host, Journal(journal_path, "spec", host.identity()), run_lock=None,
                  apply_lock=None, lock_timeout=1)
    fixer.apply("sysctl[vm.swappiness]", "sysctl", "vm.swappiness", Plan("write", (
        WriteText("proc/sys/vm/swappiness", "60\n", "10\n"),)))
    disables = tuple(WriteText(f"sys/devices/system/cpu/cpu{cpu}/cpuidle/state2/disable",
                               "0\n", "1\n") for cpu in range(8))
    with file_size_limit(journal_path.stat().st_size + 600), \
            pytest.raises(FixError, match="cannot write the journal"):
        fixer.apply("cpuidle[C2]", "cpuidle", "C2", Plan("write 1", disables))
    assert {(fake.root / c.path).read_text() for c in disables} == {"0\n"}  # none made
    assert journal_path.read_bytes().endswith(b"\n")
    fixer.apply("sysctl[vm.dirty_ratio]", "sysctl", "vm.dirty_ratio", Plan("write", (
        WriteText("proc/sys/vm/swappiness", "10\n", "5\n"),)))  # the next fix journals on
    contents = read_journal(journal_path)
    assert contents.damaged_lines == 0
    assert [e.check for e in contents.entries] == ["sysctl[vm.swappiness]",
                                                   "sysctl[vm.dirty_ratio]"]


# --- 16. a journal field of the wrong type, or a closing line that cannot be written -----------


@pytest.mark.parametrize(("edit", "words"), [
    (lambda c: c["change"].update(offset="x", type="write_bytes", old="00", new="01"),
     "'offset' must be a non-negative integer, got str 'x'"),
    (lambda c: c["change"].update(type="command", argv=5, undo_argv=["modprobe"], old="a",
                                  new="b", path=None) or c["change"].pop("path"),
     "'argv' must be a non-empty list of strings, got int 5"),
    (lambda c: c.update(change=[]), "the change must be a mapping, got list []"),
    (lambda c: c["change"].update(path="../../etc/passwd"), "would leave the host root"),
    (lambda c: c.update(check=7), "a change record without a usable 'check': expected a "
                                  "string, got int 7"),
])
def test_a_journal_field_of_the_wrong_type_is_a_usage_error(
        pytester: pytest.Pytester, fake: FakeHost, canary: Path,
        edit: Callable[[dict[str, Any]], object], words: str) -> None:
    fake.sysctl("vm.swappiness", 60)
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    records = lines(journal)
    number = next(n for n, r in enumerate(records, 1) if r["event"] == "change")
    edit(records[number - 1])
    journal.write_text("".join(json.dumps(r) + "\n" for r in records))
    before = snapshot(fake.root)
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}:{number}: *"])
    assert words in result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert unchanged(fake.root, before, canary)


def test_a_rollback_whose_journal_directory_is_gone_says_so_and_exits_1(
        pytester: pytest.Pytester, fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    fake.sysctl("vm.swappiness", 60)
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    real_close = Journal.close_rollback

    def directory_gone(self: Journal, restored: int, failed: int) -> None:
        local = self.location.host.local_path(self.location.path)
        assert local is not None
        shutil.rmtree(local.parent)  # removed while the rollback ran
        real_close(self, restored, failed)

    monkeypatch.setattr(Journal, "close_rollback", directory_gone)
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"rollback: the changes are restored, but cannot mark {journal} "
                                 "rolled back: No such file or directory: a later default "
                                 "rollback will offer this journal again*"])
    assert "Traceback" not in result.stdout.str()
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"  # restored
    assert not journal.parent.exists()  # and no journal made up in its place


def test_a_read_only_journal_is_reported_and_the_changes_stay_restored(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    _, journal = fix_run(pytester, fake.root, "version: 1\nsysctl: {vm.swappiness: 10}\n")
    if os.geteuid() == 0:
        if subprocess.run(["chattr", "+i", str(journal)], capture_output=True).returncode:
            pytest.skip("chattr +i is not available here: root ignores a read-only mode")
    else:
        journal.chmod(0o444)
    try:
        before = journal.read_bytes()
        result = rollback_run(pytester, fake.root, journal)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(journal)], check=True)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"rollback: the changes are restored, but cannot mark {journal} "
                                 "rolled back: * not permitted*", ])
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert journal.read_bytes() == before


# --- 18. module names that modprobe would read as options -------------------------------------


@pytest.mark.parametrize("name", ["--remove-holders", "-a"])
def test_a_module_name_that_starts_with_a_dash_is_refused(pytester: pytest.Pytester,
                                                          fake: FakeHost, name: str) -> None:
    (pytester.path / "spec.yaml").write_text(f"version: 1\nmodules:\n  {name!r}: loaded\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: bad gpuhost spec: spec.yaml:3: module name {name!r} "
                                 "is not allowed: a module name cannot start with '-' (modprobe "
                                 "would read it as an option)"])


RECORDING_MODPROBE = """#!/bin/sh
echo "$*" >> "$GPUHOST_ROOT/argv.log"
case " $* " in
  *" -r "*) : > "$GPUHOST_ROOT/proc/modules";;
  *) echo "nvidia 16384 0 - Live 0x0000000000000000" > "$GPUHOST_ROOT/proc/modules";;
esac
"""


def test_every_modprobe_argv_ends_its_options_before_the_name(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.file("usr/sbin/modprobe", RECORDING_MODPROBE, mode=0o755)
    _, journal = fix_run(pytester, fake.root, "version: 1\nmodules: {nvidia: loaded}\n")
    assert rollback_run(pytester, fake.root, journal).ret == pytest.ExitCode.OK
    assert (fake.root / "argv.log").read_text() == "-- nvidia\n-r -- nvidia\n"


def test_a_journal_whose_modprobe_names_an_option_is_refused(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.file("usr/sbin/modprobe", RECORDING_MODPROBE, mode=0o755)
    _, journal = fix_run(pytester, fake.root, "version: 1\nmodules: {nvidia: loaded}\n")
    journal.write_text(journal.read_text().replace('"nvidia"', '"--remove-holders"'))
    result = rollback_run(pytester, fake.root, journal)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {journal}:2: module '--remove-holders' in modprobe "
                                 "-- --remove-holders: a module name cannot start with '-'*"])
    assert (fake.root / "argv.log").read_text() == "-- nvidia\n"  # the fix's own, no more


# --- 19. messages that say what was seen ----------------------------------------------------------


class Refusing(LocalHost):
    """Writes fail with one errno, as the kernel gives it."""

    def __init__(self, root: Path, code: int, *, privileged: bool = True) -> None:
        super().__init__(root)
        self.code, self._privileged = code, privileged

    def privileged(self) -> bool:
        return self._privileged

    def _write(self, path: str, data: bytes, offset: int, *, truncate: bool) -> None:
        raise HostError(f"cannot write {self.path(path)}: {os.strerror(self.code)}", self.code)


def swappiness_check() -> Check:
    return Check("sysctl", "vm.swappiness", Exact("10", Auto()),
                 EntryOptions(where="spec.yaml:2"), SysctlProbe("proc/sys/vm/swappiness"))


@pytest.mark.parametrize(("code", "privileged", "words"), [
    (errno.EPERM, True, "refused with EPERM (Operation not permitted) even as root"),
    (errno.EACCES, True, "refused with EACCES (Permission denied) even as root"),
    (errno.EPERM, False, "permission denied: --fix needs root; run it with sudo"),
])
def test_a_refused_write_names_its_errno(fake: FakeHost, code: int, privileged: bool,
                                         words: str) -> None:
    fake.sysctl("vm.swappiness", 60)
    result = run_check(swappiness_check(), Refusing(fake.root, code, privileged=privileged),
                       {}, RunOptions(fix=True))
    assert result.outcome is Outcome.FIX_FAILED
    assert words in result.message
    assert errno.errorcode[code] in result.message  # EPERM and EACCES told apart


def test_an_immutable_file_is_explained_as_one(fake: FakeHost) -> None:
    path = fake.sysctl("vm.swappiness", 60).root / "proc/sys/vm/swappiness"
    if os.geteuid() != 0 or subprocess.run(["chattr", "+i", str(path)],
                                           capture_output=True).returncode:
        pytest.skip("needs root and a file system with chattr +i")
    try:
        result = run_check(swappiness_check(), LocalHost(fake.root), {}, RunOptions(fix=True))
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert result.outcome is Outcome.FIX_FAILED
    assert "refused with EPERM (Operation not permitted) even as root" in result.message
    assert "chattr +i" in result.message and "container" in result.message  # causes, in order
    assert result.message.index("chattr") < result.message.index("container")


class Ignoring(LocalHost):
    def write_text(self, path: str, text: str) -> None:
        return None


def test_an_ignored_write_is_told_apart_from_a_clamped_one(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    result = run_check(swappiness_check(), Ignoring(fake.root), {}, RunOptions(fix=True))
    assert result.message.endswith("(unchanged from '60': the device or kernel ignored the "
                                   "write)")


# --- 10. dmesg: linear filtering, decoded escapes, and a message that names the records --------


def test_dmesg_filters_a_large_log_in_one_pass(fake: FakeHost) -> None:
    """200,000 allowed records: the old membership test made this ~2 * 10^10 comparisons."""
    noise = [(4, f"vxlan: non-ECT from 10.233.{n // 250}.{n % 250} with TOS=0x2")
             for n in range(200_000)]
    fake.kmsg([*noise[:100_000], (3, "NVRM: Xid 79, GPU has fallen off the bus"),
               *noise[100_000:], (6, "an info line"), (2, "AER: Uncorrected (Fatal) error")])
    spec = "version: 1\ndmesg: {allow: ['vxlan: non-ECT from .* with TOS=0x2']}\n"
    result = run_spec(spec, fake.root)["dmesg"]
    assert result.observed == "2"
    assert result.evidence[0]["raw"] == ("200003 records since boot, 200002 at the levels, "
                                         "200000 allowed as noise, 2 offending; GPU events: "
                                         "1 failing, 0 warning(s), 0 set aside")


def test_kmsg_escapes_are_decoded_before_matching_and_shown_decoded(fake: FakeHost) -> None:
    fake.kmsg([(4, r"Unknown kernel command line parameters \x22initrd=\x5cucode.img\x22"),
               (4, r"gpu caf\xc3\xa9: \x1b[31mred\x1b[0m")])
    spec = ("version: 1\ndmesg: {allow: ['Unknown kernel command line parameters "
            "\"initrd=\\\\ucode.img\"']}\n")
    result = run_spec(spec, fake.root)["dmesg"]
    assert result.observed == "1"  # the allow pattern, copied from dmesg(1), matched
    shown = result.evidence[1]["raw"]
    assert shown.endswith("gpu café: \\x1b[31mred\\x1b[0m")  # decoded; ESC escaped again


def test_a_dmesg_failure_names_its_first_offending_records(pytester: pytest.Pytester,
                                                           fake: FakeHost) -> None:
    fake.kmsg([(3, f"error number {n} " + "x" * 200) for n in range(5)])
    (pytester.path / "spec.yaml").write_text("version: 1\ndmesg: {}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-rf",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    message = record["message"]
    assert message.startswith("5 kernel log record(s) at emerg, alert, crit, err, warn since "
                              "boot: first [")
    assert [f"error number {n} " in message for n in range(5)] == [True] * 3 + [False] * 2
    assert message.endswith("... (and 2 more)")
    assert len(message) < 400  # shortened: pytest's short summary shows it
    result.stdout.fnmatch_lines(["FAILED spec.yaml::dmesg - 5 kernel log record(s) *"])


# --- 12. a cpulist is bounded before a range of it is walked -----------------------------------


@pytest.mark.parametrize(("text", "words"), [
    ("0-50000000", "names a CPU number of 65536 or more"),
    ("0-99999999999999999999999", "names a CPU number of 65536 or more"),
    (",".join(["0-65535"] * 3), "the list names more than 65536 CPUs"),
    ("7-3", "is a range that runs backwards"),
    ("0-", "is not a CPU number or a range N-M"),
    ("²", "is not a CPU number or a range N-M"),
])
def test_a_cpu_list_out_of_bounds_is_refused(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_cpu_list(text)


def test_the_largest_cpu_list_is_still_read() -> None:
    assert len(parse_cpu_list("0-65535")) == 65536


def test_a_huge_online_cpu_range_is_an_error_naming_the_file(pytester: pytest.Pytester,
                                                             fake: FakeHost) -> None:
    fake.cpus(2)
    fake.file("sys/devices/system/cpu/online", "0-50000000\n")
    (pytester.path / "spec.yaml").write_text("version: 1\ncpuidle: {disabled: [C2]}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"errors": 1}
    result.stdout.fnmatch_lines(["*sys/devices/system/cpu/online: '0-50000000' is not a CPU list:"
                                 " '0-50000000' names a CPU number of 65536 or more*"])


# --- 13. a lock timeout that is not a finite number of seconds ---------------------------------


@pytest.mark.parametrize(("value", "shown"), [("nan", "nan"), ("-5", "-5"), ("inf", "inf"),
                                              ("-inf", "-inf")])
def test_a_lock_timeout_that_is_not_finite_or_is_negative_is_refused(
        pytester: pytest.Pytester, fake: FakeHost, value: str, shown: str) -> None:
    (pytester.path / "spec.yaml").write_text("version: 1\nsysctl: {vm.swappiness: 10}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                                f"--gpuhost-lock-timeout={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --gpuhost-lock-timeout={shown}: expected a finite "
                                 "number of seconds, 0 or more"])


# --- 14. every spec problem is exit 4 with file:line, never an INTERNALERROR --------------------


def _spec_error(pytester: pytest.Pytester, root: Path, spec: str) -> str:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}")
    output = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, output
    assert "Traceback" not in output and "INTERNALERROR" not in output
    [line] = [line for line in result.stderr.lines if line.startswith("ERROR: ")]
    return line


@pytest.mark.parametrize(("yaml_text", "words"), [
    ('sysctl:\n  vm.swappiness: !!int "abc"\n',
     "spec.yaml:3: cannot read the value 'abc' as !!int"),
    ("sysctl:\n  vm.swappiness: !!bool maybe\n",
     "spec.yaml:3: cannot read the value 'maybe' as !!bool"),
    ("sysctl:\n  vm.swappiness: !!binary aGVsbG8=\n",
     "spec.yaml:3: a !!binary value is not supported in a spec"),
    ("sysctl:\n  vm.swappiness: !!timestamp 2001-12-14\n",
     "spec.yaml:3: a !!timestamp value is not supported in a spec"),
    ("sysctl:\n  vm.swappiness: !!python/object:os.system x\n",
     "spec.yaml:3: a !!python/object:os.system value is not supported in a spec"),
    ("sysctl:\n  vm.swappiness: !foo 10\n", "spec.yaml:3: a !foo value is not supported"),
    ("sysctl: !!set {vm.swappiness: 10}\n", "spec.yaml:2: a !!set value is not supported"),
    ("base: &b {vm.swappiness: 10}\nsysctl:\n  <<: *b\n",
     "spec.yaml:4: merge keys ('<<') are not supported in a spec: write the keys out"),
    ("sysctl:\n  vm.swappiness: " + "9" * 5000 + "\n",
     "spec.yaml:3: cannot read the value '9999999999"),
    ("sysctl:\n  vm.swappiness: \"\\ud800\"\n", "spec.yaml:3: the value '\\ud800' holds a lone "
                                                "surrogate"),
    ("sysctl: " + "[" * 5000 + "]" * 5000 + "\n",
     "the YAML is nested deeper than 64 levels"),
    ("sysctl:\n" + "".join("  " * (n + 1) + "a:\n" for n in range(300)) + "  " * 301 + "b: 1\n",
     "the YAML is nested deeper than 64 levels"),
])
def test_a_spec_problem_is_exit_4_with_file_and_line(pytester: pytest.Pytester, fake: FakeHost,
                                                     yaml_text: str, words: str) -> None:
    (pytester.path / "spec.yaml").write_text("version: 1\n" + yaml_text)
    line = _spec_error(pytester, fake.root, "spec.yaml")
    assert line.startswith("ERROR: bad gpuhost spec: spec.yaml")
    assert words in line


def test_a_fifo_dev_zero_a_directory_and_a_huge_file_are_refused_without_blocking(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fifo = pytester.path / "fifo.yaml"
    os.mkfifo(fifo)  # no writer: a blocking open or read would hang the run
    assert "spec is a FIFO, not a regular file" in _spec_error(pytester, fake.root, str(fifo))
    assert "spec is a character device, not a regular file" in _spec_error(
        pytester, fake.root, "/dev/zero")
    (pytester.path / "dir.yaml").mkdir()
    assert "spec is a directory" in _spec_error(pytester, fake.root, "dir.yaml")
    huge = pytester.path / "huge.yaml"
    huge.write_text("version: 1\n" + "# padding\n" * 500_000)
    assert "the spec is over 4 MiB" in _spec_error(pytester, fake.root, str(huge))


def test_a_spec_file_name_with_a_newline_needs_a_name(pytester: pytest.Pytester,
                                                      fake: FakeHost) -> None:
    odd = pytester.path / "a\nkernel.core_pattern = |sh.yaml"
    odd.write_text("version: 1\nsysctl: {vm.swappiness: 10}\n")
    line = _spec_error(pytester, fake.root, str(odd))
    assert line.endswith("a\\nkernel.core_pattern = |sh.yaml:1: the spec's file name "
                         "'a\\nkernel.core_pattern = |sh.yaml' holds a control character, and "
                         "the name of a spec goes into the journal's and --fix-persist's file "
                         "names and headers: rename the file, or give the spec a 'name:'")


# --- 17. nothing written into a persistence file can become a setting or a rule of its own -----


def test_a_spec_path_with_a_newline_stays_in_the_header_comment(pytester: pytest.Pytester,
                                                                fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    odd = pytester.path / "a\nkernel.core_pattern = |sh.yaml"
    odd.write_text("version: 1\nname: lab\nsysctl: {vm.swappiness: 10}\n")
    result = pytester.runpytest(f"--gpuhost-spec={odd}", f"--gpuhost-root={fake.root}",
                                "--fix", "--fix-persist")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    written = (fake.root / "etc/sysctl.d/90-gpuhost-lab.conf").read_text()
    settings = [line for line in written.splitlines() if not line.startswith("#")]
    assert settings == ["vm.swappiness = 10"]
    assert "from spec lab (a\\nkernel.core_pattern = |sh.yaml)" in written


@pytest.mark.parametrize(("spec", "setup", "refused", "words"), [
    ('sysctl: {kernel.core_pattern: "|/bin/true\\nkernel.modprobe = /tmp/x"}',
     lambda fake: fake.sysctl("kernel.core_pattern", "core"), "etc/sysctl.d/90-gpuhost-spec.conf",
     "the value of kernel.core_pattern holds a line break or another control character"),
])
def test_a_hostile_value_is_refused_not_persisted(
        pytester: pytest.Pytester, fake: FakeHost, canary: Path, spec: str,
        setup: Callable[[FakeHost], object], refused: str, words: str) -> None:
    setup(fake)
    (pytester.path / "spec.yaml").write_text(f"version: 1\n{spec}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                                "--fix-persist", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    records = {r["id"]: r for r in json.loads((pytester.path / "r.json").read_text())["checks"]}
    persisted = records[f"persist[{refused}]"]
    assert persisted["outcome"] == "failed"
    assert persisted["message"].startswith(f"{refused} is not written: {words}")
    assert not (fake.root / refused).exists()
    assert canary.read_text() == "untouched\n"


def test_a_hostile_c_state_name_is_refused_by_the_spec_and_by_persistence(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The spec refuses it; a record that carries it anyway (a third-party kind) is refused
    again before it reaches a root udev rule, where it would be shell code."""
    from pytest_gpuhost.checks.cpuidle import CpuidleKind
    from pytest_gpuhost.fix.persist import Unsafe, persistence_files
    from pytest_gpuhost.result import CheckResult, Outcome

    fake.cpus(2, states=("POLL", "C1';reboot;'"))
    (pytester.path / "spec.yaml").write_text(
        "version: 1\ncpuidle: {disabled: [\"C1';reboot;'\"]}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                                "--fix-persist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    record = CheckResult("cpuidle[x]", "cpuidle", "C1';reboot;'", "disabled", "disabled",
                         Outcome.FIXED, "")
    supplies = [CpuidleKind().persistence]
    [refused] = persistence_files("spec", "spec.yaml", [record], supplies=supplies).values()
    assert isinstance(refused, Unsafe)
    assert "the C-state name \"C1';reboot;'\" is not plain words" in str(refused)


def test_a_recorded_config_write_into_the_header_is_refused() -> None:
    from pytest_gpuhost.checks.changes import ChangeError, from_dict

    with pytest.raises(ChangeError, match="at 0x10, inside the 64-byte header"):
        from_dict({"type": "write_bytes", "path": "sys/bus/pci/devices/0000:01:00.0/config",
                   "offset": 0x10, "old": "0000", "new": "ffff"})


def test_restoring_extended_config_space_from_256_bytes_says_what_256_means(
        fake: FakeHost, tmp_path: Path) -> None:
    fake.pci_device("0000:01:00.0", vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                    config=config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                                        size=256))
    journal = Journal(tmp_path / "j.jsonl", "spec")
    journal.record("x", "pcie.acs", "0000:01:00.0", WriteBytes(
        "sys/bus/pci/devices/0000:01:00.0/config", 0x146, "1d00", "0100"))
    [undo] = rollback_checks(read_journal(tmp_path / "j.jsonl"), "j.jsonl", NvmlSource(no_nvml))
    result = run_check(undo, LocalHost(fake.root), {}, RunOptions(fix=True))
    assert result.outcome is Outcome.ERROR
    assert "config space is 256 bytes but 0x147 is needed: 256 bytes means no extended config " \
           "space (conventional PCI, or a VM that does not expose it)" in result.message
    assert "need root" not in result.message


class HalfIgnoring(LocalHost):
    """cpu1's C2 ``disable`` file keeps its value (firmware that owns the state)."""

    def write_text(self, path: str, text: str) -> None:
        if "/cpu1/" not in path:
            super().write_text(path, text)


def test_several_writes_of_which_some_did_not_hold_are_not_called_clamped(
        fake: FakeHost) -> None:
    fake.cpus(2)
    result = run_spec("version: 1\ncpuidle: {disabled: [C2]}\n", fake.root, fix=True)
    assert result["cpuidle[C2]"].outcome is Outcome.FIXED  # the plain tree takes both writes
    fake.file("sys/devices/system/cpu/cpu0/cpuidle/state2/disable", "0\n")
    fake.file("sys/devices/system/cpu/cpu1/cpuidle/state2/disable", "0\n")
    partial = run_spec("version: 1\ncpuidle: {disabled: [C2]}\n", fake.root, fix=True,
                       host=HalfIgnoring)["cpuidle[C2]"]
    assert partial.outcome is Outcome.FIX_FAILED
    assert partial.message.endswith("(some of the 2 writes did not hold)")
