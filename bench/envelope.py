"""What a benchmark's envelope costs the benchmark (issue 37): the sampler at ``sample_every: 1s``
with 8 GPUs, on this machine and over ssh, and the before/after pair.

    .venv/bin/python bench/envelope.py [--rounds N] [--samples K] [--no-ssh]

The host is a copy of the example host (8 GPUs, its bridges, a kernel log, the inference-node
spec's checks) with the fake libnvidia-ml.so.1 built on it, so the agent's real ctypes path
answers. Figures, each the median of ``--rounds`` rounds with the min-max (local and ssh rounds
alternate):

- the sampler: this process's CPU per sample (the envelope's thread runs in the benchmark's
  process), as a share of the 1 s interval: the goal is at most 1%. Over ssh, also the wall
  time of a sample (one round trip) and the ssh client's and the target agent's CPU per sample
  (other processes, on the machine that has the GPUs);
- the before/after pair (``sample_every: 0``): the wall time of entering and closing an
  envelope with the spec's host checks, the kernel log and the AER counters (the goal is at
  most 50 ms locally), as a benchmark after the gate has it (the start takes the values the
  run's checks read; the end reads them in one batch), the same with the host checks read at
  both ends (no check of the run read them), and without host checks. The fake library
  re-reads its state file at every call (a real driver answers from memory): its samples cost
  more than a real driver's.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from pytest_gpuhost.envelope.__main__ import _hooks, _session, host_records
from pytest_gpuhost.envelope.nvml import NvmlSampler
from pytest_gpuhost.envelope.sampling import take
from pytest_gpuhost.gpu.nvml import FakeGpu
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.host.clock import SYSTEM_CLOCK
from pytest_gpuhost.host.remote import AgentHost, agent_command
from pytest_gpuhost.host.ssh import ssh_argv
from pytest_gpuhost.session.envelopes import KnownState, open_envelope
from pytest_gpuhost.specmodel.envelope import Limits
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import nvml_library
from pytest_gpuhost.testing.sshd import start_sshd

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "hosts" / "blackwell8-untuned"
SPEC = REPO / "examples" / "benchmark" / "inference-node.yaml"
TICKS = os.sysconf("SC_CLK_TCK")


def host_tree(root: Path) -> FakeHost:
    shutil.copytree(EXAMPLE, root, symlinks=True)
    host = FakeHost(root)
    from pytest_gpuhost.checks.gpus import find_gpus

    gpus = [gpu.address for gpu in find_gpus(LocalHost(root))]
    assert len(gpus) == 8, gpus
    nvml_library(host, {address: FakeGpu(clocks_event_reasons=0) for address in gpus})
    return host


def cpu_of(pids: list[int]) -> float:
    """The CPU seconds the processes have used (user + system)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def others_cpu(pids: list[int], root: Path) -> float:
    """The CPU seconds of the ssh client and the target's agents."""
    return cpu_of(pids + agents_of(root))


def agents_of(root: Path) -> list[int]:
    """The agent processes serving ``root`` (their command line names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if str(root).encode() in cmdline and b"ssh" not in cmdline.split(b"\0")[0]:
                found.append(int(entry.name))
    return found


def per_sample(sampler: NvmlSampler, samples: int, others: Callable[[], float]
               ) -> tuple[float, float, float]:
    """(this process's CPU, wall, the other processes' CPU) per sample, seconds."""
    take(sampler, SYSTEM_CLOCK, lambda pids: frozenset())  # warm: the library loaded
    cpu, wall, other = time.process_time(), time.perf_counter(), others()
    for _ in range(samples):
        taken = take(sampler, SYSTEM_CLOCK, lambda pids: frozenset())
        assert taken.error is None and len(taken.gpus) == 8, taken.error
    return ((time.process_time() - cpu) / samples, (time.perf_counter() - wall) / samples,
            (others() - other) / samples)


def pair(root: Path, spec: Path = SPEC, *, gated: bool = True) -> tuple[float, float]:
    """The wall and CPU seconds of one envelope's before and after (no samples during), the
    run's collection done and, ``gated``, its checks run (as a pytest run has it when a
    benchmark starts after the gate: the window's start takes what they read)."""
    options = argparse.Namespace(gpuhost_spec=[str(spec)], gpuhost_target=[],
                                 gpuhost_root=str(root), gpuhost_ssh_config=None, plugins=[])
    manager = _hooks([])
    session = _session(options, manager, spec)
    try:
        records = host_records(session) if gated else []
        envelope = open_envelope(
            session, lambda host: manager.hook.pytest_gpuhost_envelope_sampler(host=host),
            limits=Limits(sample_every=0), known=KnownState(lambda: records) if gated else None)
        start, cpu = time.perf_counter(), time.process_time()
        with envelope:
            pass
        elapsed, used = time.perf_counter() - start, time.process_time() - cpu
        verdict = envelope.close()
        assert verdict["valid"] and not verdict["missing"], verdict
        assert (verdict["before"]["state"] is not None) == (spec == SPEC)
        return elapsed, used
    finally:
        session.close()


def spread(values: list[float], scale: float, unit: str) -> str:
    values = [v * scale for v in values]
    return f"{statistics.median(values):.3g}{unit} ({min(values):.3g}-{max(values):.3g})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--no-ssh", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpuhost-envelope-bench-") as tmp:
        base = Path(tmp)
        host = host_tree(base / "host")
        local = NvmlSampler(LocalHost(host.root))
        remote: AgentHost | None = None
        if not args.no_ssh:
            sshd = start_sshd(base / "sshd")
            argv_ = ssh_argv(sshd.alias, port=None, user=None, config=sshd.client_config,
                             connect_timeout=10, inner=agent_command(str(host.root)))
            remote = AgentHost(sshd.url(host.root), argv_, str(host.root), name="pve")
        rows: dict[str, list[float]] = {key: [] for key in (
            "local cpu", "ssh cpu", "ssh wall", "ssh others", "pair", "both ends pair",
            "bare pair", "pair cpu", "both ends pair cpu", "bare pair cpu")}
        bare = base / "bare.yaml"
        bare.write_text("version: 1\nenvelope:\n")
        try:
            ssh_sampler = NvmlSampler(remote) if remote is not None else None
            if ssh_sampler is not None:
                take(ssh_sampler, SYSTEM_CLOCK, lambda pids: frozenset())  # connected
            pair(host.root)  # warm
            for number in range(args.rounds):
                order = ["local", "ssh"] if number % 2 == 0 else ["ssh", "local"]
                for which in order:
                    if which == "local":
                        cpu, _, _ = per_sample(local, args.samples, lambda: 0.0)
                        rows["local cpu"].append(cpu)
                    elif ssh_sampler is not None:
                        client = remote._process if remote is not None else None
                        pids = [client.pid] if client is not None else []
                        cpu, wall, other = per_sample(
                            ssh_sampler, args.samples,
                            functools.partial(others_cpu, pids, host.root))
                        rows["ssh cpu"].append(cpu)
                        rows["ssh wall"].append(wall)
                        rows["ssh others"].append(other)
                cases = [("pair", SPEC, True), ("both ends pair", SPEC, False),
                         ("bare pair", bare, True)]
                for key, spec, gated in cases if number % 2 == 0 else cases[::-1]:
                    wall, used = pair(host.root, spec, gated=gated)
                    rows[key].append(wall)
                    rows[f"{key} cpu"].append(used)
        finally:
            if remote is not None:
                remote.close()
                sshd.stop()
    print(f"rounds: {args.rounds}, {args.samples} samples of 8 GPUs each; load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"sampler, this machine: CPU per sample {spread(rows['local cpu'], 1e3, ' ms')}; "
          f"at 1 s: {spread(rows['local cpu'], 100, '%')} of one CPU (goal <= 1%)")
    if rows["ssh cpu"]:
        print(f"sampler, over ssh: this process's CPU per sample "
              f"{spread(rows['ssh cpu'], 1e3, ' ms')} ({spread(rows['ssh cpu'], 100, '%')} "
              f"at 1 s, goal <= 1%); wall per sample {spread(rows['ssh wall'], 1e3, ' ms')}; "
              f"the ssh client's and the agent's CPU per sample "
              f"{spread(rows['ssh others'], 1e3, ' ms')}")
    print(f"before/after pair, this machine: wall {spread(rows['pair'], 1e3, ' ms')}, CPU "
          f"{spread(rows['pair cpu'], 1e3, ' ms')} (goal <= 50 ms), after the gate (the "
          "spec's host checks taken as the run read them at the start, read at the end); "
          f"read at both ends: wall {spread(rows['both ends pair'], 1e3, ' ms')}, CPU "
          f"{spread(rows['both ends pair cpu'], 1e3, ' ms')}; without host checks (a spec "
          f"of its envelope: section alone) wall {spread(rows['bare pair'], 1e3, ' ms')}, CPU "
          f"{spread(rows['bare pair cpu'], 1e3, ' ms')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
