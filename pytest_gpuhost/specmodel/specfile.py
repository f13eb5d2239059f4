"""The spec file as bytes, and the errors of the spec layer: what a spec's reading needs
without YAML (``yamlfile.py`` composes the bytes; ``cache.py`` keys on them, and a run whose
spec it finds there never imports PyYAML).

Every problem is a SpecError naming the file, and its line where it has one: a file that is not
a regular file or is over MAX_SPEC_BYTES is refused, read without blocking, so a FIFO or
/dev/zero cannot hang the run.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

MAX_SPEC_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
"""Deeper YAML is no spec; the pure-Python composer recurses once per level."""


class SpecError(Exception):
    """A spec that cannot be used; str() is ``file:line: what is wrong, what was expected``."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_spec(path: Path, shown: str) -> bytes:
    """The spec's bytes: a regular file of at most MAX_SPEC_BYTES, opened without blocking (a
    FIFO would wait for a writer) and read no further than that bound (/dev/zero never ends)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SpecError(shown, "spec file not found") from None
    except OSError as exc:
        raise SpecError(shown, f"cannot read the spec: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")
            raise SpecError(shown, f"the spec is {kind}, not a regular file; name a YAML file")
        data = read_bounded(fd, MAX_SPEC_BYTES)
    except OSError as exc:
        raise SpecError(shown, f"cannot read the spec: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(shown, f"the spec is over {MAX_SPEC_BYTES // (1024 * 1024)} MiB; a spec "
                               "is a short YAML file")
    return data


def read_bounded(fd: int, limit: int) -> bytes:
    """What ``fd`` holds, read to its end or to one byte past ``limit`` (a longer result says
    the file is over it: /dev/zero never ends)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, limit + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def shown_name(path: Path, display: Callable[[Path], str]) -> str:
    """How messages name the spec file: ``display(path)``, escaped where it holds a control
    character (a newline in a path would forge a line of the message)."""
    shown = display(path)
    if not shown.isprintable():
        shown = shown.encode("unicode_escape").decode("ascii")
    return shown


EXCERPT_CHARS = 32
"""The most of a value an error message shows: a file named as a spec, a targets file or an
inventory may be a private key or an env file with a token, and its error goes into a CI log."""


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``value`` as an error message may show it: its ``repr``, or for a string longer than
    ``limit`` or of more than one line, its first line's first ``limit`` characters, escaped,
    followed by ``...`` and how long it was (never more of a file than that)."""
    if not isinstance(value, str):
        shown = repr(value)
        return shown if len(shown) <= 2 * limit else f"{shown[:limit]}... ({len(shown)} " \
                                                     "characters)"
    first = value.splitlines()[0] if value else value
    if len(value) <= limit and first == value:
        return repr(value)
    return f"{first[:limit]!r}... ({len(value)} characters)"


def closest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` where one of ``choices`` is close to ``word``, else ``""``."""
    import difflib  # for a message only

    found = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {found[0]!r}?)" if found else ""
