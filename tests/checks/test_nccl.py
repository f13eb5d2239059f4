"""The nccl section on a fake 8x RTX PRO 6000 board of two sockets, each GPU on a root port of
its own (pairs of a socket are NODE, across them SYS): a saved output judged, each cause of a
low bus bandwidth injected one at a time and together and named at its place, largest first,
wrong data failing whatever the bandwidth, the ring's bound and a floor as a share of it, a
saved output older than the host's state, and the section's errors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.files import OutputError
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.specmodel import SpecError
from pytest_gpuhost.testing.fakehost import ACS_KERNEL_DEFAULT, FakeHost
from pytest_gpuhost.testing.fakenccl import nccl_tests_text

from ..conftest import ended_within
from ..runner import run_spec

BUSES = (0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1)
GPUS = tuple(f"0000:{bus:02x}:00.0" for bus in BUSES)
PORTS = tuple(f"0000:{bus - 1:02x}:01.1" for bus in BUSES)
ACS_AT = 2
"""The GPU whose root port redirects (``acs``): hops 1->2 and 2->3 of the ring cross it."""
ID = "nccl[all_reduce@1G]"

pytest_plugins = ["pytester"]


def board(root: Path, *, acs: bool = False) -> FakeHost:
    fake = FakeHost(root)
    for i, (gpu, port) in enumerate(zip(GPUS, PORTS, strict=True)):
        fake.bridge(port, acs=ACS_KERNEL_DEFAULT if acs and i == ACS_AT else 0,
                    numa_node=i // 4)
        fake.gpu(gpu, parent=port, numa_node=i // 4, audio=False, max_read_request=4096)
    fake.iommu_groups({gpu: "identity" for gpu in GPUS})
    return fake


def spec(saved: Path, floor: str = "35", more: str = "") -> str:
    return (f"version: 1\nnccl:\n  all_reduce: {{bytes: 1G, min_busbw: {floor}, "
            f"from: {saved}}}\n{more}")


def judge(tmp_path: Path, text: str, *, floor: str = "35", more: str = "",
          acs: bool = False) -> CheckResult:
    fake = board(tmp_path / "host", acs=acs)
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(text)
    return run_spec(spec(saved, floor, more), fake.root)[ID]


def causes(record: CheckResult) -> list[str]:
    return [c["cause"] for c in record.details["explain"]]


def cause(record: CheckResult, name: str) -> dict[str, Any]:
    [found] = [c for c in record.details["explain"] if c["cause"] == name]
    return dict(found)


HEALTHY: dict[str, Any] = {"env": {"NCCL_MIN_NCHANNELS": "8"}, "channels": 8}
SPEC_ENV = "  env: {NCCL_MIN_NCHANNELS: \"8\"}\n"
INJECTED: dict[str, tuple[str, Mapping[str, Any], bool]] = {
    # what is injected: (the cause it makes, the run's output, ACS on a root port)
    "p2p_disable": ("nccl_transport", {"env": {"NCCL_MIN_NCHANNELS": "8", "NCCL_P2P_DISABLE":
                                               "1"}, "default_transport": "SHM/direct/direct"},
                    False),
    "p2p_level": ("nccl_transport", {"env": {"NCCL_MIN_NCHANNELS": "8", "NCCL_P2P_LEVEL": "PIX"},
                                     "default_transport": "SHM/direct/direct"}, False),
    "channels": ("nccl_channels", {"env": {"NCCL_MIN_NCHANNELS": "2"}, "channels": 2}, False),
    "acs": ("acs_redirect", {}, True),
}


def test_a_saved_run_of_a_tuned_board_passes_and_says_its_bound(tmp_path: Path) -> None:
    record = judge(tmp_path, nccl_tests_text(GPUS, 37.6, sizes=(2**30,), **HEALTHY),
                   more=SPEC_ENV)
    assert record.outcome is Outcome.PASSED and record.observed == "37.60"
    assert record.expected == ">= 35 GB/s (all_reduce busbw at 1G)"
    details = record.details
    assert causes(record) == ["cross_socket", "cross_socket"]  # the board's: hops 3->4, 7->0
    crossing = record.details["explain"][0]
    assert crossing["at"] == f"pci0000:60 -> pci0000:80 (hop {GPUS[3]}->{GPUS[4]})"
    assert crossing["remedy"].startswith("the board decides it: a ring over both sockets "
                                         "crosses their interconnect twice")
    assert details["limit_gbps"] == 45.0 and details["fraction"] == 0.836  # the sockets' hop
    assert details["ring"][3] == f"{GPUS[3]}->{GPUS[4]}" and len(details["ring"]) == 8
    assert (details["channels"], details["nccl_version"]) == (8, "2.26.2+cuda12.8")
    assert details["wrong"] == 0
    assert details["transports"] == {"P2P/CUMEM/read": 64}
    assert details["source"] == f"recorded in {tmp_path / 'all_reduce.txt'}"


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_each_cause_alone_is_named_at_its_place(tmp_path: Path, name: str) -> None:
    made, output, acs = INJECTED[name]
    given = {**HEALTHY, **output}
    record = judge(tmp_path, nccl_tests_text(GPUS, 22.2, sizes=(2**30,), **given), acs=acs,
                   more=SPEC_ENV)
    assert record.outcome is Outcome.FAILED
    found = [c for c in causes(record) if c != "cross_socket"]
    assert found[0] == made and set(found) <= {made, "nccl_env"}
    top = cause(record, made)
    assert record.message.startswith("22.20 GB/s < floor 35 GB/s (all_reduce busbw at 1G), "
                                     "63% of it: ")
    assert top["remedy"] in record.message.splitlines()[0]
    if name == "p2p_disable":
        assert top["at"].count("->") == 8 and "NCCL_P2P_DISABLE=1" in top["observed"]
        assert top["remedy"].startswith("unset NCCL_P2P_DISABLE")
    elif name == "p2p_level":
        assert top["observed"] == ("SHM/direct/direct on 8 ring pairs (of 64 connections): "
                                   "NCCL_P2P_LEVEL=PIX is tighter than the pairs' paths (NODE, "
                                   "SYS)")
        assert top["remedy"].startswith("unset NCCL_P2P_LEVEL, or set it to SYS")
    elif name == "channels":
        assert (top["observed"], top["expected"]) == (
            "2 coll channels: NCCL_MIN_NCHANNELS=2 asks for too few", ">= 8")
        assert top["loss"] == 0.41
    else:
        assert top["at"] == f"{PORTS[ACS_AT]} (hop {GPUS[1]}->{GPUS[2]} and 1 more)"
        assert top["observed"].startswith("ACSCtl 0x001d: ReqRedir+")


def test_every_cause_together_largest_first(tmp_path: Path) -> None:
    text = nccl_tests_text(GPUS, 9.5, sizes=(2**30,), channels=2, wrong={2**30: 1},
                           env={"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"},
                           transports={(3, 4): "SHM/direct/direct"})
    record = judge(tmp_path, text, acs=True, more=SPEC_ENV)
    assert causes(record) == ["nccl_wrong", "nccl_transport", "nccl_channels", "acs_redirect",
                              "cross_socket", "cross_socket", "nccl_env", "nccl_env"]
    assert cause(record, "nccl_transport")["at"] == f"{GPUS[3]}->{GPUS[4]}"
    assert cause(record, "nccl_channels")["observed"] == ("2 coll channels: NCCL's default on "
                                                          "this topology")
    env = {c["at"]: c for c in record.details["explain"] if c["cause"] == "nccl_env"}
    assert env["NCCL_ALGO"]["observed"] == "NCCL_ALGO=Ring"
    assert env["NCCL_MIN_NCHANNELS"]["observed"] == "not set"
    assert record.message.startswith("#wrong 2: the collective returned wrong data (all_reduce "
                                     "busbw at 1G): the collective's wrong values (1 out of "
                                     "place, 1 in place) returned wrong data")
    assert "(and 7 more: nccl_transport, nccl_channels, acs_redirect, cross_socket, nccl_env)" \
        in record.message


def test_wrong_data_fails_whatever_the_bandwidth(tmp_path: Path) -> None:
    record = judge(tmp_path, nccl_tests_text(GPUS, 40.0, sizes=(2**30,), wrong={2**30: 3},
                                             **HEALTHY), more=SPEC_ENV)
    assert record.outcome is Outcome.FAILED and record.observed == "40.00"
    assert causes(record)[0] == "nccl_wrong" and record.details["wrong"] == 6
    assert record.message.startswith("#wrong 6: the collective returned wrong data")


def test_a_floor_as_a_share_of_the_ring_s_bound(tmp_path: Path) -> None:
    text = nccl_tests_text(GPUS, 37.6, sizes=(2**30,), **HEALTHY)
    record = judge(tmp_path, text, floor="{path: 0.9}", more=SPEC_ENV)
    assert record.outcome is Outcome.FAILED  # 90% of 45 (the hop between sockets) is 40.5
    assert record.expected == (">= 40.5 GB/s (all_reduce busbw at 1G; path: 90% of the ring's "
                               "bound 45.00 GB/s)")
    assert record.details["floor"] == 40.5
    assert judge(tmp_path / "2", text, floor="{path: 0.6}", more=SPEC_ENV).outcome is \
        Outcome.PASSED


@pytest.mark.parametrize("older", ["boot", "fix"])
def test_a_saved_run_older_than_the_host_s_state_is_judged_with_a_warning(
        tmp_path: Path, older: str) -> None:
    fake = board(tmp_path / "host")
    saved = tmp_path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 37.6, sizes=(2**30,), **HEALTHY))
    os.utime(saved, (1_780_000_000, 1_780_000_000))  # 2026-05-28 20:26:40 UTC
    if older == "boot":
        fake.file("proc/stat", "cpu  1 2 3 4\nbtime 1780000100\n")
    else:
        fake.file("proc/stat", "cpu  1 2 3 4\nbtime 1770000000\n")
        fake.file("var/lib/pytest-gpuhost/journal/20260601T000000Z-spec-77.jsonl", "")
    record = run_spec(spec(saved, more=SPEC_ENV), fake.root)[ID]
    assert record.outcome is Outcome.PASSED
    said = ("the host's last boot (2026-05-28 20:28:20 UTC)" if older == "boot" else
            "the host's last --fix (2026-06-01 00:00:00 UTC)")
    assert record.warnings == (f"{saved} was written 2026-05-28 20:26:40 UTC, before {said}: "
                               "it predates the host's state",)
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    saved.rename(fresh / "all_reduce.txt")
    os.utime(fresh / "all_reduce.txt", (1_790_000_000, 1_790_000_000))
    assert run_spec(spec(fresh / "all_reduce.txt", more=SPEC_ENV),
                    fake.root)[ID].warnings == ()


@pytest.mark.parametrize(("text", "words"), [
    (nccl_tests_text(GPUS, 30.0, sizes=(2**29,)), "no row at 1073741824 bytes (rows: 536870912) "
                                                  "(no_row)"),
    (nccl_tests_text(GPUS, 30.0, sizes=(2**30,), cut_after=0),
     "cut short after 0 rows: no '# Avg bus bandwidth' line (truncated)"),
    (nccl_tests_text(GPUS, 30.0, sizes=(2**30,), collective="all_gather"),
     "not an output of all_reduce: it is all_gather_perf's output (other_collective)"),
    (nccl_tests_text(GPUS, 30.0, sizes=(2**30,), cut_after=0, failure="unhandled system error"),
     "the run died after 0 rows: gpu-node-07: Test NCCL failure common.cu:1154 'unhandled "
     "system error' (died)"),
    (nccl_tests_text(GPUS[:1], 0.0, sizes=(2**30,)), "a run of 1 rank moves nothing over a "
                                                     "link: its busbw is no link figure "
                                                     "(one_rank)"),
])
def test_a_saved_output_that_cannot_be_judged_is_an_error_saying_which(
        tmp_path: Path, text: str, words: str) -> None:
    record = judge(tmp_path, text)
    assert record.outcome is Outcome.ERROR
    assert record.message.startswith(f"recorded in {tmp_path / 'all_reduce.txt'}: ")
    assert words in record.message


@pytest.mark.parametrize("kind", ["FIFO", "directory"])
def test_a_saved_output_that_is_no_regular_file_is_an_error_and_never_waits(
        tmp_path: Path, kind: str) -> None:
    """A FIFO named by ``from:`` would block an open for reading until a writer came."""
    fake = board(tmp_path / "host")
    saved = tmp_path / "all_reduce.txt"
    if kind == "FIFO":
        os.mkfifo(saved)
    else:
        saved.mkdir()
    done = ended_within(60.0, lambda: run_spec(spec(saved), fake.root)[ID],
                        "judging a FIFO as a saved output")
    assert isinstance(done, CheckResult) and done.outcome is Outcome.ERROR
    assert f"cannot read {saved}: a {kind}, not a regular file" in done.message


def test_one_check_per_collective_and_size(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    saved = tmp_path / "sweep.txt"
    saved.write_text(nccl_tests_text(GPUS, 30.0, sizes=(2**28, 2**30)))
    records = run_spec(f"version: 1\nnccl:\n  all_reduce: {{bytes: [256M, 1g], min_busbw: 20, "
                       f"from: {saved.name}, gpus: 8}}\n", fake.root, workdir=tmp_path)
    nccl = {key: r.outcome for key, r in records.items() if r.kind == "nccl"}
    assert nccl == {"nccl[all_reduce@256M]": Outcome.PASSED, ID: Outcome.PASSED}
    assert records[ID].details["source"] == f"recorded in {saved}"  # beside the spec


@pytest.mark.parametrize(("section", "message"), [
    ("nccl: {}", "nccl needs a collective: one or more of all_reduce"),
    ("nccl: {all_reduce: {min_busbw: 3}}", "nccl all_reduce needs bytes"),
    ("nccl: {all_reduce: {bytes: 1T, min_busbw: 3}}", "as nccl-tests' -b takes it"),
    ("nccl: {all_reduce: {bytes: 1G}}", "needs min_busbw"),
    ("nccl: {all_reduce: {bytes: 1G, min_busbw: {path: 2}}}", "0 < x <= 1"),
    ("nccl: {all_reduce: {bytes: 1G, min_busbw: 3, gpus: 1}}", "gpus (or all) must be a whole "
                                                             "number >= 2"),
    ("nccl: {allreduce: {bytes: 1G, min_busbw: 3}}", "allreduce"),
    ("nccl: {all_reduce: {bytes: 1G, min_busbw: 3}, env: {OMP_NUM_THREADS: 4}}",
     "nccl env names NCCL_* variables"),
    ("nccl: {all_reduce: {bytes: 1G, min_busbw: 3}, tests_dir: ../build}",
     "nccl tests_dir must be a directory under the target's root"),
])
def test_bad_sections_are_spec_errors(tmp_path: Path, section: str, message: str) -> None:
    with pytest.raises(SpecError, match=None) as raised:
        run_spec(f"version: 1\n{section}\n", board(tmp_path / "host").root)
    assert message in str(raised.value) and "spec.yaml:" in str(raised.value)


def test_more_gpus_than_the_target_has_is_an_error(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    record = run_spec("version: 1\nnccl: {all_reduce: {bytes: 1G, min_busbw: 3, gpus: 16}}\n",
                      fake.root)[ID]
    assert record.outcome is Outcome.ERROR
    assert record.message == ("all_reduce needs at least 2 GPUs and at most the target's 8 GPUs;"
                              " the spec asks for 16")


def test_allure_and_the_fleet_page_show_a_collective_s_top_cause(pytester: pytest.Pytester,
                                                                 tmp_path: Path) -> None:
    import json

    from pytest_gpuhost.fleet import read_reports
    from pytest_gpuhost.fleet.page import page_data

    from ..reports.test_reports import allure_results, attachment

    fake = board(tmp_path / "host")
    saved = pytester.path / "all_reduce.txt"
    saved.write_text(nccl_tests_text(GPUS, 22.2, sizes=(2**30,), channels=8,
                                     env={"NCCL_P2P_LEVEL": "PIX"},
                                     transports={(3, 4): "SHM/direct/direct"}))
    pytester.makefile(".yaml", spec=spec(Path(saved.name)))
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-p",
                                "no:cacheprovider", "--alluredir=allure-results",
                                "--gpuhost-report=out.json")
    result.assert_outcomes(failed=1)
    out = pytester.path / "allure-results"
    ring = attachment(out, allure_results(out)[ID], "ring and causes").splitlines()
    assert ring[0] == (f"all_reduce at 1G over 8 GPUs: busbw 22.2 GB/s (recorded in {saved})")
    assert ring[2] == "environment taken: NCCL_P2P_LEVEL=PIX"
    assert ring[12] == f"bound: 45.00 GB/s, the path of {GPUS[3]}->{GPUS[4]}; reached 49% of it"
    assert ring[14].startswith(f"  nccl_transport at {GPUS[3]}->{GPUS[4]}: SHM/direct/direct on "
                               "1 ring pair (of 64 connections): NCCL_P2P_LEVEL=PIX")
    data = page_data(read_reports([pytester.path / "out.json"]), [], "t")
    [row] = data["targets"]
    tips = {data["strings"][data["checks"][row[3][i]][1]]: data["strings"][row[3][i + 6]]
            for i in range(0, len(row[3]), 7) if row[3][i + 6] >= 0}
    assert tips[ID].startswith(f"nccl_transport at {GPUS[3]}->{GPUS[4]}: sends ring traffic "
                               "through host memory (SHM) instead of GPU to GPU; unset "
                               "NCCL_P2P_LEVEL")
    report = json.loads((pytester.path / "out.json").read_text())
    [check] = report["checks"]
    assert check["details"]["explain"][0]["cause"] == "nccl_transport"


def test_a_capture_holds_each_collective_to_90_percent_of_its_lowest(tmp_path: Path) -> None:
    import yaml

    fake = board(tmp_path / "host")
    saved = tmp_path / "sweep.txt"
    saved.write_text(nccl_tests_text(GPUS, lambda size: 30.0 if size < 2**30 else 37.6,
                                     sizes=(2**28, 2**30), **HEALTHY))
    text = (f"version: 1\nnccl:\n  all_reduce: {{bytes: [256M, 1G], min_busbw: 20, from: "
            f"{saved}, why: tp}}\n  env: {{NCCL_MIN_NCHANNELS: \"8\"}}\n  pause: 3\n")
    run_spec(text, fake.root, workdir=tmp_path, capture="got.yaml")
    got = yaml.safe_load((tmp_path / "got.yaml").read_text())["nccl"]
    assert got == {"all_reduce": {"gpus": "all", "bytes": ["256M", "1G"], "min_busbw": 27,
                                  "from": str(saved), "why": "tp"},
                   "env": {"NCCL_MIN_NCHANNELS": 8}, "pause": 3.0}  # env reads 8 as "8"
    shared = text.replace("min_busbw: 20", "min_busbw: {path: 0.3}")
    run_spec(shared, fake.root, workdir=tmp_path, capture="share.yaml")
    share = yaml.safe_load((tmp_path / "share.yaml").read_text())["nccl"]["all_reduce"]
    assert share["min_busbw"] == {"path": 0.6}  # 30 of 45 is 67%: 90% of it, rounded down
    saved.write_text(nccl_tests_text(GPUS, 37.6, sizes=(2**28, 2**30), wrong={2**28: 1}))
    with pytest.raises(OutputError, match="nccl all_reduce: all_reduce@256M: #wrong 2"):
        run_spec(text, fake.root, workdir=tmp_path, capture="wrong.yaml")


def test_the_catalog_runs_nccl_only_where_nccl_tests_is(tmp_path: Path) -> None:
    from pytest_gpuhost.testing.fakenccl import install_nccl_tests

    fake = board(tmp_path / "host")
    done = run_spec((), fake.root, workdir=tmp_path, capture="all.yaml")
    assert done[ID].outcome is Outcome.SKIPPED
    assert done[ID].message == ("when: nccl_tests is false: no all_reduce_perf (nccl-tests) in "
                                "the root's bin directories or on PATH")
    install_nccl_tests(fake.root, [nccl_tests_text(GPUS, 37.6, sizes=(2**30,), **HEALTHY)])
    again = run_spec((), fake.root, workdir=tmp_path, capture="again.yaml")
    assert again[ID].outcome is Outcome.PASSED and again[ID].observed == "37.60"


def test_the_reference_s_explanation_is_what_the_check_says(tmp_path: Path) -> None:
    reference = (Path(__file__).parents[2] / "docs" / "reference.md").read_text()
    block = reference.split(f"```text\n{ID} failed: ", 1)[1].split("```", 1)[0]
    text = nccl_tests_text(GPUS, 22.2, sizes=(2**30,), env={"NCCL_P2P_LEVEL": "PIX"},
                           transports={(0, 1): "SHM/direct/direct", (3, 4): "SHM/direct/direct"})
    record = judge(tmp_path, text)
    assert record.message == " ".join(block.split())
    assert (record.details["limit_gbps"], record.details["fraction"]) == (45.0, 0.493)
    assert f"`fraction` ({record.details['fraction']})" in reference


def test_a_saved_run_over_two_machines_is_judged_but_its_hops_not_explained(
        tmp_path: Path) -> None:
    text = nccl_tests_text(GPUS, 30.0, sizes=(2**30,), **HEALTHY)
    text = text.replace("#  Rank  7 Group  0 Pid  48213 on gpu-node-07",
                        "#  Rank  7 Group  0 Pid  48213 on gpu-node-08")
    record = judge(tmp_path, text, more=SPEC_ENV)
    assert record.outcome is Outcome.FAILED and record.observed == "30.00"
    assert record.details["ring"] == [] and record.details["limit_gbps"] is None
    assert record.details["explain_notes"][0] == ("a run over 2 machines (gpu-node-07, "
                                                  "gpu-node-08): its hops are not this "
                                                  "target's paths, and are not explained")
