"""A benchmark's envelope over the tests' real sshd: of a remote target, taken there through
its agent (the fake libnvidia-ml.so.1 of its root, its kernel log), and of a container target,
taken on the container's host (its GPUs and kernel log), over the same session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.gpu.nvml import FakeGpu
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import NvmlCounters, compiler, nvml_library
from pytest_gpuhost.testing.lxc import lxc_container
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH

pytestmark = [NEEDS_OPENSSH, pytest.mark.skipif(compiler() is None, reason="no C compiler to "
                                                "build the fake libnvidia-ml.so.1 with")]
A = "0000:01:00.0"
SPEC = "version: 1\nenvelope:\n  sample_every: 0\nsysctl:\n  vm.swappiness: 10\n"
XID = "NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
BENCH = f"""\
import os
from pathlib import Path

from pytest_gpuhost.testing.fakenvml import NvmlCounters


def test_decode(gpuhost_envelope):
    counters = NvmlCounters(Path(os.environ["NVML_STATE"]))
    with gpuhost_envelope(name="decode") as envelope:
        start = counters.get("{A}", "reference_time")
        counters.set("{A}", "reference_time", start + 10_000_000)
        counters.add("{A}", "violation.thermal", 3_000_000_000)
        counters.process("{A}", 48113)
        with open(os.environ["KMSG"], "a") as log:
            log.write("3,900,9000000,-;{XID}\\n")
"""


def pve(root: Path) -> tuple[FakeHost, Path]:
    host = FakeHost(root).sysctl("vm.swappiness", 10)
    host.gpu(A, audio=False)
    host.kmsg([(6, "Linux version 6.8.0")])
    state = nvml_library(host, {A: FakeGpu(clocks_event_reasons=0)})
    NvmlCounters(state).set(A, "reference_time", 1_000_000)
    return host, state


def run(pytester: pytest.Pytester, sshd: SshServer, monkeypatch: pytest.MonkeyPatch,
        host: FakeHost, state: Path, target: str) -> dict[str, Any]:
    pytester.makefile(".yaml", node=SPEC)
    pytester.makepyfile(test_decode=BENCH)
    monkeypatch.setenv("NVML_STATE", str(state))
    monkeypatch.setenv("KMSG", str(host.root / "dev/kmsg"))
    result = pytester.runpytest_subprocess(
        "test_decode.py", "node.yaml", f"--gpuhost-target={target}",
        f"--gpuhost-ssh-config={sshd.client_config}", "--gpuhost-report=r.json",
        "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    [one] = json.loads((pytester.path / "r.json").read_text())["benchmarks"]
    envelope: dict[str, Any] = one["envelope"]
    return envelope


def texts(envelope: dict[str, Any]) -> list[str]:
    return [reason["text"] for reason in envelope["reasons"]]


def test_the_envelope_of_a_remote_target_is_taken_there(
        pytester: pytest.Pytester, sshd: SshServer, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    host, state = pve(tmp_path / "pve")
    envelope = run(pytester, sshd, monkeypatch, host, state, sshd.url(host.root))
    assert "libnvidia-ml.so.1" in envelope["sampler"]
    assert texts(envelope) == [f"{A}: thermal violation 30% of 10 s (limit 1%)",
                               f"{A}: Xid 79 during the run (hardware): GPU has fallen off "
                               "the bus."]
    # the benchmark ran here, not on the target: its processes there are shown, not judged
    assert envelope["during"][A]["processes"] == {"48113": ""}
    assert any(line.startswith("which processes on the GPUs are the benchmark's")
               for line in envelope["missing"])


def test_the_envelope_of_a_container_target_is_taken_on_its_host(
        pytester: pytest.Pytester, sshd: SshServer, monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> None:
    host, state = pve(tmp_path / "pve")
    container = lxc_container(host, "101")
    (container.root / "proc/sys/vm/swappiness").write_text("10\n")
    envelope = run(pytester, sshd, monkeypatch, host, state,
                   sshd.url(host.root, query="?lxc=101"))
    assert "libnvidia-ml.so.1" in envelope["sampler"]  # the host's driver, not the container's
    assert f"{A}: Xid 79 during the run (hardware): GPU has fallen off the bus." in \
        texts(envelope)
    assert f"{A}: thermal violation 30% of 10 s (limit 1%)" in texts(envelope)


def test_the_wrapper_takes_a_remote_targets_envelope(sshd: SshServer, tmp_path: Path) -> None:
    import subprocess
    import sys

    host, state = pve(tmp_path / "pve")
    (tmp_path / "node.yaml").write_text(SPEC)
    move = (f"from pathlib import Path; from pytest_gpuhost.testing.fakenvml import "
            f"NvmlCounters; c = NvmlCounters(Path({str(state)!r})); "
            f"c.set('{A}', 'reference_time', 11_000_000); "
            f"c.add('{A}', 'violation.thermal', 3_000_000_000)")
    done = subprocess.run(
        [sys.executable, "-m", "pytest_gpuhost.envelope", "--gpuhost-spec=node.yaml",
         f"--gpuhost-target={sshd.url(host.root)}",
         f"--gpuhost-ssh-config={sshd.client_config}", "--out", "e.json", "--",
         sys.executable, "-c", move], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"gpuhost envelope: invalid: {A}: thermal violation 30% of 10 s " \
                          "(limit 1%)\n"
    written = json.loads((tmp_path / "e.json").read_text())
    assert "libnvidia-ml.so.1" in written["envelope"]["sampler"]
    assert written["state"]["targets"]
