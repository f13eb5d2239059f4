"""What a kernel command-line parameter means: the words of a line, and each parameter as the
program that acts on it reads them.

Pure functions. The kernel splits its command line at spaces, a double-quoted stretch staying one
word (``acpi_osi="Windows 2015"``), and treats ``-`` and ``_`` alike in a parameter's name.

A parameter means what the program that acts on it makes of it (``READERS``): for most, the
kernel keeps the last occurrence, value whole (``isolcpus=1-15,17-31``); kmod reads every
``modprobe.blacklist=`` and splits it at commas, dracut every ``rd.driver.pre=``, the kernel's
``iommu=`` handler every occurrence, option by option (``iommu=pt iommu=1`` is passthrough);
``video=`` gives each driver the options of the last occurrence naming it. ``Parameter``
judges a spec's ``has``/``lacks`` on that reading, for the running line and for the next boot's
alike, and says what to add the same way (an item to an existing list, never a second one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec


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


def list_items(value: str | None) -> list[str]:
    """The items of a listed parameter's value (``a,b`` -> ``[a, b]``), empty ones dropped."""
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
            for item in list_items(value):
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
        return [item for item in list_items(self.value) if item not in have]

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
            return bool(list_items(self.value)) and not self.missing(words)
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
            return any(item in force.items for item in list_items(self.value))
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
