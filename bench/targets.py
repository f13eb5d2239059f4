"""Many targets over ssh: 100 (and 20) fake hosts behind one OpenSSH server on 127.0.0.1, named
in an Ansible inventory and checked under -n 1, 4 and 8: the wall time, and the peak memory of
the controller (the pytest process the user started, not its xdist workers).

    .venv/bin/python bench/targets.py                                  # prints the section
    .venv/bin/python bench/targets.py --repeat 3 --results bench/RESULTS.md
    .venv/bin/python bench/targets.py --targets 100 --workers 4 --repeat 1   # one figure

Each target is a small fake root of its own (7 checks: five sysctls, a module, dmesg), reached
through the inventory (``ansible_host``, ``ansible_port``, ``ansible_user``, the key file,
``gpuhost_root``), so every target costs what a real one costs here: its own ssh connection, key
exchange and remote python3. The server, its keys and the roots live in a temporary directory;
neither this machine's sshd nor ~/.ssh is used. Each run is a fresh ``python -m pytest``; rounds
alternate the order of the worker counts; figures are medians over the rounds (min-max).
``--basetemp`` is the run's own: without it, pytest (xdist's controller makes a base temporary
directory) sweeps old ``/tmp/pytest-of-USER/pytest-N`` directories at its end, and on a machine
shared with other test runs that sweep alone took up to 100 s of a measured run.

Where the time goes is measured, not guessed: the CPU seconds of the pytest process tree
(controller, workers, their ssh clients: ``wait4``) and of the target side (the sshd's reaped
children: the sessions and the agents' python3), against the machine's cores; the connections
and round trips come from the JSON report.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pytest_gpuhost.testing.fakehost import FakeHost  # noqa: E402
from pytest_gpuhost.testing.sshd import SshServer, start_sshd  # noqa: E402

SECTION = "## (7) many targets over ssh"
GOAL_S = 30.0
"""The issue's goal: 100 targets under 30 s at -n 4 on this machine."""
SPEC = """\
version: 1
sysctl:
  vm.swappiness: 10
  vm.dirty_ratio: 5
  vm.dirty_background_ratio: 2
  kernel.numa_balancing: 0
  net.core.rmem_max: 16777216
modules:
  nvidia: loaded
dmesg: {}
"""
CHECKS_PER_TARGET = 7
NO_SHELL_RC = "SetEnv SHLVL=1\n"
"""sshd runs each session's command with the user's shell; bash, started by sshd at shell level
1, sources ~/.bashrc. Here root's ~/.bashrc runs ``pyenv init`` (141 ms of CPU a session) and
puts pyenv's python3 shim first on PATH (96 ms a run): seven times the rest of a session's cost
on the target side, and nothing a GPU host's plain root shell pays. At shell level 2, bash
sources nothing, and python3 is /usr/bin's (``--shell-rc`` measures with it)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Measured:
    wall: float
    controller_peak_kib: int
    tree_cpu: float
    """CPU seconds of pytest and everything it waited for (workers, ssh clients)."""
    target_cpu: float
    """CPU seconds of the target side: sshd's sessions and the agents."""
    connections: int
    round_trips: int


def build(work: Path, server: SshServer, count: int) -> Path:
    """``count`` fake roots and an inventory naming them; returns the run's directory."""
    directory = work / f"fleet{count}"
    directory.mkdir()
    hosts = []
    for index in range(count):
        name = f"node{index:03d}"
        root = FakeHost(work / "roots" / name)
        root.sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5, "vm.dirty_background_ratio": 2,
                      "kernel.numa_balancing": 0, "net.core.rmem_max": 16777216})
        root.module("nvidia")
        root.kmsg([(6, "Linux version 6.8.0-49-generic"), (6, "nvidia: loading module")])
        hosts.append(f"{name} gpuhost_root={root.root}")
    (directory / "hosts.ini").write_text(
        "[gpu]\n" + "\n".join(hosts) + "\n\n[gpu:vars]\nansible_host=127.0.0.1\n"
        f"ansible_port={server.port}\nansible_user={server.user}\n"
        f"ansible_ssh_private_key_file={server.directory / 'user_key'}\n")
    (directory / "spec.yaml").write_text(SPEC)
    (directory / "ssh_config").write_text(
        f"Host *\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  UserKnownHostsFile {server.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
    return directory


def command(workers: int) -> list[str]:
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp=basetemp",
            "--gpuhost-spec=spec.yaml",
            "--gpuhost-inventory=hosts.ini", "--gpuhost-ssh-config=ssh_config",
            "--gpuhost-report=report.json"]
    return args + (["-n", str(workers)] if workers else [])


def children_cpu(pid: int) -> float:
    """CPU seconds of a process's reaped children (``cutime`` + ``cstime``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS


def watch_peak(pid: int, peak: list[int], done: threading.Event) -> None:
    """The controller's VmHWM (its own peak RSS, in KiB), read until it exits."""
    path = Path(f"/proc/{pid}/status")
    while not done.is_set():
        try:
            for line in path.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak[0] = max(peak[0], int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            return
        time.sleep(0.02)


def run_once(directory: Path, workers: int, count: int, server: SshServer,
             env: dict[str, str]) -> Measured:
    import json

    report = directory / "report.json"
    report.unlink(missing_ok=True)
    target_before = children_cpu(server.process.pid)
    with tempfile.TemporaryFile("w+") as output:
        start = time.perf_counter()
        process = subprocess.Popen([sys.executable, *command(workers)], cwd=directory, env=env,
                                   stdout=output, stderr=subprocess.STDOUT)
        peak, done = [0], threading.Event()
        watcher = threading.Thread(target=watch_peak, args=(process.pid, peak, done))
        watcher.start()
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        watcher.join()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            output.seek(0)
            tail = "\n".join(output.read().splitlines()[-30:])
            raise SystemExit(f"{count} targets, -n {workers}: exit {code}\n{tail}")
    time.sleep(0.2)  # the last sessions' processes are reaped by sshd
    data = json.loads(report.read_text())
    outcomes = {check["outcome"] for check in data["checks"]}
    if len(data["checks"]) != count * CHECKS_PER_TARGET or outcomes != {"passed"}:
        raise SystemExit(f"{count} targets, -n {workers}: {len(data['checks'])} checks, "
                         f"outcomes {outcomes}")
    targets = data["targets"]
    return Measured(wall, peak[0], usage.ru_utime + usage.ru_stime,
                    children_cpu(server.process.pid) - target_before,
                    sum(t["connections"] or 0 for t in targets),
                    sum(t["round_trips"] or 0 for t in targets))


def connection_cost(server: SshServer, rounds: int = 10) -> float:
    """Seconds for one target's connection here (ssh, key exchange, python3 and the agent's
    hello, then one batch), measured alone: the floor under every target's share."""
    from pytest_gpuhost.host import Read
    from pytest_gpuhost.host.remote import AgentHost, agent_command, ssh_argv

    times = []
    for _ in range(rounds):
        argv = ssh_argv(server.alias, port=None, user=None, config=server.client_config,
                        connect_timeout=10, inner=agent_command("/"))
        host = AgentHost("bench", argv, "/")
        start = time.perf_counter()
        host.batch([Read("proc/sys/kernel/osrelease")])
        times.append(time.perf_counter() - start)
        host.close()
    return statistics.median(times)


def spread(values: list[float], digits: int = 1) -> str:
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="100,20",
                        help="target counts, comma-separated (default 100,20)")
    parser.add_argument("--workers", default="1,4,8",
                        help="-n values, comma-separated; 0 runs without xdist (default 1,4,8)")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--results", type=Path, help="put the section into this file")
    parser.add_argument("--shell-rc", action="store_true",
                        help="let the targets' shell source the user's ~/.bashrc (see "
                             "NO_SHELL_RC)")
    args = parser.parse_args()
    counts = [int(n) for n in args.targets.split(",")]
    worker_counts = [int(n) for n in args.workers.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    began = time.perf_counter()
    results: dict[tuple[int, int], list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuhost-targets-") as temporary:
        work = Path(temporary)
        env["ANSIBLE_LOCAL_TEMP"] = str(work / "ansible-tmp")
        env["ANSIBLE_HOME"] = str(work / "ansible")
        server = start_sshd(work / "sshd", extra_config="" if args.shell_rc else NO_SHELL_RC)
        try:
            one = connection_cost(server)
            for count in counts:
                directory = build(work, server, count)
                run_once(directory, worker_counts[0], count, server, env)  # warm-up
                for round_ in range(args.repeat):
                    order = worker_counts if round_ % 2 == 0 else worker_counts[::-1]
                    for workers in order:
                        measured = run_once(directory, workers, count, server, env)
                        results.setdefault((count, workers), []).append(measured)
                        print(f"  {count} targets, -n {workers}, round {round_ + 1}/"
                              f"{args.repeat}: {measured.wall:.1f} s, controller "
                              f"{measured.controller_peak_kib / 1024:.0f} MiB, CPU "
                              f"{measured.tree_cpu:.1f} s + {measured.target_cpu:.1f} s",
                              file=sys.stderr, flush=True)
                shutil.rmtree(work / "roots")
        finally:
            server.stop()
    elapsed = time.perf_counter() - began
    section = render(results, counts, worker_counts, one, args, elapsed)
    print(section)
    if args.results is not None:
        text = args.results.read_text() if args.results.exists() else ""
        start = text.find(SECTION)
        if start < 0:
            text = text.rstrip("\n") + "\n\n" + section
        else:
            end = text.find("\n## ", start + len(SECTION))
            text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
        args.results.write_text(text)
    goal = results.get((100, 4))
    return 0 if goal is None or statistics.median(m.wall for m in goal) < GOAL_S else 1


def render(results: dict[tuple[int, int], list[Measured]], counts: list[int],
           worker_counts: list[int], one: float, args: argparse.Namespace,
           elapsed: float) -> str:
    cores = os.cpu_count() or 1
    rows = []
    for count in counts:
        for workers in worker_counts:
            runs = results[count, workers]
            wall = [m.wall for m in runs]
            met = ""
            if (count, workers) == (100, 4):
                met = "yes" if statistics.median(wall) < GOAL_S else "**no**"
            cpu = statistics.median(m.tree_cpu + m.target_cpu for m in runs)
            rows.append(
                f"| {count} targets, {f'-n {workers}' if workers else 'no -n'} | "
                f"{f'< {GOAL_S:.0f} s' if (count, workers) == (100, 4) else ''} | "
                f"{spread(wall)} s | "
                f"{spread([m.controller_peak_kib / 1024 for m in runs], 0)} MiB | "
                f"{statistics.median(m.tree_cpu for m in runs):.1f} s + "
                f"{statistics.median(m.target_cpu for m in runs):.1f} s = {cpu:.1f} s "
                f"({cpu / cores:.1f} s on {cores} cores) | "
                f"{runs[0].connections} / {runs[0].round_trips} | {met} |")
    shown = " ".join(shlex.quote(word) for word in ["python", *command(4)])
    return f"""{SECTION}

Produced by `python bench/targets.py --targets {','.join(map(str, counts))} --workers \
{','.join(map(str, worker_counts))} --repeat {args.repeat}` in {elapsed:.0f} s on this machine \
(`nproc` {cores}, Python {platform.python_version()}, \
{subprocess.run(['ssh', '-V'], capture_output=True, text=True).stderr.strip()}): one sshd on \
127.0.0.1, one small fake root per target ({CHECKS_PER_TARGET} checks: five sysctls, a \
module, dmesg), every target a host of an Ansible inventory with its own connection. Medians \
of {args.repeat} rounds after a warm-up, min-max in parentheses. The controller's peak is its \
own VmHWM (the process the user started; xdist's workers are not in it). CPU is the pytest \
process tree's (controller, workers, ssh clients) plus the target side's (sshd's sessions and \
the agents' python3): on {cores} cores, the wall time cannot go below their sum divided by \
{cores}.

| figure | goal | wall | controller peak RSS | CPU: pytest + targets | connections / round \
trips | met |
| --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

- one target's connection alone (ssh, key exchange, python3, the agent's hello, one batch): \
{one * 1000:.0f} ms here

Commands:

```
python bench/targets.py --targets {','.join(map(str, counts))} --workers \
{','.join(map(str, worker_counts))} --repeat {args.repeat}
cd $BENCH/fleet100 && {shown}
```
"""


if __name__ == "__main__":
    raise SystemExit(main())
