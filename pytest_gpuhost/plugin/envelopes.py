"""Benchmarks' envelopes in a pytest run: one around each pytest-benchmark test, and each one a
test opens with the ``gpuhost_envelope`` fixture; each verdict kept beside its result.

Where the tests run (a run without xdist, each worker), ``EnvelopeHooks`` takes them: a
benchmark's verdict goes into its ``extra_info["gpuhost_envelope"]`` (the file
pytest-benchmark saves), every verdict of a test onto its call report (``ENVELOPES_ATTR``,
which xdist carries to the controller), into Allure as an attachment, and under
``--gpuhost-envelope=strict`` an invalid one is an error of its test (at its teardown: the
test itself ran). The controller keeps them (``EnvelopeBook``) for the terminal summary, which
names the invalid ones, and the JSON report's ``benchmarks``. An invalid envelope never
changes the exit status otherwise: a benchmark that ran is not a failed test.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ..envelope.window import Envelope
    from ..session.envelopes import KnownState
    from ..specmodel.envelope import Limits
    from .run import Run

ENVELOPES_ATTR = "gpuhost_envelopes"
"""A test's call report carries ``[{"test", "name", "envelope"}]`` here."""
TAKEN = pytest.StashKey[list[tuple[str, "Envelope"]]]()
"""The envelopes a test took, each with its name (the benchmark's, or the fixture's)."""
BENCHMARK = "benchmark"
NAMED = 3
"""Reasons named per invalid benchmark in the summary; the rest are counted."""


class EnvelopeHooks:
    """Where tests run: the envelopes of each test."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.strict = run.settings.envelope == "strict"
        self.known: KnownState | None = None
        """The host checks' values this process read (its checks' records, the last
        envelope's end): each envelope's start, without reading them again."""

    def opener(self, item: pytest.Item) -> Callable[..., Envelope]:
        """The ``gpuhost_envelope`` fixture's value: ``gpuhost_envelope(target=None,
        gpus=None, limits=None, name=None, pids=None)`` makes an envelope to enter around a
        benchmark (``pids``: the benchmark's processes as the target numbers them, for one
        that runs there rather than in this process)."""
        def open_one(*, target: str | None = None, gpus: Sequence[str] | None = None,
                     limits: Limits | None = None, name: str | None = None,
                     pids: Sequence[int] | None = None) -> Envelope:
            there = {} if pids is None else {"roots": lambda: list(pids), "pids_there": True}
            envelope = self._open(target=target, gpus=gpus, limits=limits, **there)
            item.stash.setdefault(TAKEN, []).append((name or item.name, envelope))
            return envelope

        return open_one

    def _open(self, **given: Any) -> Envelope:
        from ..session.envelopes import KnownState, open_envelope

        if self.known is None:
            ledger = self.run.ledger
            self.known = KnownState(lambda: ledger.records.values())
        hook = self.run.config.hook.pytest_gpuhost_envelope_sampler
        return open_envelope(self.run.session, lambda host: hook(host=host),
                             known=self.known, **given)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """A pytest-benchmark test runs inside an envelope; its verdict goes into the file
        pytest-benchmark saves."""
        fixture = getattr(item, "funcargs", {}).get(BENCHMARK)
        if fixture is None or not hasattr(fixture, "extra_info"):
            return (yield)
        from ..envelope.verdict import FIELD  # a run's first benchmark loads the envelope

        try:
            envelope = self._open()
        except Exception as exc:  # the envelope's failure is never the benchmark's
            warnings.warn(pytest.PytestWarning(
                f"gpuhost: no envelope for {item.name}: {exc}"), stacklevel=1)
            return (yield)
        item.stash.setdefault(TAKEN, []).append((item.name, envelope))
        with envelope:
            try:
                return (yield)
            finally:
                envelope.close()
                fixture.extra_info[FIELD] = envelope.verdict

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call" and item.stash.get(TAKEN, None):
            taken = [{"test": item.nodeid, "name": name, "envelope": envelope.close()}
                     for name, envelope in item.stash[TAKEN]]
            setattr(report, ENVELOPES_ATTR, taken)
            if self.run.settings.alluredir is not None:
                attach(taken)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        result = yield
        invalid = [(name, envelope) for name, envelope in item.stash.get(TAKEN, [])
                   if not envelope.valid]
        if self.strict and invalid:
            __tracebackhide__ = True
            pytest.fail("--gpuhost-envelope=strict: " + "; ".join(
                f"{name}: {envelope.summary()}" for name, envelope in invalid), pytrace=False)
        return result


def attach(taken: Sequence[dict[str, Any]]) -> None:
    """Each envelope as a JSON attachment of the test's Allure result."""
    try:
        import allure
    except ImportError:
        return
    for each in taken:
        allure.attach(json.dumps(each["envelope"], indent=2),
                      name=f"gpuhost envelope: {each['name']}",
                      attachment_type=allure.attachment_type.JSON)


class EnvelopeBook:
    """On the controller: every test's envelopes, in the order their reports came."""

    def __init__(self) -> None:
        self.benchmarks: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.benchmarks += getattr(report, ENVELOPES_ATTR, None) or []

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in summary_lines(self.benchmarks):
            terminalreporter.write_line(line)


def summary_lines(benchmarks: Sequence[dict[str, Any]]) -> list[str]:
    """``gpuhost: 1 of 3 benchmarks invalid: test_decode: REASON; ...``, one line for each
    invalid one after; none without envelopes."""
    if not benchmarks:
        return []
    invalid = [each for each in benchmarks if not each["envelope"].get("valid")]
    count = len(benchmarks)
    noun = "benchmark" if count == 1 else "benchmarks"
    partial = [each for each in benchmarks if each["envelope"].get("missing")]
    without = f" ({len(partial)} without {partial[0]['envelope']['missing'][0]})" \
        if partial else ""
    if not invalid:
        return [f"gpuhost: {count} {noun}, every envelope valid{without}"]
    lines = [f"gpuhost: {len(invalid)} of {count} {noun} invalid:"]
    for each in invalid:
        texts = [str(r.get("text")) for r in each["envelope"].get("reasons", [])]
        more = f"; and {len(texts) - NAMED} more" if len(texts) > NAMED else ""
        lines.append(f"  {each['name']}: {'; '.join(texts[:NAMED])}{more}")
    if len(invalid) == 1 and len(lines[1]) + len(lines[0]) < 200:
        return [f"{lines[0]} {lines[1].strip()}"]
    return lines
