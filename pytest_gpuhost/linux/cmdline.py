"""The kernel command line: the running one (proc/cmdline) and the one the next boot gets.

Pure functions. The kernel splits its command line at spaces, a double-quoted stretch staying one
word (``acpi_osi="Windows 2015"``), and treats ``-`` and ``_`` alike in a parameter's name.

A parameter means what the program that acts on it makes of it (``READERS``): for most, the
kernel keeps the last occurrence, value whole (``isolcpus=1-15,17-31``); kmod reads every
``modprobe.blacklist=`` and splits it at commas, dracut every ``rd.driver.pre=``, the kernel's
``iommu=`` handler every occurrence, option by option (``iommu=pt iommu=1`` is passthrough);
``video=`` gives each driver the options of the last occurrence naming it. ``Parameter``
judges a spec's ``has``/``lacks`` on that reading, for the running line and for the next boot's
alike, and says what to add the same way (an item to an existing list, never a second one).

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

import msgspec

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
class Reader(msgspec.Struct, frozen=True):
    """How the program that acts on a parameter reads the command line."""

    every: bool
    """Every occurrence is acted on (else the last one is in force)."""
    listed: bool
    """A value is a comma-separated list of items."""
    who: str
    """Who reads it, for messages."""


LAST_WINS = Reader(every=False, listed=False, who="the kernel")
"""Most parameters: the kernel's ``__setup``/``module_param`` handler runs for each occurrence
and each overwrites the last (``isolcpus=1-15,17-31`` is one value, commas and all)."""
READERS: Mapping[str, Reader] = {
    # kmod's modprobe (libkmod-config.c, kcmdline_parse_result): every modprobe.blacklist= adds
    # each comma-separated name to the blacklist
    "modprobe.blacklist": Reader(every=True, listed=True, who="kmod (modprobe)"),
    # dracut: "can be specified multiple times", each a comma list (dracut.cmdline(7))
    "rd.driver.pre": Reader(every=True, listed=True, who="dracut"),
    "rd.driver.post": Reader(every=True, listed=True, who="dracut"),
    "rd.driver.blacklist": Reader(every=True, listed=True, who="dracut"),
    # systemd-modules-load: every occurrence, each a comma list
    "modules_load": Reader(every=True, listed=True, who="systemd-modules-load"),
    "rd.modules_load": Reader(every=True, listed=True, who="systemd-modules-load"),
    # the kernel's own module blacklist is one string (core_param charp): the last one wins
    "module_blacklist": Reader(every=False, listed=True, who="the kernel"),
    "initcall_blacklist": Reader(every=True, listed=True, who="the kernel"),
    # early_param/__setup handlers that walk a comma list and keep what earlier ones set:
    # iommu=pt iommu=1 is passthrough (x86's iommu_setup)
    "iommu": Reader(every=True, listed=True, who="the kernel"),
    "intel_iommu": Reader(every=True, listed=True, who="the kernel"),
    "amd_iommu": Reader(every=True, listed=True, who="the kernel"),
    "pci": Reader(every=True, listed=True, who="the kernel"),
    # each occurrence counts, its value whole (console=ttyS0,115200n8: the comma is the
    # console's own; hugepagesz=1G hugepages=32 hugepagesz=2M hugepages=1024: pairs)
    "console": Reader(every=True, listed=False, who="the kernel"),
    "earlycon": Reader(every=True, listed=False, who="the kernel"),
    "hugepages": Reader(every=True, listed=False, who="the kernel"),
    "hugepagesz": Reader(every=True, listed=False, who="the kernel"),
}
"""Each parameter whose reader is not last-wins-whole-value. ``video=`` has a reader of its own
(``VideoOptions``)."""
VIDEO = "video"


def reader(key: str) -> Reader:
    return READERS.get(key, LAST_WINS)


def split_words(text: str) -> list[str]:
    """Words as the kernel's ``next_arg`` splits them: a double quote groups spaces, and the
    quotes themselves are dropped."""
    words: list[str] = []
    current: list[str] = []
    quoted = False
    started = False
    for char in text.strip():
        if char == '"':
            quoted, started = not quoted, True
        elif char.isspace() and not quoted:
            if started:
                words.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        words.append("".join(current))
    return words


def param_key(word: str) -> str:
    name, _, _ = word.partition("=")
    return name.replace("-", "_")


def _values(words: Sequence[str], key: str) -> list[str | None]:
    """The value of every occurrence of ``key`` in order (None for a bare flag)."""
    found: list[str | None] = []
    for word in words:
        if param_key(word) == key:
            found.append(word.partition("=")[2] if "=" in word else None)
    return found


def _items(value: str | None) -> list[str]:
    return [item for item in (value or "").split(",") if item]


class InForce(msgspec.Struct, frozen=True):
    """What the command line sets for one parameter, read as its reader reads it."""

    key: str
    reader: Reader
    values: tuple[str | None, ...]
    """Every occurrence's value, in order (None: a bare flag)."""

    @property
    def acted_on(self) -> tuple[str | None, ...]:
        """The occurrences that count: every one, or the last."""
        return self.values if self.reader.every else self.values[-1:]

    @property
    def items(self) -> list[str]:
        """For a listed parameter, the items in force, in order, each once."""
        seen: dict[str, None] = {}
        for value in self.acted_on:
            for item in _items(value):
                seen.setdefault(item, None)
        return list(seen)


class VideoOptions(msgspec.Struct, frozen=True):
    """``video=``: the kernel keeps each occurrence; a driver takes the options of the last one
    that names it (``video=DRIVER:OPTIONS``), else those of the last one that names none
    (drivers/video/cmdline.c). ``video=vesafb:off,efifb:off`` gives vesafb the options
    ``off,efifb:off`` (off, as its prefix says) and efifb nothing."""

    values: tuple[str | None, ...]

    def options(self, driver: str | None) -> str | None:
        named = [v.partition(":")[2] for v in self.values
                 if v and ":" in v and v.partition(":")[0] == driver] if driver else []
        if named:
            return named[-1]
        unnamed = [v for v in self.values if v and ":" not in v]
        return unnamed[-1] if unnamed else None

    def holds(self, word_value: str | None) -> bool:
        """Whether ``video=word_value`` is in force: the driver's options are those, or begin
        with them (drivers test ``off`` as a prefix)."""
        if not word_value:
            return False
        driver, colon, wanted = word_value.partition(":")
        options = self.options(driver if colon else None)
        if options is None:
            return False
        wanted = wanted if colon else word_value
        return options == wanted or options.startswith(wanted + ",")


class Parameter(msgspec.Struct, frozen=True):
    """A spec's ``has``/``lacks`` entry: ``iommu=pt``, or a bare ``nokaslr``, judged as the
    program that acts on it reads the command line (``READERS``)."""

    word: str

    @property
    def key(self) -> str:
        return param_key(self.word)

    @property
    def value(self) -> str | None:
        return self.word.partition("=")[2] if "=" in self.word else None

    @property
    def reader(self) -> Reader:
        return reader(self.key)

    def in_force(self, words: Sequence[str]) -> InForce:
        return InForce(self.key, self.reader, tuple(_values(words, self.key)))

    def missing(self, words: Sequence[str]) -> list[str]:
        """For a listed parameter, the spec's items the command line does not set."""
        have = self.in_force(words).items
        return [item for item in _items(self.value) if item not in have]

    def present(self, words: Sequence[str]) -> bool:
        """Whether ``words`` set this parameter: the occurrence in force has this value; for a
        parameter whose every occurrence counts, any occurrence; for a listed one (``pci=``,
        ``modprobe.blacklist=``), each of its items among those in force; for ``video=``, the
        driver's options in force."""
        force = self.in_force(words)
        if not force.values:
            return False
        if self.key == VIDEO and self.value is not None:
            return VideoOptions(force.values).holds(self.value)
        if self.value is None:
            return None in force.acted_on
        if force.reader.listed:
            return bool(_items(self.value)) and not self.missing(words)
        return self.value in force.acted_on

    def mentioned(self, words: Sequence[str]) -> bool:
        """For ``lacks``: a bare key, any occurrence of it; a value, that value in force, read
        as ``present`` reads it (each item of a listed value)."""
        force = self.in_force(words)
        if self.value is None and "=" not in self.word:
            return bool(force.values)
        if self.key == VIDEO:
            return VideoOptions(force.values).holds(self.value)
        if force.reader.listed:
            return any(item in force.items for item in _items(self.value))
        return self.value in force.acted_on

    def shown(self, words: Sequence[str]) -> str:
        """What ``words`` say about this parameter's key, for the observed value."""
        values = _values(words, self.key)
        if not values:
            return f"no {self.key}"
        return " ".join(self.key if v is None else f"{self.key}={v}" for v in values)

    def why_not(self, words: Sequence[str]) -> str:
        """Why ``words`` do not set this parameter, as its reader sees it, and what to add:
        an item to the list a listed parameter already has, never a second one of it."""
        force = self.in_force(words)
        key, shown = self.key, self.shown(words)
        if not force.values:
            return f"the command line has no {key}"
        if self.key == VIDEO and self.value is not None:
            driver, colon, _ = self.value.partition(":")
            options = VideoOptions(force.values).options(driver if colon else None)
            if colon and options is None:
                return (f"no video= names {driver} ({shown!r}: the kernel takes one driver "
                        f"per video=, DRIVER:OPTIONS, so the others in a comma list are that "
                        f"driver's options): add {self.word}")
            return f"video= gives {driver or 'the display'} the options {options!r}, not " \
                   f"{self.value!r}"
        if force.reader.listed and self.value is not None:
            missing = ", ".join(self.missing(words))
            how = "every" if force.reader.every else "the last"
            return (f"{key}= lists {', '.join(force.items) or 'nothing'}, without {missing} "
                    f"({force.reader.who} reads {how} {key}= as a comma list): add {missing} "
                    f"to its {key}=")
        if force.reader.every:
            return f"the command line has {shown!r}, none of them {self.word!r}"
        last = " (the last one is in force)" if len(force.values) > 1 else ""
        return f"the command line has {shown!r}{last}, not {self.word!r}"

    def to_add(self, words: Sequence[str]) -> tuple[str, str]:
        """(the word a boot configuration's drop-in appends, what an administrator adds by
        hand) for the command line ``words``: a listed parameter's missing items; where only
        the last occurrence counts (module_blacklist=), the whole list, its items kept."""
        force = self.in_force(words)
        if not (force.reader.listed and self.value is not None and force.values):
            return self.word, f"add {self.word!r}"
        missing = self.missing(words)
        if force.reader.every:
            return f"{self.key}={','.join(missing)}", \
                f"add {','.join(missing)} to its {self.key}= list"
        merged = ",".join([*force.items, *missing])
        return f"{self.key}={merged}", f"add {','.join(missing)} to its {self.key}= list " \
            f"(the last {self.key}= is in force: {self.key}={merged})"


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
    items = dict.fromkeys([*_items(old.partition("=")[2]), *_items(new.partition("=")[2])])
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
