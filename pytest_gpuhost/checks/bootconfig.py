"""The next boot's kernel command line, and the drop-in that boot-time fixes write to it.

Read as a list of paths, then parsed by ``linux.cmdline``. Where etc/kernel/cmdline exists
(systemd-boot, proxmox-boot-tool) it is the next boot's whole command line: it is the
administrator's own file, so pytest-gpuhost never edits it and a boot-time fix there says what to
add. Otherwise GRUB's etc/default/grub and etc/default/grub.d/*.cfg: a fix writes its own
drop-in, etc/default/grub.d/90-gpuhost-<spec>.cfg, and never touches the others.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from ..host import Glob, Host, Read, Request
from ..linux.cmdline import (
    GRUB_DEFAULT,
    GRUB_DROPINS,
    KERNEL_CMDLINE,
    PROXMOX_UUIDS,
    dropin_words,
    grub_dropins,
    grub_variables,
    grub_words,
    kernel_cmdline_words,
    merge_words,
    render_dropin,
    unsafe_word,
)
from . import CannotFix, Evidence

if TYPE_CHECKING:  # a plan's changes load when used
    from .changes import Plan

GRUB, SYSTEMD_BOOT, UNKNOWN = "grub", "kernel-cmdline", "none"
SPEC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
"""A spec name that may name a drop-in file (as --fix-persist's own files require)."""


def dropin_path(spec: str) -> str:
    return f"{GRUB_DROPINS}/90-gpuhost-{spec}.cfg"


class BootCommandLine(msgspec.Struct, frozen=True):
    """What the next boot's command line will be, and where each word comes from."""

    loader: str
    words: tuple[str, ...]
    origin: dict[str, str] = msgspec.field(default_factory=dict)
    """word -> ``file:line`` of the assignment that brought it in."""
    apply: str = ""
    """What makes a change to it take effect."""

    def where(self, words: Sequence[str]) -> str:
        places = sorted({self.origin[w] for w in words if w in self.origin})
        if places:
            return ", ".join(places)
        return KERNEL_CMDLINE if self.loader == SYSTEMD_BOOT else "the GRUB configuration"

    def evidence(self) -> Evidence:
        source = KERNEL_CMDLINE if self.loader == SYSTEMD_BOOT else \
            f"{GRUB_DEFAULT} + {GRUB_DROPINS}/*.cfg"
        return Evidence(f"next boot: {source}", " ".join(self.words) or "(empty)")


BOOT_READS: tuple[Request, ...] = (Read(KERNEL_CMDLINE), Read(PROXMOX_UUIDS), Read(GRUB_DEFAULT),
                                   Glob(f"{GRUB_DROPINS}/*.cfg"))
"""Everything the next boot's command line comes from, in one batch."""


def read_all(host: Host) -> dict[str, str | None]:
    """path -> text of each file the boot loader applies, in its order (None: not there, or
    a dangling link, which the boot loader skips too)."""
    replies = host.batch(BOOT_READS)
    texts: dict[str, str | None] = {}
    for path, reply in zip((KERNEL_CMDLINE, PROXMOX_UUIDS, GRUB_DEFAULT), replies, strict=False):
        texts[path] = reply.text() if reply.error is None else None
    dropins = {path: data for path, data in
               (replies[3].matches() if replies[3].error is None else ())}
    for path in grub_dropins([p.rsplit("/", 1)[-1] for p in dropins]):
        data = dropins[path]
        texts[path] = data.decode("utf-8", "replace") if isinstance(data, bytes) else None
    return texts


def parse_boot_config(texts: dict[str, str | None]) -> BootCommandLine:
    """The next boot's command line from what ``read_all`` read."""
    proxmox = texts.get(PROXMOX_UUIDS) is not None
    kernel_cmdline = texts.get(KERNEL_CMDLINE)
    if kernel_cmdline is not None:
        words = kernel_cmdline_words(kernel_cmdline)
        tool = "proxmox-boot-tool refresh" if proxmox else "kernel-install add (or reinstall " \
                                                          "the kernel package)"
        return BootCommandLine(SYSTEMD_BOOT, tuple(words), {w: KERNEL_CMDLINE for w in words},
                               f"run `{tool}`, then reboot")
    grub = [(path, text) for path, text in texts.items()
            if text is not None and path not in (KERNEL_CMDLINE, PROXMOX_UUIDS)]
    if texts.get(GRUB_DEFAULT) is None and not grub:
        return BootCommandLine(UNKNOWN, ())
    origin: dict[str, str] = {}
    for count in range(1, len(grub) + 1):
        values, where = grub_variables(grub[:count])
        for word in grub_words(values):
            origin.setdefault(word, where.get("GRUB_CMDLINE_LINUX_DEFAULT") or
                              where.get("GRUB_CMDLINE_LINUX") or grub[count - 1][0])
    values, _ = grub_variables(grub)
    words = grub_words(values)
    tool = "proxmox-boot-tool refresh" if proxmox else "update-grub"
    return BootCommandLine(GRUB, tuple(words), {w: origin[w] for w in words if w in origin},
                           f"run `{tool}`, then reboot")


def read_boot_config(host: Host) -> BootCommandLine:
    return parse_boot_config(read_all(host))


def _header(spec: str) -> str:
    return (f"# Written by pytest-gpuhost --fix-persist for spec {spec}: kernel parameters for "
            "the next boot.\n# Edit the spec and run --fix --fix-persist again rather than "
            "this file; remove it\n# (or --gpuhost-rollback) to undo, then update-grub.\n")


def dropin_text(current: str | None, spec: str, words: Sequence[str]) -> str:
    """Our drop-in with ``words`` merged into what it already holds."""
    existing = dropin_words(current) if current else []
    return render_dropin(_header(spec), merge_words(existing, words))


def plan_dropin(host: Host, spec: str, words: Sequence[str], *,
                by_hand: str | None = None) -> Plan:
    """Add ``words`` to the next boot's command line through our grub.d drop-in (``by_hand``:
    what an administrator adds to a file pytest-gpuhost does not edit, where that is not the
    words as they are: an item of an existing list)."""
    from .changes import Plan, ReplaceFile  # a plan's: a check that passes makes none

    boot = read_boot_config(host)
    shown = " ".join(words)
    instead = by_hand or f"add {shown!r}"
    if boot.loader == SYSTEMD_BOOT:
        raise CannotFix(f"this host boots with {KERNEL_CMDLINE} (systemd-boot or "
                        f"proxmox-boot-tool), the administrator's own file, which pytest-gpuhost "
                        f"does not edit: {instead} there and {boot.apply}")
    if boot.loader == UNKNOWN:
        raise CannotFix(f"no boot configuration found ({GRUB_DEFAULT}, {KERNEL_CMDLINE}): "
                        f"{instead} in the kernel command line of the boot loader")
    bad = [w for w in words if unsafe_word(w)]
    if bad:
        raise CannotFix(f"{bad[0]!r} holds characters a shell acts on, and a grub.d drop-in is "
                        "shell that update-grub runs as root: not written (allowed: letters, "
                        "digits and _ . , : ; = / + @ % ~ [ ] -)")
    if not SPEC_NAME.match(spec):
        raise CannotFix(f"the spec name {spec!r} is not a plain word (letters, digits, '.', '_', "
                        "'+', '-'), so it does not name a file in the boot configuration")
    path = dropin_path(spec)
    # read once: the text to edit (as read_text gives it) and the change's exact original
    original = host.read_bytes(path) if host.exists(path) else None
    current = None if original is None else original.decode("utf-8", "replace")
    try:
        text = dropin_text(current, spec, words)
    except ValueError as exc:  # our own drop-in holds such a word: someone edited it
        raise CannotFix(f"{path}: {exc}; fix or remove that file first") from None
    if text == current:
        raise CannotFix(f"{path} already adds {shown!r}, yet the boot configuration does not "
                        f"end with it: a later file in {GRUB_DROPINS} overrides it")
    return Plan(f"add {shown} to {path} (then {boot.apply.removeprefix('run ')})",
                (ReplaceFile.of_bytes(path, original, text),))
