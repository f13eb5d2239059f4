"""What a host's reads, writes and commands fail with: one ``HostError`` family, whose message
says what and where and whose ``errno`` says why."""

from __future__ import annotations

import errno

MISSING_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)
"""Errors that mean "there is nothing there" to ``exists``."""


class HostError(Exception):
    """A read, write or command that failed; the message says what and where, ``errno`` why."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


def raised(error: HostError) -> HostError:
    """A copy of a kept error, to raise: the kept one (a cached reply's) never takes a
    traceback, which would keep the raising frames alive and grow at every raise. Made
    without calling ``__init__`` (subclasses take other arguments), with the same state."""
    again = type(error).__new__(type(error), *error.args)
    again.__dict__.update(error.__dict__)
    return again


class UnsafePath(HostError):
    """A path that would leave the host root."""


class TargetLost(HostError):
    """What every read of a target that could not be reached fails with: the connection's own
    error (its words and errno), told apart from an error of the host itself."""


class CommandTimeout(HostError):
    """A command that did not finish in time. Its whole process group was killed, but what it
    did before that is unknown: a fix that timed out may or may not have been made."""

    def __init__(self, message: str, argv: tuple[str, ...], timeout: float) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.argv = argv
        self.timeout = timeout


class TargetTimeout(TargetLost):
    """A remote target that used up its time (--gpuhost-target-timeout) waiting on one step:
    its connection is ended, and everything asked of it later fails with this error."""

    def __init__(self, message: str, step: str) -> None:
        super().__init__(message, errno.ETIMEDOUT)
        self.step = step
