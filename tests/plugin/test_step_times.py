"""A long step (nvbandwidth over every pair) says it takes a while only where its last run
here did, with how long that took, remembered in pytest's cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.progress import long_step, progress_to, step_times


class Times:
    def __init__(self, known: dict[str, float]) -> None:
        self.known = dict(known)

    def last(self, key: str) -> float | None:
        return self.known.get(key)

    def remember(self, key: str, seconds: float) -> None:
        self.known[key] = seconds


def said(times: Times | None, ticks: list[float]) -> list[str]:
    lines: list[str] = []
    clock = iter(ticks)
    with progress_to(lines.append), step_times(times), \
            long_step("pve nvbandwidth", "running nvbandwidth", clock=lambda: next(clock)):
        pass
    return lines


def test_a_step_says_it_takes_a_while_only_when_its_last_run_did() -> None:
    assert said(None, [0.0, 1.0]) == ["running nvbandwidth"]
    assert said(Times({}), [0.0, 1.0]) == ["running nvbandwidth"]
    slow = Times({"pve nvbandwidth": 42.0})
    assert said(slow, [100.0, 103.5]) == ["running nvbandwidth; the last run took 42.0 s; "
                                          "this takes a while"]
    assert slow.known["pve nvbandwidth"] == 3.5  # this run's, for the next
    assert said(slow, [0.0, 1.0]) == ["running nvbandwidth; the last run took 3.5 s"]


def test_the_example_hosts_second_run_says_how_long_the_first_took(
        pytester: pytest.Pytester, example_host: Path) -> None:
    args = ("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}", "-m", "gpuhost_slow")
    first = pytester.runpytest(*args)
    first.stdout.fnmatch_lines(["  p2p[[]*]: running nvbandwidth * (every pair, serially)"])
    second = pytester.runpytest(*args)
    second.stdout.fnmatch_lines(["  p2p[[]*]: running nvbandwidth * (every pair, serially); "
                                 "the last run took * s*"])
    assert "this takes a while" not in first.stdout.str()
    remembered = pytester.runpytest(*args, "-p", "no:cacheprovider")  # no memory: no claim
    remembered.stdout.fnmatch_lines(["  p2p[[]*]: running nvbandwidth * (every pair, serially)"])
