"""A live nccl run: a fake ``all_reduce_perf`` in the fake tree's bin (its PATH) prints chosen
outputs; the run's command line and environment, repeat's median and spread, a failed floor
measured once more after a pause (on the test's clock), the timeout that kills the run's process
group, a run that dies, and the same run over the tests' sshd through the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.host.remote import AgentHost, agent_command, ssh_argv
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.testing.fakenccl import calls, install_nccl_tests, nccl_tests_text
from pytest_gpuhost.testing.sshd import SshServer

from ..blocking import gone, until
from ..conftest import NEEDS_OPENSSH
from ..runner import run_spec
from .test_nccl import GPUS, HEALTHY, ID, board

pytest_plugins = ["pytester"]

SPEC = ("version: 1\nnccl:\n  all_reduce: {{bytes: 1G, min_busbw: 35{more}}}\n"
        "  env: {{NCCL_MIN_NCHANNELS: \"8\"}}\n{section}")


def spec(more: str = "", section: str = "") -> str:
    return SPEC.format(more=more, section=section)


def output(busbw: float, **given: Any) -> str:
    return nccl_tests_text(GPUS, busbw, sizes=(2**30,), **{**HEALTHY, **given})


def test_a_live_run_says_what_it_ran_and_with_which_environment(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [output(37.6)])
    record = run_spec(spec(), fake.root)[ID]
    assert record.outcome is Outcome.PASSED and record.observed == "37.60"
    [call] = calls(fake.root)
    assert call["argv"] == ["all_reduce_perf", "-b", "1G", "-e", "1G", "-g", "8"]
    assert call["env"] == {"NCCL_MIN_NCHANNELS": "8", "NCCL_DEBUG": "INFO",
                           "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert record.details["source"] == "ran all_reduce_perf -b 1G -e 1G -g 8"
    assert "attempts" not in record.details


def test_repeat_judges_the_median_and_says_the_spread(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [output(30.0), output(38.0), output(36.0)])
    record = run_spec(spec(", repeat: 3"), fake.root)[ID]
    assert len(calls(fake.root)) == 3
    assert record.outcome is Outcome.PASSED and record.observed == "36.00"
    assert record.details["runs"] == [30.0, 38.0, 36.0] and record.details["spread_gbps"] == 8.0
    assert ("all_reduce@1G", "busbw 36.00 GB/s (median of 3: 30.00, 38.00, 36.00; spread 8.00)") \
        in [(e["source"], e["raw"]) for e in record.evidence]


@pytest.mark.parametrize("second", [37.0, 20.5])
def test_a_failed_floor_is_measured_once_more_after_a_pause(tmp_path: Path,
                                                             second: float) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [output(20.0), output(second)])
    paused: list[float] = []
    record = run_spec(spec(section="  pause: 30\n"), fake.root, sleep=paused.append)[ID]
    assert paused == [30.0] and len(calls(fake.root)) == 2
    assert record.details["attempts"] == [20.0, second]
    assert record.outcome is (Outcome.PASSED if second > 35 else Outcome.FAILED)
    assert record.observed == f"{second:.2f}"
    assert (f"20.00 GB/s below the floor, then {second:.2f} GB/s after 30 s"
            in [e["raw"] for e in record.evidence])


def test_retry_zero_and_wrong_data_are_not_measured_again(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [output(20.0)])
    paused: list[float] = []
    assert run_spec(spec(", retry: 0"), fake.root, sleep=paused.append)[ID].outcome is \
        Outcome.FAILED
    assert paused == [] and len(calls(fake.root)) == 1
    other = board(tmp_path / "other")
    install_nccl_tests(other.root, [output(20.0, wrong={2**30: 1})])
    assert run_spec(spec(), other.root, sleep=paused.append)[ID].outcome is Outcome.FAILED
    assert paused == [] and len(calls(other.root)) == 1


def test_a_run_past_its_timeout_is_killed_with_its_process_group(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [""], hang=True)
    record = run_spec(spec(section="  timeout: 5\n"), fake.root)[ID]
    assert record.outcome is Outcome.ERROR
    assert record.message.startswith("all_reduce_perf -b 1G -e 1G -g 8 did not finish within "
                                     "5 s; its process group was killed: ")
    child = fake.root / "var/log/nccl-tests-child.pid"
    until(child.exists, "the fake's child writing its pid")
    until(lambda: gone(int(child.read_text())), "the child of the killed run ending")


def test_a_run_that_dies_or_is_missing_is_an_error_saying_so(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    assert run_spec(spec(), fake.root)[ID].message.startswith(
        f"all_reduce_perf not found in {fake.root}/usr/sbin, ")
    assert run_spec(spec(), fake.root)[ID].message.endswith(
        ": build nccl-tests (https://github.com/NVIDIA/nccl-tests, make) and put its build/ on "
        "PATH or name it in tests_dir:, or judge a saved run with from: FILE")
    install_nccl_tests(fake.root, [output(30.0, cut_after=0, failure="unhandled cuda error")],
                       codes=[1])
    record = run_spec(spec(), fake.root)[ID]
    assert record.outcome is Outcome.ERROR
    assert record.message == ("all_reduce_perf -b 1G -e 1G -g 8 exited 1: the run died after 0 "
                              "rows: gpu-node-07: Test NCCL failure common.cu:1154 'unhandled "
                              "cuda error'")


@NEEDS_OPENSSH
def test_the_live_run_over_ssh_through_the_agent(tmp_path: Path, sshd: SshServer) -> None:
    fake = board(tmp_path / "node")
    install_nccl_tests(fake.root, [output(22.2, env={"NCCL_P2P_LEVEL": "PIX"},
                                          default_transport="SHM/direct/direct")])

    made: list[AgentHost] = []

    def over_ssh(root: Path) -> AgentHost:
        argv = ssh_argv(sshd.alias, port=None, user=None, config=sshd.client_config,
                        connect_timeout=10, inner=agent_command(str(root)))
        made.append(AgentHost(sshd.url(root), argv, str(root)))
        return made[-1]

    record = run_spec(spec(section="  pause: 0\n"), fake.root, host=over_ssh)[ID]
    assert made and made[0].traffic.round_trips > 0  # every read and run went over ssh
    assert len(calls(fake.root)) == 2  # run there, then once more after the failed floor
    assert record.outcome is Outcome.FAILED
    assert record.details["explain"][0]["cause"] == "nccl_transport"
    assert "NCCL_P2P_LEVEL=PIX on NODE, SYS pairs" in record.message


def test_tests_dir_runs_the_build_directory_s_binary(tmp_path: Path) -> None:
    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [output(37.6)], directory="opt/nccl-tests/build")
    record = run_spec(spec(section="  tests_dir: /opt/nccl-tests/build\n"), fake.root)[ID]
    assert record.outcome is Outcome.PASSED
    assert record.details["source"] == ("ran opt/nccl-tests/build/all_reduce_perf -b 1G -e 1G "
                                        "-g 8")
    missing = run_spec(spec(section="  tests_dir: opt/elsewhere\n"), fake.root)[ID]
    assert missing.outcome is Outcome.ERROR
    assert "opt/elsewhere/all_reduce_perf is not an executable file" in missing.message


def test_the_gpu_script_records_defaults_and_p2p_disabled(tmp_path: Path) -> None:
    """bench/nccl_gpu.py, on a fake tree instead of this machine's GPUs: two runs, NCCL's
    defaults then NCCL_P2P_DISABLE=1, each record's busbw and causes."""
    import subprocess
    import sys

    fake = board(tmp_path / "host")
    install_nccl_tests(fake.root, [
        output(37.6, env={}),
        output(14.0, env={"NCCL_P2P_DISABLE": "1"}, default_transport="SHM/direct/direct")])
    script = Path(__file__).parents[2] / "bench" / "nccl_gpu.py"
    done = subprocess.run([sys.executable, str(script), "--root", str(fake.root)],
                          capture_output=True, text=True, check=True)
    printed = done.stdout.splitlines()
    assert printed[0].startswith("- NCCL's defaults: passed, busbw 37.6 GB/s over 8 GPUs "
                                 "(NCCL 2.26.2+cuda12.8, 8 channels")
    disabled = printed.index(next(line for line in printed
                                  if line.startswith("- NCCL_P2P_DISABLE=1")))
    assert printed[disabled].startswith("- NCCL_P2P_DISABLE=1: passed, busbw 14.0 GB/s")
    assert printed[disabled + 1].startswith("  - nccl_transport at ")
    envs = [c["env"] for c in calls(fake.root)]
    assert [e.get("NCCL_P2P_DISABLE") for e in envs if isinstance(e, dict)] == [None, "1"]


def test_the_explanation_reads_in_the_run_s_one_batch(pytester: pytest.Pytester,
                                                      tmp_path: Path) -> None:
    """The ring's hops are explained from the paths' reads, fetched with every other
    observation before the run: a spec with nccl asks the host no more often than the same
    spec without it, but to find and run all_reduce_perf, twice for two sizes."""
    from ..run.test_batched_reads import Counting

    spec_text = "version: 1\npcie: {max_read_request: 4096, acs_redirect: off}\n"
    counted = []
    nccl = "nccl: {all_reduce: {bytes: [512M, 1G], min_busbw: 35}}\n"
    for name, text in (("without", spec_text), ("with", spec_text + nccl)):
        fake = board(tmp_path / name)
        install_nccl_tests(fake.root, [nccl_tests_text(GPUS, 37.6, sizes=(2**29, 2**30),
                                                       **HEALTHY)])
        (tmp_path / f"{name}.yaml").write_text(text)
        plugin = Counting()
        result = pytester.runpytest(f"--gpuhost-spec={tmp_path / name}.yaml",
                                    f"--gpuhost-root={fake.root}", "-p", "no:cacheprovider",
                                    plugins=[plugin])
        assert result.ret == 0
        counted.append(plugin.calls)
    assert counted[1].pop("run") == 2  # a run per size, its binary found in the batch
    assert counted[0] == counted[1]
