"""The captured spec as YAML text laid out as a person writes a spec: one entry a line in flow
style (``key: {value: 0, why: "..."}``), comments where something was left out.

Words (``madvise``, ``acpi-cpufreq``) and canonical decimal integers are written bare; every
other string is double-quoted (JSON's escapes are YAML's), so ``off``, ``Y``, ``0x2`` or ``1.10``
stay strings. A host's value can hold any character: those YAML refuses in a file (DEL, the C1
controls, U+FFFE, a lone surrogate) and those it takes for line breaks and folds inside quotes
(U+0085, U+2028, U+2029) are written as escapes, so the value reads back as it was; in a comment
they are written as their escapes' text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..checks.capturing import WARNING

_INTEGER = re.compile(r"-?(?:0|[1-9]\d{0,17})\Z")
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*\Z")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]*\Z")
RESERVED = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null"})
"""Words YAML 1.1 reads as booleans or null: always quoted."""
INDENT = "  "
WIDTH = 80


_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufffe\uffff]")
"""What JSON leaves as it is but YAML refuses or folds (JSON escapes what is below 0x20)."""


def _escaped(found: re.Match[str]) -> str:
    return f"\\u{ord(found.group()):04x}"


def quoted(text: str) -> str:
    """``text`` double-quoted, every character escaped that YAML would refuse or fold."""
    return _UNSAFE.sub(_escaped, json.dumps(text, ensure_ascii=False))


def scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    if _INTEGER.match(text) or (_WORD.match(text) and text.lower() not in RESERVED):
        return text
    return quoted(text)


def key(name: str) -> str:
    return name if _PLAIN_KEY.match(name) and name.lower() not in RESERVED else quoted(name)


def flow(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{key(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    return scalar(value)


def _one_line(value: Any) -> bool:
    """Scalars and mappings of scalars (an entry with its ``why``, however long) go on their
    key's line; lists too while they fit, else one item a line."""
    if isinstance(value, Mapping):
        return all(not isinstance(v, (Mapping, list, tuple)) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(not isinstance(v, (Mapping, list, tuple)) for v in value) and \
            len(flow(value)) <= WIDTH
    return True


def block(value: Mapping[str, Any], depth: int) -> list[str]:
    """A mapping in block style, each entry in flow style on its key's line."""
    lines: list[str] = []
    pad = INDENT * depth
    for name, item in value.items():
        if _one_line(item):
            lines.append(f"{pad}{key(name)}: {flow(item)}")
        elif isinstance(item, Mapping):
            lines.append(f"{pad}{key(name)}:")
            lines += block(item, depth + 1)
        else:
            lines.append(f"{pad}{key(name)}:")
            lines += [f"{pad}{INDENT}- {flow(entry)}" for entry in item]
    return lines


def comment(text: str) -> str:
    """One comment line: a newline or carriage return inside would end the comment, and a
    character YAML refuses would make the file unloadable (written as its escape's text)."""
    return "# " + _UNSAFE.sub(_escaped, " ".join(text.split()))


def spec_text(header: Sequence[str], top: Mapping[str, Any],
              sections: Mapping[str, tuple[Mapping[str, Any] | None, Sequence[str]]]) -> str:
    """``header`` comment lines, the top-level keys (version, name), then each section with
    the notes of what was left out of it as comments above its entries."""
    lines = [comment(line) for line in header]
    lines += [f"{key(name)}: {scalar(value)}" for name, value in top.items()]
    for name, (entries, notes) in sections.items():
        lines.append("")
        if entries:
            lines.append(f"{key(name)}:")
            lines += [INDENT + comment(note if note.startswith(WARNING) else f"left out: {note}")
                      for note in notes]
            lines += block(entries, 1)
        else:
            lines.append(comment(f"{name}: nothing captured"))
            lines += [comment(f"  {note}" if note.startswith(WARNING) else f"  left out: {note}")
                      for note in notes]
    return "\n".join(lines) + "\n"
