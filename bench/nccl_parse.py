"""What reading a collective's run costs: nccl-tests' output behind 10,000 lines of NCCL's INFO
log (8 GPUs, 32 channels: each rank's environment, topology, rings, trees and every ring, tree
and P2P connection with its transport), parsed as the nccl check parses it.

    .venv/bin/python bench/nccl_parse.py

CPU time of this process (``time.process_time``), median of 15 rounds with min-max, after one
unmeasured round. Goal: under 50 ms, so that a saved run's log, however talkative, never costs
a check more than its judgement.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_gpuhost.gpu.nccltests import parse_nccl_tests  # noqa: E402
from pytest_gpuhost.testing.fakenccl import nccl_tests_text  # noqa: E402

ROUNDS = 15
INFO_LINES = 10_000
GOAL_MS = 50.0
GPUS = tuple(f"0000:{bus:02x}:00.0" for bus in (0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1))


def info_log(lines: int) -> list[str]:
    """NCCL's INFO lines of an 8-GPU run of 32 channels, rank by rank, until ``lines``."""
    out: list[str] = []
    channels = 32
    while len(out) < lines:
        for rank in range(8):
            at = f"rtxpro-a07:48213:{48244 + rank} [{rank}] NCCL INFO"
            out += [f"{at} NCCL_MIN_NCHANNELS set by environment to 32.",
                    f"{at} NCCL_SOCKET_IFNAME set by environment to eth0",
                    f"{at} === System : maxBw 24.0 totalBw 24.0 ===",
                    f"{at} CPU/0 (1/2/-1)", f"{at} + PCI[24.0] - GPU/{rank:x}1000 ({rank})",
                    f"{at} Setting affinity for GPU {rank} to ffff,ffffffff",
                    f"{at} Pattern 4, crossNic 0, nChannels {channels}, bw 12.000000/12.000000, "
                    "type SYS/PIX, sameChannels 1"]
            out += [f"{at} Channel {c:02d}/{channels} :" + "".join(f" {r:3d}" for r in range(8))
                    for c in range(channels)]
            out.append(f"{at} Trees" + "".join(f" [{c}] 1/-1/-1->0->-1" for c in range(8)))
            out += [f"{at} Channel {c:02d}/0 : {rank}[{rank}] -> {(rank + 1) % 8}"
                    f"[{(rank + 1) % 8}] via P2P/CUMEM/read" for c in range(channels)]
            out += [f"{at} Channel {c:02d}/1 : {rank}[{rank}] -> {peer}[{peer}] via P2P/CUMEM"
                    for c in range(channels) for peer in range(8) if peer != rank]
            out += [f"{at} Connected all rings", f"{at} Connected all trees",
                    f"{at} {channels} coll channels, 0 collnet channels, 0 nvls channels, "
                    f"{channels} p2p channels, 4 p2p channels per peer"]
    return out[:lines]


def main() -> None:
    body = nccl_tests_text(GPUS, 37.6, sizes=tuple(2**k for k in range(3, 31)), info=False)
    head, _, rows = body.partition("#\n#" + " " * 62)
    text = "\n".join([*info_log(INFO_LINES), head.rstrip("\n")]) + "\n#\n#" + " " * 62 + rows
    parsed = parse_nccl_tests(text)
    assert len(parsed.rows) == 28 and parsed.channels == 32 and len(parsed.rings) == 32
    times = []
    for round_ in range(ROUNDS + 1):
        start = time.process_time()
        parse_nccl_tests(text)
        if round_:  # the first round warms up
            times.append((time.process_time() - start) * 1000)
    median = statistics.median(times)
    print(f"{len(text.splitlines())} lines ({INFO_LINES} of them INFO, "
          f"{len(parsed.connections)} connections), {len(text) / 2**20:.2f} MiB")
    met = "met" if median < GOAL_MS else "NOT met"
    print(f"parse: median {median:.1f} ms (min {min(times):.1f}, max {max(times):.1f}) of "
          f"{ROUNDS} rounds, CPU time; goal < {GOAL_MS:g} ms: {met}")


if __name__ == "__main__":
    main()
