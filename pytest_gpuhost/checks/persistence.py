"""What a kind supplies to ``--fix-persist``: lines for the boot configuration's files, each
checked by the kind that makes it (a line it cannot write safely is refused, saying why), and
the records whose values are to be kept. ``fix/persist.py`` merges the lines into files."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    from ..result import CheckResult

PERSIST_TARGETS = ("sysctl", "modules-load", "modprobe", "udev", "tmpfiles", "cmdline")
"""The files a kind's persistence lines go to: etc/sysctl.d, etc/modules-load.d,
etc/modprobe.d, etc/udev/rules.d, etc/tmpfiles.d (written at every boot), and the kernel command
line (a parameter merged into the grub.d drop-in)."""
_CONTROL = r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]"
if TYPE_CHECKING:
    CONTROL: re.Pattern[str]
    """A control character (a tab aside): a line break in a persistence line would be a line
    of its own (``kernel.core_pattern = |sh``)."""


def __getattr__(name: str) -> object:
    """``CONTROL``, compiled (and cached by ``re``) at its first use: --fix-persist's, which a
    verify run never makes; compiling the class costs more than the rest of the module."""
    if name == "CONTROL":
        return re.compile(_CONTROL)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BootCommand(msgspec.Struct, frozen=True):
    """A command a persistence line runs at boot: udev runs a program by its absolute path, and
    one that is not there fails at boot, unseen."""

    name: str
    """``setpci``: looked up in the target's sbin and bin directories."""
    package: str
    """``pciutils``: what to install where the target has none."""
    sets: str
    """``MaxReadReq``: what the line sets, for the message."""


class PersistLine(msgspec.Struct, frozen=True):
    """A line a kind supplies to --fix-persist; ``target`` (one of ``PERSIST_TARGETS``) names
    the file it goes to. A line that cannot be written safely is ``refused`` with the reason:
    its whole file is then not written, and its ``persist`` check fails saying why."""

    target: str
    text: str
    runs: BootCommand | None = None
    """The command the line runs at boot, named in ``text`` as ``{NAME}``: --fix-persist writes
    where the target keeps it, or refuses the file where the target has none."""
    refused: str | None = None

    def __post_init__(self) -> None:
        if self.target not in PERSIST_TARGETS:
            raise ValueError(f"a persistence line for {self.target!r}: the files are "
                             f"{', '.join(PERSIST_TARGETS)}")

    @classmethod
    def refuse(cls, target: str, why: str) -> PersistLine:
        return cls(target, "", refused=why)


def right_now(results: Sequence[CheckResult], kind: str) -> list[CheckResult]:
    """The records of ``kind`` whose value is right now, or (in a dry run) would be after the
    planned fix: the values --fix-persist keeps."""
    from ..result import Outcome

    settled = (Outcome.PASSED, Outcome.FIXED, Outcome.WOULD_FIX)
    return [r for r in results if r.kind == kind and r.observed and r.outcome in settled]


def settled(results: Sequence[CheckResult], kind: str) -> list[tuple[CheckResult, str]]:
    """``right_now``'s records with their value: the one read back, or for a dry run's
    ``would_fix`` the text its first planned change writes (a record whose plan writes no text
    is left out: a kind with such fixes reads its own plan)."""
    from ..result import Outcome

    found = []
    for record in right_now(results, kind):
        if record.outcome is not Outcome.WOULD_FIX:
            found.append((record, str(record.observed)))
        elif record.plan and record.plan[0].get("type") == "write_text":
            found.append((record, str(record.plan[0]["new"]).strip()))
    return found
