"""What explaining every P2P pair costs: the diagnosis of each ordered pair of 8 and of 64 GPUs
(a switch per 8 GPUs, two sockets, ACS on), in-process, from a host whose reads were batched,
as a run's records ask for it.

    .venv/bin/python bench/explain.py

CPU time of this process (``time.process_time``: the machine's other load counts less than in
wall time), median of 5 rounds with min-max, per pair and for all pairs. The measurement it
explains takes seconds per pair (nvbandwidth copies 256 MiB 48 times), so the goal is only that
the diagnosis stays a small share of that.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from itertools import permutations
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_gpuhost.checks.gpus import find_gpus  # noqa: E402
from pytest_gpuhost.checks.p2p_explain import Explainer, Tuning, flow_of  # noqa: E402
from pytest_gpuhost.host import LocalHost  # noqa: E402
from pytest_gpuhost.host.cache import CachedHost  # noqa: E402
from pytest_gpuhost.testing.fakehost import FakeHost  # noqa: E402

ROUNDS = 5


def tree(root: Path, gpus: int) -> FakeHost:
    fake = FakeHost(root)
    for n in range(gpus):
        switch = n // 8
        port, upstream = f"0000:{switch * 16:02x}:01.1", f"0000:{switch * 16 + 1:02x}:00.0"
        if n % 8 == 0:
            fake.bridge(port, acs=0x1D, numa_node=switch % 2)
            fake.bridge(upstream, parent=port, port_type=5, acs=None, numa_node=switch % 2)
        down = f"0000:{switch * 16 + 2:02x}:{n % 8:02x}.0"
        fake.bridge(down, parent=upstream, port_type=6, acs=0x1D, numa_node=switch % 2)
        fake.gpu(f"0000:{switch * 16 + 3 + n % 8:02x}:00.0", parent=down,
                 numa_node=switch % 2, audio=False)
    return fake


def measure(gpus: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        host = CachedHost(LocalHost(tree(Path(directory) / "host", gpus).root))
        found = find_gpus(host)
        pairs = list(permutations([gpu.address for gpu in found], 2))
        times = []
        for _ in range(ROUNDS):
            explainer = Explainer(found, None, Tuning())
            host.prefetch(explainer.reads())  # the run's batch
            start = time.process_time()
            for source, target in pairs:
                explainer.explain(host, flow_of(f"{source}->{target}")).details(40.0)
            times.append(time.process_time() - start)
        median = statistics.median(times)
        print(f"{gpus} GPUs, {len(pairs)} pairs: {median * 1000:.0f} ms "
              f"({min(times) * 1000:.0f}-{max(times) * 1000:.0f}), "
              f"{median / len(pairs) * 1e6:.0f} us a pair")


if __name__ == "__main__":
    for count in (8, 64):
        measure(count)
