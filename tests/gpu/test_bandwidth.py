"""The reference tools' outputs, parsed from fixtures written in their real formats."""

from __future__ import annotations

import pytest

from pytest_gpuhost.gpu.bandwidth import (
    Measurements,
    ParseError,
    Rate,
    parse_nvbandwidth_json,
    parse_nvbandwidth_text,
    parse_output,
    parse_p2p_bandwidth_latency_test,
    to_measurements,
)

from ..conftest import FIXTURES

GPUS4 = ("0000:01:00.0", "0000:21:00.0", "0000:81:00.0", "0000:a1:00.0")


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nvbandwidth_v02_text_zero_diagonal_and_waiving() -> None:
    output = parse_nvbandwidth_text(read("nvbandwidth_v0.2_4gpu.txt"))
    assert output.tool == "nvbandwidth v0.2"
    assert "device_to_device_bidirectional_memcpy_read_ce" in output.waived
    d2d = output.matrices["device_to_device_memcpy_read_ce"]
    assert d2d[(0, 0)] == 0.0
    # The read test: the row GPU reads from the column GPU, so (source, target) is transposed.
    assert d2d[(0, 2)] == 19.86 and d2d[(2, 0)] == 19.84
    measured = to_measurements(output, GPUS4, "test")
    assert measured.rates["0000:01:00.0->0000:21:00.0"] == Rate(25.28)
    # v0.2's 0.00 off the diagonal (row 3, column 1) is a pair it did not measure, not 0 GB/s.
    assert d2d[(1, 3)] is None
    unmeasured = measured.rates["0000:21:00.0->0000:a1:00.0"]
    assert unmeasured.gbps is None
    assert "reported 0.00 for device 1 -> 3: the pair was not measured" in str(unmeasured.problem)
    assert measured.rates["h2d[0000:81:00.0]"] == Rate(24.70)
    assert measured.rates["d2h[0000:a1:00.0]"] == Rate(26.15)
    assert "PCI address order" in measured.notes[0]
    assert measured.source == "nvbandwidth v0.2 (test): device_to_device_memcpy_read_ce"


def test_nvbandwidth_v08_text_na_cells_and_the_sum_line_names_the_test() -> None:
    output = parse_nvbandwidth_text(read("nvbandwidth_v0.8_3gpu_na.txt"))
    measured = to_measurements(output, GPUS4[:3], "test")
    # The read test: row 1 (the reader) got 52.21 from column 0: data flows GPU 0 -> 1.
    assert measured.rates["0000:01:00.0->0000:21:00.0"] == Rate(52.21)
    assert measured.rates["0000:21:00.0->0000:01:00.0"] == Rate(52.17)
    na = measured.rates["0000:81:00.0->0000:21:00.0"]  # row 1, column 2
    assert na.gbps is None and "reported N/A for device 2 -> 1" in str(na.problem)
    assert "no device_to_host_memcpy_ce results" in str(measured.rates["d2h[0000:01:00.0]"].problem)


def test_a_gpu_beyond_the_output_is_named() -> None:
    measured = to_measurements(parse_output(read("nvbandwidth_v0.8_3gpu_na.txt")), GPUS4, "t")
    assert "(0, 3)" in str(measured.rates["0000:01:00.0->0000:a1:00.0"].problem)


def test_waived_p2p_tests_fail_the_pairs_with_the_reason() -> None:
    output = parse_output(read("nvbandwidth_v0.8_waived_p2p.txt"))  # Running X. / Waived: MSG
    assert output.waived == {"device_to_device_memcpy_read_ce", "device_to_device_memcpy_write_ce"}
    measured = to_measurements(output, GPUS4[:2], "t")
    problem = str(measured.rates["0000:01:00.0->0000:21:00.0"].problem)
    assert problem == ("nvbandwidth v0.8 waived device_to_device_memcpy_read_ce (Waived: Peer "
                       "access is not available between the devices): P2P is not available "
                       "between these GPUs")
    assert measured.rates["h2d[0000:21:00.0]"] == Rate(55.91)
    d2h = str(measured.rates["d2h[0000:01:00.0]"].problem)
    assert d2h == ("nvbandwidth v0.8 gave no device_to_host_memcpy_ce result: Error: "
                   "cudaErrorMemoryAllocation: out of memory")


def test_the_old_waiving_line_is_still_read() -> None:
    output = parse_output(read("nvbandwidth_v0.2_waiving_p2p.txt"))  # Waiving NAME.
    assert output.waived == {"device_to_device_memcpy_read_ce", "device_to_device_memcpy_write_ce"}
    measured = to_measurements(output, GPUS4[:2], "t")
    assert str(measured.rates["0000:21:00.0->0000:01:00.0"].problem) == (
        "nvbandwidth v0.2 waived device_to_device_memcpy_read_ce: P2P is not available between "
        "these GPUs")
    assert measured.rates["h2d[0000:01:00.0]"] == Rate(25.50)


HEADER = "nvbandwidth Version: v0.8\n\nDevice 0: NVIDIA L40S\nDevice 1: NVIDIA L40S\n\n"


@pytest.mark.parametrize("status", ["Waived: needs 2 peer-capable GPUs", "Not Found: no such test",
                                    "Error: cudaErrorNoDevice"])
def test_a_file_whose_only_test_has_no_result_is_not_a_parse_error(status: str) -> None:
    text = HEADER + f"Running device_to_device_memcpy_read_ce.\n{status}\n"
    output = parse_nvbandwidth_text(text)
    assert output.matrices == {}
    assert output.problems == {"device_to_device_memcpy_read_ce": status}
    assert (status.startswith("Waived")) == bool(output.waived)
    problem = str(to_measurements(output, GPUS4[:2], "t").rates[f"{GPUS4[0]}->{GPUS4[1]}"].problem)
    assert status in problem


def test_the_write_test_keeps_its_rows_as_sources_whatever_its_label_says() -> None:
    # DeviceToDeviceWriteCE: M[row][col] = copy row -> column run by the row GPU, labelled
    # 'GPU(row) <- GPU(column)'; the read test's label is '->' with data flowing column -> row.
    text = HEADER + ("Running device_to_device_memcpy_write_ce.\n"
                     "memcpy CE GPU(row) <- GPU(column) bandwidth (GB/s)\n"
                     "           0         1\n 0       N/A     30.00\n 1     20.00       N/A\n"
                     "\nSUM device_to_device_memcpy_write_ce 50.00\n")
    measured = to_measurements(parse_output(text), GPUS4[:2], "t")
    assert measured.rates[f"{GPUS4[0]}->{GPUS4[1]}"] == Rate(30.00)
    assert measured.rates[f"{GPUS4[1]}->{GPUS4[0]}"] == Rate(20.00)
    read = text.replace("write", "read").replace("<-", "->")
    measured = to_measurements(parse_output(read), GPUS4[:2], "t")
    assert measured.rates[f"{GPUS4[0]}->{GPUS4[1]}"] == Rate(20.00)  # row 1 read from column 0


def test_a_table_cut_short_ends_there_and_later_tables_are_read() -> None:
    text = HEADER + ("Running host_to_device_memcpy_ce.\n"
                     "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n"
                     "           0         1\n\n"
                     "Running device_to_device_memcpy_read_ce.\n"
                     "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)\n"
                     "           0         1\n 0       N/A     30.00\n 1     20.00       N/A\n"
                     "\nRunning device_to_host_memcpy_ce.\n"
                     "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)\n"
                     "           0         1\n")  # the end, as a pager or a paste cuts it
    output = parse_nvbandwidth_text(text)
    assert set(output.matrices) == {"device_to_device_memcpy_read_ce"}
    measured = to_measurements(output, GPUS4[:2], "t")
    assert measured.rates[f"{GPUS4[0]}->{GPUS4[1]}"] == Rate(20.00)
    assert "cut short" in str(measured.rates[f"h2d[{GPUS4[0]}]"].problem)
    assert "cut short" in str(measured.rates[f"d2h[{GPUS4[1]}]"].problem)


def test_nvbandwidth_json_string_cells_and_waived_status() -> None:
    output = parse_nvbandwidth_json(read("nvbandwidth_2gpu.json"))
    assert output.tool == "nvbandwidth v0.7"
    measured = to_measurements(output, GPUS4[:2], "t")
    assert measured.rates["0000:21:00.0->0000:01:00.0"] == Rate(26.3412)  # row 0 reads column 1
    assert measured.rates["0000:01:00.0->0000:21:00.0"] == Rate(26.2987)
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
    assert "CANNOT access peer device 2" in str(staged.problem)
    assert "(its 19.90 GB/s is a copy staged" in str(staged.problem)
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


def test_a_zero_in_the_connectivity_matrix_is_no_p2p_without_a_cannot_line() -> None:
    """A host with P2P off can print CAN lines (or none) while its P2P Connectivity Matrix says
    0: the "P2P=Enabled" numbers are then copies staged through host memory, never P2P."""
    output = parse_output(read("p2pBandwidthLatencyTest_2gpu_matrix_zero.txt"))
    assert output.no_peer == {(0, 1), (1, 0)}
    measured = to_measurements(output, ("0000:17:00.0", "0000:ca:00.0"), "t")
    for pair in ("0000:17:00.0->0000:ca:00.0", "0000:ca:00.0->0000:17:00.0"):
        assert measured.rates[pair].gbps is None
        assert "P2P access is not possible" in str(measured.rates[pair].problem)
        assert "Connectivity Matrix" in str(measured.rates[pair].problem)
