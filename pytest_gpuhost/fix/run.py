"""What a --fix run holds beyond its checks: the fixer with its journal and locks, and the
session-end work (persistence, closing a rollback's journal)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..result import CheckResult, Outcome
from .state import STATE_DIR as STATE_DIR  # re-exported
from .state import StateFile, StateStore

if TYPE_CHECKING:  # a verify run holds an empty FixRun: the fixer's modules load with a fix
    from ..gpu.nvml import NvmlSource
    from ..host import Host
    from .fixer import Fixer
    from .history import FixHistory
    from .journal import JournalContents

JOURNAL_KEY = "gpuhost_journal"
RUN_KEY = "gpuhost_run"
"""The run's id, from the controller to its xdist workers: every journal of the run names it."""


def new_run_id() -> str:
    """A run's id: its journals (a container's and its host's) name it, and a rollback pairs
    them by it."""
    import uuid

    return uuid.uuid4().hex


class FixRun(msgspec.Struct):
    fixer: Fixer | None
    """None in a dry run and when --fix is off."""
    journal_path: StateFile | None
    persist: bool
    rollback: JournalContents | None = None
    history: FixHistory | None = None
    """The host's earlier fixes, whose failures this run does not retry; None: retry all."""

    def journal_used(self) -> bool:
        """Whether the run's journal holds changes: written by this process, or (for a file
        of this machine, written by xdist workers) there. Reads no remote host."""
        if self.journal_path is None:
            return False
        writer = self.fixer.journal if self.fixer is not None else None
        if writer is not None and writer.written:
            return True
        local = self.journal_path.host.local_path(self.journal_path.path)
        return local is not None and local.exists()

    def journal_changes(self) -> int:
        """How many changes the run's journal holds that a rollback may undo (every one but
        those the host refused): this process's count, or, for a file of this machine that
        xdist workers wrote, the file's. Reads no remote host."""
        if self.journal_path is None:
            return 0
        writer = self.fixer.journal if self.fixer is not None else None
        if writer is not None and writer.written:
            return writer.made
        local = self.journal_path.host.local_path(self.journal_path.path)
        if local is None or not local.exists():
            return 0
        from .journal import FAILED, JournalError, read_journal

        try:
            return sum(entry.state != FAILED for entry in read_journal(local).entries)
        except JournalError:
            return 1  # a journal that cannot be read whole: the rollback itself says why


def make_fixer(host: Host, journal: StateFile | None, spec: str, *, worker: bool,
               distributing: bool, lock_timeout: float, nvml: NvmlSource | None,
               run: str | None = None, containers: Sequence[str] = ()) -> Fixer:
    """A worker serializes its fixes on the apply lock (its controller holds the run lock); a
    single process (or the one worker that runs every check of a remote target) takes the
    run lock at its first fix and holds it to the end. Both locks are on the host."""
    from .fixer import Fixer
    from .journal import Journal
    from .locking import RootLock

    store = StateStore.of(host)
    run_lock = None if worker else RootLock(store.file(f"{STATE_DIR}/run.lock"), "run")
    apply_lock = RootLock(store.file(f"{STATE_DIR}/apply.lock"), "apply") \
        if worker or distributing else None
    writer = None if journal is None else Journal(journal, spec, host.identity,
                                                  shared=worker or distributing, run=run,
                                                  containers=containers)
    return Fixer(host, writer, run_lock=run_lock, apply_lock=apply_lock,
                 lock_timeout=lock_timeout, nvml=nvml)


def rollback_fixer(host: Host, *, lock_timeout: float, nvml: NvmlSource | None) -> Fixer:
    """A rollback's fixer, holding the target's run lock and then its apply lock before the
    rollback chooses, reads or judges anything (raises LockUnavailable, naming the holder).

    While another run holds them its changes are still being made; and a command a run
    started holds them until it has ended, even after the run itself was killed (it inherits
    them: ``agent.Root.run``). A change judged meanwhile would pass as "never made" and the
    journal be closed, then the change land: so nothing is judged until both are had. The
    rollback journals nothing, and holds both to its end."""
    from .fixer import Fixer
    from .locking import RootLock

    store = StateStore.of(host)
    run_lock = RootLock(store.file(f"{STATE_DIR}/run.lock"), "run")
    apply_lock = RootLock(store.file(f"{STATE_DIR}/apply.lock"), "apply")
    run_lock.acquire(lock_timeout)
    try:
        apply_lock.acquire(lock_timeout)
    except BaseException:
        run_lock.release()
        raise
    return Fixer(host, None, run_lock=run_lock, apply_lock=None, lock_timeout=lock_timeout,
                 nvml=nvml, held=(apply_lock,))


def default_journal(host: Host, option: Path | None, spec: str,
                    workerinput: Mapping[str, object] | None) -> StateFile:
    """The run's journal: the one the controller chose (an xdist worker), the file named by
    --gpuhost-journal (on this machine), or a new one on the host."""
    if workerinput is not None and JOURNAL_KEY in workerinput:
        return StateFile.local(Path(str(workerinput[JOURNAL_KEY])))
    if option is not None:
        return StateFile.local(option)
    return StateStore.of(host).new_journal(spec)


def close_rollback(journal: JournalContents, results: Sequence[CheckResult]) -> bool:
    """Mark the journal rolled back when every change is back to its original: each that an
    earlier rollback did not restore has a record, and each passed or was fixed. Else the
    changes that are back are written down as restored, so that a rerun finishes the rest."""
    from .journal import Journal
    from .rollback import undo_id

    back = {r.id for r in results if r.outcome in (Outcome.FIXED, Outcome.PASSED)}
    left = [(number, entry) for number, entry in enumerate(journal.entries, 1)
            if not entry.restored]
    writer = Journal(journal.location, "rollback")
    if any(undo_id(number, entry) not in back for number, entry in left):
        # a change not back, or one never judged (an interrupted run)
        writer.restored([entry.id for number, entry in left
                         if undo_id(number, entry) in back])
        return False
    restored = sum(r.outcome is Outcome.FIXED for r in results)
    writer.close_rollback(restored, failed=0)
    return True
