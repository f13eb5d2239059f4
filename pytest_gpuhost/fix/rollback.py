"""--gpuhost-rollback: restore the originals a journal recorded, newest first, each read back.

Each journaled change becomes a ``rollback`` check whose expected value is the original: it
passes when the host already holds it (the change never happened, or was undone), and its fix
writes the original back. A change whose outcome line is missing (the run crashed) is restored
the same way: restoring an original is safe whether or not the change was made.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import CannotFix, Check, Evidence, Observation, Probe
from ..checks.modules import ModuleProbe, ModuleState
from ..checks.nvml import PERSISTENCE, PersistenceModeProbe
from ..gpu.nvml import NvmlSource
from ..host import Host, HostError
from ..linux.pciconfig import BCR_FLR, short_config
from ..spec import EntryOptions
from ..spec.matchers import Auto, Choice, Exact, Expectation
from .changes import Change, Command, NvmlSetting, Plan, ReplaceFile, WriteBytes, WriteText
from .journal import JournalContents, JournalError
from .persist import FileContentProbe, expected_state


@dataclass(frozen=True)
class TextProbe:
    path: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        if not host.exists(self.path):
            return Observation(None, problem=f"{self.path} no longer exists")
        value = host.read_text(self.path).rstrip("\n")
        return Observation(value, (Evidence(self.path, value),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if observed.value is None:
            raise CannotFix(f"{self.path} no longer exists; a rollback never creates it")
        return Plan(f"write {value!r} back to {self.path}",
                    (WriteText(self.path, observed.value + "\n", value + "\n"),))


@dataclass(frozen=True)
class Guarded:
    """Undo a change only while the host still holds what the fix left: a value someone
    changed since is theirs, and is reported rather than overwritten."""

    inner: Probe
    left: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        return self.inner.observe(host)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if (observed.value or "").strip() != self.left.strip():
            raise CannotFix(f"changed since the fix (now {observed.value!r}, the fix left "
                            f"{self.left.strip()!r}): left as it is")
        return self.inner.plan(host, value, observed)


@dataclass(frozen=True)
class BitsProbe:
    """The bits a config-space write changed (``old`` XOR ``new``), read back and restored by a
    read-modify-write of those bits alone; bit 15 of Device Control (FLR) is never set."""

    path: str
    offset: int
    old: int
    new: int
    length: int
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
        if current & self.mask != self.new & self.mask:
            raise CannotFix(f"changed since the fix (bits {self.shown(current)}, the fix left "
                            f"{self.shown(self.new)}): left as it is")
        restored = (current & ~self.mask | self.old & self.mask) & ~BCR_FLR
        change = WriteBytes(self.path, self.offset, self._hex(current), self._hex(restored))
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


def _restore(change: Change, nvml: NvmlSource) -> tuple[Expectation, Probe]:
    """What the original was, and a probe that can read and write it back."""
    if isinstance(change, NvmlSetting):
        return (Exact(change.old, Choice(PERSISTENCE)),
                Guarded(PersistenceModeProbe(nvml, change.address), change.new))
    if isinstance(change, WriteText):
        return Exact(change.old.rstrip("\n"), Auto()), Guarded(TextProbe(change.path), change.new)
    if isinstance(change, WriteBytes):
        old, new = (int.from_bytes(bytes.fromhex(v), "little") for v in (change.old, change.new))
        probe = BitsProbe(change.path, change.offset, old, new, len(bytes.fromhex(change.old)))
        return Exact(probe.shown(old), Choice((probe.shown(old),))), probe
    if isinstance(change, ReplaceFile):
        return (expected_state(change.old),
                FileContentProbe(change.path, change.old, only_if=change.new))
    if change.argv[:1] == ("modprobe",):
        return (Exact(change.old, ModuleState()),
                Guarded(ModuleProbe(change.argv[-1]), change.new))
    raise JournalError(f"no way to roll back {change.describe()}")


def rollback_checks(journal: JournalContents, shown: str, nvml: NvmlSource) -> list[Check]:
    checks = []
    entries = list(journal.entries)
    for number, entry in reversed(list(enumerate(entries, 1))):
        expect, probe = _restore(entry.change, nvml)
        options = EntryOptions(where=f"{shown}:{entry.line}",
                               why=f"undo {entry.change.describe()} ({entry.state} at "
                                   f"{entry.time})")
        # The entry's number keeps ids unique when one target was changed twice.
        checks.append(Check("rollback", f"{entry.check} {_target(entry.change)} #{number}",
                            expect, options, probe))
    return checks
