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

from ..checks import Check, Fact, Kind, facts_of, owned
from ..checks.conditions import ConditionFn
from ..checks.gpus import GPUS
from ..config.settings import Settings, SettingsError
from ..engine import RunOptions
from ..fix.run import RUN_KEY, close_rollback, default_journal, make_fixer, new_run_id
from ..gpu.nvml import NvmlFactory
from ..host import Host, HostError, doing
from ..result import CheckResult
from ..specmodel import EntryOptions, Spec
from ..specmodel.cache import load_spec_cached
from .containers import CONTAINER
from .limits import FILES_PER_SESSION as FILES_PER_SESSION  # re-exported
from .limits import FILES_SPARE as FILES_SPARE  # re-exported
from .target import HOST_FACTS, LOCAL, HostFacts, Target

if TYPE_CHECKING:  # a rollback's, persistence's and a capture's modules load when used
    from ..capture.writer import SpecCapture
    from ..config.targets import TargetAddress
    from ..fix.journal import JournalContents
    from .capturing import capture_report as capture_report
    from .rollback import OpenRollback
    from .unreachable import UnreachableHost as UnreachableHost

__all__ = ["HOST_FACTS", "LOCAL", "HostFacts", "Session", "Target", "UnreachableHost"]

_LAZY = {"capture_report": ".capturing", "UnreachableHost": ".unreachable"}
"""Re-exported, imported on first use: ``capture_report`` (``reports.REPORTS`` names it here)
is a capture's, ``UnreachableHost`` a lost target's; a verify run that needs neither loads
neither module."""


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    rollbacks: dict[str, OpenRollback] = msgspec.field(default_factory=dict)
    """Each target's rollback under --gpuhost-rollback (a target with nothing to roll back has
    none): its checks and the file pytest collects them from."""
    rollback_closed: dict[str, bool] = msgspec.field(default_factory=dict)
    """Each rolled back journal closed at the end (every change of it back), by target."""
    own: frozenset[str] | None = None
    """The remote targets this process collects and runs (an xdist worker's share, which its
    controller gave it: ``plugin/distributing.py``); None: every target."""
    concurrency: int | None = None
    """Remote targets this process connects to at once; None: --gpuhost-connect-concurrency."""
    spec_cache: Path | None = None
    """Where parsed specs are kept between runs (``spec/cache.py``); None: parsed each run."""
    run_id: str = ""
    """The run's id, in every journal it writes (an xdist worker's: its controller's)."""
    _cleanup: list[Path] = msgspec.field(default_factory=list)
    _expanded: dict[tuple[Path, str], list[Check]] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.run_id:
            given = (self.workerinput or {}).get(RUN_KEY)
            self.run_id = str(given) if given else new_run_id()
        for path in self.settings.specs:
            self.specs[path] = load_spec_cached(self.spec_cache, path, self.kinds,
                                                self.conditions, display=self.settings.display)
        self._ssh_masters()
        for url in self.settings.targets:
            host = self.make_host(url, self.settings)
            target = Target(url.name, host, self.settings, self.conditions, self.nvml_for,
                            self.shared_dir, url=url.url, address=url)
            if url.error is not None:  # an inventory host Ansible could not resolve
                target.lose(HostError(url.error))
            self.targets[url.name] = target
        for target in self.targets.values():
            if target.address.kernel_on is not None:
                target.kernel_on = self.targets[target.address.kernel_on]
        if self.settings.capture is not None:
            from .capturing import capture_target

            capture_target(self)  # an unknown --gpuhost-capture-from: before anything runs
        if self.settings.rollback is not None:
            self._open_rollbacks()
            return
        for target in self.targets.values():
            if not target.dormant:
                self._prepare_fix(target)

    def _prepare_fix(self, target: Target) -> None:
        """Under --fix: the target's fixer and journal, and its earlier fixes (not retried)."""
        if self.settings.fix and not self.settings.dry_run:
            try:
                with doing("opening the journal"):
                    self._open_fixer(target)
            except HostError as exc:  # cannot be reached: its checks are errors saying so
                target.lose(exc)
        if self.settings.fix and not self.settings.fix_retry:
            from ..fix.history import FixHistory

            target.fixrun.history = FixHistory(target.host, target.fixrun.journal_path)

    def wake(self, target: Target) -> None:
        """A target the run added as a host gets its first check: from now on it is a target
        like the others (its journal, its place in the reports)."""
        if target.dormant:
            target.dormant = False
            if self.settings.rollback is None:
                self._prepare_fix(target)

    def _ssh_masters(self) -> None:
        """A container reached over ssh and its host share one ssh connection (a master whose
        sessions both ride on): a directory of control sockets for the run, where xdist's has
        none, removed at its end."""
        if self.settings.ssh_masters is not None or not any(
                t.scheme == "ssh" and t.kernel_on is not None for t in self.settings.targets):
            return
        import tempfile

        from ..host.ssh import masters_directory

        directory = Path(tempfile.mkdtemp(prefix="gpuhost-"))
        self._cleanup.append(directory)
        masters = masters_directory(directory)
        if masters is not None:
            self.settings = msgspec.structs.replace(self.settings, ssh_masters=masters)

    @functools.cached_property
    def options(self) -> RunOptions:
        return RunOptions(fix=self.settings.fix, dry_run=self.settings.dry_run,
                          persist=self.settings.persist,
                          simulate=self.settings.dry_run and self.settings.rollback is not None)

    @property
    def spec_name(self) -> str:
        return next(iter(self.specs.values())).name if self.specs else "rollback"

    def specs_of(self, target: Target) -> list[Spec]:
        """The specs ``target`` runs (its own, else the run's; none for an added host)."""
        return [self.specs[path.resolve()] for path in self.settings.specs_of(target.address)
                if path.resolve() in self.specs]

    def runs(self, spec: Spec) -> list[Target]:
        """The targets that run ``spec``."""
        return [target for target in self.targets.values()
                if any(own is spec for own in self.specs_of(target))]

    def _journal_name(self, target: Target) -> str:
        """The spec a target's journal is named after: its own, else the run's first."""
        own = self.specs_of(target)
        return own[0].name if own else self.spec_name

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
        journal = default_journal(target.host, settings.journal, self._journal_name(target),
                                  self.workerinput if local else None)
        target.fixrun.journal_path = journal
        target.fixrun.fixer = make_fixer(
            target.host, journal, self._journal_name(target),
            worker=self.workerinput is not None and local,
            distributing=settings.distributing and local,
            lock_timeout=settings.lock_timeout, nvml=target.nvml, run=self.run_id,
            containers=[each.url for each in self.targets.values()
                        if each.kernel_on is target])

    def _open_rollbacks(self) -> None:
        from .rollback import open_rollbacks

        self.rollbacks = open_rollbacks(self.settings, list(self.targets.values()))
        for opened in self.rollbacks.values():
            if opened.copied is not None:
                self._cleanup.append(opened.copied)
        for name in self.rollbacks:
            self.wake(self.targets[name])

    @property
    def rollback(self) -> JournalContents | None:
        """The journal a rollback restores (the first target's, of several)."""
        for name in self.rollbacks:
            return self.targets[name].fixrun.rollback
        return None

    def rollback_of(self, path: Path) -> tuple[Target, list[Check]] | None:
        """The target whose rollback pytest collects from ``path``, and its checks."""
        for name, opened in self.rollbacks.items():
            if opened.anchor.resolve() == path.resolve():
                return self.targets[name], opened.checks
        return None

    # -- phases -----------------------------------------------------------------------------

    def placed(self, spec: Spec, target: Target) -> list[tuple[Check, Target]]:
        """Each check of ``spec`` on ``target`` with the target it runs on (its host for a
        ``kernel`` check of a container: ``containers.placed``); a host that gets its first
        check wakes."""
        from .containers import placed

        found = placed(target, lambda where: self.expanded(spec, where))
        for check, where in found:
            if check.options.when is not None:  # asked of the target it was written for
                where.asked_of.setdefault(id(check), {})[target.name] = target
        for where in dict.fromkeys(where for _, where in found):
            self.wake(where)
            if spec.name not in where.spec_names:
                where.spec_names.append(spec.name)
        return found

    def expanded(self, spec: Spec, target: Target) -> list[Check]:
        """``expand``, once per spec and target (a host expands its containers' spec too)."""
        key = (spec.path, target.name)
        if key not in self._expanded:
            self._expanded[key] = self.expand(spec, target)
        return self._expanded[key]

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
                from .unexpanded import Unexpandable, Unexpanded

                checks += owned(self.kinds[section], section, [Check(
                    section, None, Unexpanded(section),
                    EntryOptions(where=f"{self.settings.display(spec.path)}:1"),
                    Unexpandable(exc))])
        if not self.settings.catalog:
            return checks
        from ..capture.catalog import observe_only

        return [observe_only(c) for c in checks]

    def machine_keys(self) -> dict[str, str]:
        """Each target's machine as a state names it, where collection told it (a keyed hash:
        ``machines.Machine.key``); reads nothing."""
        from .machines import machine_of

        found = {name: machine_of(target) for name, target in self.targets.items()}
        return {name: machine.key for name, machine in found.items() if machine is not None}

    def collects(self, target: Target) -> bool:
        """Whether this process collects (and runs) ``target``: this machine always, a remote
        target when it is this process's own (``own``)."""
        return self.own is None or target.url == LOCAL or target.name in self.own

    def facts_of(self, spec: Spec) -> list[Fact[Any]]:
        """The facts the expansion of ``spec`` reads, for one batch."""
        facts: list[Fact[Any]] = [HOST_FACTS, CONTAINER, GPUS]
        if len(self.settings.targets) > 1:  # which are one machine (``machines.py``)
            from .machines import MACHINE

            facts.append(MACHINE)
        for section, model in spec.sections.items():
            facts += facts_of(self.kinds[section], model)
        return facts

    def run(self, check: Check, target: Target | None = None) -> CheckResult:
        """Raises only LockUnavailable; every other outcome is the record."""
        target = target or self.target
        if check.fresh and self.reads_fresh_together and target.fresh_turn():
            from .observing import read_fresh_together

            read_fresh_together(target, self.targets.values(), self.connect_at_once)
        return target.run(check, self.options, named=self.named)

    @functools.cached_property
    def reads_fresh_together(self) -> bool:
        """Whether the first fresh check of one remote target may begin the fresh phase of
        every remote target this process runs (``observing.read_fresh_together``)."""
        from .observing import fresh_together

        return fresh_together(self.targets.values(), runs_what_it_collects=self.runs_own)

    @property
    def connect_at_once(self) -> int:
        """Remote targets this process reads from at once: its share of the connections (an
        xdist worker's), else --gpuhost-connect-concurrency."""
        return self.concurrency or self.settings.connect_concurrency

    @property
    def runs_own(self) -> bool:
        """Whether this process runs every check of the remote targets it collects: serially,
        or an xdist worker under the target scheduler (not one that started from the
        controller's collection of every target, whose checks other workers share)."""
        return self.workerinput is None or self.own is not None

    # -- persistence ------------------------------------------------------------------------

    @property
    def persisting(self) -> bool:
        """--fix-persist: each target's persistence files are checks of their own, ranked last."""
        return self.settings.persist and bool(self.specs) and self.settings.rollback is None

    def finish(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """Without pytest (the tests' and benchmarks' drivers): each target's persistence
        files written at the end, from that target's own records (of its first spec)."""
        if not self.persisting:
            return []
        from .persisting import persistence_checks

        done: list[CheckResult] = []
        for target in self.targets.values():
            if target.dormant:
                continue
            mine = [r for r in results if not self.named or r.target == target.name]
            own = self.specs_of(target)
            done += [target.run(check, self.options, named=self.named)
                     for check in persistence_checks(self, target, mine, own[0] if own else
                                                          None).values()]
        return done

    def capture_reporter(self, command: str) -> SpecCapture:
        """The reporter that writes the captured spec (``capturing.py``)."""
        from .capturing import capture_reporter

        return capture_reporter(self, command)

    def close_rollback(self, results: Sequence[CheckResult]) -> bool:
        """Close each target's rolled back journal whose changes are all back (its own
        records say); whether every one was."""
        for name in self.rollbacks:
            contents = self.targets[name].fixrun.rollback
            assert contents is not None
            mine = [r for r in results if not self.named or r.target == name]
            self.rollback_closed[name] = close_rollback(contents, mine)
        return all(self.rollback_closed.values())

    def close(self) -> None:
        """The end of the run: connections closed, temporary copies removed, and the specs'
        models and the read caches let go."""
        for target in self.targets.values():  # every session ends at once, then each is reaped
            target.close(wait=False)
        for target in self.targets.values():
            target.reap()
        for directory in self._cleanup:
            shutil.rmtree(directory, ignore_errors=True)
        self.specs.clear()
