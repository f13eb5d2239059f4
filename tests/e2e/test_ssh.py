"""Remote targets over a real OpenSSH server on 127.0.0.1.

The server is started by the tests on a free port with host and user keys, authorized_keys and
known_hosts made under tmp_path, and a client configuration given with --gpuhost-ssh-config:
neither this machine's sshd nor anyone's ~/.ssh is used. Targets are fake roots on this machine
reached over ssh, so a run over ssh can be compared with the same run made locally.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.checks.memory import THP, THP_MODES
from pytest_gpuhost.host import Read
from pytest_gpuhost.host.remote import AgentHost, agent_command, ssh_argv
from pytest_gpuhost.host.ssh import lxc_under
from pytest_gpuhost.host.upload import agent_source, digest_of
from pytest_gpuhost.linux.sysfs import bracketed
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container
from pytest_gpuhost.testing.sshd import SshServer, start_sshd

from ..conftest import (
    BLACKWELL8,
    EXAMPLE_HOST,
    NEEDS_OPENSSH,
    RELAY_HELLO,
    counts,
    snapshot,
    stand_in_ssh,
    workers_by_target,
)

pytestmark = NEEDS_OPENSSH



def ssh_args(server: SshServer, *roots: Path | str, names: tuple[str, ...] = ()) -> list[str]:
    """--gpuhost-target for each root (over the server) and the client configuration."""
    targets = [f"--gpuhost-target={server.url(root)}" + (f"?name={name}" if name else "")
               for root, name in zip(roots, names or ("",) * len(roots), strict=True)]
    return [*targets, f"--gpuhost-ssh-config={server.client_config}", "-p", "no:cacheprovider"]


def outcomes(report: Path) -> dict[str, str]:
    data = json.loads(report.read_text())
    return {check["id"]: check["outcome"] for check in data["checks"]}


def copy_example(tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(EXAMPLE_HOST, target, symlinks=True)
    return target


# -- the example host, over ssh and locally ---------------------------------------------------


def test_the_example_host_over_ssh_gives_the_local_outcomes_in_six_round_trips(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    local, remote = copy_example(tmp_path, "local"), copy_example(tmp_path, "remote")
    spec = f"--gpuhost-spec={BLACKWELL8}"
    here = pytester.runpytest(spec, f"--gpuhost-root={local}", "--gpuhost-report=local.json",
                              "-p", "no:cacheprovider")
    there = pytester.runpytest(spec, *ssh_args(sshd, remote), "--gpuhost-report=ssh.json")
    assert counts(here) == counts(there)
    assert outcomes(pytester.path / "local.json") == outcomes(pytester.path / "ssh.json")
    report = json.loads((pytester.path / "ssh.json").read_text())
    [target] = report["targets"]
    assert target["name"] == sshd.alias
    assert target["round_trips"] + 1 <= 6  # the connection included
    assert target["bytes_sent"] > 0 and target["bytes_received"] > 0
    assert target["connect_seconds"] > 0
    assert target["kernel"] == "6.5.0-44-generic"
    assert {check["target"] for check in report["checks"]} == {sshd.alias}
    there.stdout.fnmatch_lines([f"*::sysctl[[]vm.swappiness]@{sshd.alias}*"])


def test_an_ssh_target_runs_the_agents_joined_source(sshd: SshServer, tmp_path: Path) -> None:
    """What the target's python3 runs is the agent's modules joined here (its hello says the
    joined source's digest), on an ssh target and on a container entered through one."""
    host_tree = FakeHost(tmp_path / "node")
    host_tree.sysctl("vm.swappiness", 10)
    lxc_container(host_tree, "101").sysctl("net.core.somaxconn", 4096)
    expected = digest_of(agent_source().decode())
    for inner, path, value in (
            (agent_command(str(host_tree.root)), "proc/sys/vm/swappiness", b"10\n"),
            (lxc_under(str(host_tree.root), "101", agent_command("/")),
             "proc/sys/net/core/somaxconn", b"4096\n")):
        argv = ssh_argv(sshd.alias, port=None, user=None, config=sshd.client_config,
                        connect_timeout=10, inner=inner)
        host = AgentHost(sshd.url(host_tree.root), argv, str(host_tree.root))
        try:
            assert host.agent_digest() == expected
            assert host.batch([Read(path)])[0].data() == value
        finally:
            host.close()


def test_fix_over_ssh_then_rollback_over_ssh(pytester: pytest.Pytester, sshd: SshServer,
                                              tmp_path: Path) -> None:
    local, remote = copy_example(tmp_path, "local"), copy_example(tmp_path, "remote")
    original = snapshot(remote)
    spec = f"--gpuhost-spec={BLACKWELL8}"
    here = pytester.runpytest(spec, f"--gpuhost-root={local}", "--fix",
                              "--gpuhost-report=local.json", "-p", "no:cacheprovider")
    there = pytester.runpytest(spec, *ssh_args(sshd, remote), "--fix",
                               "--gpuhost-report=ssh.json")
    assert counts(here) == counts(there)
    assert outcomes(pytester.path / "local.json") == outcomes(pytester.path / "ssh.json")
    journals = sorted((remote / "var/lib/pytest-gpuhost/journal").glob("*.jsonl"))
    assert len(journals) == 1  # on the target, not on the controller
    assert not (pytester.path / "var").exists()
    report = json.loads((pytester.path / "ssh.json").read_text())
    assert report["journal"] is not None and "ssh://" in report["journal"]
    pytester.runpytest(spec, *ssh_args(sshd, remote), "--fix", "--gpuhost-report=again.json")
    again = json.loads((pytester.path / "again.json").read_text())
    [peermem] = [c for c in again["checks"] if c["outcome"] == "fix_failed"]
    assert peermem["key"] == "nvidia_peermem"  # read from the target's journal: not retried
    assert peermem["message"].startswith("failed at ") and f" in {report['journal']}:" in \
        peermem["message"] and peermem["message"].endswith("pass --fix-retry to try again")
    assert again["journal"] is None  # the second run changed nothing
    back = pytester.runpytest("--gpuhost-rollback", *ssh_args(sshd, remote))
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    back.stdout.fnmatch_lines(["*rollback: *.jsonl is closed*"])
    after = snapshot(remote)
    changed = {path for path in set(original) | set(after)
               if original.get(path, (None,))[0] != after.get(path, (None,))[0]}
    # what a fix changes is back; the journal and the lock file are the run's own record
    assert {p for p in changed if not p.startswith("var/lib/pytest-gpuhost/")} <= {
        "dev/kmsg",  # the kernel's own complaints about the failed nvidia_peermem load stay
        THP}  # THP's word is back: a kernel shows it bracketed, a fake tree as written
    assert bracketed(after[THP][0].decode(), THP_MODES) == \
        bracketed(original[THP][0].decode(), THP_MODES)


# -- targets that cannot be had ------------------------------------------------------------------


def test_an_unreachable_target_is_errors_naming_it_and_the_others_run(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, tmp_path: Path) -> None:
    fake.sysctl("vm.swappiness", 10)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(sshd, fake.root),
                                "--gpuhost-target=ssh://root@127.0.0.1:1/?name=down",
                                "--gpuhost-connect-timeout=3", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "r.json").read_text())
    by_target = {check["target"]: check for check in report["checks"]}
    assert by_target[sshd.alias]["outcome"] == "passed"
    down = by_target["down"]
    assert down["outcome"] == "error"
    assert "cannot reach ssh://root@127.0.0.1:1/" in down["message"]
    assert "Connection refused" in down["message"]  # ssh's own words
    [info] = [t for t in report["targets"] if t["name"] == "down"]
    assert "Connection refused" in info["unreachable"]


def test_an_unknown_host_key_is_never_accepted(pytester: pytest.Pytester, sshd: SshServer,
                                               fake: FakeHost, tmp_path: Path) -> None:
    fake.sysctl("vm.swappiness", 10)
    other = tmp_path / "other_known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)
    key = (tmp_path / "k.pub").read_text().split()
    other.write_text(f"[127.0.0.1]:{sshd.port} {key[0]} {key[1]}\n")  # a changed host key
    config = tmp_path / "ssh_config"
    config.write_text(sshd.client_config.read_text().replace(str(sshd.known_hosts), str(other)))
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(fake.root)}",
                                f"--gpuhost-ssh-config={config}", "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [check] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert check["outcome"] == "error"
    assert "Host key verification failed" in check["message"] or \
        "HOST IDENTIFICATION HAS CHANGED" in check["message"]
    assert other.read_text().count("\n") == 1  # nothing was added to known_hosts


def run_behind(pytester: pytest.Pytester, fake: FakeHost, directory: Path, before: str
               ) -> tuple[pytest.RunResult, dict[str, str]]:
    """One sysctl check over an sshd of its own whose sessions run ``before`` (shell) first,
    then the command asked for: the run and its one check's record."""
    fake.sysctl("vm.swappiness", 10)
    server = start_sshd(directory, extra_config=(
        f"ForceCommand /bin/sh -c '{before}; eval \"$SSH_ORIGINAL_COMMAND\"'\n"))
    try:
        spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
        result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(server, fake.root),
                                    "--gpuhost-report=r.json")
    finally:
        server.stop()
    [check] = json.loads((pytester.path / "r.json").read_text())["checks"]
    return result, check


def test_a_target_without_python3_says_so(pytester: pytest.Pytester, fake: FakeHost,
                                          tmp_path: Path) -> None:
    result, check = run_behind(pytester, fake, tmp_path / "sshd-no-python", "PATH=/nonexistent")
    assert check["outcome"] == "error"
    assert "python3 is not installed there" in check["message"]
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_login_that_prints_says_what_to_change(pytester: pytest.Pytester, fake: FakeHost,
                                                 tmp_path: Path) -> None:
    """A shell startup file that prints on a non-interactive login (an echo in ~/.bashrc)
    comes before the agent's hello: the message names it and what to do."""
    result, check = run_behind(pytester, fake, tmp_path / "sshd-banner", "echo Welcome to pve")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert check["outcome"] == "error"
    assert "not the agent's answer: b'Welcome to pve'" in check["message"]
    assert "prints on a non-interactive login" in check["message"]


KILLING_MODPROBE = textwrap.dedent("""\
    #!/bin/sh
    # A modprobe whose host goes away mid-fix: it kills the agent that ran it.
    kill -9 $PPID
    """)


def test_a_connection_lost_mid_fix_leaves_a_journal_rollback_can_use(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60).sysctl("vm.dirty_ratio", 20)
    fake.file("usr/sbin/modprobe", KILLING_MODPROBE, mode=0o755)
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
        modules:
          nvidia: loaded
        """))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(sshd, fake.root), "--fix",
                                "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    records = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert records["sysctl[vm.swappiness]"]["outcome"] == "fixed"
    lost = records["module[nvidia]"]
    assert lost["outcome"] in ("fix_failed", "error")
    assert "lost the connection" in lost["message"]
    # modprobe ran: whether it loaded the module is not known, and the message says so
    assert lost["message"].startswith("the state is unknown: "), lost["message"]
    assert "--gpuhost-rollback" in lost["message"]
    [journal] = (fake.root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl")
    assert '"event": "change"' in journal.read_text()
    back = pytester.runpytest("--gpuhost-rollback", *ssh_args(sshd, fake.root))
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n", back.stdout.str()


GARBLING = RELAY_HELLO + """\
# then answer the first batch with something that is not the agent's (a corrupted stream)
header = sys.stdin.buffer.readline()
sys.stdin.buffer.read(int(header))
sys.stdout.buffer.write(b"7\\nGARBAGE")
sys.stdout.buffer.flush()
time.sleep(60)
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_target_that_answers_garbage_is_errors_and_the_others_run(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, xdist: list[str]) -> None:
    stand_in_ssh(tmp_path / "bin", monkeypatch, "garbled", GARBLING)
    good = FakeHost(tmp_path / "good").sysctl("vm.swappiness", 10)
    garbled = FakeHost(tmp_path / "garbled").sysctl("vm.swappiness", 10)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", *ssh_args(sshd, good.root, garbled.root,
                                            names=("good", "garbled")),
        "--gpuhost-report=r.json", *xdist, timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    by_target = {check["target"]: check for check in report["checks"]}
    assert by_target["good"]["outcome"] == "passed"
    assert by_target["garbled"]["outcome"] == "error"
    assert "not the agent's answer: b'GARBAGE'" in by_target["garbled"]["message"]
    [info] = [t for t in report["targets"] if t["name"] == "garbled"]
    assert "not the agent's answer" in info["unreachable"]


DROPPING = """\
# relay the agent's messages; the connection drops when the run asks for a lock there (the
# moment a --fix starts)
first = True
while True:
    header = sys.stdin.buffer.readline()
    if not header:
        break
    message = sys.stdin.buffer.read(sum(map(int, header.split()[:2])))  # the agent first
    if not first and b'"op":"lock"' in message:
        child.kill()
        sys.stderr.write("Connection to drops closed by remote host.\\n")
        sys.stderr.flush()
        os._exit(255)
    first = False
    child.stdin.write(header + message)
    child.stdin.flush()
    size = child.stdout.readline()
    sys.stdout.buffer.write(size + child.stdout.read(int(size)))
    sys.stdout.buffer.flush()
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_connection_lost_at_the_run_lock_loses_that_target_only(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, xdist: list[str]) -> None:
    stand_in_ssh(tmp_path / "bin", monkeypatch, "drops", DROPPING)
    fine = FakeHost(tmp_path / "fine").sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 5})
    drops = FakeHost(tmp_path / "drops").sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 5})
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
          vm.dirty_ratio: 5
        """))
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", *ssh_args(sshd, drops.root, fine.root,
                                            names=("drops", "fine")),
        "--fix", "--gpuhost-report=r.json", *xdist, timeout=120)
    # one target's connection is that target's error, not the whole run stopped (exit 2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    outcomes = {(c["target"], c["id"]): c["outcome"] for c in report["checks"]}
    assert outcomes == {("fine", "sysctl[vm.swappiness]"): "fixed",
                        ("fine", "sysctl[vm.dirty_ratio]"): "passed",
                        ("drops", "sysctl[vm.swappiness]"): "error",
                        ("drops", "sysctl[vm.dirty_ratio]"): "passed"}  # ran first
    [lost] = [c for c in report["checks"] if c["outcome"] == "error"]
    assert "lost the connection to ssh://" in lost["message"]
    assert "closed by remote host" in lost["message"]
    [info] = [t for t in report["targets"] if t["name"] == "drops"]
    assert "lost the connection" in info["unreachable"]  # lost at its last check: said so
    assert (fine.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (drops.root / "proc/sys/vm/swappiness").read_text() == "60\n"


# -- several targets -----------------------------------------------------------------------------


def test_targets_are_in_ids_and_k_selects_one(pytester: pytest.Pytester, sshd: SshServer,
                                              tmp_path: Path) -> None:
    roots = []
    for name in ("a", "b"):
        host = FakeHost(tmp_path / name).sysctl("vm.swappiness", 10)
        roots.append(host.root)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(sshd, *roots,
                                                                     names=("n1", "n2")),
                                "-k", "n2", "-v")
    result.stdout.fnmatch_lines(["*::sysctl[[]vm.swappiness]@n2 PASSED*"])
    assert "@n1 PASSED" not in result.stdout.str()
    result.assert_outcomes(passed=1, deselected=1)


def test_local_and_ssh_targets_side_by_side(pytester: pytest.Pytester, sshd: SshServer,
                                            tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host").sysctl("vm.swappiness", 10).sysctl("vm.dirty_ratio", 5)
    container = FakeHost(tmp_path / "container").sysctl("vm.swappiness", 60)
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
        """))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(sshd, host.root,
                                                                     names=("pve",)),
                                "--gpuhost-target=local", f"--gpuhost-root={container.root}")
    result.stdout.fnmatch_lines(["kind * pve * local*", "sysctl * 1 passed * 1 failed*"])
    result.assert_outcomes(passed=1, failed=1)


# -- containers ----------------------------------------------------------------------------------

FAKE_LXC_ATTACH = textwrap.dedent("""\
    #!/bin/sh
    # lxc-attach -n CTID -- CMD...: "enters" the container by running CMD here, and records
    # which container was asked for.
    [ "$1" = "-n" ] || { echo "lxc-attach: expected -n" >&2; exit 2; }
    echo "$2" >> "$(dirname "$0")/attached"
    shift 2
    [ "$1" = "--" ] && shift
    exec "$@"
    """)


def fake_lxc_attach(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "lxc-attach"
    tool.write_text(FAKE_LXC_ATTACH)
    tool.chmod(0o755)
    return directory


CONTAINER_SPEC = ("version: 1\nsysctl:\n  vm.swappiness: 10\n"
                  "  net.ipv4.tcp_rmem: \"4096 87380 268435456\"\n")


def test_an_lxc_container_of_this_machine(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """lxc://101 of the host tree at --gpuhost-root: entered with the host's lxc-attach (under
    that root); its kernel sysctl is read on the host (@local), its namespace one inside."""
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 10,
                                               "net.ipv4.tcp_rmem": "4096 131072 6291456"})
    lxc_container(host, "101")
    spec = pytester.makefile(".yaml", spec=CONTAINER_SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "-v", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines_random(["*::sysctl[[]vm.swappiness]@local PASSED*",
                                        "*::sysctl[[]net.ipv4.tcp_rmem]@lxc-101 FAILED*"])


def test_an_lxc_container_of_an_ssh_host(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """ssh://HOST/ROOT?lxc=101: ROOT is the host's tree, the container is entered with the
    lxc-attach under it, over the same ssh login; the kernel check is reported under the host."""
    server = start_sshd(tmp_path / "sshd-pve")
    try:
        host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60,
                                                   "net.ipv4.tcp_rmem": "4096 87380 268435456"})
        lxc_container(host, "101")
        spec = pytester.makefile(".yaml", spec=CONTAINER_SPEC)
        url = server.url(host.root, query="?lxc=101")
        result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target={url}",
                                    f"--gpuhost-ssh-config={server.client_config}", "-v",
                                    "-p", "no:cacheprovider")
    finally:
        server.stop()
    result.stdout.fnmatch_lines_random([
        f"*::sysctl[[]vm.swappiness]@{server.alias} FAILED*",
        f"*::sysctl[[]net.ipv4.tcp_rmem]@{server.alias}-lxc-101 PASSED*"])


def test_inside_a_container_a_read_only_sysctl_says_fix_it_on_the_host(fake: FakeHost) -> None:
    """EROFS is the kernel's answer to a write of a global sysctl inside a container."""
    import errno

    from pytest_gpuhost.checks.changes import WriteText
    from pytest_gpuhost.fix.fixer import explain
    from pytest_gpuhost.host import HostError, LocalHost

    change = WriteText("proc/sys/vm/swappiness", "60\n", "10\n")
    refused = HostError("cannot write proc/sys/vm/swappiness: Read-only file system",
                        errno.EROFS)
    assert "read-only in this container" not in explain(LocalHost(fake.root), change, refused)
    fake.file(".dockerenv", "")
    assert explain(LocalHost(fake.root), change, refused).startswith(
        "read-only in this container: fix it on the host (--gpuhost-target=ssh://HOST)")


def test_inside_a_container_64_bytes_of_config_space_say_check_the_host(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0").file("run/.containerenv", "")
    config = fake.root / "sys/bus/pci/devices/0000:01:00.0/config"
    config.write_bytes(config.read_bytes()[:64])
    spec = pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={fake.root}",
                                "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*config space is 64 bytes: not readable from this container: "
                                 "check the host*"])


def test_under_xdist_each_targets_checks_run_on_one_worker(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots, names = [], []
    for number in range(4):
        host = FakeHost(tmp_path / f"t{number}").sysctls({"vm.swappiness": 10,
                                                          "vm.dirty_ratio": 5})
        host.kmsg([(6, "hello")])
        roots.append(host.root)
        names.append(f"n{number}")
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
          vm.dirty_ratio: 5
        dmesg: {}
        """))
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", *ssh_args(sshd, *roots, names=tuple(names)), "-n", "2", "-v",
        "--gpuhost-report=r.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    workers = workers_by_target(result)
    assert sorted(workers) == names
    assert all(len(seen) == 1 for seen in workers.values()), workers
    report = json.loads((pytester.path / "r.json").read_text())
    assert len(report["checks"]) == 12
    for target in report["targets"]:
        # read by each worker's collection, then by the worker that ran its checks
        assert target["connections"] <= 3 and target["round_trips"] <= 8, target


def test_under_xdist_each_target_has_its_own_p2p_measurement(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """Identical servers have the same GPU addresses: one target's numbers (or its failure to
    measure) must never be reported as another's."""
    from ..checks.test_p2p import ROWS, four_gpus, record, spec

    slow_rows = [[None if value is None else value / 2 for value in row] for row in ROWS]
    fast = four_gpus(FakeHost(tmp_path / "fast"))
    record(fast, ROWS)
    slow = four_gpus(FakeHost(tmp_path / "slow"))
    record(slow, slow_rows)
    pytester.makefile(".yaml", spec=spec())
    for xdist in ([], ["-n", "2"]):
        pytester.runpytest_subprocess("--gpuhost-spec=spec.yaml",
                                      *ssh_args(sshd, fast.root, slow.root,
                                                names=("fast", "slow")),
                                      "--gpuhost-report=r.json", *xdist, timeout=120)
        checks = json.loads((pytester.path / "r.json").read_text())["checks"]
        observed = {(c["target"], c["id"]): c["observed"] for c in checks}
        pair = "p2p[0000:01:00.0->0000:21:00.0]"
        assert observed["fast", pair] == "52.00", (xdist, observed)
        assert observed["slow", pair] == "26.00", (xdist, observed)


def test_a_host_without_lxc_attach_says_so_not_python3(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost) -> None:
    """The remote shell's 127 is about lxc-attach here (not a Proxmox or LXC host)."""
    assert shutil.which("lxc-attach") is None or pytest.skip("lxc-attach is installed here")
    fake.sysctl("vm.swappiness", 10)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}",
                                f"--gpuhost-target={sshd.url(fake.root, query='?lxc=101')}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [check] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert check["outcome"] == "error"
    assert "lxc-attach" in check["message"] and "not found" in check["message"]
    assert "python3 is not installed" not in check["message"]


def test_gpu_events_over_ssh_are_judged_as_locally(pytester: pytest.Pytester, sshd: SshServer,
                                                   tmp_path: Path) -> None:
    """The target's kernel log and boot time, read by its agent: an application's Xid warns, a
    hardware one fails naming its action, and Prometheus counts them under the target."""
    host = FakeHost(tmp_path / "gpu")
    host.file("proc/stat", "cpu  1 2 3\nbtime 1796083200\n")
    host.kmsg([(3, "NVRM: Xid (PCI:0000:41:00): 79, GPU has fallen off the bus."),
               (4, "NVRM: Xid (PCI:0000:81:00): 13, pid=9, name=python3, Graphics Exception")])
    spec = pytester.makefile(".yaml", spec="version: 1\ndmesg: {since: '2026-12-01T00:00:00Z'}\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *ssh_args(sshd, host.root,
                                                                     names=("gpu",)),
                                "--gpuhost-report=r.json", "--gpuhost-prom=m.prom")
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert (record["id"], record["outcome"]) == ("dmesg", "failed")
    assert record["target"] == "gpu"
    assert "0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it " \
        "repeats" in record["message"]
    assert [e["verdict"] for e in record["details"]["xid"]] == ["fail", "warn"]
    prom = (pytester.path / "m.prom").read_text()
    assert ('gpuhost_xid_total{target="gpu",gpu="0000:81:00.0",code="13",class="application",'
            'action="restart_app",event="Xid"} 1') in prom
    assert result.ret == pytest.ExitCode.TESTS_FAILED
