"""Many targets over ssh: 100 (and 20) fake hosts behind one OpenSSH server on 127.0.0.1, named
in an Ansible inventory and checked under -n 1 and 4, side by side with ansible-core's ad hoc
read of the same files on every host (``ansible all -f 4`` and ``-f 20 -m command -a 'cat
...'``, its default ControlPersist): the wall time, the peak memory of the controller (the
pytest or ansible process the user started, not its xdist workers or forks), and the logins and
sessions per target counted from the server's side (sshd's VERBOSE log: ``Accepted publickey``,
``Starting session``; an agent start is one ``command`` session).

    .venv/bin/python bench/targets.py                                  # prints the section
    .venv/bin/python bench/targets.py --repeat 3 --results bench/RESULTS.md
    .venv/bin/python bench/targets.py --targets 100 --workers 4 --forks 4 --repeat 1
    .venv/bin/python bench/targets.py --targets 100 --big 500          # and 500 once at -n 4
    mkdir /tmp/base && git archive COMMIT | tar -x -C /tmp/base && echo COMMIT > /tmp/base/.commit
    .venv/bin/python bench/targets.py --baseline /tmp/base   # and the same against older code

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
(controller, workers, their ssh clients, and ssh's master connections, which leave the tree
when they go to the background: this process is their subreaper) and of the target side (the
sshd's reaped children: the sessions and the agents' python3), against the machine's cores;
the sessions and round trips come from the JSON report.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import itertools
import os
import platform
import resource
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
sys.path.insert(0, str(REPO / "bench"))  # bench.py before the bench/ folder

from pytest_gpuhost.testing.fakehost import FakeHost  # noqa: E402
from pytest_gpuhost.testing.sshd import SshServer, start_sshd  # noqa: E402

SECTION = "## (7) many targets over ssh"
LATENCY_SECTION = "## (7b) many targets over a link with {rtt:.0f} ms of round-trip latency"
RELAY = REPO / "bench" / "latency_relay.py"
PDSH_LIKE = REPO / "bench" / "pdsh_like.py"
"""An ssh ProxyCommand that delays every byte (``--latency``): Ansible's ssh reads the same
configuration, so both tools cross the same link."""
GOAL_S = 12.0
"""Issue 26's goal: 100 targets in 12 s or less at -n 4 on this machine."""
PDSH_GOALS = {100: 1.3, 500: 1.2}
"""Issue 41's goals: at most this times the pdsh-like limit's wall time, at the same
parallelism (pytest -n 4 against pdsh-like -f 4)."""
GOAL_RATIO = 0.5
"""Issue 26's goal: at most half of Ansible's ad hoc read at the same parallelism (beyond it:
0.33)."""
BIG_PEAK_MIB = 200
"""Issue 26's goal: 500 targets to completion with the controller under 200 MB."""
FILES = ("proc/sys/vm/swappiness", "proc/sys/vm/dirty_ratio", "proc/sys/vm/dirty_background_ratio",
         "proc/sys/kernel/numa_balancing", "proc/sys/net/core/rmem_max", "proc/modules",
         "sys/module/nvidia/initstate", "dev/kmsg")
"""What the spec's checks read on a target, which Ansible's ad hoc run reads too."""
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
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class Measured:
    wall: float
    controller_peak_kib: int
    tree_cpu: float
    """CPU seconds of pytest and every process it started (workers, ssh clients, and the ssh
    master connections that leave its process tree: this process is their subreaper)."""
    target_cpu: float
    """CPU seconds of the target side: sshd's sessions and the agents."""
    connections: int
    round_trips: int
    logins: int = 0
    """``Accepted publickey`` lines in sshd's log during the run."""
    sessions: int = 0
    """``Starting session`` lines (an agent start, or one of Ansible's commands and copies)."""
    agents: int = 0
    """``Starting session: command`` lines: commands run, an agent start each for pytest."""
    load1: float = 0.0
    """The 1-minute load average when the run began."""


def build(work: Path, server: SshServer, count: int, latency: float = 0.0) -> Path:
    """``count`` fake roots and an inventory naming them; returns the run's directory.
    ``latency``: seconds each byte takes each way (bench/latency_relay.py as ProxyCommand)."""
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
    (directory / "hosts-ansible.ini").write_text(
        "[gpu]\n" + "\n".join(f"{line} ansible_ssh_common_args='-o ControlPath="
                               f"{directory / 'cp' / line.split()[0]}'" for line in hosts)
        + "\n\n[gpu:vars]\nansible_host=127.0.0.1\n"
        f"ansible_port={server.port}\nansible_user={server.user}\n"
        f"ansible_ssh_private_key_file={server.directory / 'user_key'}\n")
    (directory / "user_key").symlink_to(server.directory / "user_key")
    (directory / "targets.txt").write_text("".join(
        f"{server.user}@127.0.0.1 {server.port} {line.split('=', 1)[1]}\n" for line in hosts))
    (directory / "spec.yaml").write_text(SPEC)
    relay = f"  ProxyCommand {sys.executable} {RELAY} %h %p {latency}\n" if latency else ""
    (directory / "ssh_config").write_text(
        f"Host *\n{relay}  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  UserKnownHostsFile {server.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
    return directory


def ansible_command(forks: int) -> list[str]:
    """ansible-core's ad hoc read of the checks' files on every host (the venv's ansible)."""
    files = " ".join("{{ gpuhost_root }}/" + path for path in FILES)
    return [str(Path(sys.executable).parent / "ansible"), "all", "-i", "hosts-ansible.ini", "-o",
            "-f", str(forks), "-m", "command", "-a", f"cat {files}"]


def ansible_env(directory: Path, env: dict[str, str]) -> dict[str, str]:
    """Ansible's defaults but the client configuration (the test sshd's known host key); the
    interpreter found as by default, without the warning. Each host's master has a control
    socket of its own (``hosts-ansible.ini``): Ansible's default path is a hash of the address,
    port and user, which here every host shares (one sshd), so its hosts would ride each
    other's masters as hosts of a real fleet, each its own address, cannot."""
    (directory / "cp").mkdir(exist_ok=True)
    return {**env, "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=60s "
            f"-F {directory / 'ssh_config'}",
            "ANSIBLE_PYTHON_INTERPRETER": "auto_silent",
            "ANSIBLE_HOST_KEY_CHECKING": "True"}


def pdsh_command(forks: int) -> list[str]:
    """The limit: bench/pdsh_like.py, one ``ssh HOST cat FILES`` a target, ``forks`` at once
    (what ``pdsh -R ssh -f N`` does), over the same ssh configuration."""
    return [sys.executable, str(PDSH_LIKE), "-f", str(forks), "-F", "ssh_config", "-i", "user_key",
            "targets.txt", *FILES]


def end_masters(directory: Path) -> None:
    """Ansible's persisting masters ended after its run: the next run starts cold, as every
    pytest run does."""
    for socket in sorted((directory / "cp").glob("*")):
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "x"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False,
                       timeout=30)
        socket.unlink(missing_ok=True)


def command(workers: int) -> list[str]:
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp=basetemp",
            "--gpuhost-spec=spec.yaml",
            "--gpuhost-inventory=hosts.ini", "--gpuhost-ssh-config=ssh_config",
            "--gpuhost-report=report.json"]
    return args + (["-n", str(workers)] if workers else [])


PHASES = """\
\"\"\"When each phase of the run began (written by bench/targets.py; ``-p phases``).\"\"\"
import json, os, resource, time

import pytest

seen = {}


def _mark(name, last=False):
    if last or name not in seen:
        seen[name] = time.time()


def pytest_configure(config):
    _mark("configured")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    _mark("collecting")  # before pytest-gpuhost's own hook connects to the targets
    return (yield)


def pytest_collection_finish(session):
    _mark("collected")


def pytest_xdist_setupnodes(config, specs):
    _mark("workers starting")  # after the controller's collection (its sessionstart)


def pytest_xdist_node_collection_finished(node, ids):
    _mark("workers collected", last=True)


def pytest_runtest_logreport(report):
    _mark("first check reported")
    _mark("last check reported", last=True)


def pytest_unconfigure(config):
    worker = getattr(config, "workerinput", {}).get("workerid")
    _mark("unconfigured")
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    seen["cpu"] = time.process_time()
    seen["children cpu"] = children.ru_utime + children.ru_stime
    with open(os.environ["BENCH_PHASES"] + (f".{worker}" if worker else ""), "w") as out:
        json.dump(seen, out)
"""


def profile(directory: Path, workers: int, env: dict[str, str]) -> list[tuple[str, float]]:
    """One run with a plugin that notes when each phase began: (phase, seconds) in order."""
    import json

    (directory / "phases.py").write_text(PHASES)
    marks = directory / "phases.json"
    start = time.time()
    subprocess.run([sys.executable, *command(workers)[:2], "-p", "phases",
                    *command(workers)[2:]], cwd=directory, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL,
                   env={**env, "BENCH_PHASES": str(marks),
                        "PYTHONPATH": os.pathsep.join(filter(None, [str(directory),
                                                                    env.get("PYTHONPATH")]))})
    end = time.time()
    found = json.loads(marks.read_text())
    each = [json.loads(path.read_text()) for path in directory.glob("phases.json.gw*")]
    cpu = [("controller's CPU", found.pop("cpu")), ("workers' CPU", sum(
        worker["cpu"] for worker in each)), ("their ssh clients' CPU", sum(
            worker["children cpu"] for worker in each) + found.pop("children cpu")
            - sum(worker["cpu"] for worker in each))]
    for worker in each:
        del worker["cpu"], worker["children cpu"]
    if each:  # the controller collects nothing: the last worker to get to each phase
        found.pop("collecting", None)
        found.pop("collected", None)
        for name in ("configured", "collecting", "collected"):
            found[f"worker {name} (last)"] = max(worker[name] for worker in each)
    seen = sorted(found.items(), key=lambda item: item[1])
    points = [("start", start), *seen, ("exited", end)]
    return [(f"{a} -> {b}", tb - ta) for (a, ta), (b, tb) in itertools.pairwise(points)] + cpu


def become_subreaper() -> None:
    """Processes that leave the measured run's tree (ssh's backgrounded master connections)
    become this process's children when their parent exits, so their CPU is counted too."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_orphans(server: SshServer) -> None:
    """Wait for whatever the run left to this process (never the sshd)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == server.process.pid:
            raise SystemExit("the benchmark's sshd exited")


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


def server_counts(server: SshServer, since: int) -> tuple[int, int, int]:
    """(logins, sessions, command sessions) in sshd's log after byte ``since``."""
    text = server.log.read_bytes()[since:].decode(errors="replace")
    return (text.count("Accepted publickey"), text.count("Starting session:"),
            text.count("Starting session: command"))


def run_once(directory: Path, workers: int, count: int, server: SshServer,
             env: dict[str, str], tool: str = "pytest") -> Measured:
    """One run: pytest at -n ``workers`` (0: without xdist), or (``tool`` "ansible") ansible's
    ad hoc read with ``workers`` forks."""
    import json

    report = directory / "report.json"
    report.unlink(missing_ok=True)
    target_before = children_cpu(server.process.pid)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    since = server.log.stat().st_size
    if tool == "ansible":
        argv, env = ansible_command(workers), ansible_env(directory, env)
    elif tool == "pdsh":
        argv = pdsh_command(workers)
    else:
        argv = [sys.executable, *command(workers)]
    with tempfile.TemporaryFile("w+") as output:
        start = time.perf_counter()
        process = subprocess.Popen(argv, cwd=directory, env=env, stdout=output,
                                   stderr=subprocess.STDOUT)
        peak, done = [0], threading.Event()
        watcher = threading.Thread(target=watch_peak, args=(process.pid, peak, done))
        watcher.start()
        _, status, _ = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        done.set()
        watcher.join()
        code = os.waitstatus_to_exitcode(status)
        output.seek(0)
        text = output.read()
        if code != 0:
            tail = "\n".join(text.splitlines()[-30:])
            raise SystemExit(f"{count} targets, {tool} {workers}: exit {code}\n{tail}")
    if tool == "ansible":
        end_masters(directory)
    time.sleep(0.2)  # the last sessions' processes are reaped by sshd
    reap_orphans(server)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    tree_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    counted = server_counts(server, since)
    target_cpu = children_cpu(server.process.pid) - target_before
    if tool == "pdsh":
        if f"{count} of {count} targets read" not in text:
            raise SystemExit(f"{count} targets, pdsh-like -f {workers}: {text[-500:]}")
        return Measured(wall, peak[0], tree_cpu, target_cpu, 0, 0, *counted)
    if tool == "ansible":
        read = sum(1 for line in text.splitlines() if "| CHANGED | rc=0 |" in line)
        if read != count:
            raise SystemExit(f"{count} targets, ansible -f {workers}: {read} hosts read\n"
                             + "\n".join(text.splitlines()[-10:]))
        return Measured(wall, peak[0], tree_cpu, target_cpu, 0, 0, *counted)
    data = json.loads(report.read_text())
    outcomes = {check["outcome"] for check in data["checks"]}
    if len(data["checks"]) != count * CHECKS_PER_TARGET or outcomes != {"passed"}:
        raise SystemExit(f"{count} targets, -n {workers}: {len(data['checks'])} checks, "
                         f"outcomes {outcomes}")
    targets = data["targets"]
    return Measured(wall, peak[0], tree_cpu, target_cpu,
                    sum(t["connections"] or 0 for t in targets),
                    sum(t["round_trips"] or 0 for t in targets), *counted)


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


def connection_parts(server: SshServer, rounds: int = 10) -> tuple[float, float]:
    """Wall seconds (medians of ``rounds``) of ``ssh HOST true`` (a login alone) and of ``ssh
    HOST python3 -I -S -c pass`` (a login and the agent's python starting, nothing loaded):
    what ``connection_cost`` is made of, less the agent's upload, load, hello and batch."""
    parts = []
    for inner in (["true"], ["python3", "-I", "-S", "-c", "pass"]):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            subprocess.run(["ssh", "-F", str(server.client_config), server.alias, *inner],
                           check=True, stdin=subprocess.DEVNULL, capture_output=True)
            times.append(time.perf_counter() - start)
        parts.append(statistics.median(times))
    return parts[0], parts[1]


def login_cpu(server: SshServer, kex: str | None, rounds: int = 10) -> float:
    """CPU seconds of one ``ssh HOST true`` here, client and server side together (medians of
    ``rounds``), with OpenSSH's default key exchange or ``kex``: what a login costs before
    anything runs on the target."""
    extra = ["-o", f"KexAlgorithms={kex}"] if kex else []
    spent = []
    for _ in range(rounds):
        target_before = children_cpu(server.process.pid)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(["ssh", "-F", str(server.client_config), *extra, server.alias, "true"],
                       check=True, stdin=subprocess.DEVNULL, capture_output=True)
        time.sleep(0.05)  # sshd reaps the session
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
                     + children_cpu(server.process.pid) - target_before)
    return statistics.median(spent)


def negotiated_kex(server: SshServer) -> str:
    """The key exchange OpenSSH's defaults choose between this client and this server."""
    done = subprocess.run(["ssh", "-v", "-F", str(server.client_config), server.alias, "true"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True)
    found = [line.split("kex: algorithm:", 1)[1].strip() for line in done.stderr.splitlines()
             if "kex: algorithm:" in line]
    return found[0] if found else "unknown"


def spread(values: list[float], digits: int = 1) -> str:
    return (f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


def load() -> str:
    """The machine's load average and CPU pressure now: what else was running."""
    averages = Path("/proc/loadavg").read_text().split()[:3]
    try:
        pressure = Path("/proc/pressure/cpu").read_text().split()[1].split("=")[1]
    except (OSError, IndexError):
        pressure = "?"
    return f"load {' '.join(averages)}, CPU pressure {pressure}% (avg10)"


Variant = tuple[str, int]
"""("pytest", -n) or ("ansible", forks)."""


def name_of(variant: Variant) -> str:
    tool, number = variant
    if tool == "ansible":
        return f"ansible -f {number}"
    if tool == "pdsh":
        return f"pdsh-like -f {number}"
    return f"pytest -n {number}" if number else "pytest, no -n"


def measure(work: Path, server: SshServer, counts: list[int], variants: list[Variant],
            repeat: int, env: dict[str, str],
            figures: dict[tuple[int, Variant], list[Measured]], label: str = "",
            latency: float = 0.0, ansible_upto: int | None = None) -> None:
    """``repeat`` rounds of every variant, per target count (their order reversed every
    other round), each connection ``latency`` seconds late each way (``build``); Ansible
    only up to ``ansible_upto`` targets."""
    for count in sorted(counts):
        directory = build(work, server, count, latency)
        here = [variant for variant in variants if variant[0] != "ansible"
                or ansible_upto is None or count <= ansible_upto]
        for round_ in range(repeat):
            for variant in here if round_ % 2 == 0 else here[::-1]:
                load1 = float(Path("/proc/loadavg").read_text().split()[0])
                measured = dataclasses.replace(
                    run_once(directory, variant[1], count, server, env, variant[0]),
                    load1=load1)
                figures.setdefault((count, variant), []).append(measured)
                print(f"  {label}{count} targets, {name_of(variant)}, round {round_ + 1}/"
                      f"{repeat}: {measured.wall:.1f} s, controller "
                      f"{measured.controller_peak_kib / 1024:.0f} MiB, CPU "
                      f"{measured.tree_cpu:.1f} s + {measured.target_cpu:.1f} s, logins "
                      f"{measured.logins}, sessions {measured.sessions}, load {load1:.2f}",
                      file=sys.stderr, flush=True)
        shutil.rmtree(directory)
        shutil.rmtree(work / "roots")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="100,20",
                        help="target counts, comma-separated (default 100,20)")
    parser.add_argument("--workers", default="1,4",
                        help="-n values, comma-separated; 0 runs without xdist (default 1,4)")
    parser.add_argument("--forks", default="4,20",
                        help="ansible's -f values, comma-separated; empty: no ansible "
                             "(default 4,20)")
    parser.add_argument("--pdsh", default="4",
                        help="the pdsh-like limit's -f values (bench/pdsh_like.py), "
                             "comma-separated; empty: none (default 4)")
    parser.add_argument("--ansible-upto", type=int, default=100, metavar="N",
                        help="run Ansible only at counts up to N targets (default 100)")
    parser.add_argument("--repeat", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--big", type=int, default=0, metavar="N",
                        help="also N targets, once, at -n 4 (the issue's 500)")
    parser.add_argument("--results", type=Path, help="put the section into this file")
    parser.add_argument("--shell-rc", action="store_true",
                        help="let the targets' shell source the user's ~/.bashrc (see "
                             "NO_SHELL_RC)")
    parser.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                        help="each byte delayed this long each way (bench/latency_relay.py as "
                             "ProxyCommand, crossed by both tools): writes section (7b)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also run 100 targets at each --workers value, once, with "
                             "pytest-gpuhost imported from CHECKOUT (a git checkout, or a git "
                             "archive copy with the commit in CHECKOUT/.commit)")
    args = parser.parse_args()
    counts = [int(n) for n in args.targets.split(",")]
    variants: list[Variant] = [("pytest", int(n)) for n in args.workers.split(",")]
    variants += [("ansible", int(n)) for n in args.forks.split(",") if n]
    variants += [("pdsh", int(n)) for n in args.pdsh.split(",") if n]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    began, before = time.perf_counter(), load()
    become_subreaper()
    results: dict[tuple[int, Variant], list[Measured]] = {}
    extra: dict[tuple[int, Variant], list[Measured]] = {}
    baseline: dict[tuple[int, Variant], list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="gpuhost-targets-") as temporary:
        work = Path(temporary)
        env["ANSIBLE_LOCAL_TEMP"] = str(work / "ansible-tmp")
        env["ANSIBLE_HOME"] = str(work / "ansible")
        server = start_sshd(work / "sshd", extra_config="" if args.shell_rc else NO_SHELL_RC,
                            log_level="VERBOSE")
        try:
            one = connection_cost(server)
            parts = connection_parts(server)
            logins = (negotiated_kex(server), login_cpu(server, None),
                      login_cpu(server, "curve25519-sha256"))
            warm = build(work, server, min(counts))
            run_once(warm, 4, min(counts), server, env)  # the caches, the sshd
            shutil.rmtree(warm)
            shutil.rmtree(work / "roots")
            measure(work, server, counts, variants, args.repeat, env, results,
                    latency=args.latency, ansible_upto=args.ansible_upto)
            phases = []
            if 100 in counts and ("pytest", 4) in variants:
                directory = build(work, server, 100, args.latency)
                phases = profile(directory, 4, env)
                shutil.rmtree(directory)
                shutil.rmtree(work / "roots")
            if args.big:
                measure(work, server, [args.big], [("pytest", 4)], 1, env, extra,
                        latency=args.latency)
            if args.baseline is not None:
                old = {**env, "PYTHONPATH": str(args.baseline.resolve())}
                ours = [variant for variant in variants if variant[0] == "pytest"]
                measure(work, server, [100], ours, 1, old, baseline, "baseline: ",
                        args.latency)
        finally:
            server.stop()
    elapsed = time.perf_counter() - began
    section = render(results, extra, baseline, counts, variants, one, args, elapsed,
                     (before, load()), phases, logins, parts)
    print(section)
    if args.results is not None:
        from bench import put_section  # bench/bench.py: RESULTS.md's sections, one way

        assert section.startswith("## (7")
        text = args.results.read_text() if args.results.exists() else ""
        args.results.write_text(put_section(text, section))
    goal = results.get((100, ("pytest", 4)))
    return 0 if goal is None or args.latency or \
        statistics.median(m.wall for m in goal) <= GOAL_S else 1


def row(name: str, goal: str, runs: list[Measured], met: str, count: int) -> str:
    cores = os.cpu_count() or 1
    tree = statistics.median(m.tree_cpu for m in runs)
    targets = statistics.median(m.target_cpu for m in runs)
    per = runs[0]
    return (f"| {name} | {goal} | {spread([m.wall for m in runs])} s | "
            f"{spread([m.load1 for m in runs], 2)} | "
            f"{spread([m.controller_peak_kib / 1024 for m in runs], 0)} MiB | "
            f"{tree:.1f} s + {targets:.1f} s = {tree + targets:.1f} s "
            f"({(tree + targets) / cores:.1f} s on {cores} cores) | "
            f"{per.logins / count:g} / {per.sessions / count:g} / {per.agents / count:g} | "
            f"{f'{per.connections} / {per.round_trips}' if per.round_trips else ''} | {met} |")


def baseline_commit(checkout: Path) -> str:
    """The commit of the baseline's code: a git checkout's, or that a ``git archive`` copy
    names in its ``.commit`` file (a copy changes no repository)."""
    named = checkout / ".commit"
    if named.exists():
        return named.read_text().strip()
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def ratios(results: dict[tuple[int, Variant], list[Measured]], count: int, ours: Variant,
           theirs: Variant) -> list[float]:
    """Per round: pytest's wall / Ansible's (the runs of a round were back to back)."""
    return [a.wall / b.wall for a, b in zip(results[count, ours], results[count, theirs],
                                            strict=True)]


def ratio_goal(count: int, ours: Variant, theirs: Variant) -> float | None:
    """The goal of a ratio of wall times: issue 26's against Ansible at 100 targets, issue 41's
    against the pdsh-like limit at 100 and 500, each at the same parallelism."""
    if ours[1] != theirs[1]:
        return None
    if theirs[0] == "pdsh":
        return PDSH_GOALS.get(count)
    return GOAL_RATIO if count == 100 else None


def fitted(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per target): the least-squares line through (targets, seconds)."""
    mean_n = statistics.fmean(n for n, _ in points)
    mean_s = statistics.fmean(s for _, s in points)
    slope = sum((n - mean_n) * (s - mean_s) for n, s in points) / \
        sum((n - mean_n) ** 2 for n, _ in points)
    return mean_s - slope * mean_n, slope


def costs(results: dict[tuple[int, Variant], list[Measured]], counts: list[int],
          variants: list[Variant]) -> list[str]:
    """Each tool's fixed cost and cost per target: the line through its medians at each count
    (wall time, and the CPU of both sides), where it ran at two counts or more."""
    lines = []
    for variant in variants:
        runs = [(count, results[count, variant]) for count in sorted(counts)
                if (count, variant) in results]
        if len(runs) < 2:
            continue
        wall = fitted([(n, statistics.median(m.wall for m in r)) for n, r in runs])
        tree = fitted([(n, statistics.median(m.tree_cpu for m in r)) for n, r in runs])
        targets = fitted([(n, statistics.median(m.target_cpu for m in r)) for n, r in runs])
        lines.append(f"| {name_of(variant)} | {', '.join(str(n) for n, _ in runs)} | "
                     f"{wall[0]:.1f} s | {wall[1] * 1000:.0f} ms | {tree[0]:.1f} s | "
                     f"{tree[1] * 1000:.0f} ms | {targets[0]:.1f} s | "
                     f"{targets[1] * 1000:.0f} ms |")
    return lines


def render(results: dict[tuple[int, Variant], list[Measured]],
           extra: dict[tuple[int, Variant], list[Measured]],
           baseline: dict[tuple[int, Variant], list[Measured]], counts: list[int],
           variants: list[Variant], one: float, args: argparse.Namespace, elapsed: float,
           loads: tuple[str, str], phases: list[tuple[str, float]],
           logins: tuple[str, float, float], parts: tuple[float, float]) -> str:
    cores, latency = os.cpu_count() or 1, args.latency
    rows = []
    for count in counts:
        for variant in variants:
            if (count, variant) not in results:
                continue
            runs = results[count, variant]
            goal = (count, variant) == (100, ("pytest", 4)) and not latency
            met = ("yes" if statistics.median(m.wall for m in runs) <= GOAL_S else "**no**") \
                if goal else ""
            rows.append(row(f"{count} targets, {name_of(variant)}",
                            f"<= {GOAL_S:.0f} s" if goal else "", runs, met, count))
    commit = baseline_commit(args.baseline) if args.baseline else ""
    for (count, variant), runs in sorted(extra.items()):
        peak = runs[0].controller_peak_kib / 1024
        rows.append(row(f"{count} targets, {name_of(variant)}, 1 run",
                        f"completes, controller < {BIG_PEAK_MIB} MB", runs,
                        "yes" if peak * 1.048576 < BIG_PEAK_MIB else "**no**", count))
    for (count, variant), runs in sorted(baseline.items()):
        rows.append(row(f"baseline ({commit}): {count} targets, {name_of(variant)}, 1 run",
                        "", runs, "", count))
    compared = []
    for count in counts:
        for ours, theirs in ((("pytest", 4), ("ansible", 4)), (("pytest", 4), ("ansible", 20)),
                             (("pytest", 1), ("ansible", 4)), (("pytest", 4), ("pdsh", 4)),
                             (("pytest", 1), ("pdsh", 4)),
                             *((("pytest", 4), other) for other in variants
                               if other[0] == "pdsh" and other[1] != 4)):
            if (count, ours) in results and (count, theirs) in results:
                values = ratios(results, count, ours, theirs)
                limit = ratio_goal(count, ours, theirs) if not latency else None
                met = ("yes" if statistics.median(values) <= limit else "**no**") \
                    if limit is not None else ""
                compared.append(f"| {count} targets | {name_of(ours)} / {name_of(theirs)} | "
                                f"{f'<= {limit}' if limit is not None else ''} | "
                                f"{spread(values, 2)} | {met} |")
    invocation = (f"python bench/targets.py --targets {','.join(map(str, counts))} --workers "
                  f"{','.join(str(n) for tool, n in variants if tool == 'pytest')} --forks "
                  f"{','.join(str(n) for tool, n in variants if tool == 'ansible')} "
                  f"--pdsh {','.join(str(n) for tool, n in variants if tool == 'pdsh')} "
                  f"--ansible-upto {args.ansible_upto} "
                  f"--repeat {args.repeat}"
                  + (f" --big {args.big}" if args.big else "")
                  + (" --shell-rc" if args.shell_rc else "")
                  + (f" --latency {args.latency:g}" if args.latency else "")
                  + (f" --baseline {args.baseline}" if args.baseline else ""))
    shown = " ".join(shlex.quote(word) for word in ["python", *command(4)])
    shown_ansible = " ".join(shlex.quote(word) for word in ["ansible", *ansible_command(4)[1:]])
    ansible_args = "ANSIBLE_SSH_ARGS='-C -o ControlMaster=auto -o ControlPersist=60s -F ssh_config'"
    ssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    ansible = subprocess.run([str(Path(sys.executable).parent / "ansible"), "--version"],
                             capture_output=True, text=True).stdout.splitlines()[:1]
    shell = ("the targets' shell sourced root's ~/.bashrc (--shell-rc)" if args.shell_rc else
             "the targets' shell did not source root's ~/.bashrc (sshd's `SetEnv SHLVL=1`): "
             "here that runs pyenv init, 141 ms of CPU a session, and puts pyenv's python3 "
             "shim first (96 ms a run), which a GPU host's plain root shell does not pay; "
             "`--shell-rc` measures with it")
    timeline = ("- where a run of 100 targets at -n 4 spends its time (one more run, with a "
                "plugin noting when each phase began): "
                + "; ".join(f"{name} {took:.1f} s" for name, took in phases)
                + ". The controller connects to no target: each worker collects its own share "
                "(its collection is in when its slowest target is), and is given its targets' "
                "checks as soon as its own collection is in") if phases else ""
    ratio_table = ("Ratios of the wall times of the same round (back-to-back runs), medians "
                   "with min-max:\n\n| targets | ratio | goal | value | met |\n"
                   "| --- | --- | --- | --- | --- |\n" + "\n".join(compared) + "\n"
                   ) if compared else ""
    lines = costs(results, counts, variants)
    cost_table = ("Fixed cost and cost per target: the least-squares line through each tool's "
                  "medians at each count (wall time; the CPU of the process tree here, and of "
                  "the target side, which on a real fleet each target spends itself):"
                  "\n\n| tool | at targets | wall: fixed | wall: per target | tree CPU: fixed "
                  "| tree CPU: per target | targets' CPU: fixed | targets' CPU: per target |"
                  "\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
                  + "\n".join(lines) + "\n") if lines else ""
    pdsh_line = (f"cd $BENCH/fleet100 && python bench/pdsh_like.py -f 4 -F ssh_config "
                 f"-i user_key targets.txt {' '.join(FILES)}\n") \
        if any(tool == "pdsh" for tool, _ in variants) else ""
    ansible_line = f"cd $BENCH/fleet100 && {ansible_args} {shown_ansible}\n" \
        if any(tool == "ansible" for tool, _ in variants) else ""
    title = LATENCY_SECTION.format(rtt=2000 * latency) if latency else SECTION
    link = (f" Every connection crosses bench/latency_relay.py as its ProxyCommand: each byte "
            f"{latency * 1000:g} ms late each way ({2000 * latency:g} ms a round trip), for "
            "Ansible too.") if latency else ""
    return f"""{title}

Produced by `{invocation}` in {elapsed:.0f} s on this machine (`nproc` {cores}, Python \
{platform.python_version()}, {ssh}, {' '.join(ansible)}), shared with other work \
({loads[0]} at the start, {loads[1]} at the end). One sshd on 127.0.0.1 (LogLevel VERBOSE); \
each target a host of an Ansible inventory with its own small fake root ({CHECKS_PER_TARGET} \
checks: five sysctls, a module, dmesg) and its own ssh connection. Ansible reads the same files \
on every host (`ansible all -f N -m command -a 'cat ...'`, its default `ControlPersist`, each \
host's master its own control socket as on hosts of their own addresses, the masters ended \
after each run, the interpreter discovered as by default). Runs alternate in each \
round (the order reversed every other round); medians of {args.repeat} rounds after one warm-up \
run, min-max in parentheses, the 1-minute load average when each run began beside it. \
Controller peak RSS: the VmHWM of the pytest (or ansible) process the user started (xdist's \
workers and Ansible's forks are not in it). CPU: the process tree's (controller, workers or \
forks, ssh clients and masters reaped by then) + the target side's (sshd's sessions and \
what they ran); on {cores} cores the wall time cannot go below their sum / {cores}. Per \
target, from sshd's log: logins (`Accepted publickey`) / sessions (`Starting session`) / \
commands (`Starting session: command`: for pytest, its agent's starts).{link}

| figure | goal | wall | load | controller peak RSS | CPU: tree + targets | per target: \
logins / sessions / commands | pytest's report: sessions / round trips | met |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
{chr(10).join(rows)}

{ratio_table}
{cost_table}
- one target's connection alone (ssh, key exchange, login, python3, the agent's hello, one \
batch): {one * 1000:.0f} ms of wall time here, of which a login alone (`ssh HOST true`) \
{parts[0] * 1000:.0f} ms and python3's start on the target (`ssh HOST python3 -I -S -c pass`, \
less the login) {(parts[1] - parts[0]) * 1000:.0f} ms: the agent's upload, load, hello and \
one batch the remaining {(one - parts[1]) * 1000:.0f} ms (medians of 10, one at a time)
- one login alone (`ssh HOST true`, CPU of client and server together, median of 10): \
{logins[1] * 1000:.0f} ms with OpenSSH's default key exchange here ({logins[0]}), \
{logins[2] * 1000:.0f} ms with curve25519-sha256: 100 logins cost \
{100 * logins[1]:.1f} s of CPU before anything runs on a target, the same for every tool that \
logs in once a host (Ansible too). pytest-gpuhost never chooses the key exchange: ssh runs with \
the user's configuration
- {shell}
{timeline}

Commands:

```
{f"git archive {commit} | tar -x -C {args.baseline}{chr(10)}" if args.baseline else ""}\
{invocation}
cd $BENCH/fleet100 && {shown}
{ansible_line}{pdsh_line}```
"""


if __name__ == "__main__":
    raise SystemExit(main())
