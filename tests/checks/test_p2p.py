"""p2p: pairs classed by NUMA node, floors with a warning margin, probes resolved on the host,
and one measurement per session even under ``-n 4``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

import pytest

from pytest_gpuhost.gpu.bandwidth import Measurements, Rate
from pytest_gpuhost.gpu.measure import MeasurementFailed, SharedMeasurement
from pytest_gpuhost.gpu.nvml import FakeGpu, FakeNvml
from pytest_gpuhost.host import CommandResult, HostError, LocalHost
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.specmodel import SpecError
from pytest_gpuhost.testing.fakehost import FakeHost, nvbandwidth_text
from pytest_gpuhost.testing.faketools import saved_nvbandwidth_script

from ..conftest import FIXTURES, ended_within
from ..runner import Run, run_spec

pytest_plugins = ["pytester"]

G = ("0000:01:00.0", "0000:21:00.0", "0000:81:00.0", "0000:a1:00.0")
D2D = "memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)"


def four_gpus(fake: FakeHost, numa: tuple[int, ...] = (0, 0, 1, 1)) -> FakeHost:
    for address, node in zip(G, numa, strict=True):
        fake.gpu(address, numa_node=node)
    return fake


def spec(probe: str = "auto", *, inside: str = "", after: str = "") -> str:
    return (f"version: 1\np2p:\n  probe: {probe}\n  floors: {{same_numa: 45, cross_numa: 32}}\n"
            f"  warn_margin: 5%\n{inside}{after}")


def read_matrix(rows: list[list[float | None]]) -> list[list[float | None]]:
    """``rows[s][t]`` (data from GPU s to GPU t) as nvbandwidth's read test prints it: the row is
    the GPU that reads, the column the one read from."""
    return [list(column) for column in zip(*rows, strict=True)]


def record(fake: FakeHost, rows: list[list[float | None]], name: str = "nvbandwidth.txt") -> None:
    fake.recorded_bandwidth(name, nvbandwidth_text(
        {"device_to_device_memcpy_read_ce": (D2D, read_matrix(rows))},
        devices=["GPU"] * len(rows)))


ROWS: list[list[float | None]] = [  # ROWS[s][t]: p2p[G[s]->G[t]]
    [None, 52.0, 35.0, 31.0],
    [46.0, None, 33.0, 34.0],
    [33.5, 33.2, None, 44.9],
    [36.0, 36.0, 50.0, None],
]


def test_one_check_per_ordered_pair_classed_by_numa_node(fake: FakeHost) -> None:
    record(four_gpus(fake), ROWS)
    results = run_spec(spec(), fake.root)
    assert list(results) == [f"p2p[{a}->{b}]" for a in G for b in G if a != b]
    same = results[f"p2p[{G[0]}->{G[1]}]"]
    assert (same.outcome, same.observed, same.expected) == (Outcome.PASSED, "52.00",
                                                            ">= 45 GB/s (same_numa)")
    assert {key: same.details[key] for key in ("class", "floor", "gbps", "probe")} == {
        "class": "same_numa", "floor": 45.0, "gbps": 52.0,
        "probe": "nvbandwidth v0.8 (recorded in var/lib/pytest-gpuhost/nvbandwidth.txt): "
                 "device_to_device_memcpy_read_ce"}
    # each GPU on a host bridge of its own (NODE), MaxReadReq 512: explained, and its limit
    assert same.details["topology"] == "NODE" and same.details["limit_gbps"] == 57.61
    assert [c["cause"] for c in same.details["explain"]] == ["max_read_request"]
    cross = results[f"p2p[{G[0]}->{G[3]}]"]
    assert cross.outcome is Outcome.FAILED
    assert cross.message == ("31.00 GB/s < floor 32 GB/s (cross_numa), 97% of the floor: "
                             "MaxReadReq 512 on 0000:a1:00.0 (the reading GPU) keeps fewer bytes "
                             "in flight than 4096 would; add pcie: {max_read_request: 4096} to "
                             "the spec and --fix raises it (and 1 more: cross_socket at "
                             "pci0000:01 -> pci0000:a1)")
    assert results[f"p2p[{G[2]}->{G[3]}]"].message.startswith("44.90 GB/s < floor 45")


def test_within_the_margin_passes_with_a_warning(fake: FakeHost) -> None:
    record(four_gpus(fake), ROWS)
    results = run_spec(spec(), fake.root)
    warned = results[f"p2p[{G[1]}->{G[0]}]"]
    assert warned.outcome is Outcome.PASSED
    assert warned.warnings == ("46.00 GB/s is within 5% above the floor 45 GB/s (same_numa)",)
    assert results[f"p2p[{G[0]}->{G[1]}]"].warnings == ()


def test_file_probe_relative_to_the_root_and_absolute(fake: FakeHost, tmp_path: Path) -> None:
    record(four_gpus(fake), ROWS, name="saved.txt")
    relative = run_spec(spec("file:var/lib/pytest-gpuhost/saved.txt"), fake.root)
    assert relative[f"p2p[{G[0]}->{G[1]}]"].observed == "52.00"
    outside = tmp_path / "nvb.json"
    shutil.copy(FIXTURES / "nvbandwidth_2gpu.json", outside)
    absolute = run_spec(spec(f"file:{outside}"), fake.root)
    # The JSON's read test: row 1 reads 26.2987 from column 0, so data flows GPU 0 -> 1.
    assert absolute[f"p2p[{G[0]}->{G[1]}]"].observed == "26.30"
    assert absolute[f"p2p[{G[1]}->{G[0]}]"].observed == "26.34"
    assert "does not name this GPU pair" not in absolute[f"p2p[{G[0]}->{G[1]}]"].message
    missing = absolute[f"p2p[{G[0]}->{G[3]}]"]
    assert missing.outcome is Outcome.FAILED and "(0, 3)" in missing.message


def test_an_absolute_file_probe_that_is_a_fifo_is_an_error_and_never_waits(
        fake: FakeHost, tmp_path: Path) -> None:
    four_gpus(fake)
    fifo = tmp_path / "nvb.json"
    os.mkfifo(fifo)
    done = ended_within(60.0, lambda: run_spec(spec(f"file:{fifo}"), fake.root),
                        "reading a FIFO as a saved output")
    assert isinstance(done, Run)
    record = done[f"p2p[{G[0]}->{G[1]}]"]
    assert record.outcome is Outcome.ERROR
    assert f"cannot read {fifo}: a FIFO, not a regular file" in record.message


def test_p2p_sample_cannot_access_peer_fails_the_pair(fake: FakeHost) -> None:
    for address, node in (("0000:1b:00.0", 0), ("0000:3d:00.0", 0), ("0000:89:00.0", 1)):
        fake.gpu(address, numa_node=node)
    path = FIXTURES / "p2pBandwidthLatencyTest_3gpu_one_cannot.txt"
    results = run_spec(spec(f"file:{path}"), fake.root)
    staged = results["p2p[0000:1b:00.0->0000:89:00.0]"]
    assert staged.outcome is Outcome.FAILED and staged.observed is None
    assert "P2P access is not possible: device 0 CANNOT access peer device 2" in staged.message
    refused = staged.details["explain"][0]  # named by the diagnosis too, first: the costliest
    assert (refused["cause"], refused["at"]) == ("p2p_unsupported", "the probe")
    assert refused["observed"].startswith("P2P access is not possible: device 0 CANNOT")
    assert results["p2p[0000:1b:00.0->0000:3d:00.0]"].message.startswith("24.97 GB/s < floor 45")


def test_unknown_numa_node_uses_nvml_topology(fake: FakeHost) -> None:
    four_gpus(fake, numa=(-1, -1, -1, -1))
    record(fake, ROWS)
    nvml = FakeNvml(devices={a: FakeGpu() for a in G},
                    topologies={f"{a}->{b}": "NODE" if (a in G[:2]) == (b in G[:2]) else "SYS"
                                for a in G for b in G if a < b})
    results = run_spec(spec(), fake.root, nvml=nvml)
    assert results[f"p2p[{G[0]}->{G[1]}]"].details["class"] == "same_numa"
    assert results[f"p2p[{G[0]}->{G[2]}]"].details["class"] == "cross_numa"
    unclassed = run_spec(spec(), fake.root)[f"p2p[{G[0]}->{G[1]}]"]
    assert unclassed.outcome is Outcome.FAILED
    assert unclassed.message.startswith("cannot class the pair: sysfs numa_node is -1 and -1, "
                                        "and NVML unavailable")


class BrokenTopologyNvml(FakeNvml):
    def topology(self, one: str, other: str) -> str | None:
        raise HostError("NVML nvmlDeviceGetTopologyCommonAncestor failed: Unknown Error")


def test_an_nvml_error_while_classing_fails_the_pairs_with_the_reason(fake: FakeHost) -> None:
    four_gpus(fake, numa=(-1, -1, -1, -1))
    record(fake, ROWS)
    results = run_spec(spec(), fake.root,
                       nvml=BrokenTopologyNvml(devices={a: FakeGpu() for a in G}))
    assert len(results) == 12
    unclassed = results[f"p2p[{G[0]}->{G[1]}]"]
    assert unclassed.outcome is Outcome.FAILED
    assert unclassed.message == ("cannot class the pair: sysfs numa_node is -1 and -1, and NVML "
                                 "cannot tell: NVML nvmlDeviceGetTopologyCommonAncestor failed: "
                                 "Unknown Error")


def test_a_class_without_a_floor_is_not_tested(fake: FakeHost) -> None:
    record(four_gpus(fake), ROWS)
    text = "version: 1\np2p: {probe: auto, floors: {cross_numa: 30}}\n"
    assert len(run_spec(text, fake.root)) == 8


def test_host_copies_have_one_check_per_gpu(fake: FakeHost) -> None:
    fake.gpu(G[0])
    shutil.copy(FIXTURES / "nvbandwidth_v0.2_4gpu.txt", fake.root / "nvb.txt")
    text = "version: 1\np2p: {probe: 'file:nvb.txt', floors: {h2d: 24.65, d2h: 20}}\n"
    results = run_spec(text, fake.root)
    assert list(results) == [f"p2p.h2d[{G[0]}]", f"p2p.d2h[{G[0]}]"]
    assert results[f"p2p.h2d[{G[0]}]"].message.startswith(
        "24.61 GB/s < floor 24.65 GB/s (h2d), 100% of the floor: MaxReadReq 512 on 0000:01:00.0 "
        "(the GPU)")
    assert results[f"p2p.d2h[{G[0]}]"].outcome is Outcome.PASSED


def test_one_gpu_without_host_floors_says_what_to_add(fake: FakeHost) -> None:
    fake.gpu(G[0])
    result = run_spec(spec(), fake.root)["p2p"]
    assert result.outcome is Outcome.FAILED and "add floors h2d/d2h" in result.message


def test_nothing_to_measure_with_is_an_error(fake: FakeHost) -> None:
    four_gpus(fake)
    result = run_spec(spec(), fake.root)[f"p2p[{G[0]}->{G[1]}]"]
    assert result.outcome is Outcome.ERROR
    assert "has no nvbandwidth under it nor a recorded output" in result.message
    cuda = run_spec(spec("cuda"), fake.root)[f"p2p[{G[0]}->{G[1]}]"]
    assert cuda.outcome is Outcome.ERROR and "probe cuda measures this machine" in cuda.message


@pytest.mark.parametrize(("text", "message"), [
    ("p2p: {probe: gpu, floors: {same_numa: 1}}", "p2p probe 'gpu' is not one of: auto, cuda"),
    ("p2p: {size: 12XB, floors: {same_numa: 1}}", "p2p size must be a positive size like 256MiB"),
    ("p2p: {floors: {same_numa: fast}}", "p2p floor same_numa must be a positive number"),
    ("p2p: {floors: {same_node: 1}}", "unknown floor 'same_node' in p2p floors"),
    ("p2p: {warn_margin: 150%, floors: {same_numa: 1}}", "p2p warn_margin must be a percentage"),
    ("p2p: {probe: 'file:x', concurrent: {floor: 20}}", "p2p concurrent needs probe: cuda"),
    ("p2p: {probe: auto}", "p2p needs floors"),
    ("p2p: {floors: {same_numa: 1}, speed: 3}", "unknown key 'speed' in p2p"),
    ("p2p: {timeout: 0, floors: {same_numa: 1}}", "p2p timeout must be a positive number of "
                                                  "seconds"),
])
def test_bad_p2p_sections_are_spec_errors(fake: FakeHost, text: str, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        run_spec(f"version: 1\n{text}\n", fake.root)


def test_a_measurement_is_taken_once_and_shared(tmp_path: Path) -> None:
    calls: list[int] = []

    def measure() -> Measurements:
        calls.append(1)
        return Measurements("test", {"a->b": Rate(12.5)})

    first = SharedMeasurement("k", measure, tmp_path)
    second = SharedMeasurement("k", measure, tmp_path)  # another worker, same session
    assert first.get().rates["a->b"] == Rate(12.5)
    assert second.get().rates["a->b"] == Rate(12.5)
    assert calls == [1] and first.measured_here and not second.measured_here


def test_a_failed_measurement_is_reported_by_every_check(tmp_path: Path) -> None:
    calls: list[int] = []

    def measure() -> Measurements:
        calls.append(1)
        raise HostError("nvbandwidth exited 1: CUDA_ERROR_NO_DEVICE")

    for _ in range(3):
        with pytest.raises(MeasurementFailed, match="CUDA_ERROR_NO_DEVICE"):
            SharedMeasurement("k", measure, tmp_path).get()
    assert calls == [1]


def json_output(rows: list[list[float | None]]) -> str:
    cells = [["N/A" if v is None else f"{v:.4f}" for v in row] for row in read_matrix(rows)]
    return json.dumps({"nvbandwidth": {"version": "v0.8", "testcases": [
        {"name": "device_to_device_memcpy_read_ce", "status": "Passed",
         "bandwidth_description": D2D, "bandwidth_matrix": cells}]}})


def test_under_xdist_nvbandwidth_runs_once(pytester: pytest.Pytester, fake: FakeHost) -> None:
    four_gpus(fake)
    fake.file("nvbandwidth.json", json_output(ROWS))
    fake.file("usr/bin/nvbandwidth", saved_nvbandwidth_script(hold_s=0.3), mode=0o755)
    pytester.makefile(".yaml", spec=spec(inside="  size: 64MiB\n"))
    result = pytester.runpytest_subprocess("spec.yaml", f"--gpuhost-root={fake.root}", "-n", "4",
                                           "-p", "no:cacheprovider", "--gpuhost-report=out.json")
    result.stdout.fnmatch_lines(["*4 workers*"])
    assert (fake.root / "nvbandwidth.log").read_text() == \
        "-j -b 64 -t device_to_device_memcpy_read_ce\n"
    data = json.loads((pytester.path / "out.json").read_text())
    assert data["summary"]["passed"] + data["summary"]["failed"] == 12
    assert data["summary"]["error"] == 0
    assert {c["details"]["probe"] for c in data["checks"]} == {
        "nvbandwidth v0.8 (ran nvbandwidth -j -b 64 -t device_to_device_memcpy_read_ce): "
        "device_to_device_memcpy_read_ce"}


def test_nvbandwidth_runs_with_cuda_ordinals_in_pci_order(fake: FakeHost,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    four_gpus(fake)
    fake.file("nvbandwidth.json", json_output(ROWS))
    fake.file("usr/bin/nvbandwidth", '#!/bin/sh\necho "CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER" '
              '> "$GPUHOST_ROOT/env.log"\ncat "$GPUHOST_ROOT/nvbandwidth.json"\n', mode=0o755)
    results = run_spec(spec("nvbandwidth"), fake.root)
    assert (fake.root / "env.log").read_text() == "CUDA_DEVICE_ORDER=PCI_BUS_ID\n"
    assert results[f"p2p[{G[0]}->{G[1]}]"].observed == "52.00"


def test_nvbandwidth_past_the_p2p_timeout_is_killed_and_says_how_to_allow_more(
        fake: FakeHost) -> None:
    """A slow link (the fault the check is for) makes nvbandwidth slow: the run ends at the
    section's timeout with what to raise, and does not wait for it."""
    import threading

    four_gpus(fake)
    fake.file("usr/bin/nvbandwidth", "#!/bin/sh\nsleep 60\n", mode=0o755)
    results: list[Run] = []
    thread = threading.Thread(target=lambda: results.append(
        run_spec(spec("nvbandwidth", inside="  timeout: 1\n"), fake.root)), daemon=True)
    thread.start()
    thread.join(30)
    assert results, "the p2p measurement was not bounded by its timeout"
    result = results[0][f"p2p[{G[0]}->{G[1]}]"]
    assert isinstance(result, CheckResult) and result.outcome is Outcome.ERROR
    assert "nvbandwidth -j -b 256 -t device_to_device_memcpy_read_ce did not finish within " \
        "1 s" in result.message
    assert "raise the p2p section's timeout" in result.message


def test_nvbandwidth_runs_under_the_measurement_timeout(fake: FakeHost,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Not the 120 s of a command: 56 pairs of 8 GPUs at 4 GB/s (links trained down) take
    about 180 s."""
    from pytest_gpuhost.checks.p2p import MEASURE_TIMEOUT_S

    four_gpus(fake)
    fake.file("usr/bin/nvbandwidth", f"#!/bin/sh\ncat '{fake.root}/nvbandwidth.json'\n",
              mode=0o755)
    fake.file("nvbandwidth.json", json_output(ROWS))
    timeouts: list[float] = []
    real_run = LocalHost.run

    def run(self: LocalHost, argv: list[str], env: Mapping[str, str] | None = None, *,
            timeout: float = 120.0) -> CommandResult:
        timeouts.append(timeout)
        return real_run(self, argv, env, timeout=timeout)

    monkeypatch.setattr(LocalHost, "run", run)
    assert run_spec(spec("nvbandwidth"), fake.root)[f"p2p[{G[0]}->{G[1]}]"].observed == "52.00"
    assert timeouts == [MEASURE_TIMEOUT_S] and MEASURE_TIMEOUT_S == 600


def test_p2p_runs_after_the_pcie_fixes_and_before_dmesg(pytester: pytest.Pytester,
                                                        fake: FakeHost) -> None:
    record(four_gpus(fake), ROWS)
    fake.kmsg([(6, "boot")])
    text = spec(after="pcie: {max_read_request: 4096}\ndmesg: {since: boot}\n")
    pytester.makefile(".yaml", spec=text)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-v")
    lines = [line.split(" ")[0] for line in result.stdout.lines if line.startswith("spec.yaml::")]
    kinds = [line.split("::")[1].split("[")[0] for line in lines]
    assert kinds.index("p2p") > max(i for i, k in enumerate(kinds) if k.startswith("pcie"))
    assert kinds[-1] == "dmesg"


class _BareMachine(LocalHost):
    """This machine (as a root of its own says it is), with neither cuda-python nor
    nvbandwidth."""

    def local_machine(self) -> bool:
        return True

    def which(self, name: str) -> None:
        return None


def test_auto_without_any_probe_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    from pytest_gpuhost.checks import p2p
    from pytest_gpuhost.gpu import cudaprobe, measure
    from pytest_gpuhost.specmodel import EntryOptions

    monkeypatch.setattr(cudaprobe, "cuda_available", lambda: False)  # measure's, on first use
    section = p2p.P2pSection("auto", None, 1, (), 0.0, None, EntryOptions("spec.yaml:2"))
    measurer = measure.Measurer(section, _BareMachine(tmp_path), (), {})
    with pytest.raises(HostError) as error:
        measurer.measure()
    assert str(error.value) == (
        "probe auto found no way to measure: install cuda-python: pip install "
        "'pytest-gpuhost[cuda]' (from a checkout: pip install '.[cuda]'), or put nvbandwidth on "
        "PATH")
