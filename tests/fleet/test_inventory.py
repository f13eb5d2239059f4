"""Ansible inventories (through ansible-core's own API) and plain targets files."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.config.inventory import (
    InventoryError,
    InventoryHost,
    parse_targets,
    read_inventory,
    read_targets_file,
)
from pytest_gpuhost.config.targets import (
    TargetAddress,
    TargetError,
    name_targets,
    parse_target_line,
)
from pytest_gpuhost.host.remote import ssh_argv

from ..conftest import ended_within

INI = """\
[gpu]
node02 ansible_user=ops
node01 ansible_host=10.0.0.1 ansible_port=2222
node03 ansible_host="{{ inventory_hostname }}.lab"

[gpu:vars]
ansible_user=root
ansible_ssh_private_key_file=/etc/gpuhost/keys/fleet_ed25519
ansible_ssh_common_args='-o ProxyJump=bastion -o "UserKnownHostsFile /etc/gpuhost/known_hosts"'

[login]
login01 ansible_host=10.0.1.1

[rack1]
node01
login01

[cluster:children]
gpu
login
"""

YAML = """\
all:
  vars:
    ansible_user: admin
  children:
    cluster:
      children:
        gpu:
          hosts:
            g2:
            g1:
              ansible_host: 192.0.2.11
              ansible_port: 22
          vars:
            ansible_ssh_common_args: -o ConnectTimeout=5
            ansible_ssh_extra_args: -o ServerAliveInterval=10
        login:
          hosts:
            l1:
              ansible_user: ops
"""


@pytest.fixture(scope="module", autouse=True)
def _ansible_home(ansible_home: None) -> None:
    """Every test here keeps Ansible's files in its own directories."""


def inventory(tmp_path: Path, text: str, name: str = "hosts.ini") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def names(hosts: list[InventoryHost]) -> list[str]:
    return [host.name for host in hosts]


def test_ini_hosts_with_their_vars_sorted_by_name(tmp_path: Path) -> None:
    hosts = read_inventory(inventory(tmp_path, INI))
    assert names(hosts) == ["login01", "node01", "node02", "node03"]
    key, args = "/etc/gpuhost/keys/fleet_ed25519", (
        "-o", "ProxyJump=bastion", "-o", "UserKnownHostsFile /etc/gpuhost/known_hosts")
    assert hosts == [
        InventoryHost("login01", "10.0.1.1"),
        InventoryHost("node01", "10.0.0.1", 2222, "root", key, args),
        InventoryHost("node02", "node02", None, "ops", key, args),  # host var beats group var
        InventoryHost("node03", "node03.lab", None, "root", key, args),  # templated
    ]


def test_yaml_children_and_vars_at_every_level(tmp_path: Path) -> None:
    hosts = read_inventory(inventory(tmp_path, YAML, "hosts.yml"))
    assert hosts == [
        InventoryHost("g1", "192.0.2.11", 22, "admin", None,
                      ("-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=10")),
        InventoryHost("g2", "g2", None, "admin", None,
                      ("-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=10")),
        InventoryHost("l1", "l1", None, "ops"),
    ]
    assert names(read_inventory(tmp_path / "hosts.yml", "cluster")) == ["g1", "g2", "l1"]
    for host in hosts:  # plain values, which xdist can hand its workers (Ansible tags its own)
        assert {type(value) for value in (host.name, host.address, host.user, *host.ssh_args)
                if value is not None} == {str}


def test_group_vars_and_host_vars_beside_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars/gpu.yml").write_text("ansible_port: 2200\n")
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars/node02.yml").write_text("ansible_host: 10.0.0.2\n")
    hosts = {h.name: h for h in read_inventory(inventory(tmp_path, INI))}
    assert (hosts["node02"].address, hosts["node02"].port) == ("10.0.0.2", 2200)
    assert hosts["node01"].port == 2222  # the inventory's host var beats group_vars
    assert hosts["login01"].port is None


@pytest.mark.parametrize(("limit", "expected"), [
    ("gpu", ["node01", "node02", "node03"]),                 # a group
    ("node02", ["node02"]),                                  # a host
    ("cluster:!login", ["node01", "node02", "node03"]),      # children, minus a group
    ("gpu:!node02", ["node01", "node03"]),                   # minus a host
    ("gpu:&rack1", ["node01"]),                              # intersection
    ("node0*", ["node01", "node02", "node03"]),              # glob
    ("*01", ["login01", "node01"]),
    ("~node0[13]", ["node01", "node03"]),                    # regex
    ("login01,node03", ["login01", "node03"]),               # a list
    ("all:!rack1", ["node02", "node03"]),
])
def test_limit_selects_as_ansible_does(tmp_path: Path, limit: str,
                                       expected: list[str]) -> None:
    assert names(read_inventory(inventory(tmp_path, INI), limit)) == expected


def test_a_limit_that_matches_nothing(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"the limit 'dgx\*' matches none of the 4 hosts in "):
        read_inventory(inventory(tmp_path, INI), "dgx*")


def test_a_missing_inventory_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"nope.ini: no such inventory file"):
        read_inventory(tmp_path / "nope.ini")


def test_an_inventory_ansible_cannot_parse(tmp_path: Path) -> None:
    path = inventory(tmp_path, "all:\n  hosts: [unclosed\n", "broken.yml")
    with pytest.raises(InventoryError, match="Ansible could not parse it as an inventory"):
        read_inventory(path)


def test_an_inventory_without_hosts(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="defines no hosts"):
        read_inventory(inventory(tmp_path, "[gpu]\n"))


def test_bad_variables_name_the_host(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"host n1: ansible_port must be a port number"):
        read_inventory(inventory(tmp_path, "[gpu]\nn1 ansible_port=ssh\n"))
    with pytest.raises(InventoryError, match=r"host n1: ansible_ssh_common_args: No closing"):
        read_inventory(inventory(tmp_path, "[gpu]\nn1 ansible_ssh_common_args='-o \"x'\n"))
    with pytest.raises(InventoryError, match=r"host n1: ansible_host: .*undefined_thing"):
        read_inventory(inventory(tmp_path, "[gpu]\nn1 ansible_host='{{ undefined_thing }}'\n"))


def test_without_ansible_the_error_names_the_extra(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "ansible" or m.startswith("ansible.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ansible", None)  # what an absent package looks like
    with pytest.raises(InventoryError) as error:
        read_inventory(inventory(tmp_path, INI))
    assert "pip install 'pytest-gpuhost[ansible]'" in str(error.value)
    assert "pip install '.[ansible]'" in str(error.value)


def test_importing_the_module_does_not_import_ansible() -> None:
    code = ("import sys, pytest_gpuhost.config.inventory, pytest_gpuhost.plugin; "
            "print(any(m.split('.')[0] == 'ansible' for m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


# -- plain targets files -----------------------------------------------------------------------

def test_targets_file_lines_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "targets"
    path.write_text(textwrap.dedent("""\
        # the fleet
        ssh://root@gpu01

        ssh://root@gpu02:2222   # behind the rack switch
          gpu03.lab
        ssh://gpu04#not-a-comment
    """))
    assert read_targets_file(path) == ["ssh://root@gpu01", "ssh://root@gpu02:2222", "gpu03.lab",
                                       "ssh://gpu04#not-a-comment"]


@pytest.mark.parametrize(("text", "message"), [
    ("a\nb c d\n", r"targets:2: one target a line and optionally its spec, got 'b c d'"),
    ("a\n\nb\na # again\n", r"targets:4: 'a' is listed twice \(first at line 1\)"),
    ("# nothing\n\n   \n", r"targets: no targets \(every line is blank or a comment\)"),
])
def test_targets_file_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        parse_targets(text, "targets")


def test_a_missing_targets_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="none: no such targets file"):
        read_targets_file(tmp_path / "none")


# -- inventory hosts as targets ----------------------------------------------------------------

def test_an_inventory_host_as_a_target(tmp_path: Path) -> None:
    path = inventory(tmp_path, "[gpu]\nn1 ansible_host=10.0.0.1 ansible_port=2222 "
                               "ansible_user=ops ansible_ssh_private_key_file=keys/n1 "
                               "gpuhost_root=/srv/image ansible_ssh_common_args='-o "
                               "ProxyJump=bastion -4'\nn2 ansible_host=fe80::1\n")
    n1, n2 = (host.target("--gpuhost-inventory=hosts.ini", tmp_path)
              for host in read_inventory(path))
    assert n1 == TargetAddress("ssh://ops@10.0.0.1:2222/srv/image?name=n1", "ssh", host="10.0.0.1",
                        user="ops", port=2222, root="/srv/image", name="n1",
                        identity_file=str(tmp_path / "keys/n1"),
                        ssh_args=("-o", "ProxyJump=bastion", "-4"),
                        source="--gpuhost-inventory=hosts.ini")
    assert (n2.url, n2.host, n2.root, n2.identity_file) == ("ssh://[fe80::1]/?name=n2",
                                                            "fe80::1", "/", None)


@pytest.mark.parametrize(("line", "message"), [
    ("n1 gpuhost_root=relative/tree", r"host n1: gpuhost_root must be an absolute path"),
    ("n1 ansible_ssh_common_args='node02'", r"'node02' is not an ssh option \(ssh would read "
                                            r"it as the host to reach\)"),
    ("n1 ansible_ssh_common_args='-o'", r"'-o' takes a value and none follows it"),
    ("n1 ansible_ssh_common_args='-4 -E'", r"'-E' takes a value and none follows it \(ssh "
                                           r"would take the next of pytest-gpuhost's own "
                                           r"options as its value\)"),
    ("n1 ansible_port='²'", r"ansible_port must be a port number \(1-65535\), got '²'"),
    ("n1 ansible_ssh_extra_args='-- x'", r"'--' is not an ssh option"),
    ("n1 ansible_ssh_common_args='-Z'", r"'-Z' is not an ssh option"),
    ("n1 ansible_ssh_common_args='-4v -p2200 -oBatchMode=yes -J b'", None),
])
def test_ssh_arguments_and_roots_are_checked(tmp_path: Path, line: str,
                                             message: str | None) -> None:
    path = inventory(tmp_path, f"[gpu]\n{line}\n")
    if message is None:
        read_inventory(path)
        return
    with pytest.raises(InventoryError, match=message):
        read_inventory(path)


@pytest.mark.parametrize(("name", "address", "message"), [
    ("node@1", "node1", r"host 'node@1': a target's name is letters, digits"),
    ("node1", "-oProxyCommand=x", r"host node1: ansible_host='-oProxyCommand=x' is not a host"),
])
def test_names_and_addresses_a_target_cannot_have(name: str, address: str,
                                                  message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        InventoryHost(name, address).target("x", Path("/"))


def test_an_ansible_parse_error_says_where_when_ansible_knows(tmp_path: Path) -> None:
    path = inventory(tmp_path, "all:\n  hosts:\n    a: [1\n", "broken.yml")
    with pytest.raises(InventoryError, match=rf"{path}:4:1: YAML parsing failed: "):
        read_inventory(path)
    path = inventory(tmp_path, "[gpu]\nn1\n[gpu:vars]\nno value here\n")
    with pytest.raises(InventoryError, match=r"Expected key=value, got: no value here "
                                             r"\(Ansible's ini plugin\)"):
        read_inventory(path)


def test_ansible_prints_nothing_of_its_own(tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InventoryError):
        read_inventory(inventory(tmp_path, "[gpu]\nn1\n[gpu:vars]\nno value here\n"))
    with pytest.raises(InventoryError):
        read_inventory(inventory(tmp_path, "[gpu]\nn1\n"), "nothing*")
    assert capfd.readouterr() == ("", "")


def test_a_limit_ansible_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"the limit 'gpu:&' is not a pattern Ansible "
                                             r"accepts"):
        read_inventory(inventory(tmp_path, INI), "gpu:&")


# -- targets from every source -------------------------------------------------------------------

@pytest.mark.parametrize(("line", "url", "host", "user", "port"), [
    ("gpu03.lab", "ssh://gpu03.lab", "gpu03.lab", None, None),
    ("root@gpu04:2222", "ssh://root@gpu04:2222", "gpu04", "root", 2222),
    ("ssh://gpu05/srv?name=five", "ssh://gpu05/srv?name=five", "gpu05", None, None),
])
def test_a_targets_file_line_is_a_url_or_a_bare_ssh_host(line: str, url: str, host: str,
                                                        user: str | None,
                                                        port: int | None) -> None:
    target = parse_target_line(line)
    assert (target.scheme, target.url, target.host, target.user, target.port) == (
        "ssh", url, host, user, port)


def test_local_in_a_targets_file() -> None:
    assert parse_target_line("local").local


@pytest.mark.parametrize(("targets", "message"), [
    ([TargetAddress("ssh://a?name=x", "ssh", host="a", name="x", source="--gpuhost-target"),
      TargetAddress("ssh://b/?name=x", "ssh", host="b", name="x", source="--gpuhost-inventory=h")],
     r"two targets are named x: ssh://a\?name=x \(--gpuhost-target\) and ssh://b/\?name=x "
     r"\(--gpuhost-inventory=h\)"),
    ([TargetAddress("ssh://a", "ssh", host="a", name="", source="f:1"),
      TargetAddress("ssh://a", "ssh", host="a", name="", source="--gpuhost-target")],
     r"target ssh://a is given twice \(f:1 and --gpuhost-target\)"),
    ([TargetAddress("ssh://a", "ssh", host="a", name="", source="f:1"),
      TargetAddress("ssh://root@a/?name=n", "ssh", host="a", user="root", name="n", source="inv")],
     r"ssh://a \(f:1\) and ssh://root@a/\?name=n \(inv\) are the same target"),
    ([TargetAddress("ssh://n1", "ssh", host="n1", name="", source="f:1"),
      TargetAddress("ssh://10.0.0.1/?name=n1", "ssh", host="10.0.0.1", name="n1", source="inv")],
     r"ssh://n1 \(f:1\) would be named n1, as ssh://10.0.0.1/\?name=n1 \(inv\) is"),
])
def test_the_same_target_from_two_sources_is_refused(targets: list[TargetAddress],
                                                     message: str) -> None:
    with pytest.raises(TargetError, match=message):
        name_targets(targets)


def test_one_address_over_two_jump_hosts_is_two_targets() -> None:
    named = name_targets([
        TargetAddress("ssh://10.0.0.1/?name=a1", "ssh", host="10.0.0.1", name="a1",
               ssh_args=("-J", "bastion-a")),
        TargetAddress("ssh://10.0.0.1/?name=b1", "ssh", host="10.0.0.1", name="b1",
               ssh_args=("-J", "bastion-b")),
    ])
    assert [t.name for t in named] == ["a1", "b1"]


def test_a_hosts_key_and_arguments_reach_the_ssh_command_line() -> None:
    argv = ssh_argv("10.0.0.1", port=2222, user="ops", config=Path("/etc/cfg"),
                    connect_timeout=10, inner=["python3", "-c", "pass"],
                    identity_file="/keys/n1", extra=("-o", "ConnectTimeout=3"))
    assert argv[:9] == ["ssh", "-F", "/etc/cfg", "-o", "BatchMode=yes",
                        "-o", "ConnectTimeout=3", "-i", "/keys/n1"]
    assert argv[-7:] == ["-p", "2222", "-l", "ops", "--", "10.0.0.1", "python3 -c pass"]


def test_no_hosts_arguments_turn_batch_mode_off() -> None:
    """ssh keeps an option's first value: an inventory's ``-o BatchMode=no`` (or a
    ``-oBatchMode=no``) comes after the run's ``BatchMode=yes``, so a password prompt never
    holds the run; a host's other options still win over the run's (its ConnectTimeout)."""
    argv = ssh_argv("n1", port=None, user=None, config=None, connect_timeout=10,
                    inner=["true"], extra=("-o", "BatchMode=no", "-oConnectTimeout=3"))
    assert argv.index("BatchMode=yes") < argv.index("BatchMode=no")
    assert argv.index("-oConnectTimeout=3") < argv.index("ConnectTimeout=10")


def test_an_inventory_script_that_never_answers_is_given_up_at_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dynamic inventory (an executable file: Ansible's script plugin, enabled by default)
    asking a CMDB that does not answer: Ansible waits on it without a limit."""
    import os
    import signal

    from pytest_gpuhost.config import inventory as module

    monkeypatch.setattr(module, "INVENTORY_TIMEOUT_S", 1.0)
    script = tmp_path / "cmdb.sh"
    script.write_text(f"#!/bin/sh\necho $$ > '{tmp_path}/pid'\nexec sleep 60\n")
    script.chmod(0o755)
    try:
        error = ended_within(20, lambda: read_inventory(script), "reading the inventory")
        assert isinstance(error, InventoryError)
        assert str(error) == (
            f"{script}: Ansible did not finish reading the inventory within 1 s: an inventory "
            "script or plugin that waits on something (a CMDB or cloud API that does not "
            "answer); run ansible-inventory -i FILE --list to see it hang, or write the hosts "
            "to a static inventory")
    finally:
        pid = (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else ""
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
