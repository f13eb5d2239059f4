"""The gpuhost part of a run, without pytest: load the specs, expand them on a host, run one
check, finish (persistence, closing a rollback), and the run's information for the reporters.

The plugin (``plugin.py``) is a thin layer of hooks over this; the tests and the benchmarks use
it directly. Reads are batched by phase: expanding a spec reads every kind's facts in one batch,
and before a check runs, the observations of every pending check of its rank are read in one
batch (``CachedHost``); anything changed through the host makes the next read live.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checks import Check, Fact, Facts, Kind
from .checks.conditions import ConditionFn
from .checks.gpus import GPUS
from .engine import RunOptions, run_check
from .fix.journal import JOURNAL_DIR, JournalContents, JournalError, latest_journal, read_journal
from .fix.rollback import rollback_checks
from .fix.run import FixRun, close_rollback, default_journal, make_fixer
from .fix.run import persist as persist_files
from .gpu.nvml import NvmlFactory, NvmlSource, NvmlUnavailable
from .host import CachedHost, Host, Read, Reply, Request
from .result import CheckResult
from .settings import Settings, SettingsError
from .spec import Spec, load_spec

LOCAL = "local"


@dataclass(frozen=True)
class HostFacts:
    """What reports say about the machine: as the host itself reports it."""

    hostname: str | None
    kernel: str | None
    driver: str | None
    """The NVIDIA kernel module's version (sysfs), else the version line of proc/driver."""
    gpus: tuple[str, ...]
    gpu_models: tuple[str, ...]


def _first_line(reply: Reply) -> str | None:
    if reply.error is not None:
        return None
    text = reply.text().strip()
    return text.splitlines()[0] if text else None


def _driver_line(line: str | None) -> str | None:
    """``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release ...`` ->
    ``580.95.05``; a bare version stays as it is."""
    if line is None:
        return None
    words = [w for w in line.replace("  ", " ").split() if w[:1].isdigit() and "." in w]
    return words[0] if words else line


HOST_FACTS_READS: tuple[Request, ...] = (
    Read("proc/sys/kernel/hostname"), Read("proc/sys/kernel/osrelease"),
    Read("sys/module/nvidia/version"), Read("proc/driver/nvidia/version"),
)


def _parse_host_facts(replies: Sequence[Reply]) -> tuple[str | None, ...]:
    hostname, kernel, module, proc = (_first_line(r) for r in replies)
    return hostname, kernel, module or _driver_line(proc)


HOST_FACTS = Fact("host facts", HOST_FACTS_READS, _parse_host_facts)


class _RememberedConditions(Mapping[str, ConditionFn]):
    """Each ``when:`` condition asked once per target: the answer does not change mid-run."""

    def __init__(self, conditions: Mapping[str, ConditionFn]) -> None:
        self._conditions = conditions
        self._answers: dict[str, tuple[bool, str]] = {}

    def __getitem__(self, name: str) -> ConditionFn:
        condition = self._conditions[name]

        def remembered(host: Host) -> tuple[bool, str]:
            if name not in self._answers:
                self._answers[name] = condition(host)
            return self._answers[name]

        return remembered

    def __iter__(self) -> Any:
        return iter(self._conditions)

    def __len__(self) -> int:
        return len(self._conditions)

    def requests(self, name: str) -> Sequence[Request]:
        return tuple(getattr(self._conditions.get(name), "requests", ()))


class Target:
    """One machine of the run: its host (with the phase cache), facts, fixer and journal."""

    def __init__(self, name: str, host: Host, settings: Settings,
                 conditions: Mapping[str, ConditionFn], nvml: NvmlFactory,
                 shared_dir: Path | None) -> None:
        self.name = name
        self.host = CachedHost(host)
        self.conditions = _RememberedConditions(conditions)
        self.nvml = NvmlSource(nvml)
        self.facts = Facts(self.host, nvml=self.nvml, shared_dir=shared_dir)
        self.fixrun = FixRun(None, None, persist=settings.persist)
        self._pending: dict[int, Check] = {}
        self._group: int | None = None

    # -- reads by phase ---------------------------------------------------------------------

    def select(self, checks: Iterable[Check]) -> None:
        """The checks this process will run, whose observations are read together."""
        self._pending = {id(check): check for check in checks}

    def _reads(self, check: Check) -> list[Request]:
        reads = list(getattr(check.probe, "reads", tuple)())
        if check.options.when is not None:
            reads += self.conditions.requests(check.options.when.name)
        return reads

    def prefetch(self, check: Check) -> None:
        """Before ``check`` runs: read what every pending check of its rank will read, in one
        batch, unless that is still cached. A new rank starts from live reads (dmesg must see
        what the checks before it caused)."""
        if self._group != check.order:
            self._group = check.order
            self.host.invalidate()
        if all(self.host.cached(r) for r in self._reads(check)):
            return
        group = [c for c in self._pending.values() if c.order == check.order]
        self.host.prefetch(r for c in [check, *group] for r in self._reads(c))

    def run(self, check: Check, options: RunOptions) -> CheckResult:
        self.prefetch(check)
        self._pending.pop(id(check), None)
        return run_check(check, self.host, self.conditions, options, self.fixrun.fixer)

    def host_facts(self) -> HostFacts:
        hostname, kernel, driver = self.facts.get(HOST_FACTS)
        gpus = self.facts.get(GPUS)
        if driver is None:
            try:
                driver = self.nvml.get().driver_version()
            except (NvmlUnavailable, Exception):  # a report never fails for want of a driver
                driver = None
        models = sorted({f"NVIDIA 10de:{gpu.device_id.removeprefix('0x')}" for gpu in gpus})
        return HostFacts(hostname, kernel, driver, tuple(g.address for g in gpus),
                         tuple(models))


@dataclass
class Session:
    """One pytest process's gpuhost run."""

    settings: Settings
    kinds: Mapping[str, Kind]
    conditions: Mapping[str, ConditionFn]
    make_host: Callable[[str, Settings], Host]
    nvml_for: Callable[[Host], NvmlFactory]
    shared_dir: Path | None = None
    workerinput: Mapping[str, object] | None = None
    specs: dict[Path, Spec] = field(default_factory=dict)
    targets: dict[str, Target] = field(default_factory=dict)
    rollback_checks: list[Check] = field(default_factory=list)

    def __post_init__(self) -> None:
        for path in self.settings.specs:
            self.specs[path] = load_spec(path, self.kinds, self.conditions,
                                         display=self.settings.display)
        host = self.make_host(LOCAL, self.settings)
        target = Target(LOCAL, host, self.settings, self.conditions, self.nvml_for(host),
                        self.shared_dir)
        self.targets[LOCAL] = target
        if self.settings.rollback is not None:
            self._open_rollback(target)
        elif self.settings.fix and not self.settings.dry_run:
            self._open_fixer(target)

    @property
    def options(self) -> RunOptions:
        return RunOptions(fix=self.settings.fix, dry_run=self.settings.dry_run,
                          persist=self.settings.persist)

    @property
    def spec_name(self) -> str:
        return next(iter(self.specs.values())).name if self.specs else "rollback"

    @property
    def target(self) -> Target:
        """The run's one target (remote targets come with their own sessions' parts)."""
        return self.targets[LOCAL]

    def _open_fixer(self, target: Target) -> None:
        settings = self.settings
        journal = default_journal(settings.root, str(settings.journal)
                                  if settings.journal else None, settings.invocation,
                                  self.spec_name, self.workerinput)
        target.fixrun.journal_path = journal
        target.fixrun.fixer = make_fixer(
            settings.root, target.host, journal, self.spec_name,
            worker=self.workerinput is not None, distributing=settings.distributing,
            lock_timeout=settings.lock_timeout, nvml=target.nvml)

    def _open_rollback(self, target: Target) -> None:
        settings = self.settings
        option = settings.rollback
        journal = settings.invocation / option if option else latest_journal(settings.root)
        if journal is None:
            raise SettingsError(f"no journal to roll back under {settings.root / JOURNAL_DIR} "
                                "(every one there is rolled back already); pass "
                                "--gpuhost-rollback=FILE")
        if not journal.is_file():
            raise SettingsError(f"--gpuhost-rollback={option}: no such journal")
        try:
            contents = read_journal(journal)
            if not contents.entries:
                raise JournalError(f"{journal}: the journal records no change to roll back")
            self.rollback_checks = rollback_checks(contents, settings.display(journal),
                                                   target.nvml)
        except JournalError as exc:
            raise SettingsError(str(exc)) from None
        target.fixrun.rollback = contents
        if not settings.dry_run:  # restored under the root's run lock, journaling nothing
            target.fixrun.fixer = make_fixer(
                settings.root, target.host, None, "rollback", worker=False, distributing=False,
                lock_timeout=settings.lock_timeout, nvml=target.nvml)

    @property
    def rollback(self) -> JournalContents | None:
        return self.target.fixrun.rollback

    # -- phases -----------------------------------------------------------------------------

    def expand(self, spec: Spec, target: Target | None = None) -> list[Check]:
        """Every check of ``spec`` on the target: the facts of all its kinds in one batch."""
        target = target or self.target
        facts: list[Fact[Any]] = [HOST_FACTS, GPUS]
        for section, model in spec.sections.items():
            facts += getattr(self.kinds[section], "facts", lambda _: ())(model)
        target.facts.prime(facts)
        return [check for section, model in spec.sections.items()
                for check in self.kinds[section].expand(model, target.facts)]

    def run(self, check: Check, target: Target | None = None) -> CheckResult:
        """Raises only LockUnavailable; every other outcome is the record."""
        return (target or self.target).run(check, self.options)

    def finish(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """Session-end fixes on the controller: the persistence files (one record each)."""
        target = self.target
        if not target.fixrun.persist or not self.specs:
            return []
        spec = next(iter(self.specs.values()))
        return persist_files(target.host, target.fixrun.fixer, self.options, spec.name,
                             self.settings.display(spec.path), results)

    def close_rollback(self, results: Sequence[CheckResult]) -> bool:
        contents = self.rollback
        assert contents is not None
        return close_rollback(contents, results)

    def close(self) -> None:
        for target in self.targets.values():
            if target.fixrun.fixer is not None:
                target.fixrun.fixer.close()
