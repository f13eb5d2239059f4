"""A remote target's observations are read as soon as it is collected, while the others still
connect, where the run changes nothing (``session/observing.py``): each target's batch of
what its checks observe comes before collection ends, its fresh phase (dmesg) after it, and the
number of batches a target costs is the same. A --fix reads as before, at its first check.
Once every check that reads the host as it stands has run, the targets' fresh phases begin
together, at the first fresh check, in a verify and a --fix alike."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.config.settings import Settings
from pytest_gpuhost.config.targets import Scheme, TargetAddress, TargetError, TargetUrl
from pytest_gpuhost.host import Host, HostError, LocalHost, Reply, Request
from pytest_gpuhost.session.observing import fresh_together, read_fresh_together
from pytest_gpuhost.session.target import LOCAL
from pytest_gpuhost.testing.counting import CountingHost
from pytest_gpuhost.testing.fakehost import FakeHost

SPEC = ("version: 1\nsysctl:\n  vm.swappiness: 10\n  vm.dirty_ratio: 5\n"
        "modules:\n  nvidia: loaded\ndmesg: {}\n")


def _far(url: TargetUrl) -> TargetAddress:
    if not url.parts.netloc:
        raise TargetError(f"{url.text!r}: far://NAME/ROOT")
    return TargetAddress(url.text, "far", host=url.parts.netloc, root=url.root, name=url.name)


class Events:
    """A scheme whose targets are trees here, read as if far away: every batch a target is
    asked, and the end of collection, in the order they happened."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def note(self, event: str, size: int = 0) -> None:
        with self.lock:
            self.seen.append((event, size))

    @pytest.hookimpl
    def pytest_gpuhost_target_schemes(self) -> list[Scheme]:
        return [Scheme("far", ("far://NAME/ROOT",), _far)]

    @pytest.hookimpl(tryfirst=True)
    def pytest_gpuhost_make_host(self, url: str, settings: Settings,
                                 target: TargetAddress) -> Host | None:
        if target.scheme != "far":
            return None
        events, name = self, target.host

        class Far(CountingHost):
            def batch(self, requests: Sequence[Request]) -> list[Reply]:
                events.note(f"batch {name}", len(requests))
                return super().batch(requests)

            def local_machine(self) -> bool:
                return False

        return Far(LocalHost(Path(target.root)))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.note("collected")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            self.note(f"ran {report.nodeid}")

    def fresh_batches_before_fresh_checks(self) -> bool:
        """Whether every target's last batch (its fresh phase's) came before the first dmesg
        check's report, and no batch after it."""
        first = next(n for n, (event, _) in enumerate(self.seen)
                     if event.startswith("ran ") and "dmesg" in event)
        last_batch = max(n for n, (event, _) in enumerate(self.seen)
                         if event.startswith("batch "))
        return last_batch < first

    def batches(self, name: str) -> tuple[list[int], list[int]]:
        """The sizes of ``name``'s batches before and after collection ended."""
        end = self.seen.index(("collected", 0))
        return ([size for event, size in self.seen[:end] if event == f"batch {name}"],
                [size for event, size in self.seen[end:] if event == f"batch {name}"])


def _run(pytester: pytest.Pytester, tmp_path: Path, *args: str) -> tuple[Events, Any]:
    targets = []
    for name in ("a", "b", "c"):
        FakeHost(tmp_path / name).sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5}) \
            .module("nvidia").kmsg([(6, "Linux version 6.8.0")])
        targets.append(f"--gpuhost-target=far://{name}{tmp_path / name}")
    spec = pytester.makefile(".yaml", spec=SPEC)
    events = Events()
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *targets, "-p", "no:cacheprovider",
                                *args, plugins=[events])
    return events, result


def test_a_verify_reads_each_targets_observations_before_collection_ends(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    events, result = _run(pytester, tmp_path)
    result.assert_outcomes(passed=12)
    for name in ("a", "b", "c"):
        before, after = events.batches(name)
        # the facts, then the observations of its sysctls and module: both while collecting
        assert len(before) == 2, events.seen
        assert before[1] >= 3  # two sysctls and the module's files, one batch
        assert len(after) == 1, events.seen  # dmesg's live read, in the fresh phase
    # every target's fresh phase began at the first dmesg check, together: the run waited for
    # one round trip there, not three in turn
    assert events.fresh_batches_before_fresh_checks(), events.seen


def test_a_fix_reads_its_targets_observations_at_their_first_check(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    events, result = _run(pytester, tmp_path, "--fix")
    result.assert_outcomes(passed=12)
    for name in ("a", "b", "c"):
        before, after = events.batches(name)
        assert len(before) == 1, events.seen  # the facts only
        assert len(after) == 2, events.seen  # the observations, then dmesg's
    # each target's fixes came before any fresh read, and the fresh reads together
    assert events.fresh_batches_before_fresh_checks(), events.seen


class Waiting:
    """A target as ``read_fresh_together`` sees it: what it has left to run, and whether
    its fresh phase began (``start_fresh``), which fails with ``fails``."""

    def __init__(self, url: str, *, plain: bool = False, fresh: bool = True,
                 fails: bool = False) -> None:
        self.url, self.plain, self.fresh, self.fails = url, plain, fresh, fails
        self.kernel_on: Waiting | None = None
        self.started = False

    def reads_as_it_stands(self) -> bool:
        return self.plain

    def fresh_turn(self) -> bool:
        return not self.started and not self.plain and self.fresh

    def start_fresh(self) -> None:
        self.started = True
        if self.fails:
            raise HostError("ssh: connection lost")


def _together(first: Waiting, *targets: Waiting) -> list[str]:
    read_fresh_together(first, [first, *targets], 2)
    return [t.url for t in (first, *targets) if t.started]


def test_fresh_phases_begin_together_only_once_no_plain_check_is_left() -> None:
    a, b, c = Waiting("ssh://a"), Waiting("ssh://b"), Waiting("ssh://c")
    assert _together(a, b, c) == ["ssh://a", "ssh://b", "ssh://c"]
    # a check of c that reads the host as it stands is still to run: each waits for its turn
    a, b, c = Waiting("ssh://a"), Waiting("ssh://b"), Waiting("ssh://c", plain=True)
    assert _together(a, b, c) == []
    # this machine (its reads cost no round trip) and a target with no fresh check left
    # begin nothing early; the others do, and one that fails leaves its check to say why
    a, here, done = Waiting("ssh://a"), Waiting(LOCAL), Waiting("ssh://d", fresh=False)
    lost = Waiting("ssh://e", fails=True)
    assert _together(a, here, done, lost) == ["ssh://a", "ssh://e"]
    # alone, the first target's fresh phase is its own check's to begin
    assert _together(Waiting("ssh://a"), Waiting(LOCAL)) == []


def test_fresh_phases_begin_together_where_the_process_runs_every_check_of_its_targets() -> None:
    a, b = Waiting("ssh://a"), Waiting("ssh://b")
    assert fresh_together([a, b], runs_what_it_collects=True)
    # an xdist worker that shares its targets' checks with others: another may still run one
    assert not fresh_together([a, b], runs_what_it_collects=False)
    assert not fresh_together([a, Waiting(LOCAL)],
                              runs_what_it_collects=True)
    b.kernel_on = a  # a container and its host: one machine
    assert not fresh_together([a, b], runs_what_it_collects=True)
