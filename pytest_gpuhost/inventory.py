"""Fleets as operators already write them down: an Ansible inventory, or a plain targets file.

A building block for remote targets: it reads, and connects to nothing. An inventory is read
through ansible-core's own API (``InventoryManager`` and ``DataLoader``; variables through
``VariableManager``, so group_vars/host_vars beside it and children groups count as they do for
Ansible, and a ``limit`` selects hosts as ``ansible --limit`` does). ansible-core is an extra
(``pip install 'pytest-gpuhost[ansible]'``), imported only here, only when an inventory is read.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MISSING_EXTRA = ("reading an Ansible inventory needs ansible-core, which is not installed: "
                 "pip install 'pytest-gpuhost[ansible]' (from a checkout: pip install "
                 "'.[ansible]')")
HOST_VARS = ("ansible_host", "ansible_ssh_host")
PORT_VARS = ("ansible_port", "ansible_ssh_port")
USER_VARS = ("ansible_user", "ansible_ssh_user")
KEY_VARS = ("ansible_private_key_file", "ansible_ssh_private_key_file")
ARGS_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
"""Each in the order of Ansible's ssh connection plugin, where the last one set wins; the ssh
arguments are common then extra, as that plugin passes them."""
_COMMENT = re.compile(r"(?:^|\s)#.*")


class InventoryError(Exception):
    """An inventory or targets file that cannot be used as it is; the message says why."""


@dataclass(frozen=True)
class InventoryHost:
    """One host of an inventory, as ssh would reach it."""

    name: str
    """The inventory hostname (what ``--limit`` and reports name)."""
    address: str
    """``ansible_host``, else the name."""
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    """``ansible_ssh_private_key_file`` as written (ssh expands ``~``)."""
    ssh_args: tuple[str, ...] = ()
    """``ansible_ssh_common_args`` then ``ansible_ssh_extra_args``, split as a shell would."""


def read_inventory(path: Path, limit: str | None = None) -> list[InventoryHost]:
    """The hosts of the inventory at ``path`` (INI, YAML, a directory, or any inventory plugin
    Ansible's configuration enables), selected by ``limit`` (``gpu``, ``node01``, ``gpu:!login``,
    ``gpu:&rack1``, ``node0*``, ``~node0[12]``), sorted by name."""
    if not path.exists():
        raise InventoryError(f"{path}: no such inventory file")
    data_loader, inventory_manager, variable_manager, templar = _ansible()
    loader = data_loader()
    inventory = inventory_manager(loader=loader, sources=[str(path)], parse=False)
    if not inventory.parse_source(str(path)):
        raise InventoryError(f"{path}: Ansible could not parse it as an inventory (INI, YAML or "
                             f"an enabled inventory plugin); ansible-inventory -i {path} --list "
                             "-vvv says why")
    inventory.reconcile_inventory()
    everything = len(inventory.get_hosts("all"))
    if not everything:
        raise InventoryError(f"{path}: the inventory defines no hosts")
    if limit:
        inventory.subset(limit)
    hosts = inventory.get_hosts("all")
    if not hosts:
        raise InventoryError(f"--limit {limit!r} matches none of the {everything} hosts in {path}")
    variables = variable_manager(loader=loader, inventory=inventory)
    found = []
    for host in hosts:
        values = variables.get_vars(host=host, include_hostvars=False)
        found.append(_host(host.name, _Resolver(templar(loader=loader, variables=values),
                                                values, host.name, path)))
    return sorted(found, key=lambda h: h.name)


def _ansible() -> tuple[Any, Any, Any, Any]:
    try:
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError:
        raise InventoryError(MISSING_EXTRA) from None
    return DataLoader, InventoryManager, VariableManager, Templar


@dataclass(frozen=True)
class _Resolver:
    """A host's variables, templated as Ansible would (``{{ inventory_hostname }}.lab``)."""

    templar: Any
    values: Mapping[str, Any]
    host: str
    source: Path

    def last(self, names: Sequence[str]) -> str | None:
        value = None
        for name in names:
            if self.values.get(name) is not None:
                value = self.template(name)
        return value

    def template(self, name: str) -> str:
        from ansible.errors import AnsibleError

        try:
            return str(self.templar.template(self.values[name]))
        except AnsibleError as exc:  # an undefined variable, a template that does not parse
            raise InventoryError(f"{self.source}: host {self.host}: {name}: {exc}") from None


def _host(name: str, variables: _Resolver) -> InventoryHost:
    port = variables.last(PORT_VARS)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise InventoryError(f"{variables.source}: host {name}: ansible_port must be a port "
                             f"number (1-65535), got {port!r}")
    args: list[str] = []
    for var in ARGS_VARS:
        if variables.values.get(var) is not None:
            text = variables.template(var)
            try:
                args += shlex.split(text)
            except ValueError as exc:
                raise InventoryError(f"{variables.source}: host {name}: {var}: {exc}: "
                                     f"{text!r}") from None
    return InventoryHost(name=name, address=variables.last(HOST_VARS) or name,
                         port=int(port) if port is not None else None,
                         user=variables.last(USER_VARS),
                         identity_file=variables.last(KEY_VARS), ssh_args=tuple(args))


def parse_targets(text: str, source: str) -> list[str]:
    """One target a line; ``#`` starts a comment (at a line's start or after a space); blank
    lines are skipped. A line with two words, a target listed twice or a file with none is an
    error naming ``source:line``."""
    targets: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        if len(line.split()) > 1:
            raise InventoryError(f"{source}:{number}: one target a line, got {line!r}")
        if line in seen:
            raise InventoryError(f"{source}:{number}: {line} is listed twice (first at line "
                                 f"{seen[line]})")
        seen[line] = number
        targets.append(line)
    if not targets:
        raise InventoryError(f"{source}: no targets (every line is blank or a comment)")
    return targets


def read_targets_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such targets file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read the targets file: {exc}") from None
    return parse_targets(text, str(path))
