"""--gpuhost-rollback: restore the originals a journal recorded, newest first, each read back.

Each journaled change becomes a ``rollback`` check whose expected value is the original: it
passes when the host already holds it (the change never happened, or was undone), and its fix
writes the original back. A change whose outcome line is missing (the run crashed) is restored
the same way: restoring an original is safe whether or not the change was made.
"""

from __future__ import annotations

from dataclasses import dataclass

from .changes import Change, Command, NvmlSetting, Plan, ReplaceFile, WriteBytes, WriteText
from .checks import CannotFix, Check, Evidence, Observation, Probe
from .checks.modules import ModuleProbe, ModuleState
from .checks.nvml import PERSISTENCE, PersistenceModeProbe
from .host import Host, HostError
from .journal import JournalContents
from .matchers import Auto, Choice, Exact, Expectation
from .nvml import NvmlSource
from .persist import FileContentProbe, expected_state
from .spec import EntryOptions


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
class BytesProbe:
    path: str
    offset: int
    length: int
    fixable = True

    def observe(self, host: Host) -> Observation:
        data = host.read_bytes(self.path)[self.offset:self.offset + self.length]
        if len(data) != self.length:
            raise HostError(f"{self.path}: {len(data)} bytes at 0x{self.offset:02x}, not "
                            f"{self.length}: reads past 64 bytes of sysfs config need root")
        return Observation(data.hex(), (Evidence(f"{self.path} @0x{self.offset:02x}",
                                                 data.hex(" ")),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        change = WriteBytes(self.path, self.offset, observed.value or "", value)
        return Plan(f"write {value} back to {self.path} @0x{self.offset:02x}", (change,))


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
                PersistenceModeProbe(nvml, change.address))
    if isinstance(change, WriteText):
        return Exact(change.old.rstrip("\n"), Auto()), TextProbe(change.path)
    if isinstance(change, WriteBytes):
        return (Exact(change.old, Choice((change.old,))),
                BytesProbe(change.path, change.offset, len(bytes.fromhex(change.old))))
    if isinstance(change, ReplaceFile):
        return expected_state(change.old), FileContentProbe(change.path, change.old)
    if change.argv[:1] == ("modprobe",):
        return Exact(change.old, ModuleState()), ModuleProbe(change.argv[-1])
    raise ValueError(f"no way to roll back {change.describe()}")


def rollback_checks(journal: JournalContents, shown: str, nvml: NvmlSource) -> list[Check]:
    checks = []
    entries = list(journal.entries)
    for number, entry in reversed(list(enumerate(entries, 1))):
        expect, probe = _restore(entry.change, nvml)
        options = EntryOptions(where=f"{shown}:{number}",
                               why=f"undo {entry.change.describe()} ({entry.state} at "
                                   f"{entry.time})")
        checks.append(Check("rollback", f"{entry.check} {_target(entry.change)}", expect,
                            options, probe))
    return checks
