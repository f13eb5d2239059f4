"""nccl-tests' text output and NCCL's INFO lines, parsed: a saved sweep of 8x RTX PRO 6000 on two
sockets (every row), the INFO lines NCCL prints of its choices, ``#wrong`` and ``N/A``, and each
output that cannot be judged, said as such."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.gpu.nccltests import (
    Connection,
    NcclOutputError,
    parse_nccl_tests,
    rank_addresses,
)
from pytest_gpuhost.testing.fakenccl import nccl_tests_text

FIXTURES = Path(__file__).parent.parent / "fixtures"
SWEEP = FIXTURES / "nccl_tests_all_reduce_8x_rtx_pro_6000_2socket.txt"
GPUS = tuple(f"0000:{bus:02x}:00.0" for bus in (0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1))


def test_every_row_and_what_nccl_said_of_a_saved_sweep() -> None:
    output = parse_nccl_tests(SWEEP.read_text())
    assert output.test == "all_reduce_perf"
    assert (output.threads, output.gpus, output.min_bytes, output.max_bytes, output.iters,
            output.validation, output.graph) == (1, 8, 8, 2**30, 20, True, 0)
    assert [row.size for row in output.rows] == [2**k for k in range(3, 31)]
    last = output.row(2**30)
    assert (last.count, last.type, last.redop, last.root) == (2**28, "float", "sum", -1)
    assert (last.time_us, last.algbw, last.busbw, last.wrong) == (84615.1, 12.69, 22.21, 0)
    assert (last.in_algbw, last.in_busbw, last.in_wrong) == (12.69, 22.21, 0)
    assert output.row(8).busbw == 0.0 and output.row(8192).busbw == 0.58
    assert (output.out_of_bounds, output.avg_busbw) == (0, 9.7449)
    assert [(d.rank, d.host, d.device, d.bus) for d in output.devices[:2]] == [
        (0, "rtxpro-a07", 0, "0000:01:00"), (1, "rtxpro-a07", 1, "0000:21:00")]
    assert output.devices[7].name == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    assert output.version == "2.26.2+cuda12.8" and output.env == ()
    assert output.channels == 2 and output.rings == (tuple(range(8)),) * 2
    assert output.trees == ("[0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",)
    assert len(output.connections) == 16
    assert output.connections[3] == Connection(0, 3, 4, "P2P/CUMEM/read")
    assert rank_addresses(output, GPUS) == dict(enumerate(GPUS))
    assert output.collective_fits("all_reduce") is None
    assert output.collective_fits("all_gather") == "it is all_reduce_perf's output"


def test_the_environment_nccl_took_and_each_transport() -> None:
    text = nccl_tests_text(GPUS, 14.0, env={"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"},
                           default_transport="SHM/direct/direct")
    text += ("rtx:1:2 [0] NCCL INFO Channel 05 : 0[1000] -> 1[21000] via P2P/IPC\n"
             "rtx:1:2 [3] NCCL INFO Channel 02/0 : 3[3] -> 11[3] [send] via NET/IB/0/GDRDMA\n")
    output = parse_nccl_tests(text)
    assert output.environment() == {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}
    kinds = {(c.channel, c.source, c.target): (c.kind, c.direction) for c in output.connections}
    assert kinds[(0, 0, 1)] == ("SHM", None) and kinds[(2, 3, 11)] == ("NET", "send")
    assert Connection(5, 0, 1, "P2P/IPC") in output.connections  # the older form, bus ids


@pytest.mark.parametrize("where", ["out", "in"])
def test_wrong_values_are_caught_out_of_place_and_in_place(where: str) -> None:
    text = nccl_tests_text(GPUS, 38.0, wrong={2**30: 3})
    if where == "in":  # only the in-place column says it
        lines = text.splitlines()
        at = next(i for i, line in enumerate(lines) if line.strip().startswith("1073741824"))
        cells = lines[at].split()
        cells[8] = "0"
        lines[at] = "  ".join(cells)
        text = "\n".join(lines) + "\n"
    row = parse_nccl_tests(text).row(2**30)
    assert row.errors == (6 if where == "out" else 3)
    assert parse_nccl_tests(text).row(2**29).errors == 0


def test_na_in_place_is_no_count_and_a_lone_gpu_is_one_rank() -> None:
    text = ("# nThread 1 nGpus 1 minBytes 1024 maxBytes 1024 step: 1048576(bytes) warmup iters: "
            "5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n"
            "#  Rank  0 Group  0 Pid   4242 on   lab-1 device  0 [0x81] NVIDIA RTX PRO 6000\n#\n"
            "        1024           256     float    none      -1    19.56  0.05    0.00      0"
            "     0.78  1.31    0.00    N/A\n# Out of bounds values : 0 OK\n"
            "# Avg bus bandwidth    : 0 \n")
    output = parse_nccl_tests(text)
    assert output.rows[0].wrong == 0 and output.rows[0].in_wrong is None
    assert output.ranks == 1 and output.devices[0].bus_number == 0x81
    assert rank_addresses(output, GPUS) == {0: "0000:81:00.0"}  # by its bus, not its number
    assert output.collective_fits("alltoall") is None
    assert "root -1" in str(output.collective_fits("broadcast"))
    assert "redop none" in str(output.collective_fits("all_reduce"))


@pytest.mark.parametrize(("text", "reason", "words"), [
    (nccl_tests_text(GPUS, 30.0, cut_after=2), "truncated", "cut short after 2 rows"),
    (nccl_tests_text(GPUS, 30.0, cut_after=1, failure="unhandled cuda error"), "died",
     "died after 1 rows: rtx"),
    ("rtx: Test NCCL failure common.cu:891 'invalid usage'\n", "died", "before its header"),
    ("Segmentation fault (core dumped)\n", "not_nccl_tests", "no '# nThread"),
])
def test_an_output_that_cannot_be_judged_says_why(text: str, reason: str, words: str) -> None:
    text = text.replace("gpu-node-07", "rtx")
    with pytest.raises(NcclOutputError) as raised:
        parse_nccl_tests(text)
    assert raised.value.reason == reason and words in str(raised.value)


def test_no_row_at_the_size_names_the_sizes_there_are() -> None:
    output = parse_nccl_tests(nccl_tests_text(GPUS, 30.0, sizes=(2**20, 2**21)))
    with pytest.raises(NcclOutputError) as raised:
        output.row(2**30)
    assert raised.value.reason == "no_row"
    assert str(raised.value) == "no row at 1073741824 bytes (rows: 1048576, 2097152)"


def test_another_collective_without_the_starting_line_by_its_rows() -> None:
    output = parse_nccl_tests(nccl_tests_text(GPUS, 30.0, collective="broadcast",
                                              starting=False))
    assert output.test is None
    assert output.collective_fits("broadcast") is None
    assert output.collective_fits("all_reduce") == ("its rows have redop none and root 0, which "
                                                    "all_reduce never prints")
