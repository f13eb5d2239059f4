"""--gpuhost-rollback: restore the originals a journal recorded, newest first, each read back.

Each journaled change becomes a ``rollback`` check whose expected value is the original: it
passes when the host already holds it (the change never happened, or was undone), and its fix
writes the original back. A change whose outcome line is missing (the run crashed) or whose
command timed out (``unknown``) is restored the same way: restoring an original is safe whether
or not the change was made, once nothing can still be making it: the rollback holds the target's
run and apply locks before it reads or judges anything (``fix.run.rollback_fixer``), and a
command a run started holds them until it has ended, even after its run was killed.

A journal is rolled back only on the host it changed (``refuse_foreign``): the same root (its
real path) and, on the real root ``/``, the same machine (machine-id; the hostname where there
is none). After a reboot (another boot id) a journal with runtime changes (sysctls, config space,
modules, NVML) is refused unless ``--gpuhost-rollback-after-reboot`` is given: the reboot reset
those values, and whatever holds them now was set at boot, perhaps by another tool or by our own
persistence files, so "restoring" the originals could detune a host that is right. Files that
--fix-persist wrote survive a reboot, so a journal of files alone rolls back after one. A journal
older than the identity header is rolled back only on the root whose journal directory holds it.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import msgspec

from ..checks import CannotFix, Check, Evidence, Observation, Probe
from ..checks.changes import (
    Change,
    Command,
    NvmlSetting,
    Plan,
    ReplaceFile,
    WriteBytes,
    WriteText,
    lossless_text,
)
from ..checks.modules import ModuleProbe, ModuleState, module_name_problem
from ..checks.nvml import PERSISTENCE, EccProbe, PersistenceModeProbe, PowerLimitProbe, Watts
from ..gpu.nvml import NvmlSource
from ..host import Host, HostError, HostIdentity
from ..linux.pciconfig import short_config
from ..linux.sysfs import bracketed
from ..specmodel import EntryOptions
from ..specmodel.matchers import Auto, Choice, Domain, Exact, Expectation
from .journal import FAILED, JOURNAL_DIR, JournalContents, JournalEntry, JournalError
from .persist import FileContentProbe, expected_state

AFTER_REBOOT = "--gpuhost-rollback-after-reboot"


def _who(identity: HostIdentity) -> str:
    parts = [f"root {identity.root}"]
    parts += [f"{label} {value}" for label, value in (
        ("hostname", identity.hostname), ("machine-id", identity.machine_id),
        ("boot id", identity.boot_id)) if value]
    return ", ".join(parts)


def journal_home(path: Path) -> Path | None:
    """The root whose journal directory holds ``path`` (ROOT for
    ROOT/var/lib/pytest-gpuhost/journal/NAME), or None when it lies elsewhere."""
    parent = Path(os.path.realpath(path)).parent
    tail = PurePosixPath(JOURNAL_DIR).parts
    if parent.parts[-len(tail):] != tail:
        return None
    return Path(*parent.parts[:-len(tail)])


def refuse_foreign(journal: JournalContents, here: HostIdentity, *,
                   after_reboot: bool = False) -> None:
    """Raise JournalError unless ``journal`` was written for this host (see the module's
    docstring); the message says whose journal it is, what this host is, and what to pass."""
    made, path = journal.identity, journal.shown
    if made is None:
        _refuse_unidentified(journal, here)
        return
    mine = f"{path}: the journal of {_who(made)}; this host is {_who(here)}"
    if made.root != here.root:
        raise JournalError(f"{mine}: it is rolled back only there: pass --gpuhost-root="
                           f"{made.root}")
    if made.machine_id or here.machine_id:
        if made.machine_id != here.machine_id:
            raise JournalError(f"{mine}: another machine (a copied disk image or a shared "
                               "directory); run the rollback on the machine that wrote it")
    elif made.hostname != here.hostname:
        raise JournalError(f"{mine}: another machine (no machine-id to compare, and the "
                           "hostnames differ); run the rollback on the machine that wrote it")
    if not after_reboot:
        _refuse_rebooted(journal, made, here, mine)


def _refuse_unidentified(journal: JournalContents, here: HostIdentity) -> None:
    """A journal older than the identity header: only on the root whose journal directory
    holds it."""
    local = journal.local
    home = journal_home(local) if local is not None else None
    if home is not None and os.path.realpath(home) == here.root:
        return
    where = (f"it lies under the root {home}: pass --gpuhost-root={home}" if home is not None
             else f"it does not lie in a ROOT/{JOURNAL_DIR} directory, so the host it "
                  f"changed cannot be told: move it into the journal directory of the root "
                  f"it changed and pass that --gpuhost-root")
    raise JournalError(f"{journal.shown}: a journal without the identity of the host it changed "
                       f"(written before pytest-gpuhost recorded it) is rolled back only on "
                       f"the root whose journal directory holds it; this host is "
                       f"{_who(here)}, and {where}")


def _refuse_rebooted(journal: JournalContents, made: HostIdentity, here: HostIdentity,
                     mine: str) -> None:
    """Runtime changes of a boot before this one: the reboot reset them."""
    runtime = [e for e in journal.entries if e.state != FAILED and not e.restored
               and not isinstance(e.change, ReplaceFile)]
    rebooted = made.boot_id and here.boot_id and made.boot_id != here.boot_id
    if rebooted and runtime:
        raise JournalError(
            f"{mine}: the host has rebooted since (boot id {made.boot_id} then, {here.boot_id} "
            f"now). The reboot reset its {len(runtime)} runtime change(s) (sysctls, config "
            "space, modules); what holds those values now was set at boot, and restoring the "
            f"originals could detune it. Check the host first; pass {AFTER_REBOOT} to restore "
            "them anyway (each is still restored only while the host holds what the fix left)")


class TextProbe(msgspec.Struct, frozen=True):
    """A text file as exact bytes, shown losslessly: an original that is not UTF-8 is
    restored byte for byte and read back as bytes (``lossless_text``)."""

    path: str
    original: bytes
    fixable = True

    def observe(self, host: Host) -> Observation:
        if not host.exists(self.path):
            return Observation(None, problem=f"{self.path} no longer exists")
        value = lossless_text(host.read_bytes(self.path)).rstrip("\n")
        return Observation(value, (Evidence(self.path, value),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if observed.value is None:
            raise CannotFix(f"{self.path} no longer exists; a rollback never creates it")
        change = WriteText.of_bytes(self.path, host.read_bytes(self.path), self.original)
        shown = lossless_text(self.original).rstrip("\n")
        return Plan(f"write {shown!r} back to {self.path}", (change,))


class ChoiceProbe(msgspec.Struct, frozen=True):
    """A sysfs choice file (transparent_hugepage/enabled reads ``always [madvise] never``) as
    its selected word: the kernel takes one word and refuses the list it shows (EINVAL), so
    the original is restored by writing its bracketed word (``_choice``)."""

    path: str
    choices: tuple[str, ...]
    fixable = True

    def observe(self, host: Host) -> Observation:
        if not host.exists(self.path):
            return Observation(None, problem=f"{self.path} no longer exists")
        raw = host.read_text(self.path).strip()
        selected = bracketed(raw, self.choices)
        return Observation(selected, (Evidence(self.path, raw),),
                           problem=None if selected else f"{self.path} selects nothing: {raw!r}")

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if observed.value is None:
            raise CannotFix(observed.problem or f"{self.path} selects nothing")
        change = WriteText.of_bytes(self.path, host.read_bytes(self.path),
                                    (value + "\n").encode())
        return Plan(f"write {value!r} back to {self.path}", (change,))


def _choice(change: WriteText) -> tuple[str, tuple[str, ...]] | None:
    """(the selected word, every word) of an original that reads as a sysfs choice file (plain
    words, exactly one of them bracketed) where the change wrote one of its words; else None."""
    old = lossless_text(change.old_bytes).split()
    words = tuple(word.removeprefix("[").removesuffix("]") for word in old)
    selected = [word for word in old if word.startswith("[") and word.endswith("]")]
    plain = (word.replace("_", "").replace("-", "").replace("+", "") for word in words)
    if len(selected) != 1 or not all(word.isalnum() for word in plain):
        return None
    if lossless_text(change.new_bytes).strip() not in words:
        return None
    return selected[0][1:-1], words


class Guarded(msgspec.Struct, frozen=True):
    """Undo a change only while the host still holds what the fix left: a value someone
    changed since is theirs, and is reported rather than overwritten. ``left`` is what the
    fix wrote and what it read back right after (a kernel may clamp or round it), compared
    as the entry's matcher compares (``domain``: integers as integers, text
    whitespace-normalized: the kernel shows tcp_rmem with tabs)."""

    inner: Probe
    left: tuple[str, ...]
    domain: Domain
    fixable = True

    def observe(self, host: Host) -> Observation:
        return self.inner.observe(host)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        current = observed.value or ""
        if not any(self.domain.equal(current, left) for left in self.left):
            shown = " or ".join(repr(left.strip()) for left in self.left)
            raise CannotFix(f"changed since the fix (now {current!r}, the fix left "
                            f"{shown}): left as it is")
        return self.inner.plan(host, value, observed)


class PendingEcc(msgspec.Struct, frozen=True):
    """The pending ECC mode (what an ECC fix set), restored through NVML."""

    inner: EccProbe
    fixable = True

    def observe(self, host: Host) -> Observation:
        seen = self.inner.observe(host)
        value = seen.next_boot.value if seen.next_boot else None
        return Observation(value, seen.evidence, seen.problem)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        change = NvmlSetting(self.inner.address, "ecc", observed.value or "", value)
        return Plan(f"NVML nvmlDeviceSetEccMode({self.inner.address}, {value})", (change,))


class BitsProbe(msgspec.Struct, frozen=True):
    """The bits a config-space write changed (``old`` XOR ``new``), read back and restored by a
    read-modify-write of those bits alone, never setting the bits the change says must not be
    (Device Control's function-level reset)."""

    path: str
    offset: int
    old: int
    new: int
    length: int
    read_back: int | None = None
    """The bits the fix read back right after its write, where the device kept others."""
    never_set: int = 0
    fixable = True

    @property
    def mask(self) -> int:
        return self.old ^ self.new

    def shown(self, value: int) -> str:
        return f"0x{value & self.mask:0{self.length * 2}x}"

    def _current(self, host: Host) -> int:
        config = host.read_bytes(self.path)
        data = config[self.offset:self.offset + self.length]
        if len(data) != self.length:
            needed = self.offset + self.length - 1
            raise HostError(f"{self.path}: {short_config(len(config), needed)}")
        return int.from_bytes(data, "little")

    def observe(self, host: Host) -> Observation:
        current = self._current(host)
        return Observation(self.shown(current), (Evidence(
            f"{self.path} @0x{self.offset:02x}",
            f"0x{current:0{self.length * 2}x}, bits 0x{self.mask:0{self.length * 2}x} hold "
            f"{self.shown(current)}"),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        current = self._current(host)
        left = {self.new & self.mask} | (
            {self.read_back & self.mask} if self.read_back is not None else set())
        if current & self.mask not in left:
            raise CannotFix(f"changed since the fix (bits {self.shown(current)}, the fix left "
                            f"{self.shown(self.new)}): left as it is")
        restored = (current & ~self.mask | self.old & self.mask) & ~self.never_set
        change = WriteBytes(self.path, self.offset, self._hex(current), self._hex(restored),
                            self.never_set)
        return Plan(f"write bits {self.shown(self.old)} back to {self.path} @0x{self.offset:02x}",
                    (change,))

    def _hex(self, value: int) -> str:
        return value.to_bytes(self.length, "little").hex()


def _target(change: Change) -> str:
    if isinstance(change, Command):
        return " ".join(change.argv)
    if isinstance(change, NvmlSetting):
        return f"nvml {change.setting} {change.address}"
    return change.path


def _left(entry: JournalEntry, written: bytes) -> tuple[str, ...]:
    """What the fix left: the value it wrote and, when it differs, the one it read back."""
    values = [lossless_text(written).rstrip("\n")]
    if entry.read_back is not None:
        values.append(lossless_text(entry.read_back).rstrip("\n"))
    return tuple(dict.fromkeys(values))


def _restore(entry: JournalEntry, nvml: NvmlSource) -> tuple[Expectation, Probe]:
    """What the original was, and a probe that can read and write it back."""
    change = entry.change
    if isinstance(change, NvmlSetting) and change.setting == "power_limit":
        return (Exact(change.old, Watts()),
                Guarded(PowerLimitProbe(nvml, change.address), (change.new,), Watts()))
    if isinstance(change, NvmlSetting) and change.setting == "ecc":
        return (Exact(change.old, Choice(PERSISTENCE)),
                Guarded(PendingEcc(EccProbe(nvml, change.address)), (change.new,),
                        Choice(PERSISTENCE)))
    if isinstance(change, NvmlSetting):
        domain = Choice(PERSISTENCE)
        return (Exact(change.old, domain),
                Guarded(PersistenceModeProbe(nvml, change.address), (change.new,), domain))
    choice = _choice(change) if isinstance(change, WriteText) else None
    if isinstance(change, WriteText) and choice is not None:
        selected, words = choice
        left = [lossless_text(change.new_bytes).strip()]
        if entry.read_back is not None:
            left.append(bracketed(lossless_text(entry.read_back), words) or "")
        return Exact(selected, Auto()), Guarded(ChoiceProbe(change.path, words),
                                                tuple(dict.fromkeys(w for w in left if w)),
                                                Auto())
    if isinstance(change, WriteText):
        original = lossless_text(change.old_bytes).rstrip("\n")
        return Exact(original, Auto()), Guarded(TextProbe(change.path, change.old_bytes),
                                               _left(entry, change.new_bytes), Auto())
    if isinstance(change, WriteBytes):
        old, new = (int.from_bytes(bytes.fromhex(v), "little") for v in (change.old, change.new))
        length = len(bytes.fromhex(change.old))
        read_back = (int.from_bytes(entry.read_back, "little")
                     if entry.read_back is not None and len(entry.read_back) == length else None)
        probe = BitsProbe(change.path, change.offset, old, new, length, read_back,
                          change.never_set)
        return Exact(probe.shown(old), Choice((probe.shown(old),))), probe
    if isinstance(change, ReplaceFile):
        return (expected_state(change.old),
                FileContentProbe(change.path, change.old, only_if=change.new,
                                 content_raw=change.old_raw))
    if change.argv[:1] == ("modprobe",):
        name = change.argv[-1]
        problem = module_name_problem(name)
        if problem is not None:
            raise JournalError(f"module {name!r} in {' '.join(change.argv)}: {problem}")
        state = ModuleState()
        return (Exact(change.old, state),
                Guarded(ModuleProbe(name), (change.new,), state))
    raise JournalError(f"no way to roll back {change.describe()}")


def rollback_key(number: int, entry: JournalEntry) -> str:
    """The key of the check that undoes the journal's ``number``th change (from 1): the
    entry's number keeps keys unique when one target was changed twice."""
    return f"{entry.check} {_target(entry.change)} #{number}"


def undo_id(number: int, entry: JournalEntry) -> str:
    """The id of that check, as its record carries it."""
    return f"rollback[{rollback_key(number, entry)}]"


def rollback_checks(journal: JournalContents, shown: str, nvml: NvmlSource) -> list[Check]:
    """A check per change, newest first, but for those an earlier rollback of the journal
    restored: never judged again (the host may rightly hold something else there now, such
    as what undoing an older change of the same file left)."""
    checks = []
    entries = list(journal.entries)
    for number, entry in reversed(list(enumerate(entries, 1))):
        if entry.restored:
            continue
        try:
            expect, probe = _restore(entry, nvml)
        except JournalError as exc:
            raise JournalError(f"{shown}:{entry.line}: {exc}") from None
        options = EntryOptions(where=f"{shown}:{entry.line}",
                               why=f"undo {entry.change.describe()} ({entry.state} at "
                                   f"{entry.time})")
        checks.append(Check("rollback", rollback_key(number, entry), expect, options, probe))
    return checks
