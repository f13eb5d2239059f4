"""An xdist controller's side of a gpuhost run (registered only when it distributes,
``start.py``, as pytest-xdist's own ``DSession``): the directory its workers share, the run
lock held for them, the remote targets collected once for all of them, each target's checks
sent to one worker, and the checks each worker collected counted in the record book.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ..files import write_atomically
from ..fix.locking import LockUnavailable
from ..fix.run import JOURNAL_KEY
from .workers import (
    COLLECTED,
    CONTROLLER,
    SSH_MASTERS_KEY,
    WORKERINPUT_KEY,
    DoneLog,
    Progress,
)

if TYPE_CHECKING:
    from .book import RecordBook
    from .start import Run


class SharedDirectory:
    """Controller side: make the directory, pass it and ``extra`` values such as the run's
    journal to every worker, and record each worker that goes down."""

    def __init__(self, extra: dict[str, object] | None = None) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="pytest-gpuhost-"))
        self.extra = dict(extra or {})

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[WORKERINPUT_KEY] = str(self.path)
        node.workerinput.update(self.extra)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        if error is not None:
            worker = node.gateway.id
            write_atomically(self.path / f"down-{worker}", f"worker {worker} crashed: {error}")

    def ssh_masters(self) -> Path | None:
        """Where the run's ssh targets keep their master connections (None: too long a path
        for a socket); the workers are told."""
        from ..host.remote import masters_directory

        directory = masters_directory(self.path)
        if directory is not None:
            self.extra[SSH_MASTERS_KEY] = str(directory)
        return directory

    def pytest_unconfigure(self) -> None:
        if (self.path / "ssh").is_dir():  # ssh targets' masters (a local run loads no ssh code)
            from ..host.remote import end_masters

            end_masters(self.path / "ssh")
        shutil.rmtree(self.path, ignore_errors=True)

    def share_collection(self, collected: dict[str, object]) -> None:
        """Hand the workers what the controller collected (before they start)."""
        write_atomically(self.path / COLLECTED, json.dumps(collected, separators=(",", ":")),
                         mode=0o600)


class Distributing:
    def __init__(self, run: Run, book: RecordBook) -> None:
        self.run = run
        self.book = book
        assert run.shared is not None
        self.shared: SharedDirectory = run.shared

    def start(self) -> None:
        """At configure, before any worker starts: this machine's target, wherever it is in
        the list, has its workers share the journal chosen here and fix under the run lock
        held here. A remote target's one worker takes that target's run lock itself (held
        here, it would lock its own run out)."""
        session = self.run.session
        local = next((t for t in session.targets.values() if t.url == "local"), None)
        fixrun = local.fixrun if local is not None else None
        journal = fixrun.journal_path if fixrun is not None else None
        if journal is not None:
            self.shared.extra[JOURNAL_KEY] = str(journal)
        self.run.config.pluginmanager.register(self.shared, "gpuhost-shared-dir")
        from .dead_workers import DeadWorkerSends

        self.run.config.pluginmanager.register(DeadWorkerSends(), "gpuhost-dead-worker-sends")
        fixer = fixrun.fixer if fixrun is not None else None
        if fixer is not None and fixer.run_lock is not None:
            try:  # before any worker starts: the workers' fixes run under this run's lock
                fixer.run_lock.acquire(self.run.settings.lock_timeout)
            except LockUnavailable as exc:
                pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """With remote targets, before the workers start (xdist starts them last): collect
        every remote target once, in parallel, for all the workers."""
        if self.run.session.named and self.run.session.specs:
            self.shared.share_collection(self.run.session.export_collection())

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """With remote or several targets, each target's checks go to one worker."""
        if not self.run.session.named or getattr(config.option, "dist", "load") not in (
                "load", "loadscope"):
            return None
        return make_target_scheduler(config, log)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        """The checks a worker collected, so that one whose worker died before reporting it
        still counts (as an error) in every report."""
        files = {self.run.spec_file_id(path) for path in self.run.session.specs}
        self.book.expect(nodeid for nodeid in ids if nodeid.split("::", 1)[0] in files)

    def progress(self) -> Progress:
        """What the workers' logs say they started and finished, and which went down (a
        check's position in the book's ``collected`` is its index there)."""
        return DoneLog(self.shared.path, CONTROLLER).read()


def target_of(nodeid: str) -> str | None:
    """The target an id names (``spec.yaml::sysctl[vm.swappiness]@pve`` -> ``pve``)."""
    name = nodeid.rsplit("::", 1)[-1]
    head, at, target = name.rpartition("@")
    if not at or not head or "]" in target or "[" in target:
        return None
    return target


def make_target_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduling with every check of one target in one scope: one worker runs
    them all, in order, over one connection; other tests are grouped by module as
    ``--dist loadscope`` groups them. (``--dist loadgroup`` does not group on pytest 9.2.)"""
    from xdist.scheduler import LoadScopeScheduling

    class TargetScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist is untyped
        def _split_scope(self, nodeid: str) -> str:
            target = target_of(nodeid)
            if target is not None:
                return f"gpuhost target {target}"
            return str(super()._split_scope(nodeid))

    return TargetScheduling(config, log)
