"""Issue 9 ("Safety first"): each case that once wrote the wrong place, lost an undo, hung or
gave a traceback, on fake trees, with canaries outside the tree where anything is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_gpuhost.fix.changes import ReplaceFile, WriteText
from pytest_gpuhost.fix.journal import (
    JOURNAL_DIR,
    JournalContents,
    JournalEntry,
    JournalError,
    read_journal,
)
from pytest_gpuhost.fix.rollback import AFTER_REBOOT, refuse_foreign
from pytest_gpuhost.host import HostError, HostIdentity, LocalHost
from pytest_gpuhost.testing.fakehost import FakeHost, config_space

from .conftest import counts, snapshot

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


def _identity(root: str = "/", machine: str | None = "m1", boot: str | None = "b1",
              hostname: str | None = "gpu-07") -> HostIdentity:
    return HostIdentity(root, hostname, machine, boot)


def _contents(identity: HostIdentity | None, *changes: object,
              path: Path = Path("/var/lib/pytest-gpuhost/journal/x.jsonl")) -> JournalContents:
    entries = tuple(JournalEntry(f"1-{n}", "t", "s", "c", "sysctl", None, change, "applied", n)
                    for n, change in enumerate(changes, 1))  # type: ignore[arg-type]
    return JournalContents(path, entries, False, 0, identity)


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
