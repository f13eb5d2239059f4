"""The fix protocol: plan -> record the original -> apply -> read back -> assert."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import pytest

from pytest_gpuhost.checks import Check, Observation
from pytest_gpuhost.checks.gpus import Gpu
from pytest_gpuhost.checks.pcie import MaxReadRequestProbe
from pytest_gpuhost.checks.sysctl import SysctlProbe
from pytest_gpuhost.engine import RunOptions, run_check
from pytest_gpuhost.host import Host, HostError, LocalHost
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import Condition, EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact, Integer
from pytest_gpuhost.testing.fakehost import FakeHost

FIX = RunOptions(fix=True)


class IgnoringWrites(LocalHost):
    """A device that accepts a write and keeps its old value (some ports do)."""

    def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
        return None

    def write_text(self, path: str, text: str) -> None:
        return None


class RefusingWrites(LocalHost):
    def write_text(self, path: str, text: str) -> None:
        raise HostError(f"cannot write {self.path(path)}: Operation not permitted")


class CountingWrites(LocalHost):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.writes: list[str] = []

    def write_text(self, path: str, text: str) -> None:
        self.writes.append(path)
        super().write_text(path, text)


def sysctl_check(key: str, value: str, *, fix: bool = True,
                 when: Condition | None = None) -> Check:
    path = "proc/sys/" + key.replace(".", "/")
    return Check("sysctl", key, Exact(value, Auto()),
                 EntryOptions(where="spec.yaml:3", fix=fix, when=when),
                 SysctlProbe(path))


def test_a_device_that_ignores_the_write_is_fix_failed(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0", max_read_request=512)
    check = Check("pcie.max_read_request", "0000:01:00.0", Exact("4096", Integer()),
                  EntryOptions(where="spec.yaml:3"), MaxReadRequestProbe(Gpu("0000:01:00.0", "x")))
    result = run_check(check, IgnoringWrites(fake.root), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert (result.before, result.after) == ("512", "512")
    assert "but read back '512'" in result.message


def test_an_apply_error_keeps_the_errno_text(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    result = run_check(sysctl_check("vm.swappiness", "10"), RefusingWrites(fake.root), {}, FIX)
    assert result.outcome is Outcome.FIX_FAILED
    assert result.message.endswith("proc/sys/vm/swappiness: Operation not permitted")
    assert result.after == "60"  # read back after the failed apply, honestly


def test_a_matching_value_is_never_written(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    host = CountingWrites(fake.root)
    assert run_check(sysctl_check("vm.swappiness", "10"), host, {}, FIX).outcome is Outcome.PASSED
    assert host.writes == []


def test_fix_false_in_the_spec_is_respected(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    host = CountingWrites(fake.root)
    result = run_check(sysctl_check("vm.swappiness", "10", fix=False), host, {}, FIX)
    assert result.outcome is Outcome.FAILED
    assert result.message.endswith("not fixed: 'fix: false' in the spec")
    assert host.writes == []


def test_without_fix_nothing_is_written_and_the_hint_says_how(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    host = CountingWrites(fake.root)
    result = run_check(sysctl_check("vm.swappiness", "10"), host, {}, RunOptions())
    assert result.outcome is Outcome.FAILED
    assert result.message == "'60' != '10' (fixable: run with --fix)"
    assert (result.before, result.after, result.observed) == (None, None, "60")
    assert host.writes == []


def test_an_observation_error_is_an_error_outcome(fake: FakeHost) -> None:
    class Broken(SysctlProbe, frozen=True):
        def observe(self, host: Host) -> Observation:
            raise HostError("cannot read proc/sys/x: Input/output error")

    check = Check("sysctl", "x", Exact("1", Auto()), EntryOptions(where="s:1"), Broken("x"))
    result = run_check(check, LocalHost(fake.root), {}, FIX)
    assert (result.outcome, result.message) == (Outcome.ERROR,
                                                "cannot read proc/sys/x: Input/output error")


@pytest.mark.parametrize(("holds", "negate", "outcome"), [
    (True, False, Outcome.PASSED), (False, False, Outcome.SKIPPED),
    (True, True, Outcome.SKIPPED), (False, True, Outcome.PASSED),
])
def test_when_conditions_skip_with_the_reason(fake: FakeHost, holds: bool, negate: bool,
                                              outcome: Outcome) -> None:
    fake.sysctl("vm.swappiness", 10)
    check = sysctl_check("vm.swappiness", "10", when=Condition("lab", negate))
    result = run_check(check, LocalHost(fake.root), {"lab": lambda h: (holds, "seen")}, FIX)
    assert result.outcome is outcome
    if outcome is Outcome.SKIPPED:
        assert result.message == f"when: {'not ' if negate else ''}lab is false: seen"


def test_a_probe_that_raises_still_leaves_a_record(fake: FakeHost) -> None:
    class Buggy(SysctlProbe, frozen=True):
        def observe(self, host: Host) -> Observation:
            raise TypeError("argument 3: wrong type")

    check = Check("sysctl", "x", Exact("1", Auto()), EntryOptions(where="s:1"), Buggy("x"))
    result = run_check(check, LocalHost(fake.root), {}, FIX)
    assert (result.outcome, result.message) == (Outcome.ERROR, "TypeError: argument 3: wrong type")


def test_a_failed_read_back_records_no_after(fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)

    class Vanishing(SysctlProbe, frozen=True):
        calls: ClassVar[int] = 0

        def observe(self, host: Host) -> Observation:
            Vanishing.calls += 1
            if Vanishing.calls > 2:  # before, again under the lock, then the read-back
                raise HostError("cannot read proc/sys/vm/swappiness: Input/output error")
            return super().observe(host)

    check = Check("sysctl", "vm.swappiness", Exact("10", Auto()), EntryOptions(where="s:1"),
                  Vanishing("proc/sys/vm/swappiness"))
    result = run_check(check, LocalHost(fake.root), {}, FIX)
    assert (result.outcome, result.before, result.after) == (Outcome.FIX_FAILED, "60", None)
