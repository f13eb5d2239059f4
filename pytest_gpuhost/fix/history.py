"""A fix that failed is not tried again by the next --fix, unless asked (--fix-retry).

A change the host refused (nvidia_peermem's modprobe: "Invalid argument" without an RDMA
device; a sysctl that is read-only in a container) is refused again, and trying can do harm: each
failed module load adds kernel log records, which the dmesg check then counts. So before a fix
is applied, the host's journals are asked for the last attempt at the same check: when that
attempt failed, for the same change (the same original, the same new value), the check is
``fix_failed`` naming the journal, its line and the error, and nothing is run. Another original
(the host changed since), another value (the spec changed), a later success, an ``unknown``
outcome (a command that timed out) or a reboot since (another boot id) tries again.

The journals are read once per target, in one batch, when the first fix is about to be applied;
a journal that cannot be read is passed over (the fix is then tried, as without a history).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec

from ..checks.changes import Change, to_dict
from ..host import Host, HostError, Read
from .journal import FAILED, JournalEntry, JournalError, read_journal
from .state import JOURNAL_LIMIT, StateFile, StateStore

RETRY_FLAG = "--fix-retry"


class EarlierFailure(msgspec.Struct, frozen=True):
    """The last attempt at a check's fix, which failed."""

    journal: str
    line: int
    time: str
    error: str

    def where(self) -> str:
        return f"failed at {self.time} in {self.journal}:{self.line}: {self.error}"

    def message(self) -> str:
        """The record's message: the fix was not tried again."""
        return f"{self.where()}; not retried: pass {RETRY_FLAG} to try again"

    def preview(self, problem: str) -> str:
        """A dry run's message: what --fix would do."""
        return (f"{problem}; --fix would not retry it ({self.where()}): pass {RETRY_FLAG} to "
                "try again")


class _Attempt(msgspec.Struct, frozen=True):
    entry: JournalEntry
    journal: str
    boot_id: str | None


class FixHistory:
    """The last attempt at each check's fix on one host, from every journal but the run's own."""

    def __init__(self, host: Host, own_journal: StateFile | None) -> None:
        self.host = host
        self.own_journal = own_journal
        """The run's journal: this run's own attempts are not history."""
        self._last: dict[str, _Attempt] | None = None
        self._boot_id: str | None = None

    def failed_before(self, check: str, changes: Sequence[Change]) -> EarlierFailure | None:
        """The earlier failure that stops this fix, or None to go ahead."""
        attempt = self._attempts().get(check)
        if attempt is None or attempt.entry.state != FAILED:
            return None
        planned = [to_dict(change) for change in changes]
        if to_dict(attempt.entry.change) not in planned:
            return None
        if attempt.boot_id is not None and attempt.boot_id != self._boot_id:
            return None  # rebooted since: what made it fail may be gone
        return EarlierFailure(attempt.journal, attempt.entry.line, attempt.entry.time,
                              attempt.entry.error or "no error recorded")

    def _attempts(self) -> dict[str, _Attempt]:
        if self._last is None:
            self._last = self._read()
        return self._last

    def _read(self) -> dict[str, _Attempt]:
        store = StateStore.of(self.host)
        try:
            paths = [p for p in store.journals() if not self._own(p)]
            replies = self.host.batch([Read(p, JOURNAL_LIMIT) for p in paths])
            self._boot_id = self.host.identity().boot_id if paths else None
        except HostError:
            return {}
        last: dict[str, _Attempt] = {}
        for path, reply in zip(paths, replies, strict=True):  # oldest first: later ones win
            if reply.error is not None:
                continue
            journal = store.file(path)
            try:
                contents = read_journal(journal, reply.data())
            except JournalError:
                continue
            boot_id = contents.identity.boot_id if contents.identity else None
            for entry in contents.entries:
                last[entry.check] = _Attempt(entry, journal.shown, boot_id)
        return last

    def _own(self, path: str) -> bool:
        """Whether ``path`` (under the host's root) is the run's journal: the same file of the
        host, or, for an xdist worker (which gets it as a file of this machine), the same
        file of this machine."""
        own = self.own_journal
        if own is None:
            return False
        if own.host is self.host:
            return own.path == path
        mine, theirs = own.host.local_path(own.path), self.host.local_path(path)
        return mine is not None and theirs is not None and \
            os.path.realpath(mine) == os.path.realpath(theirs)
