"""pytest's view of the checks: a spec file (or, under --gpuhost-rollback, a journal) is a file
collector whose items are the checks; an item runs its check through the session. Under
--fix-persist each target's persistence files are items too (``PersistFile``), ranked after
every other check of the target: each learns what it holds from their records at its turn."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from .. import long_lived
from ..checks import KERNEL, Check
from ..fix import LockUnavailable
from ..host import HostError, TargetLost
from ..printable import printable
from ..progress import progress_to, step_times
from ..result import CheckResult, Outcome
from .steptimes import step_times_of

if TYPE_CHECKING:
    from ..session import Session, Target
    from .ledger import Ledger


class RunState(Protocol):
    """What the items need of the run (``start.Run``)."""

    session: Session
    ledger: Ledger
    names: dict[int, str]
    """Collection index -> id of every selected check."""
    cut_short: dict[str, tuple[int, CheckResult]]
    """nodeid -> (index, record) of a check whose fix an interrupt cut short."""

    def stop(self, item: GpuhostItem, reason: str) -> None: ...

    def persistence(self, target: Target, records: Sequence[CheckResult],
                    spec: Path | None = None) -> dict[str, Check]: ...


RUN = pytest.StashKey[RunState]()
"""Where ``start.start_run`` keeps the active run."""

GPUHOST_MARK = pytest.mark.gpuhost
"""Built once: looking a marker up by name costs more than the rest of an item's set-up."""
SLOW_MARK = pytest.mark.gpuhost_slow


def run_of(config: pytest.Config) -> RunState:
    return config.stash[RUN]


class SpecFile(pytest.File):
    def collect(self) -> Iterable[GpuhostItem]:
        """Every check of the spec on every target that runs it (and this process collects: an
        xdist worker under the target scheduler, its own remote targets), on the target where its
        setting lives (a container's ``kernel`` checks on its host: ``Session.placed``), each
        once; ids name that target when the run has remote or several targets
        (``sysctl[vm.swappiness]@pve``, so ``-k pve`` selects)."""
        session = run_of(self.config).session
        spec = session.specs[self.path.resolve()]
        seen: set[tuple[str, str]] = set()
        on: dict[str, tuple[Target, list[Check]]] = {}
        for target in session.runs(spec):
            if not session.collects(target):  # an xdist worker's own remote targets only
                continue
            for check, where in session.placed(spec, target):
                if (where.name, check.id) in seen:  # a host's own check, and its container's
                    continue
                seen.add((where.name, check.id))
                on.setdefault(where.name, (where, []))[1].append(check)
                name = f"{check.id}@{where.name}" if session.named else check.id
                yield GpuhostItem.from_parent(self, name=name, check=check, target=where)
                long_lived.made_one()
        if not session.persisting:
            return
        from ..session.persisting import persistence_files  # --fix-persist's

        for where, checks in on.values():
            for check in persistence_files(session, checks, spec, where):
                name = f"{check.id}@{where.name}" if session.named else check.id
                yield PersistFile.from_parent(self, name=name, check=check, target=where)


class JournalFile(pytest.File):
    """A journal under --gpuhost-rollback: one check per change, newest first."""

    def collect(self) -> Iterable[GpuhostItem]:
        session = run_of(self.config).session
        found = session.rollback_of(self.path)
        if found is None:
            return
        target, checks = found
        for check in checks:
            name = f"{check.id}@{target.name}" if session.named else check.id
            yield GpuhostItem.from_parent(self, name=name, check=check, target=target)


class CheckFailed(AssertionError):
    """A check that failed (or whose fix failed): a failed test, in Allure too."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


class CheckError(Exception):
    """A host that could not be read: an error, broken in Allure."""

    def __init__(self, result: CheckResult) -> None:
        super().__init__(result.message)
        self.result = result


PASSING = (Outcome.PASSED, Outcome.FIXED)


def error_record(check: Check, message: str, target: str | None = None) -> CheckResult:
    """The record of a check that could not run at all (the root's lock, a lost worker)."""
    return CheckResult(id=check.id, kind=check.kind, key=check.key,
                       expected=check.expect.describe(), observed=None, outcome=Outcome.ERROR,
                       message=message, location=check.options.where,
                       severity=check.options.severity, subjects=dict(check.subjects),
                       hardware=check.hardware, target=target, section=check.owner,
                       scope=check.scope or KERNEL, measured=bool(check.measured))


class GpuhostItem(pytest.Item):
    def __init__(self, *, check: Check, target: Target, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.check = check
        self.target = target
        self.result: CheckResult | None = None
        self.index = 0
        self.waits_for: list[int] = []
        """Collection indices of the checks this one must run after (dmesg: all others)."""
        self.add_marker(GPUHOST_MARK)
        if check.slow:
            self.add_marker(SLOW_MARK)

    def runtest(self) -> None:
        __tracebackhide__ = True
        run = run_of(self.config)
        run.ledger.started(self.index)
        if self.waits_for:
            missing = run.ledger.wait_for(self.waits_for)
            if missing:
                self.result = error_record(
                    self.check, run.ledger.unfinished(self.check.id, missing, run.names),
                    self._target_name(run))
                raise CheckError(self.result)
        self.prepare(run)
        try:
            with progress_to(self._progress_sink()), step_times(step_times_of(self.config)):
                self.result = run.session.run(self.check, self.target)
        except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP: no report of this test follows
            fixer = self.target.fixrun.fixer
            if fixer is not None and fixer.interrupted is not None:
                record = error_record(self.check, fixer.interrupted, self._target_name(run))
                run.cut_short[self.nodeid] = (self.index, record)
                run.ledger.cut_short(self.nodeid, self.index, record)  # an xdist worker's
            raise
        except LockUnavailable as exc:
            reason = str(exc)
            if len(run.session.targets) > 1:  # a fleet: that target's lock, not the run's
                reason += (": nothing was changed on this target and its checks were given up "
                           "on; the other targets went on (run again on it when that run is "
                           "done)")
                self.target.lose(TargetLost(reason))
            else:
                run.stop(self, reason)
            self.result = error_record(self.check, reason, self._target_name(run))
            raise CheckError(self.result) from None
        if self.result.outcome is Outcome.SKIPPED:
            # Reported at the spec's line, as a skip mark's would be (not in pytest's runner).
            raise pytest.skip.Exception(printable(self.result.message),
                                        _use_item_location=True)
        if self.result.outcome is Outcome.ERROR:
            raise CheckError(self.result)
        if self.result.outcome not in PASSING:
            raise CheckFailed(self.result)

    def prepare(self, run: RunState) -> None:
        """What a check must know before it runs, beyond what collection gave it: nothing."""

    def _target_name(self, run: RunState) -> str | None:
        return self.target.name if run.session.named else None

    def _progress_sink(self) -> Any:
        """Lines a long check reports, written to the terminal past output capturing."""
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or capture is None or hasattr(self.config, "workerinput"):
            return None

        def show(text: str) -> None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(printable(f"  {self.check.id}: {text}"))

        return show

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, (CheckFailed, CheckError)):
            from ..reports.failure import format_failure  # a passing run has none

            return format_failure(excinfo.value.result)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, int, str]:
        # The domain must not be a suffix of the nodeid, or -v rewrites its dots into '::'.
        line = int(self.check.options.where.rsplit(":", 1)[-1]) - 1
        return self.path, line, f"gpuhost check {self.name}"  # with its target: @pve



class PersistFile(GpuhostItem):
    """A --fix-persist file of one target: collected with the other checks, ranked after them
    all (its ``waits_for``), it learns at its turn what it must hold, from their records."""

    sources: list[int] | None = None
    """Collection indices of the checks whose records it is made of: its spec's on its target
    (None: every one it waits for)."""

    def prepare(self, run: RunState) -> None:
        records = run.ledger.records_of(self.waits_for)
        if self.sources is not None:
            records = {index: record for index, record in records.items()
                       if index in self.sources}
        try:
            checks = run.persistence(self.target, [records[i] for i in sorted(records)],
                                     self.path)
        except HostError as exc:  # the target cannot be read: the file's check says why
            self.result = error_record(self.check, str(exc), self._target_name(run))
            raise CheckError(self.result) from None
        self.check = checks.get(str(self.check.key), self.check)
