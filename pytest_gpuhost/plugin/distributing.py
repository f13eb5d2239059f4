"""An xdist controller's side of a gpuhost run (registered only when it distributes,
``start.py``, as pytest-xdist's own ``DSession``): the directory its workers share, the run
lock held for them, which worker collects and runs which remote target, each target's checks
sent to one worker (``scheduling.py``), and the checks each worker collected counted in the
record book.

With remote targets and xdist's default distribution (``load``, or ``loadscope``), the remote
targets are shared out among the workers before they start: each worker connects to its own
(a share of --gpuhost-connect-concurrency at a time), collects them, runs their checks over
that same agent session and ends it after the last. The controller connects to none: one
login and one agent session a target, and a worker starts on its targets as soon as it has
collected them. A worker that goes down hands the targets it had not finished to the worker
that replaces it. With any other distribution (``--dist each``, ``loadfile``...) or a
capture, every worker must collect every target: the controller collects each once, for all
of them (``session.collecting.export_collection``), and each worker expands from that,
connecting only to run its targets' checks.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest

from ..files import write_atomically
from ..fix import LockUnavailable
from ..fix.run import JOURNAL_KEY, RUN_KEY
from ..result import CheckResult
from ..session.collecting import export_collection
from .run import refuse_before_changes
from .scheduling import TargetScheduling, target_scope
from .workers import (
    COLLECTED,
    CONCURRENCY_KEY,
    CONTROLLER,
    OWN_KEY,
    SSH_MASTERS_KEY,
    WORKERINPUT_KEY,
    DoneLog,
    Progress,
)

if TYPE_CHECKING:
    from ..config.settings import Settings
    from .book import RecordBook
    from .run import Run

DISTRIBUTIONS = ("load", "loadscope")
"""xdist's distributions a run with targets replaces with its own scheduler."""


def by_target(config: pytest.Config, settings: Settings) -> bool:
    """Whether the workers collect their own remote targets (the controller connects to none):
    xdist's default distribution, a run with targets, no capture (whose writer, on the
    controller, needs the target's facts), and no container whose kernel checks run on its
    host (a pair's checks are placed across both targets: the controller collects them once,
    as under --dist loadfile), and no --fix: a run that may change something is collected here
    first, so that a setting with two owners is refused before any worker changes anything
    (``session/owners.py``)."""
    return settings.remote and bool(settings.specs) and settings.capture is None and \
        not settings.fix and \
        getattr(config.option, "dist", "no") in DISTRIBUTIONS and \
        not any(target.kernel_on for target in settings.targets)


def shares(total: int, workers: int) -> list[int]:
    """--gpuhost-connect-concurrency split among the workers, at least one each."""
    return [max(1, total // workers + (1 if number < total % workers else 0))
            for number in range(workers)]


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


def share(config: pytest.Config, settings: Settings) -> tuple[SharedDirectory, Settings]:
    """The directory the workers will share, with the targets as resolved here; where a
    worker's ssh session rides on a connection another process made (the controller's
    collection), the directory of their OpenSSH masters too."""
    from ..config.settings import target_record
    from .workers import TARGETS_KEY

    shared = SharedDirectory({TARGETS_KEY: [target_record(t) for t in settings.targets]})
    if any(target.scheme == "ssh" for target in settings.targets) and \
            not by_target(config, settings):  # else one agent session a target: no master
        settings = msgspec.structs.replace(settings, ssh_masters=shared.ssh_masters())
    return shared, settings


class Distributing:
    def __init__(self, run: Run, book: RecordBook) -> None:
        self.run = run
        self.book = book
        assert run.shared is not None
        self.shared: SharedDirectory = run.shared
        self.targeted = by_target(run.config, run.settings)
        """The workers collect their own remote targets (see the module's docstring)."""
        self.remote = [name for name, target in run.session.targets.items()
                       if target.url != "local"]
        self.owners: dict[Any, tuple[list[str], int]] = {}
        """Worker -> the remote targets it collects and runs, and how many at once."""
        self.collected: set[str] = set()
        """The remote targets some worker collected (under the target scheduler)."""
        self.lost: dict[str, str] = {}
        """A remote target not collected -> how the last worker given it ended."""
        self.orphans: list[tuple[list[str], int]] = []
        """The unfinished targets of workers that went down, for their replacements."""
        self.started = 0
        self.awaiting: set[Any] = set()
        """Workers started that have not sent their collection, nor gone down."""
        self.scheduler: TargetScheduling | None = None
        self.pytest_session: pytest.Session | None = None

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
        self.shared.extra[RUN_KEY] = session.run_id  # every journal of the run names it
        self.run.config.pluginmanager.register(self.shared, "gpuhost-shared-dir")
        from .dead_workers import DeadWorkerSends

        self.run.config.pluginmanager.register(DeadWorkerSends(), "gpuhost-dead-worker-sends")
        from .worker_signals import WorkerSignals

        self.run.config.pluginmanager.register(WorkerSignals(), "gpuhost-worker-signals")
        fixer = fixrun.fixer if fixrun is not None else None
        if fixer is not None and fixer.run_lock is not None:
            try:  # before any worker starts: the workers' fixes run under this run's lock
                fixer.run_lock.acquire(self.run.settings.lock_timeout)
            except LockUnavailable as exc:
                pytest.exit(str(exc), returncode=pytest.ExitCode.INTERRUPTED)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before the workers start (xdist starts them last): where the workers do not collect
        their own targets, collect every remote target here, once, in parallel, for them."""
        self.pytest_session = session
        if self.run.session.named and self.run.session.specs and not self.targeted:
            self.shared.share_collection(export_collection(self.run.session))
        if not self.targeted:  # every target collected here: refused before a worker starts
            refuse_before_changes(self.run.session)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """A worker starts: its own remote targets (every Nth, or those of the worker it
        replaces that were not finished) and its share of the connections."""
        self.awaiting.add(node)
        if not self.targeted:
            return
        if self.orphans:
            own, at_once = self.orphans.pop(0)
        else:
            from xdist.workermanage import parse_tx_spec_config

            workers = len(parse_tx_spec_config(self.run.config))
            number = self.started % workers
            self.started += 1
            own = self.remote[number::workers]
            at_once = shares(self.run.settings.connect_concurrency, workers)[number]
        self.owners[node] = (own, at_once)
        node.workerinput[OWN_KEY] = own
        node.workerinput[CONCURRENCY_KEY] = at_once

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        """A worker that went down leaves its unfinished targets to its replacement."""
        self.awaiting.discard(node)
        owned = self.owners.pop(node, None)
        if owned is not None:
            worker = getattr(getattr(node, "gateway", None), "id", "?")
            ended = (f"worker {worker} crashed: {error}" if error is not None else
                     f"xdist ended worker {worker} before it took its collection")
            self.lost.update((name, ended) for name in owned[0] if name not in self.collected)
        if error is None or owned is None:
            return
        finished = self.scheduler.finished_scopes() if self.scheduler is not None else set()
        joined = self.scheduler.joined if self.scheduler is not None else {}
        self.orphans.append(([name for name in owned[0]
                              if target_scope(joined.get(name, name)) not in finished],
                             owned[1]))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        """With targets, each target's checks go to one worker (``scheduling.py``), a
        container's with its host's."""
        if not self.run.session.named or getattr(config.option, "dist", "load") not in \
                DISTRIBUTIONS:
            return None
        from xdist.workermanage import parse_tx_spec_config

        from ..session.containers import kernel_target

        joined = {name: kernel_target(target).name  # a container's checks: its host's unit
                  for name, target in self.run.session.targets.items()
                  if kernel_target(target) is not target}
        self.scheduler = TargetScheduling(len(parse_tx_spec_config(config)),
                                          lambda: bool(self.awaiting), self._counted, log,
                                          joined=joined)
        return self.scheduler

    def _counted(self, count: int) -> None:
        """The run's tests, every worker's collection together (xdist counts one's)."""
        if self.pytest_session is not None:
            self.pytest_session.testscollected = count

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: Sequence[str]) -> None:
        """The checks a worker collected, so that one whose worker died before reporting it
        still counts (as an error) in every report."""
        self.awaiting.discard(node)
        owned = self.owners.get(node)
        if owned is not None:
            self.collected.update(owned[0])
        files = {self.run.spec_file_id(path) for path in self.run.session.specs}
        self.book.expect(nodeid for nodeid in ids if nodeid.split("::", 1)[0] in files)

    def uncollected(self) -> list[tuple[str, str | None]]:
        """The remote targets no worker collected, each with how the last worker given it
        ended (None: not known): each worker given them (the first, then each replacement)
        went down before it sent its collection, or xdist ended it, and started no other. No
        record of their checks ever comes."""
        if not self.targeted:
            return []
        return [(name, self.lost.get(name)) for name in self.remote if name not in self.collected]

    def cut_short(self) -> dict[str, tuple[int, CheckResult]]:
        """nodeid -> (index, record) of each check whose fix an interrupt cut short on a
        worker, as its log says (read after the workers' reports were drained)."""
        return {nodeid: (index, CheckResult.from_dict(record)) for nodeid, (index, record)
                in self.progress().cut_short.items()}

    def progress(self) -> Progress:
        """What the workers' logs say they started and finished, and which went down."""
        return DoneLog(self.shared.path, CONTROLLER).read()
