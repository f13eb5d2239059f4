"""A real one-node Slurm cluster on 127.0.0.1 for tests, made entirely under a directory.

Debian's ``slurm-wlm`` daemons and ``munge``, as a site runs them, but private: a munge key,
socket and log made here (munged is told its socket with ``--socket``, Slurm with
``AuthInfo=socket=``), ``slurm.conf`` with free ports of this machine, and the state, spool, pid
and log files of slurmctld and slurmd here too. Nothing of this machine's own Slurm or munge
(``/etc/slurm``, ``/etc/munge``, ``/run/munge``) is read or changed. slurmctld and slurmd listen
on 127.0.0.1 alone (``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny``: they bind the
controller's and the node's address, not every address) and talk only to it. The one node's
``HealthCheckProgram`` is the caller's, run every ``HealthCheckInterval`` seconds by slurmd, as
on a cluster.

slurmd runs a ``HealthCheckProgram`` with no environment but ``SLURMD_NODENAME`` (found by
running one, slurm-wlm 22.05): a program that needs settings (``SLURM_CONF`` for sinfo and
scontrol, ``GPUHOST_SPEC`` ...) is a wrapper that sets them, as ``health_check_wrapper`` writes.
Root is needed: slurmd runs as root to run its health check as root.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from .sshd import free_port

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "scontrol")
NODE = "gpu07"


def missing_tools() -> list[str]:
    """The programs of Debian's ``munge`` and ``slurm-wlm`` that are not installed."""
    found = []
    for name in DAEMONS:
        if shutil.which(name) is None and not os.access(f"/usr/sbin/{name}", os.X_OK):
            found.append(name)
    return found


def _tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster(msgspec.Struct):
    directory: Path
    node: str
    processes: dict[str, subprocess.Popen[bytes]] = msgspec.field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """The environment for sinfo and scontrol of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log(self, name: str) -> str:
        path = self.directory / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else f"(no {path})"

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([_tool(argv[0]), *argv[1:]], env=self.env, capture_output=True,
                              text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)

    def state(self) -> str:
        """``sinfo -h -n NODE -o '%t %E'``, as the health check reads it (``drain admin: ...``,
        ``idle none``); empty while slurmctld does not answer."""
        done = self.run("sinfo", "-h", "-n", self.node, "-o", "%t %E")
        return done.stdout.strip() if done.returncode == 0 else ""

    def scontrol(self, *args: str) -> None:
        done = self.run("scontrol", *args)
        if done.returncode != 0:
            raise RuntimeError(f"scontrol {shlex.join(args)} exited {done.returncode}: "
                               f"{done.stderr.strip()}")

    def wait(self, predicate: str | None, *, what: str, deadline: float = 600.0,
             check: Callable[[str], bool] | None = None) -> str:
        """Poll until the node's state line is ``predicate`` (or ``check(line)`` holds). The
        deadline only catches a hang; nothing is judged by how long it took."""
        end = time.monotonic() + deadline
        line = ""
        while time.monotonic() < end:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited {process.returncode} while waiting for "
                                       f"{what}:\n{self.log(name)}")
            line = self.state()
            if (predicate is not None and line == predicate) or (
                    check is not None and check(line)):
                return line
            time.sleep(0.2)
        raise TimeoutError(f"no {what} within {deadline:.0f} s; the node is {line!r}\n"
                           f"slurmctld:\n{self.log('slurmctld')[-3000:]}\n"
                           f"slurmd:\n{self.log('slurmd')[-3000:]}")

    def stop(self) -> None:
        """Each daemon and what it started (its process group), slurmd first."""
        for name in ("slurmd", "slurmctld", "munged"):
            process = self.processes.get(name)
            if process is None or process.poll() is not None:
                continue
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def health_check_wrapper(path: Path, program: Path, settings: Mapping[str, str],
                         runs: Path) -> Path:
    """A ``HealthCheckProgram`` that sets ``settings`` in the environment and runs ``program``
    with /bin/sh, as a site's wrapper would; each run appends ``start PID`` and then
    ``end PID STATUS`` to ``runs``, so a test can wait for whole runs."""
    exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in settings.items())
    path.write_text("#!/bin/sh\n"
                    "# slurmd gives a HealthCheckProgram SLURMD_NODENAME and nothing else\n"
                    f"{exports}"
                    f'echo "start $$" >> {shlex.quote(str(runs))}\n'
                    f"/bin/sh {shlex.quote(str(program))} "
                    f"2>> {shlex.quote(str(runs.with_suffix('.log')))}\n"
                    "status=$?\n"
                    f'echo "end $$ $status" >> {shlex.quote(str(runs))}\n'
                    "exit $status\n")
    path.chmod(0o755)
    return path


def _start(name: str, argv: list[str], cluster: SlurmCluster) -> None:
    out = open(cluster.directory / "log" / f"{name}.out", "wb")  # noqa: SIM115 - theirs
    cluster.processes[name] = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        start_new_session=True, env={**os.environ, "SLURM_CONF": str(cluster.conf)})


def start_slurm(directory: Path, health_check: Path, *, interval: int = 5,
                node: str = NODE) -> SlurmCluster:
    """munged, slurmctld and slurmd on 127.0.0.1, one node ``node`` whose health check is
    ``health_check`` every ``interval`` seconds, on any node state; returns once the node is
    registered (``idle``, or drained by its first health checks)."""
    if os.geteuid() != 0:
        raise PermissionError("a Slurm cluster needs root: slurmd runs its health check as root")
    missing = missing_tools()
    if missing:
        raise FileNotFoundError(f"not installed: {', '.join(missing)}: "
                                "apt-get install slurm-wlm munge")
    directory = directory.resolve()
    for sub, mode in (("", 0o755), ("munge", 0o700), ("run", 0o755), ("log", 0o755),
                      ("state", 0o700), ("spool", 0o755)):
        (directory / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(directory / sub, mode)
    cluster = SlurmCluster(directory, node)
    key, munge_socket = directory / "munge/munge.key", directory / "run/munge.socket"
    subprocess.run([_tool("mungekey"), "--create", f"--keyfile={key}"], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    # --force: munged wants every folder above its socket open to all (o+x), and pytest's
    # temporary folders are not; only root uses this socket.
    _start("munged", [_tool("munged"), "--foreground", "--force", f"--socket={munge_socket}",
                      f"--key-file={key}", f"--pid-file={directory / 'run/munged.pid'}",
                      f"--seed-file={directory / 'munge/munged.seed'}",
                      f"--log-file={directory / 'log/munged.log'}"], cluster)
    _wait_for_path(munge_socket, cluster, "munged")
    host = socket.gethostname().split(".", 1)[0]  # slurmctld runs where SlurmctldHost says
    cluster.conf.write_text(f"""\
ClusterName=gpuhost-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={munge_socket}
CredType=cred/munge
MpiDefault=none
StateSaveLocation={directory / 'state'}
SlurmdSpoolDir={directory / 'spool'}
SlurmctldPidFile={directory / 'run/slurmctld.pid'}
SlurmdPidFile={directory / 'run/slurmd.pid'}
SlurmctldLogFile={directory / 'log/slurmctld.log'}
SlurmdLogFile={directory / 'log/slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/linear
SlurmdParameters=config_overrides
ReturnToService=2
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
HealthCheckProgram={health_check}
HealthCheckInterval={interval}
HealthCheckNodeState=ANY
SlurmctldDebug=info
SlurmdDebug=info
NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=1 RealMemory=1 State=UNKNOWN
PartitionName=gpu Nodes={node} Default=YES State=UP
""")
    try:
        _start("slurmctld", [_tool("slurmctld"), "-D", "-f", str(cluster.conf)], cluster)
        cluster.wait(None, what="slurmctld answering sinfo", check=bool)
        _start("slurmd", [_tool("slurmd"), "-D", "-f", str(cluster.conf), "-N", node], cluster)
        cluster.wait(None, what=f"slurmd registering {node}",
                     check=lambda line: bool(line) and not line.split()[0].endswith("*")
                     and not line.startswith(("unk", "down")))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_for_path(path: Path, cluster: SlurmCluster, name: str,
                   deadline: float = 600) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if path.exists():
            return
        process = cluster.processes[name]
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited {process.returncode}: {cluster.log(name)}")
        time.sleep(0.05)
    cluster.stop()
    raise TimeoutError(f"{name} made no {path} within {deadline:.0f} s: {cluster.log(name)}")
