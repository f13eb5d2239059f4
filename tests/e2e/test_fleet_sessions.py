"""Fleets under xdist: one login and one agent session a target, counted from the
server's side, and a target slow to collect that holds up no other target's checks.

The server is a real OpenSSH server on 127.0.0.1 (keys under tmp_path) logging at VERBOSE:
each login is an ``Accepted publickey`` line, each agent start (``ssh HOST python3 ...``, one
exec session) a ``Starting session: command`` line. What is counted is what sshd saw, not what
the run says of itself. No test here measures time: the order of events decides.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer, start_sshd

from ..conftest import NEEDS_OPENSSH, workers_by_target
from .relay import RELAY_FORWARDING

pytestmark = NEEDS_OPENSSH

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n  vm.dirty_ratio: 5\ndmesg: {}\n"
CHECKS = {"sysctl[vm.swappiness]": "passed", "sysctl[vm.dirty_ratio]": "passed",
          "dmesg": "passed"}


@pytest.fixture(scope="module")
def verbose_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """The test sshd, logging each login and each session it starts."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"), log_level="VERBOSE")
    yield server
    server.stop()


@pytest.fixture(scope="module", autouse=True)
def _ansible_home(ansible_home: None) -> None:
    """Ansible keeps its files in the tests' own directories."""


def inventory(server: SshServer, tmp_path: Path, names: list[str],
              extra: dict[str, str] | None = None) -> str:
    """An INI inventory: every host at the test sshd, each with its own passing root."""
    lines = ["[gpu]"]
    for name in names:
        root = FakeHost(tmp_path / "roots" / name).sysctls({"vm.swappiness": 10,
                                                            "vm.dirty_ratio": 5})
        root.kmsg([(6, "hello")])
        lines.append(f"{name} gpuhost_root={root.root} {(extra or {}).get(name, '')}".rstrip())
    lines += ["", "[gpu:vars]", "ansible_host=127.0.0.1", f"ansible_port={server.port}",
              f"ansible_user={server.user}",
              f"ansible_ssh_private_key_file={server.directory / 'user_key'}"]
    return "\n".join(lines) + "\n"


def client_config(server: SshServer, directory: Path) -> Path:
    path = directory / "ssh_config"
    path.write_text(f"Host *\n  IdentitiesOnly yes\n  IdentityAgent none\n"
                    f"  UserKnownHostsFile {server.known_hosts}\n"
                    "  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n"
                    "  LogLevel ERROR\n")
    return path


def server_counts(server: SshServer, since: int) -> tuple[int, int]:
    """(logins, sessions started) in the server's log after byte ``since``."""
    text = server.log.read_bytes()[since:].decode(errors="replace")
    return text.count("Accepted publickey"), text.count("Starting session: command")


def outcomes(report: Path) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for check in json.loads(report.read_text())["checks"]:
        found.setdefault(check["target"], {})[check["id"]] = check["outcome"]
    return found


@pytest.mark.parametrize("workers", ["2", "4"])
def test_one_login_and_one_agent_session_a_target_under_xdist(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path,
        workers: str) -> None:
    """The worker that runs a target's checks collected it over the same agent session: the
    controller connects to none, and no target is read twice."""
    names = [f"node{number:02d}" for number in range(5)]
    pytester.makefile(".ini", hosts=inventory(verbose_sshd, tmp_path, names))
    spec = pytester.makefile(".yaml", spec=SPEC)
    since = verbose_sshd.log.stat().st_size
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", workers, "-v",
        f"--gpuhost-ssh-config={client_config(verbose_sshd, tmp_path)}",
        "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=3 * len(names))
    assert outcomes(pytester.path / "r.json") == dict.fromkeys(names, CHECKS)
    workers_seen = workers_by_target(result)
    assert all(len(seen) == 1 for seen in workers_seen.values()), workers_seen
    assert server_counts(verbose_sshd, since) == (len(names), len(names))
    targets = json.loads((pytester.path / "r.json").read_text())["targets"]
    assert {t["name"]: t["connections"] for t in targets} == dict.fromkeys(names, 1)


def test_under_a_distribution_that_collects_every_target_a_worker_reads_only_its_own(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path) -> None:
    """``--dist loadfile``: the controller collects every target once and each worker starts
    from that collection (``session.collecting.seed``), learning which targets it runs only as their
    checks come. A worker must not read what a target's checks observe at collection then
    (``session/observing.py``): every worker would open a session to every target. One login
    a target (the controller's, its master shared), and an agent session for the controller's
    collection and one for the worker that runs it."""
    names = ["node01", "node02", "node03"]
    pytester.makefile(".ini", hosts=inventory(verbose_sshd, tmp_path, names))
    spec = pytester.makefile(".yaml", spec=SPEC)
    since = verbose_sshd.log.stat().st_size
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", "2",
        "--dist", "loadfile", f"--gpuhost-ssh-config={client_config(verbose_sshd, tmp_path)}",
        "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert outcomes(pytester.path / "r.json") == dict.fromkeys(names, CHECKS)
    assert server_counts(verbose_sshd, since) == (len(names), 2 * len(names))


def test_without_xdist_one_login_and_one_agent_session_a_target(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path) -> None:
    names = ["node01", "node02", "node03"]
    pytester.makefile(".ini", hosts=inventory(verbose_sshd, tmp_path, names))
    spec = pytester.makefile(".yaml", spec=SPEC)
    since = verbose_sshd.log.stat().st_size
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
        f"--gpuhost-ssh-config={client_config(verbose_sshd, tmp_path)}",
        "--gpuhost-connect-concurrency=2", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=3 * len(names))
    assert server_counts(verbose_sshd, since) == (len(names), len(names))


WAITING_RELAY = """\
#!{python}
# A ProxyCommand that relays to the test sshd only once a file appears (or gives up, saying so,
# after a bound that only a run stuck behind this target reaches).
import os, selectors, socket, sys, time
release, log, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 300
while not os.path.exists(release):
    if time.monotonic() > deadline:
        with open(log, "a") as out:
            out.write("gave up\\n")
        sys.exit(1)
    time.sleep(0.05)
with open(log, "a") as out:
    out.write("released\\n")
""" + RELAY_FORWARDING

RELEASE_AFTER_FAST = """\
from pathlib import Path


def pytest_runtest_logreport(report):
    # the slow target's connection goes through only after a check of the fast one has run
    if report.when == "call" and report.passed and report.nodeid.endswith("@fast"):
        Path({release!r}).touch()
"""


def test_a_target_slow_to_collect_holds_up_no_other_targets_checks(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path) -> None:
    """``slow``'s connection is let through only once one of ``fast``'s checks has run: a run
    that collected every target before running any check would wait on ``slow`` until its
    relay gave up (and ``slow`` would be unreachable); here both finish, ``slow`` after."""
    release, log = tmp_path / "release", tmp_path / "relay.log"
    relay = tmp_path / "relay"
    relay.write_text(WAITING_RELAY.format(python=sys.executable))
    relay.chmod(0o755)
    extra = {"slow": f"ansible_ssh_common_args='-o \"ProxyCommand={relay} {release} {log} "
                     f"{verbose_sshd.port}\"'"}
    pytester.makefile(".ini", hosts=inventory(verbose_sshd, tmp_path, ["slow", "fast"], extra))
    pytester.makeconftest(RELEASE_AFTER_FAST.format(release=str(release)))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", "2", "-v",
        f"--gpuhost-ssh-config={client_config(verbose_sshd, tmp_path)}",
        "--gpuhost-report=r.json", "--gpuhost-target-timeout=600",
        "--gpuhost-connect-timeout=600", "-p", "no:cacheprovider")
    assert log.read_text() == "released\n", result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert outcomes(pytester.path / "r.json") == {"slow": CHECKS, "fast": CHECKS}
    order = [line.rsplit("@", 1)[1].split()[0] for line in result.stdout.lines
             if line.startswith("[gw") and "PASSED" in line and "@" in line]
    assert order.index("fast") < order.index("slow"), order


def test_a_fleet_larger_than_the_soft_limit_on_open_files_still_runs(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path) -> None:
    """Each held agent session costs the process three file descriptors (the ssh client's
    pipes): under a soft limit of 80 open files, 30 targets need more, and the run raises its
    soft limit toward the hard one instead of failing to start ssh."""
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 512:
        pytest.skip(f"the hard limit on open files here is {hard}")
    names = [f"node{number:02d}" for number in range(30)]
    pytester.makefile(".ini", hosts=inventory(verbose_sshd, tmp_path, names))
    spec = pytester.makefile(".yaml", spec=SPEC)
    config = client_config(verbose_sshd, tmp_path)
    result = pytester.run(
        "bash", "-c", f"ulimit -Sn 80 && exec {sys.executable} -m pytest --gpuhost-spec={spec} "
        f"--gpuhost-inventory=hosts.ini --gpuhost-ssh-config={config} "
        "--gpuhost-report=r.json -p no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert outcomes(pytester.path / "r.json") == dict.fromkeys(names, CHECKS)


@pytest.mark.parametrize("fix", [False, True], ids=["verify", "fix"])
def test_a_container_of_an_ssh_host_and_its_host_share_one_login(
        pytester: pytest.Pytester, verbose_sshd: SshServer, tmp_path: Path, fix: bool) -> None:
    """``ssh://HOST/ROOT?lxc=101``: the host's kernel checks and the container's own run over
    one ssh login (a master connection both agent sessions ride on), as README and
    docs/remote.md say; counted from the server's log, not from what the run says of itself."""
    from pytest_gpuhost.testing.lxc import lxc_container

    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60,
                                               "net.ipv4.tcp_rmem": "4096 87380 268435456"})
    lxc_container(host, "101")
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                           "  net.ipv4.tcp_rmem: \"4096 87380 268435456\"\n")
    url = verbose_sshd.url(host.root, query="?lxc=101")
    since = verbose_sshd.log.stat().st_size
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", f"--gpuhost-target={url}",
        f"--gpuhost-ssh-config={verbose_sshd.client_config}", "-v", "-p", "no:cacheprovider",
        *(["--fix"] if fix else []))
    outcome = "FIXED" if fix else "FAILED"
    result.stdout.fnmatch_lines_random([
        f"*::sysctl[[]vm.swappiness]@{verbose_sshd.alias} {outcome}*",
        f"*::sysctl[[]net.ipv4.tcp_rmem]@{verbose_sshd.alias}-lxc-101 PASSED*"])
    logins, sessions = server_counts(verbose_sshd, since)
    assert logins == 1, verbose_sshd.log.read_bytes()[since:].decode(errors="replace")
    assert sessions == 2  # an agent on the host, one entering the container
