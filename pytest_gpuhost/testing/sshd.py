"""A real OpenSSH server on 127.0.0.1 for tests and benchmarks, made entirely under a directory.

Host key, user key, ``authorized_keys``, ``known_hosts`` and an ssh client configuration all live
in the directory, so neither this machine's own sshd nor anyone's ``~/.ssh`` is used or changed.
The server listens on a free port of 127.0.0.1 only and is stopped (and reaped) by ``stop``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import msgspec

SSHD_PATHS = ("/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd")
PRIVSEP_DIR = "/run/sshd"


def find_sshd() -> str | None:
    for candidate in SSHD_PATHS:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("sshd")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _keygen(path: Path, kind: str = "ed25519") -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "pytest-gpuhost-test",
                    "-f", str(path)], check=True, stdin=subprocess.DEVNULL)


class SshServer(msgspec.Struct):
    directory: Path
    port: int
    process: subprocess.Popen[bytes]
    user: str
    alias: str = "gpuhost-test"

    @property
    def client_config(self) -> Path:
        return self.directory / "ssh_config"

    @property
    def known_hosts(self) -> Path:
        return self.directory / "known_hosts"

    @property
    def log(self) -> Path:
        return self.directory / "sshd.log"

    def url(self, root: Path | str | None = None, *, host: str | None = None,
            query: str = "") -> str:
        """``ssh://USER@ALIAS[/ROOT]``: the alias carries port, key and known_hosts."""
        path = f"/{str(root).lstrip('/')}" if root is not None else ""
        return f"ssh://{self.user}@{host or self.alias}{path}{query}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_sshd(directory: Path, *, extra_config: str = "", log_level: str = "ERROR"
               ) -> SshServer:
    """An sshd for the current user, authenticated by a key made here, on a free port.
    ``log_level``: what ``log`` gets (``VERBOSE``: each login's ``Accepted publickey`` and
    each session's ``Starting session``, which tests and benchmarks count)."""
    sshd = find_sshd()
    if sshd is None:
        raise FileNotFoundError("sshd not found: install Debian's openssh-server")
    if os.geteuid() == 0 and not os.path.isdir(PRIVSEP_DIR):
        # sshd started by root insists on its (empty) privilege separation directory, which
        # Debian's package makes at boot; a container without an init never made it.
        os.makedirs(PRIVSEP_DIR, mode=0o755, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    _keygen(directory / "host_key")
    _keygen(directory / "user_key")
    (directory / "authorized_keys").write_text((directory / "user_key.pub").read_text())
    os.chmod(directory / "authorized_keys", 0o600)
    user = os.environ.get("USER") or __import__("pwd").getpwuid(os.getuid()).pw_name
    port = free_port()
    (directory / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {directory / 'host_key'}\n"
        f"AuthorizedKeysFile {directory / 'authorized_keys'}\n"
        f"PidFile {directory / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nMaxStartups 200:30:400\n"
        f"MaxSessions 200\nLogLevel {log_level}\n" + extra_config)
    host_key = (directory / "host_key.pub").read_text().split()
    (directory / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    server = SshServer(directory, port, subprocess.Popen(
        [sshd, "-D", "-e", "-f", str(directory / "sshd_config")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=open(directory / "sshd.log", "wb")),  # noqa: SIM115 - the server owns it
        user)
    server.client_config.write_text(
        f"Host {server.alias}\n  HostName 127.0.0.1\n  Port {port}\n"
        f"  User {user}\n  IdentityFile {directory / 'user_key'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {directory / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  LogLevel ERROR\n")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"sshd exited: {server.log.read_text(errors='replace')}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"sshd did not listen on 127.0.0.1:{port}")
