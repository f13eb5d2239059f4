"""A --fix or a rollback changes the target as root, so it reaches only a target
whose host key known_hosts already holds, even where the ssh configuration or an inventory's
ansible_ssh_common_args say ``StrictHostKeyChecking accept-new`` or ``no``; a run that only
verifies obeys them, and ``--gpuhost-accept-new-host-keys`` (ini twin
``gpuhost_accept_new_host_keys``) lets a fix obey them too. Against a real OpenSSH server on
127.0.0.1 (keys and known_hosts under tmp_path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.host.remote import ssh_argv
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH

pytestmark = NEEDS_OPENSSH

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"


def trusting_config(server: SshServer, known_hosts: Path, policy: str = "accept-new") -> Path:
    """The server's client configuration, with an empty known_hosts of its own and ``policy``
    for keys known_hosts lacks."""
    known_hosts.write_text("")
    path = known_hosts.with_suffix(".config")
    path.write_text(server.client_config.read_text()
                    .replace(str(server.known_hosts), str(known_hosts))
                    .replace("StrictHostKeyChecking yes", f"StrictHostKeyChecking {policy}"))
    return path


def checks(pytester: pytest.Pytester) -> list[dict[str, str]]:
    data = json.loads((pytester.path / "r.json").read_text())
    found: list[dict[str, str]] = data["checks"]
    return found


@pytest.mark.parametrize("policy", ["accept-new", "no"])
def test_fix_refuses_an_unknown_host_key_the_configuration_would_accept(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, tmp_path: Path,
        policy: str) -> None:
    fake.sysctl("vm.swappiness", 60)
    known = tmp_path / "known_hosts"
    config = trusting_config(sshd, known, policy)
    spec = pytester.makefile(".yaml", spec=SPEC)
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(fake.root)}",
            f"--gpuhost-ssh-config={config}", "--gpuhost-report=r.json", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args, "--fix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [check] = checks(pytester)
    assert check["outcome"] == "error"
    assert "Host key verification failed" in check["message"]
    assert "--fix changes the target as root, so it takes only a host key known_hosts already " \
           "holds" in check["message"]
    # ssh-keyscan cannot resolve the alias: the HostName and Port ssh -G gives it
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 | ssh-keygen -lf -" in check["message"]
    assert f"ssh-keyscan {sshd.alias}" not in check["message"]
    assert "--gpuhost-accept-new-host-keys" in check["message"]
    assert known.read_text() == ""  # nothing learned
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"  # nothing changed

    verify = pytester.runpytest(*args)  # only reading: the configuration's policy applies
    assert verify.ret == pytest.ExitCode.TESTS_FAILED
    [check] = checks(pytester)
    assert check["outcome"] == "failed", check["message"]

    fixed = pytester.runpytest(*args, "--fix", "--gpuhost-accept-new-host-keys")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "10\n"


def test_the_ini_twin_and_a_rollback(pytester: pytest.Pytester, sshd: SshServer,
                                     fake: FakeHost, tmp_path: Path) -> None:
    """A journal made with the key known; its rollback from a configuration that would take
    any new key is refused too, unless gpuhost_accept_new_host_keys = true."""
    fake.sysctl("vm.swappiness", 60)
    spec = pytester.makefile(".yaml", spec=SPEC)
    target = f"--gpuhost-target={sshd.url(fake.root)}"
    made = pytester.runpytest(f"--gpuhost-spec={spec}", target, "--fix", "-p", "no:cacheprovider",
                              f"--gpuhost-ssh-config={sshd.client_config}")
    assert made.ret == pytest.ExitCode.OK, made.stdout.str()
    config = trusting_config(sshd, tmp_path / "known_hosts")
    back = [target, "--gpuhost-rollback", f"--gpuhost-ssh-config={config}", "-p",
            "no:cacheprovider", "--gpuhost-report=r.json"]
    refused = pytester.runpytest(*back)  # the journal is read at start: a usage error
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: *cannot reach *Host key verification failed. "
                                  "(--gpuhost-rollback changes the target as root, *"])
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    pytester.makeini("[pytest]\ngpuhost_accept_new_host_keys = true\n")
    restored = pytester.runpytest(*back)
    assert restored.ret == pytest.ExitCode.OK, restored.stdout.str()
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_an_inventorys_ssh_arguments_cannot_turn_checking_off_for_a_fix(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost, tmp_path: Path,
        ansible_home: None) -> None:
    fake.sysctl("vm.swappiness", 60)
    inventory = pytester.makefile(".ini", hosts=(
        f"[gpu]\nnode01 ansible_host=127.0.0.1 ansible_port={sshd.port} "
        f"ansible_user={sshd.user} ansible_ssh_private_key_file={sshd.directory / 'user_key'} "
        f"gpuhost_root={fake.root} ansible_ssh_common_args='-o StrictHostKeyChecking=no "
        f"-o UserKnownHostsFile=/dev/null'\n"))
    spec = pytester.makefile(".yaml", spec=SPEC)
    config = tmp_path / "bare_config"
    config.write_text("Host *\n  IdentitiesOnly yes\n  IdentityAgent none\n"
                      "  GlobalKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-inventory={inventory}",
            f"--gpuhost-ssh-config={config}", "--gpuhost-report=r.json", "-p", "no:cacheprovider"]
    result = pytester.runpytest(*args, "--fix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [check] = checks(pytester)
    assert check["outcome"] == "error" and "Host key verification failed" in check["message"]
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 | ssh-keygen -lf -" in check["message"]
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"
    verify = pytester.runpytest(*args)  # the inventory's StrictHostKeyChecking=no, obeyed
    [check] = checks(pytester)
    assert (verify.ret, check["outcome"]) == (pytest.ExitCode.TESTS_FAILED, "failed")


def test_strict_checking_comes_before_every_host_argument() -> None:
    """ssh keeps the first value of an option: the run's StrictHostKeyChecking=yes comes
    before an inventory's own, and after -F's file, whose values give way to both."""
    argv = ssh_argv("n1", port=None, user=None, config=Path("/cfg"), connect_timeout=10,
                    inner=["true"], extra=("-o", "StrictHostKeyChecking=no"),
                    strict_host_keys=True)
    assert argv.index("StrictHostKeyChecking=yes") < argv.index("StrictHostKeyChecking=no")
    plain = ssh_argv("n1", port=None, user=None, config=None, connect_timeout=10,
                     inner=["true"])
    assert not any("StrictHostKeyChecking" in word for word in plain)
