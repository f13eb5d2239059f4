"""The run one pytest process holds, shared by its role plugins (``start.py`` registers them):
the settings, the session, the ledger the checks say they ran in, and how the run stopped; its
own hooks carry a check's record across processes and end the run."""

from __future__ import annotations

import shlex
from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .. import bundled, long_lived
from ..config.settings import Settings
from ..result import CheckResult
from ..session import Session
from .items import GpuhostItem
from .ledger import Ledger

if TYPE_CHECKING:  # xdist's modules load when a run uses it
    from ..checks import Check
    from ..reports import Report
    from ..session import Target
    from .distributing import SharedDirectory

REPORT_ATTR = "gpuhost"
"""A check's report carries ``{"index": ..., "result": record}`` (and its target's info) here."""


class Run:
    """One pytest process's gpuhost run, shared by its role plugins; its own hooks carry a
    record across processes and end the run."""

    def __init__(self, config: pytest.Config, settings: Settings, session: Session,
                 ledger: Ledger, reports: dict[str, Report],
                 shared: SharedDirectory | None = None) -> None:
        self.config = config
        self.reports = reports
        """Every report the run can write, by name (the built-in ones and the plugins')."""
        self.settings = settings
        self.session = session
        self.ledger = ledger
        self.shared = shared
        """On an xdist controller: the directory its workers share (``distributing.py``)."""
        self.names: dict[int, str] = {}
        """Collection index -> id of every selected check (the same on every worker)."""
        self.host_checks: list[tuple[int, str]] = []
        """(collection index, id) of every selected host check, which the gate and the host
        state wait for (the persistence files are the run's own work, not host checks)."""
        self.problems: list[str] = []
        self.notes: list[str] = list(settings.notes)
        """What a reporter says at the end that is no failure (where a capture was written)."""
        """Work that failed (a report that could not be written): summary lines."""
        self.stopped: str | None = None
        """Why the run stopped early (the root's lock could not be had)."""
        self.cut_short: dict[str, tuple[int, CheckResult]] = {}
        """nodeid -> (index, record) of a check whose fix an interrupt cut short in this
        process: pytest reports no test it interrupts, so the controller's book takes it
        from here (its change is ``unknown`` in the journal, never "not run")."""
        self._persistence: dict[str, dict[str, Check]] = {}

    def stop(self, item: GpuhostItem, reason: str) -> None:
        """The root's lock cannot be had: the run stops after this check and exits 2 (another
        run holds the root, or the lock cannot be taken at all)."""
        self.stopped = reason
        item.session.shouldstop = reason
        if item.check.kind == "persist":  # the first write of the run: nothing was written
            self.problems.append(f"--fix-persist: nothing written: {reason}")

    def persistence(self, target: Target, records: Sequence[CheckResult],
                    spec: Path | None = None) -> dict[str, Check]:
        """A target's persistence files' checks for a spec, made once, from its records when
        all are in."""
        key = f"{target.name}\0{spec}"
        if key not in self._persistence:
            from ..session.persisting import persistence_checks

            own = self.session.specs.get(spec.resolve()) if spec is not None else None
            self._persistence[key] = persistence_checks(self.session, target, records, own)
        return self._persistence[key]

    @property
    def command(self) -> str:
        """The command line, as a report that records it says it."""
        return shlex.join(["pytest", *self.config.invocation_params.args])

    def spec_nodeid(self, path: Path) -> str | None:
        """The spec file's id where it is not pytest's own (``spec_file_id``), else None."""
        own = self._own_id(path)
        file_id = self.spec_file_id(path)
        return None if file_id == own else file_id

    def _own_id(self, path: Path) -> str | None:
        """pytest's id for a file under the rootdir (None outside it, where pytest would say
        ``::sysctl[...]``)."""
        try:
            return path.relative_to(self.config.rootpath).as_posix()
        except ValueError:
            return None

    def spec_file_id(self, path: Path) -> str:
        """The part of a spec's check ids before ``::``. A bundled spec's file name
        (``blackwell8.yaml``): its ids must not depend on where the package is installed (the
        venv, the Python version), and they are those of a copy of it at the top of the
        rootdir, unless such a copy runs too. Else pytest's own id for a file under the
        rootdir, or for one outside it the path as the user named it, so every id names its
        spec."""
        name = bundled.bundled_name(path)
        if name is not None and (self.config.rootpath / name).resolve() not in self.session.specs:
            return name
        own = self._own_id(path)
        return own if own is not None else self.settings.display(path)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(self, config: pytest.Config, report: Any
                                      ) -> Generator[None, Any, Any]:
        """A check's report leaves this process (an xdist worker's to its controller, a report
        log) with its record as a dict."""
        data = yield
        payload = data.get(REPORT_ATTR) if isinstance(data, dict) else None
        if isinstance(payload, dict) and isinstance(payload.get("result"), CheckResult):
            data[REPORT_ATTR] = {**payload, "result": payload["result"].as_dict()}
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self, config: pytest.Config, data: Any
                                        ) -> Generator[None, Any, Any]:
        """A worker's report arrives: its record is made once, here, and the report keeps it."""
        report = yield
        payload = getattr(report, REPORT_ATTR, None)
        if isinstance(payload, dict) and isinstance(payload.get("result"), dict):
            payload["result"] = CheckResult.from_dict(payload["result"])
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_unconfigure(self) -> None:
        """The run is over: its connections and files closed, and what only it held let go
        (the records stay with pytest's reports) before pytest's last collections and the
        interpreter's at exit, each of which would walk it all again."""
        self.ledger.close()
        self.session.close()
        self.names.clear()
        self.host_checks.clear()
        self._persistence.clear()
        long_lived.thaw()  # before pytest's last collections, which must see every object


def refuse_before_changes(session: Session) -> None:
    """Before any check runs (a run's collection, or an xdist controller's before its workers
    start): one machine under two names, and a setting with two owners, are usage errors
    (exit 4), nothing changed."""
    from ..session.machines import SameMachine, refuse_one_machine_twice
    from ..session.owners import TwoOwners, refuse_two_owners

    try:
        refuse_one_machine_twice(session)
        refuse_two_owners(session)
    except (SameMachine, TwoOwners) as exc:
        raise pytest.UsageError(str(exc)) from None
