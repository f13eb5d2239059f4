"""What an operation that failed says: ``OpError`` (its message names what, where and why, with
the errno), and a file's type in words."""

from __future__ import annotations

import errno
import stat

MISSING = (errno.ENOENT, errno.ENOTDIR)
"""The errnos of a path that is not there (a missing component, or a file where a directory
belongs)."""

_TYPES = (
    (stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
    (stat.S_ISLNK, "symbolic link"),
)


class OpError(Exception):
    """An operation that failed; ``str()`` says what, where and why."""

    def __init__(self, message: str, error: int | None = None) -> None:
        super().__init__(message)
        self.errno = error


def file_type(mode: int) -> str:
    for test, name in _TYPES:
        if test(mode):
            return name
    return "special file"

