"""A collective's ring bound where the same spec measures P2P: each hop carries the lower of its
path's limit and its measured P2P bandwidth, the p2p section's one measurement (never taken
twice, under xdist too), the record saying which; without a p2p section, or with one in another
spec, the bound stays the path's. On the fake 8-GPU board of ``test_nccl`` (hops within a
socket carry 57.61 GB/s, the two across the sockets 45), with a fake nvbandwidth that logs
each run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_gpuhost.checks import Facts
from pytest_gpuhost.checks.offers import p2p_bandwidth
from pytest_gpuhost.gpu.bandwidth import Measurements, Rate
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.reports.topology import ring_text
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenccl import nccl_tests_text
from pytest_gpuhost.testing.faketools import saved_nvbandwidth_script

from ..runner import Run, run_spec
from .test_nccl import GPUS, HEALTHY, ID, SPEC_ENV, board

pytest_plugins = ["pytester"]

SLOW = (GPUS[1], GPUS[2])
"""The hop the measurement finds slow: 30 GB/s, below its path's 57.61 and the sockets' 45."""
HOP = f"{SLOW[0]}->{SLOW[1]}"
P2P = "p2p: {probe: nvbandwidth, floors: {same_numa: 1, cross_numa: 1}}\n"


def measured(fake: FakeHost, rates: Mapping[tuple[str, str], float | None],
             rest: float = 50.0) -> None:
    """A fake nvbandwidth under the root whose read test gives ``rates`` (data from a to b; None:
    ``N/A``), and ``rest`` GB/s for every other pair."""
    cells = [["N/A" if a == b or (rate := rates.get((a, b), rest)) is None else f"{rate:.4f}"
              for a in GPUS] for b in GPUS]  # row b reads from column a: data a -> b
    fake.file("nvbandwidth.json", json.dumps({"nvbandwidth": {"version": "v0.8", "testcases": [
        {"name": "device_to_device_memcpy_read_ce", "status": "Passed",
         "bandwidth_description": "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)",
         "bandwidth_matrix": cells}]}}))
    fake.file("usr/bin/nvbandwidth", saved_nvbandwidth_script(), mode=0o755)


def runs(fake: FakeHost) -> list[str]:
    log = fake.root / "nvbandwidth.log"
    return log.read_text().splitlines() if log.exists() else []


def nccl(saved: Path, floor: str = "20") -> str:
    return f"nccl:\n  all_reduce: {{bytes: 1G, min_busbw: {floor}, from: {saved}}}\n{SPEC_ENV}"


def judge(tmp_path: Path, busbw: float, *, floor: str = "20", p2p: str = P2P,
          rates: Mapping[tuple[str, str], float | None] | None = None) -> tuple[Run, FakeHost]:
    fake = board(tmp_path / "host")
    measured(fake, {SLOW: 30.0} if rates is None else rates)
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, busbw, sizes=(2**30,), **HEALTHY))
    return run_spec(f"version: 1\n{p2p}{nccl(saved, floor)}", fake.root), fake


def reference() -> str:
    """docs/reference.md, its whitespace as one space."""
    return " ".join((Path(__file__).parents[2] / "docs" / "reference.md").read_text().split())


def bound(record: CheckResult) -> tuple[object, ...]:
    details = record.details
    return (details["limit_gbps"], details["limit_hop"], details["limit_by"],
            details["fraction"])


def test_the_ring_is_bound_by_its_slowest_measured_hop_measured_once(tmp_path: Path) -> None:
    records, fake = judge(tmp_path, 22.2)
    assert runs(fake) == ["-j -b 256 -t device_to_device_memcpy_read_ce"]  # p2p's, and nccl's
    pair = records[f"p2p[{HOP}]"]
    assert pair.outcome is Outcome.PASSED and pair.observed == "30.00"
    record = records[ID]
    assert record.outcome is Outcome.PASSED
    assert bound(record) == (30.0, HOP, "measured", 0.74)
    hops = record.details["hop_limits"]
    assert hops[HOP] == {"path_gbps": 57.61, "measured_gbps": 30.0}
    assert hops[f"{GPUS[3]}->{GPUS[4]}"] == {"path_gbps": 45.0, "measured_gbps": 50.0}
    evidence = {e["source"]: e["raw"] for e in record.evidence}
    assert evidence["ring bound"] == (f"30.00 GB/s, the measured P2P bandwidth of its slowest "
                                      f"hop {HOP} (its path carries 57.61)")
    assert f"`{evidence['ring bound']}`" in reference()  # the reference says what it does
    assert f"bound: 30.00 GB/s, the measured P2P bandwidth of {HOP}; reached 74% of it" in \
        str(ring_text(record.details)).splitlines()  # Allure's attachment


def test_an_offer_is_asked_for_when_a_check_runs(tmp_path: Path) -> None:
    """The seam: what a kind asked for before another offered it is the offer, taken when
    asked; the first offer of a key stands; a key of another spec, or no offer, is None."""
    facts = Facts(LocalHost(tmp_path))
    asked = facts.asked(p2p_bandwidth("a.yaml"))
    other = facts.asked(p2p_bandwidth("b.yaml"))
    taken: list[str] = []

    def take(name: str) -> Measurements:
        taken.append(name)
        return Measurements(name, {HOP: Rate(30.0)})

    assert asked() is None
    facts.offer(p2p_bandwidth("a.yaml"), lambda: take("first"))
    facts.offer(p2p_bandwidth("a.yaml"), lambda: take("second"))
    assert taken == []  # offered, not taken
    got = asked()
    assert got is not None and got.source == "first" and taken == ["first"]
    assert other() is None


def test_a_nccl_section_before_the_p2p_section_is_bound_alike(tmp_path: Path) -> None:
    """Whichever section the spec names first."""
    fake = board(tmp_path / "host")
    measured(fake, {SLOW: 30.0})
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 22.2, sizes=(2**30,), **HEALTHY))
    records = run_spec(f"version: 1\n{nccl(saved)}{P2P}", fake.root)
    assert bound(records[ID]) == (30.0, HOP, "measured", 0.74)
    assert len(runs(fake)) == 1


def test_a_measurement_above_every_path_leaves_the_path_s_bound(tmp_path: Path) -> None:
    records, fake = judge(tmp_path, 37.6, rates={})  # every pair at 50: the sockets' hop is 45
    record = records[ID]
    assert bound(record) == (45.0, f"{GPUS[3]}->{GPUS[4]}", "path", 0.836)
    evidence = {e["source"]: e["raw"] for e in record.evidence}
    assert evidence["ring bound"] == (f"45.00 GB/s, the path of its slowest hop {GPUS[3]}->"
                                      f"{GPUS[4]} (measured 50.00)")
    assert len(runs(fake)) == 1


def test_a_hop_the_measurement_has_no_rate_for_is_bound_by_its_path(tmp_path: Path) -> None:
    records, _ = judge(tmp_path, 22.2, rates={SLOW: None, (GPUS[5], GPUS[6]): 40.0})
    assert records[f"p2p[{HOP}]"].observed is None
    record = records[ID]
    assert bound(record) == (40.0, f"{GPUS[5]}->{GPUS[6]}", "measured", 0.555)
    assert record.details["hop_limits"][HOP] == {"path_gbps": 57.61, "measured_gbps": None}
    [note] = [n for n in record.details["explain_notes"] if HOP in n]
    assert note.startswith("nvbandwidth v0.8 (ran nvbandwidth -j -b 256 -t "
                           "device_to_device_memcpy_read_ce): device_to_device_memcpy_read_ce "
                           f"has no rate for the ring's hop {HOP} (")
    assert note.endswith("): bounded by the path alone")


@pytest.mark.parametrize(("share", "outcome", "floor"), [
    ("0.7", Outcome.PASSED, 21.0), ("0.8", Outcome.FAILED, 24.0)])
def test_a_path_share_floor_is_a_share_of_the_measured_bound(
        tmp_path: Path, share: str, outcome: Outcome, floor: float) -> None:
    records, _ = judge(tmp_path, 22.2, floor=f"{{path: {share}}}")
    record = records[ID]
    assert record.outcome is outcome and record.details["floor"] == floor
    assert record.expected == (f">= {floor:g} GB/s (all_reduce busbw at 1G; path: "
                               f"{float(share):.0%} of the ring's bound 30.00 GB/s, the measured "
                               f"P2P bandwidth of {HOP})")
    assert share != "0.7" or f"`{record.expected}`" in reference()


def test_without_p2p_the_bound_is_the_path_s(tmp_path: Path) -> None:
    records, fake = judge(tmp_path, 22.2, p2p="")
    record = records[ID]
    assert bound(record) == (45.0, f"{GPUS[3]}->{GPUS[4]}", "path", 0.493)
    assert record.details["hop_limits"][HOP] == {"path_gbps": 57.61, "measured_gbps": None}
    assert runs(fake) == []  # nothing measures P2P for it


def test_a_p2p_section_of_another_spec_does_not_bound_the_ring(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    measured(fake, {SLOW: 30.0})
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 22.2, sizes=(2**30,), **HEALTHY))
    (tmp_path / "p2p.yaml").write_text(f"version: 1\n{P2P}")
    (tmp_path / "nccl.yaml").write_text(f"version: 1\n{nccl(saved)}")
    records = run_spec([tmp_path / "p2p.yaml", tmp_path / "nccl.yaml"], fake.root)
    assert records[f"p2p[{HOP}]"].observed == "30.00"
    assert records[ID].details["limit_by"] == "path"
    assert records[ID].details["limit_gbps"] == 45.0


def test_only_host_copies_measured_leave_the_path_s_bound(tmp_path: Path) -> None:
    """A p2p section that measures no pair offers nothing: the collective takes no measurement
    of its own."""
    records, fake = judge(tmp_path, 22.2, p2p="p2p: {probe: nvbandwidth, floors: {h2d: 1}}\n")
    assert records[ID].details["limit_by"] == "path"
    assert runs(fake) == ["-j -b 256 -t host_to_device_memcpy_ce"]


def test_a_failed_measurement_leaves_the_path_s_bound_and_says_so(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    measured(fake, {SLOW: 30.0})
    (fake.root / "nvbandwidth.json").unlink()  # the fake has nothing to print: it fails
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 22.2, sizes=(2**30,), **HEALTHY))
    again = run_spec(f"version: 1\n{P2P}{nccl(saved)}", fake.root)
    assert again[f"p2p[{HOP}]"].outcome is Outcome.ERROR
    record = again[ID]
    assert record.outcome is Outcome.PASSED
    assert bound(record) == (45.0, f"{GPUS[3]}->{GPUS[4]}", "path", 0.493)
    [note] = [n for n in record.details["explain_notes"] if "measurement failed" in n]
    assert note.startswith("the p2p section's measurement failed (nvbandwidth -j -b 256 -t "
                           "device_to_device_memcpy_read_ce exited 1: ")
    assert note.endswith(": each hop is bounded by its path alone")
    assert len(runs(fake)) == 1  # failed once, kept: the collective does not try again


def test_under_xdist_the_measurement_is_taken_once(pytester: pytest.Pytester,
                                                   tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    measured(fake, {SLOW: 30.0})
    saved = pytester.path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 22.2, sizes=(2**30,), **HEALTHY))
    pytester.makefile(".yaml", spec=f"version: 1\n{P2P}{nccl(saved)}")
    result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}", "-n", "2",
                                           "-p", "no:cacheprovider", "--gpuhost-report=out.json")
    result.assert_outcomes(passed=57)
    assert runs(fake) == ["-j -b 256 -t device_to_device_memcpy_read_ce"]
    report = json.loads((pytester.path / "out.json").read_text())
    [check] = [c for c in report["checks"] if c["id"] == ID]
    assert (check["details"]["limit_gbps"], check["details"]["limit_by"]) == (30.0, "measured")
