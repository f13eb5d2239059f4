"""The kernel command line: the running one (proc/cmdline) and the one the next boot gets.

Pure functions. How the kernel splits a command line into words and what each parameter means
to the program that reads it (``Parameter``, ``READERS``) are in ``kernelparams.py``; here, where
the next boot's line comes from, and the words a drop-in of ours holds (``merge_words``).

The next boot's command line comes from the boot loader's configuration:
- GRUB (Debian, Ubuntu; Proxmox on legacy boot): ``grub-mkconfig`` sources etc/default/grub and
  then every etc/default/grub.d/*.cfg in name order, and boots the default entry with
  ``$GRUB_CMDLINE_LINUX $GRUB_CMDLINE_LINUX_DEFAULT``. Only plain assignments are understood
  (``NAME="... $OTHER ..."``, single quotes, ``${NAME}``); a line that does more is ignored.
- systemd-boot / kernel-install and proxmox-boot-tool: etc/kernel/cmdline, one line; where it
  exists it is what the next boot gets, and GRUB's files do not matter.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from .kernelparams import LAST_WINS as LAST_WINS  # re-exported
from .kernelparams import READERS as READERS  # re-exported
from .kernelparams import VIDEO as VIDEO  # re-exported
from .kernelparams import InForce as InForce  # re-exported
from .kernelparams import Parameter as Parameter  # re-exported
from .kernelparams import Reader as Reader  # re-exported
from .kernelparams import VideoOptions as VideoOptions  # re-exported
from .kernelparams import list_items
from .kernelparams import param_key as param_key  # re-exported
from .kernelparams import reader as reader  # re-exported
from .kernelparams import split_words as split_words  # re-exported

GRUB_DEFAULT = "etc/default/grub"
GRUB_DROPINS = "etc/default/grub.d"
KERNEL_CMDLINE = "etc/kernel/cmdline"
PROXMOX_UUIDS = "etc/kernel/proxmox-boot-uuids"
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
DROPIN_VARIABLE = "GRUB_CMDLINE_LINUX_DEFAULT"
"""What a drop-in appends to: the default entry's parameters, which come last, so ours win."""
SAFE_WORD = re.compile(r"[A-Za-z0-9_.,:;=/+@%~\[\]-]+\Z")
"""What a parameter written into the boot configuration may hold. A grub.d drop-in is shell that
``update-grub`` sources as root: ``$``, backquotes, backslashes, quotes, spaces and the other
characters a shell acts on are never written (``;`` is, single-quoted for GRUB's own parser)."""
_ASSIGNMENT = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)\Z")
_EXPANSION = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def _shell_value(raw: str, variables: Mapping[str, str]) -> str | None:
    """The value of a plain shell assignment's right-hand side, or None when it does more than
    quote and expand variables (a command substitution, a second command)."""
    if "`" in raw or "$(" in raw:
        return None
    try:
        lexer = shlex.shlex(raw, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return None
    if len(tokens) != 1:
        return "" if not tokens else None
    # Expand outside single quotes only: split the raw text into quoted and unquoted runs.
    out: list[str] = []
    index = 0
    text = raw.strip()
    while index < len(text):
        char = text[index]
        if char == "'":
            end = text.index("'", index + 1)
            out.append(text[index + 1:end])
            index = end + 1
        elif char == '"':
            end = index + 1
            while text[end] != '"':
                end += 2 if text[end] == "\\" else 1
            out.append(_expand(text[index + 1:end], variables))
            index = end + 1
        elif (char == "#" and (index == 0 or text[index - 1].isspace())) or char.isspace():
            break
        else:
            end = index
            while end < len(text) and text[end] not in "'\" \t#":
                end += 1
            out.append(_expand(text[index:end], variables))
            index = end
    return "".join(out)


def _expand(text: str, variables: Mapping[str, str]) -> str:
    text = text.replace('\\"', '"').replace("\\$", "\0")
    expanded = _EXPANSION.sub(lambda m: variables.get(m.group(1) or m.group(2), ""), text)
    return expanded.replace("\0", "$")


def grub_variables(files: Sequence[tuple[str, str]],
                   ) -> tuple[dict[str, str], dict[str, str]]:
    """(GRUB_CMDLINE_* values, where each was last set as ``file:line``) after sourcing
    ``files`` (path, text) in order."""
    values: dict[str, str] = {}
    where: dict[str, str] = {}
    for path, text in files:
        for number, line in enumerate(text.splitlines(), 1):
            match = _ASSIGNMENT.match(line)
            if match is None or match.group(1) not in GRUB_VARIABLES:
                continue
            value = _shell_value(match.group(2), values)
            if value is not None:
                values[match.group(1)] = value
                where[match.group(1)] = f"{path}:{number}"
    return values, where


def grub_words(values: Mapping[str, str]) -> list[str]:
    """The default entry's parameters: GRUB_CMDLINE_LINUX, then GRUB_CMDLINE_LINUX_DEFAULT
    (GRUB's own parser drops the single quotes a drop-in puts around ``a;b``)."""
    text = " ".join(values.get(name, "") for name in GRUB_VARIABLES)
    try:
        return shlex.split(text)
    except ValueError:
        return split_words(text)


def grub_dropins(names: Sequence[str]) -> list[str]:
    """The drop-ins grub-mkconfig sources, in its order: ``*.cfg`` sorted by name."""
    return [f"{GRUB_DROPINS}/{name}" for name in sorted(names) if name.endswith(".cfg")]


def kernel_cmdline_words(text: str) -> list[str]:
    """etc/kernel/cmdline: the whole command line, comment lines (``#``) skipped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return split_words(" ".join(lines))


def _grub_word(word: str) -> str:
    """GRUB's script parser splits at ``;``: such a word is single-quoted in grub.cfg."""
    return f"'{word}'" if any(c in word for c in ";&|<> ") else word


def unsafe_word(word: str) -> bool:
    """Whether ``word`` must not go into the boot configuration (see SAFE_WORD)."""
    return not SAFE_WORD.match(word) or word.startswith("-")


def render_dropin(header: str, words: Sequence[str]) -> str:
    """A grub.d drop-in that appends ``words`` to the default entry's parameters; ValueError for
    a word a shell would act on (the planner refuses those first, with the reason)."""
    bad = [w for w in words if unsafe_word(w)]
    if bad:
        raise ValueError(f"not written into a grub.d drop-in (sourced by a shell): {bad!r}")
    joined = " ".join(_grub_word(w) for w in words)
    return f'{header}{DROPIN_VARIABLE}="${DROPIN_VARIABLE} {joined}"\n'


def dropin_words(text: str) -> list[str]:
    """The parameters a drop-in of ours appends (what ``render_dropin`` wrote)."""
    values, _ = grub_variables([("dropin", text)])
    return grub_words({DROPIN_VARIABLE: values.get(DROPIN_VARIABLE, "")})


def _slot(word: str) -> str:
    """What a word of a drop-in replaces: the same parameter (``amd_pstate=``), the same
    ``pci=`` option (``pci=disable_acs_redir=``), or, for another parameter whose every
    occurrence counts with its whole value (``console=``), itself."""
    key = param_key(word)
    if key == "pci":
        return "pci=" + word.partition("=")[2].partition("=")[0]
    kind = reader(key)
    return word if kind.every and not kind.listed else key


def _merged(old: str, new: str) -> str:
    """Two words of a listed parameter as one (``modprobe.blacklist=a`` and ``...=b``:
    ``modprobe.blacklist=a,b``); any other word replaces the old one."""
    key = param_key(new)
    if key == "pci" or not reader(key).listed or "=" not in old or "=" not in new:
        return new
    items = dict.fromkeys([*list_items(old.partition("=")[2]),
                           *list_items(new.partition("=")[2])])
    return f"{new.partition('=')[0]}={','.join(items)}"


def merge_words(existing: Sequence[str], added: Sequence[str]) -> list[str]:
    """``existing`` with each of ``added`` put in: a word in the same slot is replaced where it
    stands (one value per parameter in a drop-in; a listed parameter's items joined into one
    list, so a drop-in never holds two ``modprobe.blacklist=``), a new one appended."""
    merged = list(existing)
    for word in added:
        same = [i for i, w in enumerate(merged) if _slot(w) == _slot(word)]
        if not same:
            merged.append(word)
            continue
        merged[same[0]] = _merged(merged[same[0]], word)
        for extra in reversed(same[1:]):
            del merged[extra]
    return merged
