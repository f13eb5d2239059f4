"""Ansible inventories (through ansible-core's own API) and plain targets files."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.inventory import (
    InventoryError,
    InventoryHost,
    parse_targets,
    read_inventory,
    read_targets_file,
)

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
def ansible_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ansible makes its local temporary directory (~/.ansible/tmp) when first used: keep it,
    and any ansible.cfg lookup, inside the test's own directories."""
    base = tmp_path_factory.mktemp("ansible")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANSIBLE_LOCAL_TEMP", str(base / "tmp"))
        patch.setenv("ANSIBLE_CONFIG", str(base / "ansible.cfg"))
        patch.setenv("ANSIBLE_HOME", str(base))
        yield


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
    with pytest.raises(InventoryError, match=r"--limit 'dgx\*' matches none of the 4 hosts in "):
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
    code = ("import sys, pytest_gpuhost.inventory, pytest_gpuhost.plugin; "
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
    ("a\nb c\n", r"targets:2: one target a line, got 'b c'"),
    ("a\n\nb\na # again\n", r"targets:4: a is listed twice \(first at line 1\)"),
    ("# nothing\n\n   \n", r"targets: no targets \(every line is blank or a comment\)"),
])
def test_targets_file_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(InventoryError, match=message):
        parse_targets(text, "targets")


def test_a_missing_targets_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="none: no such targets file"):
        read_targets_file(tmp_path / "none")
