"""Opening a rollback: the journal to roll back on each target, its checks (newest change
first), the file pytest collects them from, and the fixer that restores them.

A container and its host were changed by one --fix (each change journaled on the machine it
changed), so the same targets roll back both: the container's newest journal, and its host's
journal of the same run (the two name the run's id; where the container has none, the host's
newest journal of a run that had the container as a target). Never simply the host's newest:
that may be another container's run since. The pair's newest run is rolled back: where the
host's newest journal of a run with the container is newer than the container's own newest
(a later run changed the host alone), that one, and the container's older journal is left for
a rollback of its own run. A target with no such journal (its side had nothing to change) is
left alone."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..checks import Check
from ..config.settings import Settings, SettingsError
from ..fix.run import rollback_fixer
from ..fix.state import JOURNAL_DIR, StateFile, StateStore
from ..host import HostError
from .containers import own_root
from .target import LOCAL, Target

if TYPE_CHECKING:
    from ..fix.journal import JournalContents


class OpenRollback(msgspec.Struct, frozen=True):
    checks: list[Check]
    anchor: Path
    """The file pytest collects the rollback's checks from (``_anchor``)."""
    copied: Path | None
    """The directory of the journal's copy made for the run, removed at its end."""


def open_rollbacks(settings: Settings, targets: list[Target]) -> dict[str, OpenRollback]:
    """Each target's rollback, by its name. A journal named (``--gpuhost-rollback=FILE``) is one
    target's: the run's first; else every target's newest, and a target that has none is
    left alone unless no target has one (the error of the first then says so)."""
    if settings.rollback and len([t for t in targets if t.address.implied is None]) > 1:
        raise SettingsError(f"--gpuhost-rollback={settings.rollback} names one target's journal: "
                            "name one --gpuhost-target, or leave the journal out to roll back "
                            "the newest journal of each target")
    chosen = targets[:1] if settings.rollback else targets
    older = [] if settings.rollback else [each for each in chosen
                                          if _host_ran_since(each, chosen)]
    opened: dict[str, OpenRollback] = {}
    nothing: list[SettingsError] = []
    try:  # the containers first: their hosts' journals are those of the containers' runs
        for target in sorted(chosen, key=lambda each: each.kernel_on is None):
            if target in older:  # its newest journal is of a run before its host's newest
                continue
            try:
                accept = None if settings.rollback else _pairing(target, chosen)
                opened[target.name] = open_rollback(settings, target, accept)
            except NothingToRollBack as exc:
                if len(chosen) == 1:
                    raise
                nothing.append(exc)
    except BaseException:
        for name in opened:  # the locks go with the run that failed
            fixer = next(t for t in targets if t.name == name).fixrun.fixer
            if fixer is not None:
                fixer.close()
        raise
    if not opened:
        raise nothing[0]
    return opened


def _host_ran_since(container: Target, chosen: list[Target]) -> bool:
    """Whether ``container``'s host holds a journal of a run that had the container as a
    target and is newer than the container's own newest journal (that run changed its host
    alone): the pair's newest run is then the host's, and the container's older journal is
    left for a rollback of its own run. Read before the locks: it only chooses; what is rolled
    back is read again under them."""
    from ..fix.journal import JournalError, latest_journal, read_journal

    host = container.kernel_on
    if host is None or host not in chosen:
        return False
    try:
        own = latest_journal(StateStore.of(container.host))
        if own is None:
            return False
        theirs = latest_journal(StateStore.of(host.host),
                                lambda journal: container.url in journal.containers)
        if theirs is None or _stamp(theirs) <= _stamp(own):
            return False
        run = read_journal(own).run
        return run is None or read_journal(theirs).run != run  # the same run: a pair
    except (JournalError, HostError):
        return False  # the rollback itself says why


def _stamp(journal: StateFile) -> str:
    """When a journal was begun, from its name (``20261202T143351Z-...``), to the second."""
    return journal.path.rsplit("/", 1)[-1][:16]


class NothingToRollBack(SettingsError):
    """A target whose journals are all rolled back already."""


Accept = Callable[["JournalContents"], bool]


def _pairing(host: Target, chosen: list[Target]) -> Accept | None:
    """Which of ``host``'s journals pairs with the containers of the rollback whose host it is
    (their journals were opened first): the one of their journals' run, or, for a container
    without one, of a run that had it as a target; None: no container of it, or one whose
    journal is older than run ids (its host's newest, as then)."""
    containers = [each for each in chosen if each.kernel_on is host]
    if not containers:
        return None
    journals = [each.fixrun.rollback for each in containers if each.fixrun.rollback]
    if any(journal.run is None for journal in journals):
        return None
    runs = {journal.run for journal in journals}
    if len(runs) > 1:
        names = ", ".join(f"{each.url} ({each.fixrun.rollback.shown})" for each in containers
                          if each.fixrun.rollback)
        raise SettingsError(f"--gpuhost-rollback: the newest journals of {names} are of "
                            f"different runs, and their host {host.name} has one journal per "
                            "run: roll each container back on its own (one --gpuhost-target)")
    if runs:
        run = runs.pop()
        return lambda journal: journal.run == run
    urls = {each.url for each in containers}
    return lambda journal: bool(urls & set(journal.containers))


def open_rollback(settings: Settings, target: Target,
                  accept: Accept | None = None) -> OpenRollback:
    """Read the journal to roll back and refuse one that is not this target's (or was written
    before its last reboot, unless --gpuhost-rollback-after-reboot); outside a dry run, the
    target's fixer restores the changes, journaling nothing. Everything is read under the
    target's locks, taken first (raises LockUnavailable while another run, or a command one
    started, holds them): a change whose command may still run is never judged."""
    if not settings.dry_run:  # under the target's locks before anything is read or judged
        try:
            target.fixrun.fixer = rollback_fixer(
                target.host, lock_timeout=settings.lock_timeout, nvml=target.nvml)
        except HostError as exc:  # the target cannot be reached
            raise SettingsError(f"--gpuhost-rollback: {exc}") from None
    try:
        return _read_rollback(settings, target, accept)
    except BaseException:
        if target.fixrun.fixer is not None:  # the locks go with the run that failed
            target.fixrun.fixer.close()
        raise


def _read_rollback(settings: Settings, target: Target, accept: Accept | None) -> OpenRollback:
    from ..fix.journal import JournalError, read_journal
    from ..fix.rollback import refuse_foreign, rollback_checks

    journal = _rollback_journal(settings, target, accept)
    try:
        contents = read_journal(journal)
        if not contents.entries:
            raise JournalError(f"{journal}: the journal records no change to roll back")
        if all(entry.restored for entry in contents.entries):
            raise JournalError(f"{journal}: every change it records was restored by an earlier "
                               "rollback; nothing is left to roll back")
        refuse_foreign(contents, target.host.identity(), after_reboot=settings.after_reboot)
        checks = rollback_checks(contents, _shown(settings, journal), target.nvml)
    except JournalError as exc:
        raise SettingsError(str(exc)) from None
    target.fixrun.rollback = contents
    anchor, copied = _anchor(journal)
    return OpenRollback(checks, anchor, copied)


def _rollback_journal(settings: Settings, target: Target, accept: Accept | None) -> StateFile:
    """The journal to roll back: the one named (a file of this machine for the local
    target; a name in the target's journal directory, or a path under its root, for a
    remote one), else the newest on the target with something to undo (that ``accept``
    takes: a container's host, the journal of the container's run)."""
    from ..fix.journal import JournalError, latest_journal

    option = settings.rollback
    store = StateStore.of(target.host)
    try:
        if option and target.url == LOCAL:
            journal: StateFile | None = StateFile.local(settings.invocation / option)
        elif option:
            path = option.lstrip("/") if "/" in option else f"{JOURNAL_DIR}/{option}"
            journal = store.file(path)
        else:
            journal = latest_journal(store, accept)
    except (JournalError, HostError) as exc:
        raise SettingsError(str(exc)) from None
    where = store.journal_dir if target.url == LOCAL else \
        f"{own_root(target.address).rstrip('/')}/{JOURNAL_DIR} of {target.name}"  # openable there
    if journal is None and accept is not None:
        raise NothingToRollBack(f"no journal of the containers' run to roll back under "
                                f"{where}: their host had nothing to change then")
    if journal is None:
        raise NothingToRollBack(f"no journal to roll back under {where} (every one "
                                "there is rolled back already); pass --gpuhost-rollback=FILE")
    try:
        found = journal.exists()
    except HostError as exc:
        raise SettingsError(f"--gpuhost-rollback: {exc}") from None
    if not found:
        raise SettingsError(f"--gpuhost-rollback={option}: no such journal ({journal})")
    return journal


def _local_path(journal: StateFile) -> Path | None:
    """The journal as a file of this machine, when it is one."""
    return journal.host.local_path(journal.path)


def _shown(settings: Settings, journal: StateFile) -> str:
    local = _local_path(journal)
    return settings.display(local) if local is not None else journal.shown


def _anchor(journal: StateFile) -> tuple[Path, Path | None]:
    """The file pytest collects the rollback's checks from: the journal itself on this
    machine, else a copy of it made for the run (the target's journal is what is read and
    closed), with the directory made for it."""
    local = _local_path(journal)
    if local is not None:
        return local, None
    directory = Path(tempfile.mkdtemp(prefix="pytest-gpuhost-rollback-"))
    copy = directory / journal.path.rsplit("/", 1)[-1]
    copy.write_bytes(journal.read())
    return copy, directory
