"""A run's host state for pytest's side: the ``gpuhost_state`` fixture, which waits for the host
checks as a gated test does (under xdist, for every worker's), the state of a finished run for
its reports, and JUnit's suite properties. The state itself is ``state.py``'s.

The run (``plugin.run.Run``) is handed in, never imported: what is needed of it is
``StateRun``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import msgspec
import pytest

from .reports import RunInfo
from .result import CheckResult

if TYPE_CHECKING:  # the state's module (hashlib, json) loads when a run uses the state
    from .config.settings import Settings
    from .state import HostState, SpecDigest

STATE_FIXTURE = "gpuhost_state"
BENCHMARK_FILES = ("benchmark_json", "benchmark_save", "benchmark_autosave", "benchmark_compare")
"""pytest-benchmark's options that save or compare results: their files carry the state."""
NAMED = 5
"""Checks named in an error of the fixture; the rest are counted."""


class StateLedger(Protocol):
    """Where a process's checks say they finished (``plugin.ledger``): here, or on another
    xdist worker."""

    def wait_for(self, indices: Iterable[int]) -> list[int]: ...

    def host_checks(self, own: Sequence[tuple[int, str]], targets: Sequence[str]
                    ) -> list[tuple[int, str]]: ...

    def records_of(self, indices: Iterable[int]) -> dict[int, CheckResult]: ...

    def lost(self, missing: Sequence[int]) -> str: ...


class StateRun(Protocol):
    """What the fixture needs of a run (``plugin.run.Run``)."""

    @property
    def session(self) -> Any: ...

    @property
    def ledger(self) -> StateLedger: ...

    @property
    def host_checks(self) -> list[tuple[int, str]]:
        """(collection index, id) of every selected host check."""


def requests_state(item: pytest.Item) -> bool:
    """A test that uses the fixture (directly or through one of its own fixtures)."""
    return STATE_FIXTURE in getattr(item, "fixturenames", ())


def spec_digests(session: Any) -> list[SpecDigest]:
    """Each spec's name and the digest of the bytes the run loaded it from (never the file as
    it is at the report: an edit during the run is not the spec that ran)."""
    from .state import SpecDigest

    return [SpecDigest(spec.name, spec.digest) for spec in session.specs.values()]


def state_of(session: Any, records: Sequence[CheckResult]) -> dict[str, Any] | None:
    """The state of a run's records: None without a spec (a rollback) or a host check."""
    from .state import build, entries_of

    entries = entries_of(records)
    if not session.specs or not entries:
        return None
    return build(entries, spec_digests(session), session.machine_keys())


def finished_state(session: Any, records: Callable[[], Sequence[CheckResult]]
                   ) -> Callable[[], dict[str, Any] | None]:
    """The state once the host checks ran, made when asked (on the controller: from every
    worker's records)."""
    return lambda: state_of(session, records())


def _fail(message: str) -> None:
    __tracebackhide__ = True
    pytest.fail(f"{STATE_FIXTURE}: {message}", pytrace=False)


def _named(ids: Sequence[str]) -> str:
    more = f", and {len(ids) - NAMED} more" if len(ids) > NAMED else ""
    return ", ".join(ids[:NAMED]) + more


def fixture_state(run: StateRun | None) -> HostState:
    """The fixture's value: the state once every selected host check finished, here or on
    another xdist worker; an error (the test's, at set-up) when there is none to give."""
    __tracebackhide__ = True
    from .state import HostState, build, entries_of

    if run is None or not run.session.specs:
        _fail("no host was checked in this run: pass --gpuhost-spec=FILE (or set gpuhost_spec "
              "in the ini file) so that the host checks run before this test")
    assert run is not None
    host_checks = run.ledger.host_checks(run.host_checks, list(run.session.targets))
    indices = [index for index, _ in host_checks]
    if not indices:
        _fail("no host check was selected, so no state vouches for this host; select the "
              "spec's checks too (a -k or -m that leaves them out leaves the state out)")
    names = dict(host_checks)
    missing = run.ledger.wait_for(indices)
    records = run.ledger.records_of(indices)
    missing += [i for i in indices if i not in missing and i not in records]
    if missing:
        _fail(f"{len(missing)} of {len(indices)} host checks did not finish"
              f"{run.ledger.lost(missing)}: {_named([names.get(i, str(i)) for i in missing])}")
    entries = entries_of([records[i] for i in indices])
    return HostState(build(entries, spec_digests(run.session), run.session.machine_keys()))


def benchmark_files(config: pytest.Config,
                    state: Callable[[], dict[str, Any] | None] | None) -> None:
    """Where pytest-benchmark saves or compares results, its files carry the host's state and
    a comparison says what changed (``benchmark.py``); a run without host checks (``state``
    None) only compares. Nothing of it loads without pytest-benchmark (or under -p
    no:benchmark)."""
    option = config.option
    if not getattr(option, "benchmark_compare", None) and (
            state is None or not any(getattr(option, name, None) for name in BENCHMARK_FILES)):
        return
    if config.pluginmanager.has_plugin("benchmark"):
        from .benchmark import BenchmarkState

        config.pluginmanager.register(BenchmarkState(state), "gpuhost-benchmark")


def with_state(config: pytest.Config, settings: Settings, session: Any,
               records: Sequence[CheckResult], info: RunInfo) -> RunInfo:
    """The run's information with its state, for the reports that show it (JSON, Allure), and
    JUnit's suite properties; the state is made only where one of them is written."""
    if settings.report is None and settings.alluredir is None and \
            not getattr(config.option, "xmlpath", None):
        return info
    state = state_of(session, records)
    junit_suite_properties(config, state)
    return msgspec.structs.replace(info, state=state)


JUNIT_PROPERTIES = ("gpuhost.spec", "gpuhost.spec.digest", "gpuhost.state.digest")


def junit_suite_properties(config: pytest.Config, state: dict[str, Any] | None) -> None:
    """The spec and the state's digest as ``<property>`` elements of JUnit's ``<testsuite>``
    (where the xunit2 schema allows properties; a test case's are not allowed there)."""
    from _pytest.junitxml import xml_key  # what pytest's record_testsuite_property uses

    xml = config.stash.get(xml_key, None)
    if xml is None or state is None:
        return
    values = (state["spec"]["name"], state["spec"]["digest"], state["digest"])
    for name, value in zip(JUNIT_PROPERTIES, values, strict=True):
        xml.add_global_property(name, value)
