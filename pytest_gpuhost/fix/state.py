"""Where pytest-gpuhost keeps its own state on a host: journals and locks, under the host's root.

State lives on the machine it is about (``ROOT/var/lib/pytest-gpuhost``): a run against an ssh
target journals and locks on that target, so a rollback from any machine finds its journal and
two runs from two machines never interleave. Every file is made, appended to and locked through
the host (``Host.create_file``, ``append_file``, ``lock``): inside the root, never through a
link, never into a file that is not pytest-gpuhost's own.

A journal named with ``--gpuhost-journal=FILE`` is a file of this machine; a ``StateFile`` is
then on this machine's ``/``.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import msgspec

from ..host import Glob, Host, HostError, LocalHost, Read

STATE_DIR = "var/lib/pytest-gpuhost"
JOURNAL_DIR = f"{STATE_DIR}/journal"
JOURNAL_LIMIT = 64 * 2**20
"""The largest journal read back: tens of thousands of changes."""

_LOCAL_ROOT: list[LocalHost] = []
_JOURNALS = itertools.count(1)
_STAMPS: set[str] = set()


def this_machine() -> LocalHost:
    """This machine at ``/`` (for a state file the user named by its own path)."""
    if not _LOCAL_ROOT:
        _LOCAL_ROOT.append(LocalHost(Path("/")))
    return _LOCAL_ROOT[0]


class StateFile(msgspec.Struct, frozen=True):
    """One of pytest-gpuhost's files on a host: the host, its path under the host's root, and
    how messages show it."""

    host: Host
    path: str
    shown: str

    @classmethod
    def local(cls, path: Path) -> StateFile:
        """A file of this machine named by its path (``--gpuhost-journal``, tests)."""
        return cls(this_machine(), os.path.abspath(path).lstrip("/"), str(path))

    def exists(self) -> bool:
        return self.host.exists(self.path)

    def read(self) -> bytes:
        [reply] = self.host.batch([Read(self.path, JOURNAL_LIMIT)])
        return reply.data()

    def __str__(self) -> str:
        return self.shown


class StateStore(msgspec.Struct, frozen=True):
    """pytest-gpuhost's state directory on one host."""

    host: Host
    shown_root: str
    """How messages show the host's root (``/srv/tree``, ``ssh://root@pve/``)."""

    @classmethod
    def of(cls, host: Host) -> StateStore:
        return cls(host, host.describe())

    def file(self, path: str) -> StateFile:
        return StateFile(self.host, path, _joined(self.shown_root, path))

    @property
    def journal_dir(self) -> str:
        return _joined(self.shown_root, JOURNAL_DIR)

    def new_journal(self, spec: str) -> StateFile:
        """``var/lib/pytest-gpuhost/journal/20261202T143351Z-blackwell8-4242.jsonl``, ``-2``
        for this process's second journal in that second (pytester, an IDE). Named without
        reading the host, so choosing it never opens a connection; the file is made at the
        first change, and a name that exists by then is refused rather than shared."""
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        number = next(_JOURNALS)
        suffix = "" if number == 1 and stamp not in _STAMPS else f"-{number}"
        _STAMPS.add(stamp)
        return self.file(f"{JOURNAL_DIR}/{stamp}-{spec}-{os.getpid()}{suffix}.jsonl")

    def journals(self) -> list[str]:
        """Every journal's path under the root, oldest name first."""
        [reply] = self.host.batch([Glob(f"{JOURNAL_DIR}/*.jsonl", read=False)])
        if reply.error is not None:
            if reply.missing:
                return []
            raise HostError(f"cannot list {self.journal_dir}: {reply.error}",
                            reply.error.errno)
        return sorted(path for path, _ in reply.matches())


def _joined(root: str, path: str) -> str:
    return f"{root.rstrip('/')}/{path}" if root not in ("", "/") else f"/{path}"
