"""The gpuhost part of a run, without pytest: load the specs, expand them on a host, run one
check, finish (persistence, closing a rollback), and the run's information for the reporters.

The plugin (``plugin.py``) is a thin layer of hooks over this; the tests and the benchmarks use
it directly. Reads are batched by phase: expanding a spec reads every kind's facts in one batch,
and before a check runs, the observations of every pending check of its rank are read in one
batch (``CachedHost``); anything changed through the host makes the next read live.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checks import Check, Fact, Facts, Kind, NoFix, Observation
from .checks.conditions import ConditionFn
from .checks.gpus import GPUS
from .engine import RunOptions, error_result, run_check
from .fix.run import FixRun, close_rollback, default_journal, make_fixer, rollback_fixer
from .fix.state import JOURNAL_DIR, StateFile, StateStore
from .gpu.nvml import NvmlFactory, NvmlSource, NvmlUnavailable, RecordedNvml
from .host import (
    BatchReads,
    CachedHost,
    Host,
    HostError,
    HostIdentity,
    Read,
    Reply,
    Request,
    TargetLost,
    doing,
    raised,
    reply_from_wire,
    reply_to_wire,
    request_from_wire,
)
from .host.agent import decode, encode
from .reports import TargetInfo
from .result import CheckResult
from .settings import Settings, SettingsError
from .spec import EntryOptions, Spec, load_spec
from .spec.matchers import Verdict

if TYPE_CHECKING:  # a rollback's, persistence's and a capture's modules load when used
    from .capture.writer import SpecCapture
    from .fix.journal import JournalContents

LOCAL = "local"
PARALLEL_CONNECTIONS = 10
"""Remote targets connected at once while collecting: under sshd's default MaxStartups (10),
which starts refusing unauthenticated connections beyond 10 (many targets behind one bastion)."""


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
    *RecordedNvml.reads,  # a fake root's NVML: opening it then costs no round trip
)


def _parse_host_facts(replies: Sequence[Reply]) -> tuple[str | None, ...]:
    hostname, kernel, module, proc = (_first_line(r) for r in replies[:4])
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


@dataclass(frozen=True)
class Unexpanded:
    """The expectation of a section that could not be expanded: it never passes."""

    section: str

    def describe(self) -> str:
        return f"the {self.section} checks"

    def judge(self, observed: str | None) -> Verdict:
        return Verdict(False, f"the {self.section} section could not be expanded")

    def fix_value(self, observed: str | None) -> str | None:
        return None


@dataclass(frozen=True)
class Unexpandable(NoFix):
    """A section whose facts could not be read: its one check is an error with the reason."""

    error: HostError

    def observe(self, host: Host) -> Observation:
        raise raised(self.error)


class UnreachableHost(BatchReads):
    """What a target that cannot be reached answers: every read an error naming it and the
    connection's own words, so its checks are errors with that reason and the others run."""

    def __init__(self, url: str, reason: HostError) -> None:
        self.url = url
        self.reason = reason
        self._lost = TargetLost(str(reason), reason.errno)

    def describe(self) -> str:
        return self.url

    def local_machine(self) -> bool:
        return False

    def privileged(self) -> bool:
        return False

    def identity(self) -> HostIdentity:
        raise raised(self.reason)

    def invalidate(self) -> None:
        """Nothing to forget."""

    def local_path(self, path: str) -> Path | None:
        return None

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        return [Reply(error=self._lost) for _ in requests]

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise raised(self.reason)

    def unlock(self, handle: int) -> None:
        """A lost connection released its locks with it."""

    write_text = write_bytes = replace_file = remove = which = run = _refuse
    create_file = append_file = lock = _refuse


class Target:
    """One machine of the run: its host (with the phase cache), facts, fixer and journal."""

    def __init__(self, name: str, host: Host, settings: Settings,
                 conditions: Mapping[str, ConditionFn], nvml_for: Callable[[Host], NvmlFactory],
                 shared_dir: Path | None, *, url: str = LOCAL) -> None:
        self.name = name
        self.url = url
        self.unreachable: str | None = None
        """Why the target could not be reached (its checks are errors saying so)."""
        self.connection = host
        self.host = CachedHost(host)
        self.conditions = _RememberedConditions(conditions)
        self.nvml = NvmlSource(nvml_for(self.host))  # through the cache: recorded facts too
        self.facts = Facts(self.host, nvml=self.nvml, shared_dir=shared_dir)
        self.fixrun = FixRun(None, None, persist=settings.persist)
        self._pending: dict[int, Check] = {}
        self._batched: set[int] = set()
        """The checks whose reads the last batch fetched (ids), while nothing has changed."""
        self._generation = -1
        self._phase_start = True
        """The next batch is a phase's first: every pending check of the phase."""
        self.round_trips = getattr(host, "traffic", None) is not None
        """Whether a read costs a round trip (a remote target's agent counts them): then every
        re-read after a fix is batched too, for the pending checks of the phase."""
        self._fresh = False
        self._host_facts: HostFacts | None = None

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
        """Before ``check`` runs: read what it and every other pending check of its phase will
        read, in one batch, unless that is still cached. The phases: every check that reads
        the host as it stands, then the fresh ones (dmesg, AER), which start from live reads
        so they see what the checks before them caused. A change made through the host (a
        fix, a command) makes the next read live anyway: on a remote target in one batch for
        the phase's pending checks again (one round trip), on this machine only what the
        check reads (re-reading every pending check's files after each fix read the example
        host's files 17,000 times in a --fix of 198 checks)."""
        if check.fresh and not self._fresh:
            self._fresh = True
            self._phase_start = True
            self.host.invalidate()
        if id(check) in self._batched and self.host.generation == self._generation:
            return  # read by this phase's batch, and nothing changed since
        reads = self._reads(check)
        if all(self.host.cached(r) for r in reads):
            return
        if not (self._phase_start or self.round_trips):
            self.host.prefetch(reads)
            return
        group = [c for c in self._pending.values() if c.fresh == check.fresh]
        self.host.prefetch(r for c in [check, *group] for r in self._reads(c))
        self._batched = {id(c) for c in group}
        self._generation = self.host.generation
        self._phase_start = False

    def run(self, check: Check, options: RunOptions, *, named: bool = False) -> CheckResult:
        lost = getattr(self.connection, "lost", None)
        if lost is not None and self.unreachable is None:
            self._unreachable(lost)  # lost mid-run: what was read before it is not used
        self._pending.pop(id(check), None)
        if self.unreachable is not None:
            # nothing of it was read: a check whose expansion saw no GPUs must not say '0 GPUs'
            result = error_result(check, self.unreachable)
        else:
            with doing("reading the observations"), contextlib.suppress(HostError):
                self.prefetch(check)  # when it fails, the check's own read says why
            with doing(f"checking {check.id}"):
                result = run_check(check, self.host, self.conditions, options,
                                   self.fixrun.fixer, self.fixrun.history)
        return dataclasses.replace(result, target=self.name) if named else result

    def lose(self, reason: HostError) -> None:
        """The target cannot be reached: every read from now on fails with ``reason``."""
        self._unreachable(reason)
        self.fixrun.fixer = None

    def _unreachable(self, reason: HostError) -> None:
        self.unreachable = str(reason)
        self.host.host = UnreachableHost(self.url, reason)
        self.host.invalidate()

    def export(self) -> dict[str, object]:
        """What collection read of the target (JSON-ready), for another process to ``seed``."""
        replies = [] if self.unreachable else [
            [request.wire(), reply_to_wire(reply)] for request, reply in
            self.host.replies().items()]
        return {"lost": self.unreachable, "spent": getattr(self.connection, "spent", 0.0),
                "replies": encode(replies)}

    def seed(self, collected: Mapping[str, object]) -> None:
        """Start from what another process of the run read (``export``): the same facts, the
        same lost target, and the time it already spent on the target."""
        if collected.get("lost"):
            self.lose(HostError(str(collected["lost"])))
            return
        wired = decode(collected.get("replies") or [])
        assert isinstance(wired, list)
        replies: dict[Request, Reply] = {}
        for wire, answer in wired:
            request = request_from_wire(wire)
            replies[request] = reply_from_wire(request, answer)
        self.host.seed(replies)
        spent = collected.get("spent")
        if isinstance(spent, (int, float)) and hasattr(self.connection, "spent"):
            self.connection.spent += spent

    def collect_facts(self, facts: Sequence[Fact[Any]], shared_dir: Path | None) -> None:
        """Read the facts a spec's expansion needs in one batch; a target that cannot be
        reached is lost (its checks are errors that say why)."""
        with doing("collecting facts"):
            try:
                self.facts.prime(facts)
            except HostError as exc:
                self.lose(exc)
                self.facts = Facts(self.host, nvml=self.nvml, shared_dir=shared_dir)
                self.facts.prime(facts)
            self.host_facts()  # from the batch just read: what reports say of the target

    def info(self) -> TargetInfo:
        """The target as it reported itself, and its connection's cost so far. Never makes a
        connection for it: a remote target not reached yet is only its name and URL."""
        traffic = getattr(self.connection, "traffic", None)
        cost = traffic.as_dict() if traffic is not None else {}
        known = self.facts.known(HOST_FACTS) or self.connection.local_machine() or \
            traffic is None
        facts = self.host_facts() if known and self.unreachable is None else \
            HostFacts(None, None, None, (), ())
        journal = self.fixrun.journal_path
        lost = getattr(self.connection, "lost", None)  # at its last check too, not only before
        unreachable = self.unreachable or (str(lost) if lost is not None else None)
        return TargetInfo(self.name, self.url, facts.hostname, facts.kernel, facts.driver,
                          facts.gpus, facts.gpu_models, unreachable,
                          journal.shown if journal and self.fixrun.journal_used() else None,
                          **cost)

    def disconnect(self) -> None:
        """End a remote target's connection for now (the next read connects again)."""
        close = getattr(self.connection, "close", None)
        if close is not None and not self.connection.local_machine():
            close()

    def close(self) -> None:
        if self.fixrun.fixer is not None:
            self.fixrun.fixer.close()
        close = getattr(self.connection, "close", None)
        if close is not None:
            close()
        self.host.clear()
        self._pending.clear()
        self._batched.clear()

    def host_facts(self) -> HostFacts:
        """What the target says about itself, read with the collection's facts and kept: the
        reports use it at the end without reading the host again."""
        if self._host_facts is None:
            self._host_facts = self._read_host_facts()
        return self._host_facts

    def _read_host_facts(self) -> HostFacts:
        try:
            hostname, kernel, driver = self.facts.get(HOST_FACTS)
        except HostError:
            return HostFacts(None, None, None, (), ())
        try:
            gpus = self.facts.get(GPUS)
        except HostError:  # the GPU checks say why; the report lists no GPU
            gpus = ()
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
    rollback_file: Path | None = None
    """The file pytest collects a rollback's checks from (see ``_anchor``)."""
    _cleanup: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        for path in self.settings.specs:
            self.specs[path] = load_spec(path, self.kinds, self.conditions,
                                         display=self.settings.display)
        for url in self.settings.targets:
            host = self.make_host(url.url, self.settings)
            target = Target(url.name, host, self.settings, self.conditions, self.nvml_for,
                            self.shared_dir, url=url.url)
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
            from .fix.history import FixHistory

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

    def _rollback_journal(self, target: Target) -> StateFile:
        """The journal to roll back: the one named (a file of this machine for the local
        target; a name in the target's journal directory, or a path under its root, for a
        remote one), else the newest on the target with something to undo."""
        from .fix.journal import JournalError, latest_journal

        settings = self.settings
        option = settings.rollback
        store = StateStore.of(target.host)
        try:
            if option and target.url == LOCAL:
                journal: StateFile | None = StateFile.local(settings.invocation / option)
            elif option:
                path = option.lstrip("/") if "/" in option else f"{JOURNAL_DIR}/{option}"
                journal = store.file(path)
            else:
                journal = latest_journal(store)
        except (JournalError, HostError) as exc:
            raise SettingsError(str(exc)) from None
        if journal is None:
            raise SettingsError(f"no journal to roll back under {store.journal_dir} (every one "
                                "there is rolled back already); pass --gpuhost-rollback=FILE")
        try:
            found = journal.exists()
        except HostError as exc:
            raise SettingsError(f"--gpuhost-rollback: {exc}") from None
        if not found:
            raise SettingsError(f"--gpuhost-rollback={option}: no such journal ({journal})")
        return journal

    def _open_rollback(self, target: Target) -> None:
        """The rollback's journal and checks, read under the target's locks (raises
        LockUnavailable while another run, or a command one started, holds them)."""
        settings = self.settings
        if len(self.targets) > 1:
            raise SettingsError("--gpuhost-rollback restores one target's journal: name one "
                                "--gpuhost-target")
        if not settings.dry_run:  # under the target's locks before anything is read or judged
            try:
                target.fixrun.fixer = rollback_fixer(
                    target.host, lock_timeout=settings.lock_timeout, nvml=target.nvml)
            except HostError as exc:  # the target cannot be reached
                raise SettingsError(f"--gpuhost-rollback: {exc}") from None
        try:
            self._read_rollback(target)
        except BaseException:
            if target.fixrun.fixer is not None:  # the locks go with the run that failed
                target.fixrun.fixer.close()
            raise

    def _read_rollback(self, target: Target) -> None:
        from .fix.journal import JournalError, read_journal
        from .fix.rollback import refuse_foreign, rollback_checks

        journal = self._rollback_journal(target)
        try:
            contents = read_journal(journal)
            if not contents.entries:
                raise JournalError(f"{journal}: the journal records no change to roll back")
            refuse_foreign(contents, target.host.identity(),
                           after_reboot=self.settings.after_reboot)
            self.rollback_checks = rollback_checks(contents, self._shown(journal), target.nvml)
        except JournalError as exc:
            raise SettingsError(str(exc)) from None
        target.fixrun.rollback = contents
        self.rollback_file = self._anchor(journal)

    def _shown(self, journal: StateFile) -> str:
        local = self._local_path(journal)
        return self.settings.display(local) if local is not None else journal.shown

    @staticmethod
    def _local_path(journal: StateFile) -> Path | None:
        """The journal as a file of this machine, when it is one."""
        return journal.host.local_path(journal.path)

    def _anchor(self, journal: StateFile) -> Path:
        """The file pytest collects the rollback's checks from: the journal itself on this
        machine, else a copy of it made for the run (the target's journal is what is read
        and closed)."""
        local = self._local_path(journal)
        if local is not None:
            return local
        directory = Path(tempfile.mkdtemp(prefix="pytest-gpuhost-rollback-"))
        self._cleanup.append(directory)
        copy = directory / journal.path.rsplit("/", 1)[-1]
        copy.write_bytes(journal.read())
        return copy

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
                    checks += self.kinds[section].expand(model, target.facts)
            except HostError as exc:  # a fact this kind needs cannot be read: one error
                checks.append(Check(section, None, Unexpanded(section),
                                    EntryOptions(where=f"{self.settings.display(spec.path)}:1"),
                                    Unexpandable(exc)))
        if not self.settings.catalog:
            return checks
        from .capture.catalog import observe_only

        return [observe_only(c) for c in checks]

    def collect_remote_facts(self) -> None:
        """The first batch of collection (every spec's facts) from every remote target at once,
        a few connections at a time: connecting is most of a remote target's time, and one
        target's wait no longer holds up the others. Expansion then reads from the cache."""
        remote = [t for t in self.targets.values() if t.url != LOCAL and t.unreachable is None]
        if len(remote) < 2 or not self.specs:
            return
        facts = list(dict.fromkeys(f for spec in self.specs.values() for f in self.facts_of(spec)))
        from concurrent.futures import ThreadPoolExecutor  # remote targets only

        with ThreadPoolExecutor(min(PARALLEL_CONNECTIONS, len(remote)),
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

    def finish(self, results: Sequence[CheckResult]) -> list[CheckResult]:
        """Session-end fixes on the controller: each target's persistence files, from that
        target's own records (one record each, named by target where the run names them)."""
        if not self.settings.persist or not self.specs:
            return []
        from .fix.persist import persistence_checks

        spec = next(iter(self.specs.values()))
        supplies = [kind.persistence for kind in self.kinds.values()
                    if hasattr(kind, "persistence")]
        done: list[CheckResult] = []
        for target in self.targets.values():
            mine = [r for r in results if not self.named or r.target == target.name]
            checks = persistence_checks(spec.name, self.settings.display(spec.path), mine,
                                        target.host, supplies)
            done += [target.run(check, self.options, named=self.named) for check in checks]
        return done

    def capture_target(self) -> Target:
        """The target --gpuhost-capture writes down: --gpuhost-capture-from, else the only one."""
        from .capture.writer import pick_target

        try:
            return self.targets[pick_target(list(self.targets), self.settings.capture_from)]
        except ValueError as exc:
            raise SettingsError(str(exc)) from None

    def capture_reporter(self, command: str) -> SpecCapture:
        """The reporter that writes the captured spec, with what the target says of itself."""
        from .capture.writer import Source, SpecCapture

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
