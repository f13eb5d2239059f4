"""The reference tools' outputs, parsed from fixtures written in their real formats."""

from __future__ import annotations

import pytest

from pytest_gpuhost.bandwidth import (
    Measurements,
    ParseError,
    Rate,
    parse_nvbandwidth_json,
    parse_nvbandwidth_text,
    parse_output,
    parse_p2p_bandwidth_latency_test,
    to_measurements,
)

from .conftest import FIXTURES

GPUS4 = ("0000:01:00.0", "0000:21:00.0", "0000:81:00.0", "0000:a1:00.0")


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nvbandwidth_v02_text_zero_diagonal_and_waiving() -> None:
    output = parse_nvbandwidth_text(read("nvbandwidth_v0.2_4gpu.txt"))
    assert output.tool == "nvbandwidth v0.2"
    assert "device_to_device_bidirectional_memcpy_read_ce" in output.waived
    d2d = output.matrices["device_to_device_memcpy_read_ce"]
    assert d2d[(0, 0)] == 0.0
    # 'GPU(row) <- GPU(column)': data flows column -> row, so (source, target) is transposed.
    assert d2d[(0, 2)] == 19.86 and d2d[(2, 0)] == 19.84
    measured = to_measurements(output, GPUS4, "test")
    assert measured.rates["0000:01:00.0->0000:21:00.0"] == Rate(25.28)
    assert measured.rates["h2d[0000:81:00.0]"] == Rate(24.70)
    assert measured.rates["d2h[0000:a1:00.0]"] == Rate(26.15)
    assert "PCI address order" in measured.notes[0]
    assert measured.source == "nvbandwidth v0.2 (test): device_to_device_memcpy_read_ce"


def test_nvbandwidth_v08_text_na_cells_and_the_sum_line_names_the_test() -> None:
    output = parse_nvbandwidth_text(read("nvbandwidth_v0.8_3gpu_na.txt"))
    measured = to_measurements(output, GPUS4[:3], "test")
    assert measured.rates["0000:01:00.0->0000:21:00.0"] == Rate(52.17)
    na = measured.rates["0000:21:00.0->0000:81:00.0"]
    assert na.gbps is None and "reported N/A for device 1 -> 2" in str(na.problem)
    assert "no device_to_host_memcpy_ce results" in str(measured.rates["d2h[0000:01:00.0]"].problem)


def test_a_gpu_beyond_the_output_is_named() -> None:
    measured = to_measurements(parse_output(read("nvbandwidth_v0.8_3gpu_na.txt")), GPUS4, "t")
    assert "(0, 3)" in str(measured.rates["0000:01:00.0->0000:a1:00.0"].problem)


def test_waived_p2p_tests_fail_the_pairs_with_the_reason() -> None:
    output = parse_output(read("nvbandwidth_v0.8_waived_p2p.txt"))
    measured = to_measurements(output, GPUS4[:2], "t")
    problem = str(measured.rates["0000:01:00.0->0000:21:00.0"].problem)
    assert "waived device_to_device_memcpy_read_ce" in problem
    assert measured.rates["h2d[0000:21:00.0]"] == Rate(55.91)


def test_nvbandwidth_json_string_cells_and_waived_status() -> None:
    output = parse_nvbandwidth_json(read("nvbandwidth_2gpu.json"))
    assert output.tool == "nvbandwidth v0.7"
    measured = to_measurements(output, GPUS4[:2], "t")
    assert measured.rates["0000:21:00.0->0000:01:00.0"] == Rate(26.2987)
    assert measured.rates["h2d[0000:01:00.0]"] == Rate(24.8811)
    assert "waived device_to_host_memcpy_ce" in str(measured.rates["d2h[0000:01:00.0]"].problem)
    assert parse_output(read("nvbandwidth_2gpu.json")).matrices == output.matrices


def test_p2p_bandwidth_latency_test_bus_ids_and_cannot_access() -> None:
    output = parse_p2p_bandwidth_latency_test(read("p2pBandwidthLatencyTest_3gpu_one_cannot.txt"))
    assert output.devices == {0: "0000:1b:00.0", 1: "0000:3d:00.0", 2: "0000:89:00.0"}
    gpus = ("0000:1b:00.0", "0000:3d:00.0", "0000:89:00.0")
    measured = to_measurements(output, gpus, "t")
    assert measured.rates["0000:1b:00.0->0000:3d:00.0"] == Rate(24.97)
    staged = measured.rates["0000:1b:00.0->0000:89:00.0"]
    assert staged.gbps is None  # never the host-staged copy's number
    assert "CANNOT access peer device 2 (its 19.90 GB/s is a copy staged" in str(staged.problem)
    assert measured.notes == ()


def test_bus_ids_that_are_not_these_gpus_are_noted() -> None:
    output = parse_output(read("p2pBandwidthLatencyTest_3gpu_one_cannot.txt"))
    measured = to_measurements(output, GPUS4[:2], "t")
    assert "names no GPU at 0000:01:00.0, 0000:21:00.0" in measured.notes[0]
    assert "does not name this GPU pair" in str(measured.rates[f"{GPUS4[0]}->{GPUS4[1]}"].problem)


@pytest.mark.parametrize("text", ["", "hello\n", "memcpy CE GPU(row) -> GPU(column) bandwidth "
                                  "(GB/s)\n  0  1\n 0  N/A  x\n", "{\"other\": 1}"])
def test_garbage_is_a_parse_error(text: str) -> None:
    with pytest.raises(ParseError):
        parse_output(text)


def test_measurements_round_trip_through_json() -> None:
    measured = Measurements("src", {"a->b": Rate(1.5), "c->d": Rate(None, "no peer")}, ("n",))
    assert Measurements.from_dict(measured.as_dict()) == measured
