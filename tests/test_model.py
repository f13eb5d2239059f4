"""The model is msgspec structs: frozen, slot-only, and equal and hashed as decided.

``@dataclass(frozen=True)`` compiled its methods with ``exec`` at every import (~0.3 ms a class,
a third of the plugin's start-up); a ``msgspec.Struct`` is defined in C. The differences that
matter are pinned here: msgspec has no ``field(compare=False)``, so each class that had one
says how it compares now.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import msgspec
import pytest

import pytest_gpuhost
from pytest_gpuhost.checks import Check, Evidence, Fact, NoFix, Observation
from pytest_gpuhost.checks.gpus import GPUS
from pytest_gpuhost.checks.sysctl import SysctlProbe
from pytest_gpuhost.host import Host, Read, Reply, Request, Stat
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact

STDLIB_ONLY = {"pytest_gpuhost.host.agent"}
"""Shipped to targets over stdin and run there with the standard library alone: no msgspec."""


def _modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(pytest_gpuhost.__path__, "pytest_gpuhost.")
            if not any(m.name == s or m.name.startswith(f"{s}.") for s in STDLIB_ONLY)
            and not m.name.endswith("__main__")]


def _classes() -> list[type]:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        found += [c for c in vars(module).values()
                  if inspect.isclass(c) and c.__module__ == name]
    return found


MUTABLE = {
    "pytest_gpuhost.session.Session", "pytest_gpuhost.fix.run.FixRun",
    "pytest_gpuhost.gpu.nvmlrecorded.FakeGpu", "pytest_gpuhost.gpu.nvmlrecorded.FakeNvml",
    "pytest_gpuhost.gpu.bandwidth.ToolOutput", "pytest_gpuhost.checks.capturing.Captured",
    "pytest_gpuhost.plugin.workers.Progress", "pytest_gpuhost.host.pipes.Traffic",
    "pytest_gpuhost.testing.sshd.SshServer", "pytest_gpuhost.testing.slurm.SlurmCluster",
}
"""State that a run changes as it goes (a session, a fix's journal, a fake NVML's settings, what
a capture gathers, xdist's progress, a connection's traffic, a test server): structs too, not
frozen. Every other struct is part of the frozen model."""


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def test_no_dataclass_is_left() -> None:
    assert [_name(c) for c in _classes() if dataclasses.is_dataclass(c)] == [], \
        "the package's models are frozen msgspec.Structs (a built-in kind's section model and " \
        "probes too: docs/adding-a-kind.md), never dataclasses"


def test_the_agent_stays_stdlib_only() -> None:
    source = "".join(path.read_text() for path in Path(pytest_gpuhost.__file__).parent.joinpath(
        "host", "agent").glob("*.py"))
    assert "msgspec" not in source
    assert "dataclass" not in source


def test_every_struct_is_frozen_but_the_run_state_and_keeps_no_instance_dict() -> None:
    """A mixin without ``__slots__ = ()`` (NoFix, NvmlReads, _Wired) would give each instance
    a ``__dict__`` beside the struct's slots; the session keeps one for its cached
    properties."""
    structs = [c for c in _classes() if issubclass(c, msgspec.Struct)]
    assert len(structs) > 150
    assert {_name(c) for c in structs if not c.__struct_config__.frozen} == MUTABLE
    for cls in structs:
        assert (cls.__dictoffset__ != 0) == (cls.__name__ == "Session"), \
            f"{cls.__qualname__}: a base class has no __slots__"


def test_a_struct_refuses_assignment() -> None:
    evidence = Evidence("proc/sys/vm/swappiness", "10")
    with pytest.raises(AttributeError):
        evidence.raw = "60"  # type: ignore[misc]  # refused by mypy and at run time


class _Looks(NoFix):
    """A third-party probe, a plain class: compared by identity."""

    def observe(self, host: Host) -> Observation:
        return Observation("1")


EXPECT = Exact("10", Auto())  # a domain (Auto) is a plain object, equal to itself only


def _check(**changes: object) -> Check:
    check = Check("sysctl", "vm.swappiness", EXPECT, EntryOptions(where="s:1"),
                  SysctlProbe("vm.swappiness"), subjects={"key": "vm.swappiness"},
                  section="sysctl")
    return msgspec.structs.replace(check, **changes)


def test_a_check_is_a_value_equal_only_when_every_field_is() -> None:
    assert _check() == _check()
    assert _check(subjects={"key": "other"}) != _check()
    assert _check(section=None) != _check()
    assert _check(probe=SysctlProbe("vm.dirty_ratio")) != _check()
    looks = _Looks()
    assert _check(probe=looks) == _check(probe=looks)
    assert _check(probe=looks) != _check(probe=_Looks())


def test_a_check_is_hashable_though_its_subjects_are_a_mapping() -> None:
    """Its hash is its id's and order's: equal checks hash alike; unequal ones may collide."""
    assert hash(_check()) == hash(_check())
    assert hash(_check(subjects={"key": "other"})) == hash(_check())
    assert len({_check(), _check(), _check(key="vm.dirty_ratio")}) == 2
    assert {_check(): "found"}[_check()] == "found"


def test_a_check_keeps_its_positional_fields_and_validates_after_a_replace() -> None:
    check = Check("x", None, Exact("1", Auto()), EntryOptions(where="s:1"), _Looks(), 3)
    assert (check.order, check.subjects, check.scope, check.section) == (3, {}, None, None)
    with pytest.raises(ValueError, match="scope 'nowhere' is not one of"):
        Check("x", None, Exact("1", Auto()), EntryOptions(where="s:1"), _Looks(),
              scope="nowhere")


def _parse(replies: object) -> str:
    return "parsed"


def test_facts_compare_and_hash_their_parser_by_identity() -> None:
    """A fact keys the session's cache: the same module constant is the same fact; another
    parser of the same reads is another fact (it makes another value of them)."""
    one = Fact("x", (Read("a"),), _parse)
    assert one == Fact("x", (Read("a"),), _parse)
    assert hash(one) == hash(Fact("x", (Read("a"),), _parse))
    assert one != Fact("x", (Read("a"),), lambda replies: "other")
    assert {GPUS: 1}[GPUS] == 1


def _same(one: Request, other: Request) -> bool:
    return one == other


def test_requests_of_two_types_never_share_a_reply() -> None:
    read, stat = Read("a"), Stat("a")
    assert not _same(read, stat)
    replies = {Read("a"): Reply("bytes"), Stat("a"): Reply("info")}
    assert replies[Read("a")].value == "bytes"
    assert hash(Read("a", 10)) == hash(Read("a", 10))
    assert Read("a", 10) != Read("a", 11)


def test_a_record_round_trips_through_its_dict() -> None:
    record = CheckResult("sysctl[a]", "sysctl", "a", "1", "2", Outcome.FAILED, "wrong",
                         evidence=({"source": "proc/sys/a", "raw": "2"},),
                         details={"n": 1}, subjects={"key": "a"}, section="sysctl")
    data = record.as_dict()
    assert list(data) == list(CheckResult.__struct_fields__)
    assert data["outcome"] == "failed" and data["evidence"] == [dict(record.evidence[0])]
    data["details"]["n"] = 2  # a copy: the record is left as it was
    assert record.details == {"n": 1}
    assert CheckResult.from_dict({**record.as_dict(), "unknown": 1}) == record
