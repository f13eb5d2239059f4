"""The spec's ``envelope:`` section: every key at its documented default unless given, shares
and counts validated at their line, and no check of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.specmodel import SpecError
from pytest_gpuhost.specmodel.envelope import DEFAULTS, Limits, seconds

from .test_spec import load

DOCUMENTED = {"sample_every": 1.0, "slowdown": 0.01, "power_cap": 0.05, "clocks": 0.90,
              "other_processes": 0, "ecc_uncorrected": 0, "remapped_rows_pending": False,
              "pcie_replays": 80, "aer_correctable": 480, "aer_uncorrectable": 0,
              "xid": "hardware", "state": "unchanged"}


def test_the_defaults_are_the_documented_ones() -> None:
    assert {key: getattr(DEFAULTS, key) for key in Limits.__struct_fields__} == DOCUMENTED


def test_a_spec_without_the_section_has_none_and_a_bare_one_every_default(tmp_path: Path) -> None:
    assert load(tmp_path, "version: 1\nsysctl:\n  vm.swappiness: 10\n").envelope is None
    bare = load(tmp_path, "version: 1\nenvelope:\nsysctl:\n  vm.swappiness: 10\n")
    assert bare.envelope == DEFAULTS and list(bare.sections) == ["sysctl"]
    alone = load(tmp_path, "version: 1\nenvelope:\n  slowdown: 0.02\n")
    assert alone.envelope == Limits(slowdown=0.02) and alone.sections == {}


def test_given_keys_override_their_defaults(tmp_path: Path) -> None:
    spec = load(tmp_path, """\
        version: 1
        envelope:
          sample_every: 500ms
          slowdown: 0.02
          power_cap: 0
          other_processes: 1
          remapped_rows_pending: true
          xid: any
          state: ignored
        """)
    assert spec.envelope == Limits(sample_every=0.5, slowdown=0.02, power_cap=0.0,
                                   other_processes=1, remapped_rows_pending=True, xid="any",
                                   state="ignored")


@pytest.mark.parametrize(("line", "message"), [
    ("slowdown: 5", r"spec.yaml:3: envelope: slowdown is a share of the run, a number from 0 "
                    r"to 1 \(0.01 is 1%\), got int 5"),
    ("pcie_replays: -1", r"spec.yaml:3: envelope: pcie_replays is a count"),
    ("pcie_replays: any", r"spec.yaml:3: envelope: pcie_replays is a count"),
    ("sample_every: soon", r"spec.yaml:3: envelope: sample_every: 'soon' is no duration"),
    ("xid: hardwar", r"spec.yaml:3: envelope: xid 'hardwar' is none of: off, hardware, any "
                     r"\(did you mean 'hardware'"),
    ("slowdon: 0.01", r"spec.yaml:3: unknown key 'slowdon' in the envelope section \(did you "
                      r"mean 'slowdown'"),
])
def test_a_wrong_value_is_refused_at_its_line(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        load(tmp_path, f"version: 1\nenvelope:\n  {line}\n")


def test_durations() -> None:
    assert [seconds(t) for t in ("1s", "500ms", "2m", "0", "1.5")] == [1.0, 0.5, 120.0, 0.0, 1.5]
    with pytest.raises(ValueError):
        seconds("-1s")
