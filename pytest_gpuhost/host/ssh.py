"""The command lines that reach a target: OpenSSH (with a master connection shared by the
processes of one run) and ``lxc-attach``. Pure but for ``masters_directory`` and ``end_masters``,
which make and end the run's control sockets, and ``keyscan_address`` (one ``ssh -G``)."""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

MASTER_PERSIST_S = 60
"""How long a shared master connection waits idle for the next session before it ends."""
MAX_SOCKET_PATH = 80
"""A control socket's path, with the 17 characters ssh adds while making it, stays within the
108 bytes of a Unix socket's name."""


def ssh_argv(destination: str, *, port: int | None, user: str | None, config: Path | None,
             connect_timeout: float, inner: Sequence[str], identity_file: str | None = None,
             extra: Sequence[str] = (), master: Path | None = None,
             strict_host_keys: bool = False) -> list[str]:
    """ssh running ``inner`` on ``destination`` (the remote side gets one shell-quoted line).
    ``extra`` (a host's own ssh arguments, an inventory's ``ansible_ssh_common_args``) comes
    before the run's options: ssh keeps the first value it is given of an option, so a host's
    ``-o ConnectTimeout=5`` wins over --gpuhost-connect-timeout, as the configuration file's
    values give way to both. Only ``BatchMode=yes`` comes before it: no host may make the run
    wait on a prompt (a password, a passphrase, an unknown host key), and, with
    ``strict_host_keys`` (a --fix or a rollback, unless --gpuhost-accept-new-host-keys),
    ``StrictHostKeyChecking=yes``: a host key known_hosts does not hold is refused whatever
    the configuration or the host's own arguments say (``accept-new``, ``no``), so root never
    writes to a machine whose key nobody checked. ``master``: a control socket for this
    target alone, shared by the processes of one run (OpenSSH's ControlMaster): the first
    makes the connection, the others open sessions over it without a new key exchange and
    login."""
    argv = ["ssh"]
    if config is not None:
        argv += ["-F", str(config)]
    argv += ["-o", "BatchMode=yes"]
    if strict_host_keys:
        argv += ["-o", "StrictHostKeyChecking=yes"]
    argv += [*extra]
    if identity_file is not None:
        argv += ["-i", identity_file]
    argv += ["-o", f"ConnectTimeout={max(1, round(connect_timeout))}",
             "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-T", "-e", "none"]
    if master is not None:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={master}",
                 "-o", f"ControlPersist={MASTER_PERSIST_S}"]
    if port is not None:
        argv += ["-p", str(port)]
    if user is not None:
        argv += ["-l", user]
    return [*argv, "--", destination, shlex.join(inner)]


def keyscan_address(destination: str, *, port: int | None, config: Path | None,
                    extra: Sequence[str] = (), timeout: float = 10.0) -> tuple[str, int]:
    """The host name and port ssh connects to for ``destination`` (an alias of the ssh
    configuration resolved to its ``HostName`` and ``Port``, as ``ssh -G`` prints them), which
    ssh-keyscan, knowing no configuration, needs; the destination as given (port 22) where
    ssh cannot say. Runs one ``ssh -G``, which connects nowhere."""
    argv = ["ssh", "-G", *(["-F", str(config)] if config is not None else []), *extra,
            *(["-p", str(port)] if port is not None else []), "--", destination]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return destination, port or 22
    values = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    name = values.get("hostname", "").strip() or destination
    given = values.get("port", "").strip()
    return name, int(given) if done.returncode == 0 and given.isdigit() else port or 22


def masters_directory(parent: Path) -> Path | None:
    """A directory for the control sockets of a run's ssh targets, or None where its path is
    too long for them (then every process makes its own connections)."""
    directory = parent / "ssh"
    if len(str(directory)) + 6 > MAX_SOCKET_PATH:
        return None
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory


def end_masters(directory: Path, timeout: float = 5.0) -> None:
    """Ask every master connection with a socket in ``directory`` to exit (``ssh -O exit``),
    all at once; one that does not answer within ``timeout`` ends by itself when idle."""
    asked = []
    for socket_path in sorted(directory.iterdir()) if directory.is_dir() else []:
        if socket_path.is_socket():
            with contextlib.suppress(OSError):
                asked.append(subprocess.Popen(
                    ["ssh", "-F", "/dev/null", "-o", f"ControlPath={socket_path}", "-O", "exit",
                     "gpuhost-master"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL))
    deadline = time.monotonic() + timeout
    for process in asked:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def lxc_argv(container: str, inner: Sequence[str], attach: str = "lxc-attach") -> list[str]:
    """``lxc-attach -n CTID -- ...``: what Proxmox's ``pct exec`` runs (``attach``: the host's
    lxc-attach, found under its root; by name, on PATH, at ``/``)."""
    return [attach, "-n", container, "--", *inner]


FIND_ATTACH = (
    "import os, sys\n"
    "root = sys.argv[1]\n"
    "dirs = ('usr/sbin', 'usr/bin', 'sbin', 'bin')\n"
    "for d in dirs:\n"
    "    p = os.path.join(root, d, 'lxc-attach')\n"
    "    if os.path.isfile(p) and not os.path.islink(p) and os.access(p, os.X_OK):\n"
    "        os.execv(p, [p] + sys.argv[2:])\n"
    "sys.exit('lxc-attach not found in ' + ', '.join(os.path.join(root, d) for d in dirs) + "
    "' (a container is entered with the lxc-attach of its host, under the host root)')\n"
)
"""Run on a container's host whose root is not ``/`` (a host tree, as tests and the example
host have): its lxc-attach, a regular file under the root's sbin/bin directories as every
command is found there, entering the container; the rest of the command line follows."""


def lxc_under(root: str, container: str, inner: Sequence[str],
              python: str | None = None) -> list[str]:
    """``lxc_argv`` with the lxc-attach of a host at ``root``: on PATH at ``/``, else the one
    under ``root`` (``FIND_ATTACH``, started with the host's python)."""
    if root == "/":
        return lxc_argv(container, inner)
    return [python or "python3", "-c", FIND_ATTACH, root, "-n", container, "--", *inner]
