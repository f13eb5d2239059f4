"""nccl-tests as a fake host tree has them: the text a run prints (its header, devices, rows and
NCCL's INFO lines, each choice of NCCL's set by the test) and a fake ``all_reduce_perf`` (or a
sibling) that prints chosen outputs in turn, records each call, and can hang with a child of its
own (the timeout's proof that the process group is killed)."""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .faketools import FAKE_TOOL_START

RTX_PRO_6000 = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TYPES = {"all_reduce": ("float", "sum", -1), "reduce_scatter": ("float", "sum", -1),
         "sendrecv": ("float", "sum", -1), "all_gather": ("float", "none", -1),
         "alltoall": ("float", "none", -1), "broadcast": ("float", "none", 0),
         "reduce": ("float", "sum", 0)}
CALLS = "var/log/nccl-tests-calls.jsonl"
"""Where the fake records each call (argv, the NCCL_* environment), under the tree's root."""


def _factor(collective: str, ranks: int) -> float:
    """busbw / algbw as nccl-tests computes it (its README's PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if collective in ("all_gather", "reduce_scatter", "alltoall"):
        return (ranks - 1) / ranks
    return 1.0


def ring_order(ranks: int) -> tuple[int, ...]:
    return tuple(range(ranks))


def nccl_tests_text(gpus: Sequence[str], busbw: float | Callable[[int], float], *,
                    collective: str = "all_reduce", sizes: Sequence[int] = (2**28, 2**29, 2**30),
                    wrong: Mapping[int, int] | None = None, env: Mapping[str, str] | None = None,
                    channels: int = 2, transports: Mapping[tuple[int, int], str] | None = None,
                    default_transport: str = "P2P/CUMEM/read", version: str = "2.26.2+cuda12.8",
                    host: str = "gpu-node-07", name: str = RTX_PRO_6000, info: bool = True,
                    starting: bool = True, cut_after: int | None = None,
                    failure: str | None = None, rings: Sequence[Sequence[int]] | None = None,
                    ) -> str:
    """One run of ``COLLECTIVE_perf -g N`` on ``gpus`` (sysfs addresses, one rank each in PCI
    order): ``busbw`` GB/s at every size (or by size), ``wrong`` errors by size, NCCL's INFO
    lines with ``env`` taken, ``channels`` rings in PCI order (or ``rings``), each ring hop's
    ``transports`` (rank pair -> transport). ``cut_after``: the output stops after that many
    rows; ``failure``: then a test failure line."""
    ranks, wrong, env = len(gpus), dict(wrong or {}), dict(env or {})
    dtype, redop, root = TYPES[collective]
    lines: list[str] = []
    pid = 48213
    prefix = f"{host}:{pid}:{pid}"
    if info:
        lines.append(f"{prefix} [0] NCCL INFO Bootstrap: Using eth0:10.20.0.7<0>")
        lines.append(f"{prefix} [0] NCCL INFO cudaDriverVersion 12080")
        lines += [f"{prefix} [0] NCCL INFO {k} set by environment to {v}." for k, v in env.items()]
    if starting:
        lines.append(f"# Collective test starting: {collective}_perf")
    lines.append(f"# nThread 1 nGpus {ranks} minBytes {min(sizes)} maxBytes {max(sizes)} step: "
                 "2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0")
    lines += ["#", "# Using devices"]
    for rank, gpu in enumerate(gpus):
        bus = gpu.split(":")[1]
        lines.append(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host} device {rank:2d} "
                     f"[0000:{bus}:00] {name}")
    if info:
        lines.append(f"NCCL version {version}")
        worker = f"{host}:{pid}:{pid + 31}"
        order = [tuple(r) for r in rings] if rings else [ring_order(ranks)] * channels
        for channel, ring in enumerate(order):
            lines.append(f"{worker} [0] NCCL INFO Channel {channel:02d}/{len(order):02d} : "
                         + " ".join(f"{r:3d}" for r in ring))
        lines.append(f"{worker} [0] NCCL INFO Trees "
                     + " ".join(f"[{c}] 1/-1/-1->0->-1" for c in range(len(order))))
        for channel, ring in enumerate(order):
            for i, source in enumerate(ring):
                target = ring[(i + 1) % len(ring)]
                via = (transports or {}).get((source, target), default_transport)
                lines.append(f"{worker} [{source}] NCCL INFO Channel {channel:02d}/0 : "
                             f"{source}[{source}] -> {target}[{target}] via {via}")
        lines.append(f"{worker} [0] NCCL INFO Connected all rings")
        lines.append(f"{worker} [0] NCCL INFO {len(order)} coll channels, 0 collnet channels, "
                     f"0 nvls channels, {len(order)} p2p channels, 2 p2p channels per peer")
        lines += [f"{worker} [{r}] NCCL INFO comm 0x55d0{r:02d} rank {r} nranks {ranks} cudaDev "
                  f"{r} nvmlDev {r} busId {gpu.split(':')[1]}000 commId 0x6c1f - Init COMPLETE"
                  for r, gpu in enumerate(gpus)]
    lines += ["#", "#" + " " * 62 + "out-of-place                       in-place          ",
              "#       size         count      type   redop    root     time   algbw   busbw "
              "#wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)   "
              "         (us)  (GB/s)  (GB/s)       "]
    factor = _factor(collective, ranks)
    total = 0.0
    for number, size in enumerate(sizes):
        if cut_after is not None and number >= cut_after:
            break
        rate = busbw(size) if callable(busbw) else busbw
        alg = rate / factor if factor else 100.0  # one rank: busbw 0 whatever it moves
        time_us = size / (alg * 1e3) if alg else 0.0
        errors = wrong.get(size, 0)
        count = size // 4
        lines.append(f"{size:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:6d}  "
                     f"{time_us:7.1f}  {alg:6.2f}  {rate:6.2f}  {errors:5d}  {time_us:7.1f}  "
                     f"{alg:6.2f}  {rate:6.2f}  {errors:5d}")
        total += rate
    if failure is not None:
        lines.append(f"{host}: Test NCCL failure common.cu:1154 '{failure}'")
        lines.append(f" .. {host} pid {pid}: Test failure common.cu:1043")
    elif cut_after is None:
        lines.append("# Out of bounds values : 0 OK")
        lines.append(f"# Avg bus bandwidth    : {total / len(sizes):.4f} ")
        lines.append("#")
    return "\n".join(lines) + "\n"


NCCL_TESTS = FAKE_TOOL_START + r'''
"""A fake nccl-tests binary for a pytest-gpuhost fake host tree (written by
pytest_gpuhost.testing.fakenccl): prints its outputs in turn, records each call."""

import json
import os
import sys
import time

CONFIG = json.loads(__CONFIG__)


def main(argv):
    root = os.environ["GPUHOST_ROOT"]  # the agent runs every command with its root there
    calls = os.path.join(root, CONFIG["calls"])
    os.makedirs(os.path.dirname(calls), exist_ok=True)
    with open(calls, "a") as log:
        log.write(json.dumps({"argv": [os.path.basename(argv[0]), *argv[1:]],
                              "env": {k: v for k, v in os.environ.items()
                                      if k.startswith(("NCCL_", "CUDA_"))}}) + "\n")
    with open(calls) as log:
        call = sum(1 for _ in log) - 1
    if CONFIG["hang"]:
        child = os.fork()
        if child == 0:  # a child of its own: the timeout must end it too
            with open(os.path.join(root, "var/log/nccl-tests-child.pid"), "w") as f:
                f.write(str(os.getpid()))
            while True:
                time.sleep(3600)
        while True:
            time.sleep(3600)
    outputs = CONFIG["outputs"]
    sys.stdout.write(outputs[min(call, len(outputs) - 1)])
    codes = CONFIG["codes"]
    return codes[min(call, len(codes) - 1)]


sys.exit(main(sys.argv))
'''


def install_nccl_tests(root: Path, outputs: Sequence[str], *, name: str = "all_reduce_perf",
                       codes: Sequence[int] = (0,), hang: bool = False,
                       directory: str = "usr/bin") -> Path:
    """ROOT/DIRECTORY/NAME printing ``outputs`` in turn (the last again once they run out),
    exiting with ``codes`` in turn; ``hang``: it and a child of its own sleep for ever."""
    config = {"outputs": list(outputs), "codes": list(codes), "hang": hang, "calls": CALLS}
    path = root / directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(NCCL_TESTS.replace("__CONFIG__", repr(json.dumps(config))))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def calls(root: Path) -> list[dict[str, object]]:
    """Each call the fake recorded: its argv and its NCCL_* and CUDA_* environment."""
    path = root / CALLS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
