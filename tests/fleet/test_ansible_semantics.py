"""An inventory means what it means to Ansible. Vault secrets come as Ansible's own
commands load them (ANSIBLE_VAULT_PASSWORD_FILE, vault_password_file in ansible.cfg, vault ids),
files encrypted by the real ``ansible-vault``; ``ansible_connection=local`` is this machine;
``ansible_python_interpreter`` is the agent's python; one host's undefined variable fails that
host alone. Whole runs use ``ansible_connection=local`` hosts on fake roots: nothing is reached
over ssh (tests/e2e/test_inventory_over_ssh.py does that part)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

from pytest_gpuhost.builtin import pytest_gpuhost_make_host
from pytest_gpuhost.config.inventory import InventoryError, InventoryHost, read_inventory
from pytest_gpuhost.config.settings import RawOptions, resolve
from pytest_gpuhost.host.remote import AgentHost
from pytest_gpuhost.testing.fakehost import FakeHost

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module", autouse=True)
def _ansible_home(ansible_home: None) -> None:
    """Every test here keeps Ansible's files in its own directories."""


def ansible_tool(name: str) -> str:
    """A command of the installed ansible-core (ansible-vault, ansible-inventory): beside this
    python, as pip installs them."""
    path = Path(sys.executable).with_name(name)
    assert path.is_file(), f"{name} not beside {sys.executable}: pip install ansible-core"
    return str(path)


def vault(*args: str, cwd: Path) -> str:
    done = subprocess.run([ansible_tool("ansible-vault"), *args], cwd=cwd, capture_output=True,
                          text=True, check=True, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    return done.stdout


def best_practice_inventory(base: Path, password_file: Path, *, hosts: str,
                            vault_id: str | None = None) -> Path:
    """Ansible's recommended layout: group_vars/all/vars.yml names the variable, and
    group_vars/all/vault.yml, encrypted whole by ansible-vault, holds its value."""
    group_vars = base / "inventory" / "group_vars" / "all"
    group_vars.mkdir(parents=True)
    (base / "inventory" / "hosts.ini").write_text(hosts)
    (group_vars / "vars.yml").write_text('ansible_user: "{{ vault_ssh_user }}"\n')
    secret = group_vars / "vault.yml"
    secret.write_text("vault_ssh_user: deploy\n")
    how = ["--vault-id", f"{vault_id}@{password_file}"] if vault_id else \
        ["--vault-password-file", str(password_file)]
    vault("encrypt", *how, str(secret), cwd=base)
    assert secret.read_text().startswith("$ANSIBLE_VAULT;1.")
    return base / "inventory" / "hosts.ini"


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "vault-pass"
    path.write_text(PASSWORD + "\n")
    path.chmod(0o600)
    return path


def test_a_vault_encrypted_group_vars_file_reads_as_ansible_inventory_reads_it(
        tmp_path: Path, password_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = best_practice_inventory(tmp_path, password_file, hosts="[gpu]\nnode01\nnode02\n")
    monkeypatch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))
    hosts = read_inventory(path)
    assert [(h.name, h.user) for h in hosts] == [("node01", "deploy"), ("node02", "deploy")]
    shown = subprocess.run([ansible_tool("ansible-inventory"), "-i", str(path), "--host",
                            "node01"], capture_output=True, text=True, check=True)
    assert json.loads(shown.stdout)["vault_ssh_user"] == "deploy"  # the real tool agrees


def test_vault_ids_and_an_inline_vault_value(tmp_path: Path, password_file: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """ANSIBLE_VAULT_IDENTITY_LIST (vault_identity_list): a file encrypted for vault id
    ``prod``, and a ``!vault`` value made by ``ansible-vault encrypt_string``."""
    path = best_practice_inventory(tmp_path, password_file, hosts="[gpu]\nnode01\n",
                                   vault_id="prod")
    encrypted = vault("encrypt_string", "--vault-id", f"prod@{password_file}", "2222",
                      "--name", "ansible_port", cwd=tmp_path)
    (path.parent / "host_vars").mkdir()
    (path.parent / "host_vars" / "node01.yml").write_text(encrypted)
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", f"prod@{password_file}")
    [host] = read_inventory(path)
    assert (host.user, host.port) == ("deploy", 2222)


def test_without_the_vault_secret_the_run_is_a_usage_error_in_one_line(
        pytester: pytest.Pytester, tmp_path: Path, password_file: Path) -> None:
    """The issue's report: exit 3 and 93 lines of INTERNALERROR. Now exit 4, one line that
    names the encrypted file and what to set; with the secret the run goes on."""
    box = FakeHost(tmp_path / "box").sysctl("vm.swappiness", 10)
    path = best_practice_inventory(
        tmp_path, password_file,
        hosts=f"[gpu]\nbox ansible_connection=local gpuhost_root={box.root}\n")
    spec = pytester.makefile(".yaml", spec=SPEC)
    args = (f"--gpuhost-spec={spec}", f"--gpuhost-inventory={path}", "-p", "no:cacheprovider")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    with pytest.MonkeyPatch.context() as patch:
        for name in set(os.environ) - set(env):
            patch.delenv(name)
        result = pytester.runpytest_subprocess(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        said = [line for line in result.stderr.lines if line.strip()]
        assert len(said) == 1, result.stderr.str()
        assert said[0].startswith(f"ERROR: --gpuhost-inventory={path}: {path}: ")
        assert f"{path.parent}/group_vars/all/vault.yml: " in said[0]
        assert "set ANSIBLE_VAULT_PASSWORD_FILE=FILE" in said[0]
        assert "Traceback" not in result.stdout.str() + result.stderr.str()

        wrong = tmp_path / "wrong-pass"
        wrong.write_text("not it\n")
        patch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(wrong))
        result = pytester.runpytest_subprocess(*args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines(["ERROR: *vault.yml: Decryption failed * the vault ids "
                                     "given, default, do not decrypt it*"])

        patch.setenv("ANSIBLE_VAULT_PASSWORD_FILE", str(password_file))
        result = pytester.runpytest_subprocess(*args)
        assert result.ret == pytest.ExitCode.OK, result.stdout.str() + result.stderr.str()
        result.assert_outcomes(passed=1)


def test_vault_password_file_in_ansible_cfg(pytester: pytest.Pytester, tmp_path: Path,
                                            password_file: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    box = FakeHost(tmp_path / "box").sysctl("vm.swappiness", 10)
    path = best_practice_inventory(
        tmp_path, password_file,
        hosts=f"[gpu]\nbox ansible_connection=local gpuhost_root={box.root}\n")
    config = tmp_path / "ansible.cfg"
    config.write_text(f"[defaults]\nvault_password_file = {password_file}\n")
    monkeypatch.setenv("ANSIBLE_CONFIG", str(config))
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                           f"--gpuhost-inventory={path}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()


@pytest.mark.parametrize(("setting", "message"), [
    ("default@prompt", r"vault id 'default@prompt' asks for its password at a prompt, which a "
                       r"pytest run cannot answer"),
    ("prod@/nonexistent/pass", r"vault id prod@/nonexistent/pass: The vault password file "
                               r"/nonexistent/pass was not found"),
])
def test_vault_ids_that_give_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       setting: str, message: str) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\nnode01\n")
    monkeypatch.setenv("ANSIBLE_VAULT_IDENTITY_LIST", setting)
    with pytest.raises(InventoryError, match=message):
        read_inventory(path)


def test_any_ansible_error_is_one_line(tmp_path: Path) -> None:
    """A host_vars file Ansible cannot load: its own error, on one line, naming the file."""
    path = tmp_path / "hosts.ini"
    path.write_text("[gpu]\nnode01\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "node01.yml").write_text("a: [unclosed\n  b: 1\n")
    with pytest.raises(InventoryError) as error:
        read_inventory(path)
    text = str(error.value)
    assert "\n" not in text and "node01.yml" in text, text


# -- ansible_connection, ansible_python_interpreter, one host's undefined variable -------------

def test_connection_and_interpreter(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text(textwrap.dedent("""\
        [gpu]
        here ansible_connection=local gpuhost_root=/srv/image
        there ansible_connection=ansible.builtin.local
        rhel8 ansible_python_interpreter=/usr/bin/python3.9
        found ansible_python_interpreter=auto_silent
        jumped ansible_connection=ssh
        """))
    hosts = {h.name: h for h in read_inventory(path)}
    assert (hosts["here"].local, hosts["here"].root) == (True, "/srv/image")
    assert hosts["there"].local
    assert (hosts["rhel8"].local, hosts["rhel8"].python) == (False, "/usr/bin/python3.9")
    assert hosts["found"].python is None  # Ansible's discovery: the target's python3
    assert not hosts["jumped"].local
    rhel8 = hosts["rhel8"].target("inv", tmp_path)
    assert rhel8.python == "/usr/bin/python3.9"
    settings = resolve(RawOptions(invocation=tmp_path, ini_base=tmp_path, ini_name="x",
                                  spec=("s.yaml",), targets=(rhel8.url,)))
    settings = msgspec.structs.replace(settings, targets=(rhel8,))
    host = pytest_gpuhost_make_host(settings=settings, target=rhel8)
    assert isinstance(host, AgentHost)
    command = host.argv[-1]  # the one line ssh runs there
    assert command.startswith("/usr/bin/python3.9 -I -S -c "), command


@pytest.mark.parametrize(("line", "message"), [
    ("n1 ansible_connection=docker", r"ansible_connection=docker: pytest-gpuhost reaches a "
                                     r"host over ssh, or with local this machine"),
    ("n1 ansible_python_interpreter='python 3'", r"ansible_python_interpreter must be a "
                                                 r"command or an absolute path"),
    ("n1 ansible_python_interpreter=-c", r"ansible_python_interpreter must be"),
])
def test_what_cannot_be_used_names_the_host(tmp_path: Path, line: str, message: str) -> None:
    """A value of the inventory this run cannot use is a usage error naming the host (exit 4,
    as a bad port is), whether or not host errors are taken."""
    path = tmp_path / "hosts.ini"
    path.write_text(f"[gpu]\n{line}\n")
    for host_errors in (False, True):
        with pytest.raises(InventoryError, match=rf"host n1: {message}"):
            read_inventory(path, host_errors=host_errors)


def test_one_hosts_undefined_variable_fails_that_host_only(tmp_path: Path) -> None:
    path = tmp_path / "hosts.ini"
    path.write_text('[gpu]\nn1\nn2 ansible_host="{{ rack_prefix }}-n2"\nn3\n')
    with pytest.raises(InventoryError, match=r"host n2: ansible_host: .*rack_prefix"):
        read_inventory(path)  # the Python API's default, as before
    hosts = read_inventory(path, host_errors=True)
    assert [(h.name, h.error is None) for h in hosts] == [("n1", True), ("n2", False),
                                                          ("n3", True)]
    assert InventoryHost("n2", "n2", error="x").target("inv", tmp_path).error == "x"


def test_a_run_goes_on_past_a_host_ansible_would_fail(pytester: pytest.Pytester,
                                                      tmp_path: Path) -> None:
    """Two local hosts (two fake roots; one by gpuhost_root, the other at --gpuhost-root) and
    one whose ansible_host is undefined: its checks are errors saying so, the others run."""
    FakeHost(tmp_path / "box").sysctl("vm.swappiness", 10)
    run_root = FakeHost(tmp_path / "run-root").sysctl("vm.swappiness", 60)
    inventory = pytester.makefile(".ini", hosts=textwrap.dedent(f"""\
        [gpu]
        box ansible_connection=local gpuhost_root={tmp_path / 'box'}
        broken ansible_host="{{{{ rack_prefix }}}}-7"
        """))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-inventory={inventory}",
                                f"--gpuhost-root={run_root.root}", "--gpuhost-report=r.json",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = json.loads((pytester.path / "r.json").read_text())
    found = {(c["target"], c["id"]): (c["outcome"], c["message"]) for c in data["checks"]}
    assert found[("box", "sysctl[vm.swappiness]")][0] == "passed"  # its own root, not 60
    outcome, message = found[("broken", "sysctl[vm.swappiness]")]
    assert outcome == "error"
    assert "host broken: ansible_host: " in message and "rack_prefix" in message
    assert "Ansible would fail this host and run the others" in message
    assert "Traceback" not in result.stdout.str()


def test_a_local_host_without_gpuhost_root_is_at_the_runs_root(pytester: pytest.Pytester,
                                                                tmp_path: Path) -> None:
    run_root = FakeHost(tmp_path / "run-root").sysctl("vm.swappiness", 10)
    inventory = pytester.makefile(".ini", hosts="[gpu]\nlocalhost ansible_connection=local\n")
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-inventory={inventory}",
                                f"--gpuhost-root={run_root.root}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.assert_outcomes(passed=1)


def test_an_undefined_vault_named_variable_fails_its_host_only(tmp_path: Path) -> None:
    """A variable called vault_* that nothing defines (the vault file left out of the
    inventory) is an undefined variable like any other, not an inventory-wide vault error."""
    path = tmp_path / "hosts.ini"
    path.write_text('[gpu]\nn1 ansible_user="{{ vault_ssh_user }}"\nn2\n')
    hosts = read_inventory(path, host_errors=True)
    assert hosts[0].error is not None and "vault_ssh_user" in hosts[0].error
    assert "encrypted with Ansible Vault" not in hosts[0].error
    assert hosts[1].error is None
