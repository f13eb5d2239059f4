"""One target's connection and first batch over a link with latency: this checkout against a
baseline checkout, alternated, to see the round trips a connection waits for.

    python bench/connect_rtt.py BASELINE LATENCY ROUNDS
    python bench/connect_rtt.py /tmp/base 0.25 8     # 500 ms a round trip

``BASELINE``: a checkout of older code (``git archive COMMIT | tar -x -C DIR``). Each round
runs a fresh process of each (the order reversed every other round) that connects to the same
test sshd on 127.0.0.1 through bench/latency_relay.py (each byte ``LATENCY`` seconds late each
way) and reads one file in one batch; it prints the medians and the per-round difference.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_gpuhost.testing.sshd import start_sshd  # noqa: E402

RELAY = REPO / "bench" / "latency_relay.py"
ONE = """
import json, sys, time
from pathlib import Path
from pytest_gpuhost.host import Read
from pytest_gpuhost.host.remote import AgentHost, agent_command, ssh_argv
argv = ssh_argv(sys.argv[1], port=None, user=None, config=Path(sys.argv[2]), connect_timeout=10,
                inner=agent_command("/"))
host = AgentHost("bench", argv, "/")
start = time.perf_counter()
host.batch([Read("proc/sys/kernel/osrelease")])
took = time.perf_counter() - start
host.close()
print(json.dumps(took))
"""


def main() -> int:
    base, latency, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        server = start_sshd(work / "sshd", extra_config="SetEnv SHLVL=1\n")
        try:
            config = work / "ssh_config"
            relay = f"  ProxyCommand {sys.executable} {RELAY} %h %p {latency}\n"
            config.write_text(server.client_config.read_text().replace(
                f"Host {server.alias}\n", f"Host {server.alias}\n{relay}", 1))
            times: dict[str, list[float]] = {"this": [], "baseline": []}
            for round_ in range(rounds):
                for which in ("this", "baseline") if round_ % 2 == 0 else ("baseline", "this"):
                    path = base if which == "baseline" else str(REPO)
                    done = subprocess.run([sys.executable, "-c", ONE, server.alias, str(config)],
                                          env={**os.environ, "PYTHONPATH": path}, cwd=temporary,
                                          capture_output=True, text=True, check=True)
                    times[which].append(json.loads(done.stdout))
        finally:
            server.stop()
    for which, values in times.items():
        print(f"{which}: median {statistics.median(values) * 1000:.0f} ms "
              f"({min(values) * 1000:.0f}-{max(values) * 1000:.0f})")
    saved = [b - a for a, b in zip(times["this"], times["baseline"], strict=True)]
    print(f"baseline - this, per round: median {statistics.median(saved) * 1000:.0f} ms "
          f"({min(saved) * 1000:.0f}-{max(saved) * 1000:.0f}), {rounds} rounds, "
          f"{2000 * latency:g} ms a round trip")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
