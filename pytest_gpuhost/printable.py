"""Host values as an operator's terminal shows them: data, never instructions to the terminal;
and counts in words that agree with them (``counted``). ``one_line`` puts a value on one line
of a message, its newlines escaped too.

A value read from a host (an ``observed`` sysctl, a USB product string in the kernel log, a
tool's stderr) can hold control characters: ``ESC ] 0 ; ... BEL`` sets the terminal's title,
``ESC [ 2 J`` clears the screen, a carriage return overwrites the line before it, bidirectional
overrides reorder what is read. ``printable`` writes each such character as its escape
(``\\x1b``, ``\\u202e``), as ``repr`` would, and keeps the text's own newlines and tabs. Bytes
that were not UTF-8 (surrogate escapes) are written as escapes too: a terminal's encoder would
refuse them.
"""

from __future__ import annotations

import re

_UNSAFE = ("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029"
           "\u202a-\u202e\u2066-\u2069\ufeff\ufff9-\ufffb\ud800-\udfff]")
"""Every character ``printable`` escapes; each is one ``str.isprintable`` refuses. Compiled
(and cached by ``re``) at the first text that holds one of them or a newline or tab: compiling
this class costs more than the rest of the module, and a run whose output is plain never needs
it."""


def _escape(found: re.Match[str]) -> str:
    code = ord(found.group())
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control, line-separator, bidi and surrogate character escaped;
    newlines and tabs kept."""
    if text.isprintable():  # nothing to escape
        return text
    return re.sub(_UNSAFE, _escape, text)


def one_line(text: str) -> str:
    """``text`` as one line of a message: where any character of it is not printable (a newline
    or a tab too), every such character escaped as Python's ``unicode_escape`` writes it."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def counted(count: int, singular: str, plural: str | None = None) -> str:
    """``1 check``, ``2 checks``: a count and its noun in agreement (``plural`` where it is
    not the singular plus ``s``: ``1 fix``, ``2 fixes``)."""
    return f"{count} {singular if count == 1 else plural or singular + 's'}"
