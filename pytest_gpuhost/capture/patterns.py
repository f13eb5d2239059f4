"""dmesg ``allow:`` patterns from kernel log records: numbers, addresses and PIDs generalized.

A record such as ``nvidia 0000:81:00.0: Xid 79, pid=4242`` becomes ``^nvidia (?:H{4}:)?H{2}:H{2}\\.
[0-7]: Xid \\d+, pid=\\d+$`` (H stands for ``[0-9a-fA-F]``): anchored, its words literal (every
regex metacharacter escaped), so it allows the same message from another device, process or
boot, and nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_HEX = "[0-9a-fA-F]"
_PIECES: tuple[tuple[str, str], ...] = (
    (rf"\b(?:{_HEX}{{4}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]\b",
     rf"(?:{_HEX}{{4}}:)?{_HEX}{{2}}:{_HEX}{{2}}\.[0-7]"),
    (rf"\b{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}\b", rf"{_HEX}{{4}}:{_HEX}{{2}}:{_HEX}{{2}}"),
    (rf"\b{_HEX}{{2}}(?::{_HEX}{{2}}){{5}}\b", rf"{_HEX}{{2}}(?::{_HEX}{{2}}){{5}}"),
    (rf"\b0x{_HEX}+\b", rf"0x{_HEX}+"),
    (rf"\b(?={_HEX}*[0-9])(?={_HEX}*[a-fA-F]){_HEX}{{8,}}\b", rf"{_HEX}+"),
    (r"(?<![A-Za-z_])\d+", r"\d+"),
)
"""(what to find, what stands for it), tried in this order at each position: PCI addresses
(with or without their domain or function), MAC addresses, 0x numbers, bare hex words of 8 or
more digits (kernel pointers), then runs of decimal digits that are not part of a name (PIDs,
counts, IPv4 parts; ``mlx5_core`` and ``eth0`` stay as they are)."""
_TOKENS = re.compile("|".join(f"({find})" for find, _ in _PIECES))
_META = re.compile(r"([.^$*+?{}\[\]\\|()])")


def escape(text: str) -> str:
    """Regex metacharacters escaped, spaces and other characters kept as they are (readable in
    YAML, unlike re.escape's ``\\ ``)."""
    return _META.sub(r"\\\1", text)


def generalize(text: str) -> str:
    """The anchored pattern that allows ``text`` and its kin (see the module's docstring)."""
    parts: list[str] = []
    position = 0
    for match in _TOKENS.finditer(text):
        parts.append(escape(text[position:match.start()]))
        index = next(i for i, group in enumerate(match.groups()) if group is not None)
        parts.append(_PIECES[index][1])
        position = match.end()
    parts.append(escape(text[position:]))
    return "^" + "".join(parts) + "$"


def allow_patterns(texts: Iterable[str], existing: Iterable[re.Pattern[str]] = ()) -> list[str]:
    """One pattern per kind of record not already allowed, in the order first seen."""
    allowed = list(existing)
    patterns: dict[str, None] = {}
    for text in texts:
        if any(p.search(text) for p in allowed):
            continue
        pattern = generalize(text)
        if pattern not in patterns:
            patterns[pattern] = None
            allowed.append(re.compile(pattern))
    return list(patterns)
