"""The ``cmdline`` persistence target: the kinds' kernel parameters (``PersistLine("cmdline",
...)``), merged into the grub.d drop-in that boot-time fixes write too (``bootconfig``), where
the host boots with GRUB. --fix-persist (``fix/persist.py``) asks here for that one file and
knows nothing of the boot configuration."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ..host import Host
from .bootconfig import GRUB, dropin_path, dropin_text, parse_boot_config, read_all
from .persistence import CONTROL, PersistLine

CMDLINE = "cmdline"

BootTexts = dict[str, "str | None"]
"""The boot configuration's files as ``boot_texts`` read them (path -> text, None: absent)."""


class CmdlineFile(msgspec.Struct, frozen=True):
    """The drop-in the ``cmdline`` lines go into: its text, or why it is not written."""

    path: str
    text: str | None
    refused: str | None = None


def cmdline_path(spec: str) -> str:
    """The file the ``cmdline`` target's lines of spec ``spec`` go into."""
    return dropin_path(spec)


def boot_texts(host: Host) -> BootTexts:
    """The host's boot configuration, read in one batch."""
    return read_all(host)


def cmdline_file(spec: str, lines: Sequence[PersistLine], read: Callable[[str], str | None],
                 texts: BootTexts) -> CmdlineFile | None:
    """The kernel parameters of ``lines`` merged into our grub.d drop-in (which boot-time
    fixes of this run may have written already, ``read`` gives its text), only where the host
    boots with GRUB; None where no line is a kernel parameter or the host boots otherwise."""
    words = [line for line in lines if line.target == CMDLINE]
    if not words or parse_boot_config(texts).loader != GRUB:
        return None
    path = dropin_path(spec)
    refused = next((line.refused for line in words if line.refused is not None), None)
    if refused is not None:
        return CmdlineFile(path, None, refused)
    unsafe = [line.text for line in words if CONTROL.search(line.text) or " " in line.text]
    if unsafe:
        return CmdlineFile(path, None, f"a kernel parameter holds a space or a control "
                                       f"character: {unsafe[0]!r}")
    return CmdlineFile(path, dropin_text(read(path), spec, [line.text for line in words]))
