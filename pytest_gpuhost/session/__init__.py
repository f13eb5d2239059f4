"""The gpuhost part of a run, without pytest: load the specs, expand them on each target, run
one check, the persistence files of a target's records, closing a rollback, and the run's
information for the reporters.

The plugin (``plugin/``) is a thin layer of hooks over this; the tests and the benchmarks use
it directly. Reads are batched by phase: expanding a spec reads every kind's facts in one batch,
and before a check runs, the observations of every pending check of its rank are read in one
batch (``CachedHost``); anything changed through the host makes the next read live. One
machine of the run is a ``Target`` (``target.py``); opening a rollback is ``rollback.py``.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..checks import (
    Check,
    Fact,
    Kind,
    NoFix,
    Observation,
    owned,
    persistence_of,
    persists_to_of,
)
from ..checks.conditions import ConditionFn
from ..checks.gpus import GPUS
from ..engine import RunOptions
from ..fix.run import close_rollback, default_journal, make_fixer
from ..gpu.nvml import NvmlFactory
from ..host import Host, HostError, doing, raised
from ..result import CheckResult
from ..settings import Settings, SettingsError
from ..spec import EntryOptions, Spec, load_spec
from ..spec.matchers import Verdict
from .target import HOST_FACTS, LOCAL, HostFacts, Target, UnreachableHost

if TYPE_CHECKING:  # a rollback's, persistence's and a capture's modules load when used
    from ..capture.writer import SpecCapture
    from ..fix.journal import JournalContents
    from ..reports import ReportRun
    from ..targets import TargetAddress

__all__ = ["HOST_FACTS", "LOCAL", "HostFacts", "Session", "Target", "UnreachableHost"]


class Unexpanded(msgspec.Struct, frozen=True):
    """The expectation of a section that could not be expanded: it never passes."""

    section: str

    def describe(self) -> str:
        return f"the {self.section} checks"

    def judge(self, observed: str | None) -> Verdict:
        return Verdict(False, f"the {self.section} section could not be expanded")

    def fix_value(self, observed: str | None) -> str | None:
        return None


class Unexpandable(NoFix, msgspec.Struct, frozen=True):
    """A section whose facts could not be read: its one check is an error with the reason."""

    error: HostError

    def observe(self, host: Host) -> Observation:
        raise raised(self.error)


class Session(msgspec.Struct, dict=True):
    """One pytest process's gpuhost run."""

    settings: Settings
    kinds: Mapping[str, Kind]
    conditions: Mapping[str, ConditionFn]
    make_host: Callable[[TargetAddress, Settings], Host]
    nvml_for: Callable[[Host], NvmlFactory]
    shared_dir: Path | None = None
    workerinput: Mapping[str, object] | None = None
    specs: dict[Path, Spec] = msgspec.field(default_factory=dict)
    targets: dict[str, Target] = msgspec.field(default_factory=dict)
    rollback_checks: list[Check] = msgspec.field(default_factory=list)
    rollback_file: Path | None = None
    """The file pytest collects a rollback's checks from (see ``_anchor``)."""
    own: frozenset[str] | None = None
    """The remote targets this process collects and runs (an xdist worker's share, which its
    controller gave it: ``plugin/distributing.py``); None: every target."""
    concurrency: int | None = None
    """Remote targets this process connects to at once; None: --gpuhost-connect-concurrency."""
    _cleanup: list[Path] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        for path in self.settings.specs:
            self.specs[path] = load_spec(path, self.kinds, self.conditions,
                                         display=self.settings.display)
        for url in self.settings.targets:
            host = self.make_host(url, self.settings)
            target = Target(url.name, host, self.settings, self.conditions, self.nvml_for,
                            self.shared_dir, url=url.url)
            if url.error is not None:  # an inventory host Ansible could not resolve
                target.lose(HostError(url.error))
            self.targets[url.name] = target
        if self.settings.capture is not None:
            self.capture_target()  # an unknown --gpuhost-capture-from: before anything runs
        if self.settings.rollback is not None:
            self._open_rollback(self.target)
        elif self.settings.fix and not self.settings.dry_run:
            for target in self.targets.values():
                try:
                    with doing("opening the journal"):
                        self._open_fixer(target)
                except HostError as exc:  # cannot be reached: its checks are errors saying so
                    target.lose(exc)
        if self.settings.fix and self.settings.rollback is None and not self.settings.fix_retry:
            from ..fix.history import FixHistory

            for target in self.targets.values():
                target.fixrun.history = FixHistory(target.host, target.fixrun.journal_path)

    @functools.cached_property
    def options(self) -> RunOptions:
        return RunOptions(fix=self.settings.fix, dry_run=self.settings.dry_run,
                          persist=self.settings.persist,
                          simulate=self.settings.dry_run and self.settings.rollback is not None)

    @property
    def spec_name(self) -> str:
        return next(iter(self.specs.values())).name if self.specs else "rollback"

    @property
    def target(self) -> Target:
        """The run's first target: the only one, unless --gpuhost-target named several."""
        return next(iter(self.targets.values()))

    @functools.cached_property
    def named(self) -> bool:
        """Whether ids and records name their target (any target but the one local one)."""
        return self.settings.remote

    def _open_fixer(self, target: Target) -> None:
        """The target's fixer, journal and locks, all on the target. On the controller of an
        xdist run, the local target's journal is chosen here and handed to the workers, which
        take the apply lock while the controller holds the run lock; a remote target's checks
        all run on one worker, which takes that target's run lock itself."""
        settings = self.settings
        local = target.url == LOCAL
        if settings.journal is not None and not local:
            raise SettingsError("--gpuhost-journal names a file of this machine, but a remote "
                                "target keeps its journal on itself: drop --gpuhost-journal")
        journal = default_journal(target.host, settings.journal, self.spec_name,
                                  self.workerinput if local else None)
        target.fixrun.journal_path = journal
        target.fixrun.fixer = make_fixer(
            target.host, journal, self.spec_name,
            worker=self.workerinput is not None and local,
            distributing=settings.distributing and local,
            lock_timeout=settings.lock_timeout, nvml=target.nvml)

    def _open_rollback(self, target: Target) -> None:
        from .rollback import open_rollback

        if len(self.targets) > 1:
            raise SettingsError("--gpuhost-rollback restores one target's journal: name one "
                                "--gpuhost-target")
        opened = open_rollback(self.settings, target)
        self.rollback_checks = opened.checks
        self.rollback_file = opened.anchor
        if opened.copied is not None:
            self._cleanup.append(opened.copied)

    @property
    def rollback(self) -> JournalContents | None:
        return self.target.fixrun.rollback

    # -- phases -----------------------------------------------------------------------------

    def expand(self, spec: Spec, target: Target | None = None) -> list[Check]:
        """Every check of ``spec`` on the target: the facts of all its kinds in one batch."""
        target = target or self.target
        target.collect_facts(self.facts_of(spec), self.shared_dir)
        checks: list[Check] = []
        for section, model in spec.sections.items():
            try:
                with doing("collecting facts"):
                    kind = self.kinds[section]
                    checks += owned(kind, section, kind.expand(model, target.facts))
            except HostError as exc:  # a fact this kind needs cannot be read: one error
                checks.append(Check(section, None, Unexpanded(section),
                                    EntryOptions(where=f"{self.settings.display(spec.path)}:1"),
                                    Unexpandable(exc)))
        if not self.settings.catalog:
            return checks
        from ..capture.catalog import observe_only

        return [observe_only(c) for c in checks]

    def collects(self, target: Target) -> bool:
        """Whether this process collects (and runs) ``target``: this machine always, a remote
        target when it is this process's own (``own``)."""
        return self.own is None or target.url == LOCAL or target.name in self.own

    def collect_remote_facts(self) -> None:
        """The first batch of collection (every spec's facts) from every remote target this
        process collects, ``concurrency`` connections at a time: connecting is most of a
        remote target's time, and one target's wait no longer holds up the others. Expansion
        then reads from the cache."""
        remote = [t for t in self.targets.values()
                  if t.url != LOCAL and t.unreachable is None and self.collects(t)]
        room_for_sessions(len(remote))
        if len(remote) < 2 or not self.specs:
            return
        facts = list(dict.fromkeys(f for spec in self.specs.values() for f in self.facts_of(spec)))
        from concurrent.futures import ThreadPoolExecutor  # remote targets only

        at_once = self.concurrency or self.settings.connect_concurrency
        with ThreadPoolExecutor(min(at_once, len(remote)),
                                thread_name_prefix="gpuhost-collect") as pool:
            for _ in pool.map(lambda target: target.collect_facts(facts, self.shared_dir),
                              remote):
                pass

    def export_collection(self) -> dict[str, object]:
        """Collect every remote target here, once, for xdist's workers (``seed``): they then
        expand the same checks without connecting (each connects only to the targets it runs)
        and cannot disagree on what they collected. The connections made here are ended."""
        self.collect_remote_facts()
        remote = [t for t in self.targets.values() if t.url != LOCAL]
        for spec in self.specs.values():
            for target in remote:
                self.expand(spec, target)
        exported: dict[str, object] = {}
        for target in remote:
            exported[target.name] = target.export()
            target.disconnect()
        return exported

    def seed(self, collected: Mapping[str, Any]) -> None:
        """Start each remote target from what the xdist controller collected of it."""
        room_for_sessions(sum(1 for t in self.targets.values() if t.url != LOCAL))
        for name, record in collected.items():
            target = self.targets.get(name)
            if target is not None and target.url != LOCAL:
                target.seed(record)

    def facts_of(self, spec: Spec) -> list[Fact[Any]]:
        """The facts the expansion of ``spec`` reads, for one batch."""
        facts: list[Fact[Any]] = [HOST_FACTS, GPUS]
        for section, model in spec.sections.items():
            facts += getattr(self.kinds[section], "facts", lambda _: ())(model)
        return facts

    def run(self, check: Check, target: Target | None = None) -> CheckResult:
        """Raises only LockUnavailable; every other outcome is the record."""
        return (target or self.target).run(check, self.options, named=self.named)

    # -- persistence ------------------------------------------------------------------------

    @property
    def persisting(self) -> bool:
        """--fix-persist: each target's persistence files are checks of their own, ranked last."""
        return self.settings.persist and bool(self.specs) and self.settings.rollback is None

    def _persisted(self) -> tuple[Spec, str]:
        spec = next(iter(self.specs.values()))  # --fix-persist runs with one spec
        return spec, self.settings.display(spec.path)

    def persistence_files(self, checks: Sequence[Check]) -> list[Check]:
        """The check of each file --fix-persist may write for one target's ``checks``, as
        collected: what it holds is known at its turn (``persistence_checks``)."""
        from ..fix.persist import candidate_files, pending_check

        spec, source = self._persisted()

        def targets_of(check: Check) -> Sequence[str]:
            kind = self.kinds.get(check.owner)
            return persists_to_of(kind)(check) if kind is not None else ()

        return [pending_check(path, source)
                for path in candidate_files(spec.name, checks, targets_of)]

    def persistence_checks(self, target: Target, results: Sequence[CheckResult]
                           ) -> dict[str, Check]:
        """File -> its check, from the target's own records at the end of its run (a file
        with nothing to hold has none)."""
        from ..fix.persist import persistence_checks

        spec, source = self._persisted()
        supplies = [supply for supply in map(persistence_of, self.kinds.values()) if supply]
        with doing("reading what the persistence files hold"):
            checks = persistence_checks(spec.name, source, results, target.host, supplies)
        return {str(check.key): check for check in checks}

    def finish(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """Without pytest (the tests' and benchmarks' drivers): each target's persistence
        files written at the end, from that target's own records."""
        if not self.persisting:
            return []
        done: list[CheckResult] = []
        for target in self.targets.values():
            mine = [r for r in results if not self.named or r.target == target.name]
            done += [target.run(check, self.options, named=self.named)
                     for check in self.persistence_checks(target, mine).values()]
        return done

    def capture_target(self) -> Target:
        """The target --gpuhost-capture writes down: --gpuhost-capture-from, else the only one."""
        from ..capture.writer import pick_target

        try:
            return self.targets[pick_target(list(self.targets), self.settings.capture_from)]
        except ValueError as exc:
            raise SettingsError(str(exc)) from None

    def capture_reporter(self, command: str) -> SpecCapture:
        """The reporter that writes the captured spec, with what the target says of itself."""
        from ..capture.writer import Source, SpecCapture

        settings = self.settings
        assert settings.capture is not None
        target = self.capture_target()
        facts = target.host_facts()
        shown = [(settings.display(path), spec) for path, spec in self.specs.items()]
        keys = "the built-in catalog" if settings.catalog else ", ".join(s for s, _ in shown)
        source = Source(target.name, facts.hostname, facts.kernel, facts.driver,
                        facts.gpu_models, len(facts.gpus), command, keys)
        return SpecCapture(settings.capture, settings.capture_shown,
                           overwrite=settings.capture_overwrite, specs=shown, source=source,
                           parsers=self.kinds, conditions=self.conditions)

    def close_rollback(self, results: Sequence[CheckResult]) -> bool:
        contents = self.rollback
        assert contents is not None
        return close_rollback(contents, results)

    def close(self) -> None:
        """The end of the run: connections closed, temporary copies removed, and the specs'
        models and the read caches let go."""
        for target in self.targets.values():
            target.close()
        for directory in self._cleanup:
            shutil.rmtree(directory, ignore_errors=True)
        self.specs.clear()


def capture_report(path: Path, run: ReportRun) -> SpecCapture:
    """--gpuhost-capture's reporter (``reports.REPORTS``), with the run's command line."""
    session: Session = run.session
    return session.capture_reporter(run.command)


FILES_PER_SESSION = 3
"""An agent session held open costs this process three file descriptors (the ssh client's
stdin, stdout and stderr pipes)."""
FILES_SPARE = 256
"""What pytest, xdist, the reports and a fix's journal may hold open besides."""


def room_for_sessions(sessions: int) -> None:
    """Raise this process's soft limit on open files toward its hard limit where ``sessions``
    held at once would not fit (a common soft limit of 1024 holds some 250 targets), never
    lowering it: a large fleet runs instead of its last targets failing to start ssh."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = sessions * FILES_PER_SESSION + FILES_SPARE
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
