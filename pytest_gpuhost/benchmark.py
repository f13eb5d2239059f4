"""pytest-benchmark's files carry the host's state (``machine_info["gpuhost"]``), and a
comparison says whether the compared result was taken under the same host state, and if not,
which checks changed.

Registered by ``plugin.py`` only where pytest-benchmark is active and saves or compares results
in the run: without it nothing here is imported. pytest-benchmark compares ``machine_info``
when it configures, before any host check ran: the ``gpuhost`` field is taken out of both sides
of that comparison (it never warns "machine_info is different" for that field alone) and the
compared one is kept for the terminal summary, made once the host checks ran. Each xdist
worker configures pytest-benchmark and compares too: there the field is taken out alike, and
the summary is the controller's. The exit status
is never touched: a host that changed but passes its spec is not a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

FIELD = "gpuhost"
"""The key of ``machine_info`` that holds the state."""
TITLE = "gpuhost: host state of the compared benchmark"


class BenchmarkState:
    """pytest-benchmark's hooks for a run (``state``: None in a run without host checks, which
    compares only)."""

    def __init__(self, state: Callable[[], dict[str, Any] | None] | None) -> None:
        self.state = state
        """The run's state once its host checks ran; None in a run without host checks."""
        self.started = False
        self.compared: list[Any] = []
        """The ``gpuhost`` field of each compared file (None: it has none), in the order
        pytest-benchmark loaded them."""

    def pytest_sessionstart(self) -> None:
        self.started = True  # machine_info asked for after this is for a file to save

    @pytest.hookimpl(wrapper=True)
    def pytest_benchmark_compare_machine_info(
            self, config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any],
            compared_benchmark: dict[str, Any]) -> Generator[None, Any, Any]:
        saved = compared_benchmark.get("machine_info") if isinstance(compared_benchmark, dict) \
            else None
        theirs = saved.pop(FIELD, None) if isinstance(saved, dict) else None
        ours = machine_info.pop(FIELD, None)
        self.compared.append(theirs)
        try:
            return (yield)
        finally:  # both as they were, for any later reader
            if theirs is not None and isinstance(saved, dict):
                saved[FIELD] = theirs
            if ours is not None:
                machine_info[FIELD] = ours

    def pytest_benchmark_update_machine_info(self, config: pytest.Config,
                                             machine_info: dict[str, Any]) -> None:
        """At save time (the session's end), the state; at configure time there is none yet."""
        if self.state is None or not self.started:
            return
        state = self.state()
        if state is not None:
            machine_info[FIELD] = state

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_terminal_summary(self, terminalreporter: Any, config: pytest.Config
                                ) -> Generator[None, None, None]:
        """After the run's summary and pytest-benchmark's table, even when that table ends in
        a performance regression (--benchmark-compare-fail raises it): that is when the
        reader most needs to know whether the host was the same."""
        try:
            yield
        finally:
            if self.compared and not hasattr(config, "workerinput"):
                self._summary(terminalreporter, config)

    def _summary(self, terminalreporter: Any, config: pytest.Config) -> None:
        now = self.state() if self.state is not None else None
        terminalreporter.section(TITLE)
        for name, theirs in zip(_names(config, len(self.compared)), self.compared,
                                strict=True):
            for line in compared_lines(name, theirs, now):
                terminalreporter.write_line(line)
        for line in envelope_lines(config):
            terminalreporter.write_line(line)


def _names(config: pytest.Config, count: int) -> list[str]:
    """The compared files' names, as pytest-benchmark loaded them."""
    session = getattr(config, "_benchmarksession", None)
    paths = list(getattr(session, "compared_mapping", None) or {})
    if len(paths) != count:
        return [f"compared result {n}" for n in range(1, count + 1)]
    return [Path(str(path)).name for path in paths]


def _label(path: object) -> str:
    """``0003`` of ``.../0003_abc_20261204.json``: the compared run as its table names it."""
    name = Path(str(path)).name
    return name.split("_", 1)[0] if "_" in name else name


def envelope_lines(config: pytest.Config) -> list[str]:
    """Of each compared benchmark: taken under an invalid envelope, and where this run's is
    slower, what differed between the two envelopes (``envelope.compare``)."""
    from .envelope.compare import differences
    from .envelope.verdict import FIELD as ENVELOPE
    from .state import shown

    session = getattr(config, "_benchmarksession", None)
    mapping = getattr(session, "compared_mapping", None) or {}
    now = {bench.fullname: bench for bench in getattr(session, "benchmarks", None) or [] if bench}
    lines = []
    for path, benchmarks in mapping.items():
        label = _label(path)
        for fullname, bench in benchmarks.items():
            theirs = (bench.get("extra_info") or {}).get(ENVELOPE)
            name = shown(bench.get("name", fullname))
            if isinstance(theirs, dict) and theirs.get("valid") is False:
                texts = "; ".join(str(r.get("text")) for r in theirs.get("reasons") or [])
                lines.append(f"{name} in {label}: taken under an invalid envelope: {texts}")
            current = now.get(fullname)
            if current is None:
                continue
            mean, was = getattr(current.stats, "mean", None), (bench.get("stats") or {}).get(
                "mean")
            if not mean or not was or mean <= was:
                continue
            found = differences(current.extra_info.get(ENVELOPE), theirs, label)
            why = ": " + "; ".join(found) if found else \
                ": nothing of the envelopes differs" if isinstance(theirs, dict) else \
                f"; {label} was saved without an envelope"
            lines.append(f"{name}: {(mean / was - 1) * 100:+.1f}% slower than in {label}{why}")
    return lines


def compared_lines(name: str, theirs: Any, now: dict[str, Any] | None) -> list[str]:
    """What the summary says of one compared file against this run's state."""
    from .state import diff_lines, invalid_reason, short, shown

    name = shown(name)
    if theirs is None:
        had = f"this run's is {short(now['digest'])}" if now is not None else \
            "nor has this run one"
        return [f"{name}: saved without a gpuhost host state (by a run without host checks); "
                f"{had}"]
    problem = invalid_reason(theirs)
    if problem is not None:
        return [f"{name}: its machine_info[{FIELD!r}] is no state this pytest-gpuhost reads: "
                f"it {problem}"]
    if now is None:
        return [f"{name}: taken under host state {short(theirs['digest'])}; this run checked "
                "no host (no gpuhost spec, or no host check selected), so nothing says the "
                "host is the same"]
    first, *rest = diff_lines(theirs, now, old_label="the compared result",
                              new_label="this run")
    return [f"{name}: {first}", *rest]
