"""A remote target's observations are read as soon as it is collected, while the others still
connect, where the run changes nothing (``session/observing.py``): each target's batch of
what its checks observe comes before collection ends, its fresh phase (dmesg) after it, and the
number of batches a target costs is the same. A --fix reads as before, at its first check."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.host import Host, LocalHost, Reply, Request
from pytest_gpuhost.settings import Settings
from pytest_gpuhost.targets import Scheme, TargetAddress, TargetError, TargetUrl
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
        assert len(after) == 1, events.seen  # dmesg's live read, in its turn


def test_a_fix_reads_its_targets_observations_at_their_first_check(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    events, result = _run(pytester, tmp_path, "--fix")
    result.assert_outcomes(passed=12)
    for name in ("a", "b", "c"):
        before, after = events.batches(name)
        assert len(before) == 1, events.seen  # the facts only
        assert len(after) == 2, events.seen  # the observations, then dmesg's
