"""The hosts of a fleet as pytest-gpuhost takes them: one host of an inventory as ssh reaches it
(``InventoryHost``, what ``inventory.py`` makes of Ansible's variables), the ssh options its
variables may carry, a plain targets file (one target a line, optionally with its spec), and
the errors of both.

A building block for remote targets: it reads, and connects to nothing; no ansible-core here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from ..specmodel.specfile import excerpt
from .targets import LOCAL, TargetAddress, valid_host, valid_name

SSH_VALUE_OPTIONS = "BbcDEeFIiJLlmOoPpQRSWw"
SSH_FLAGS = "46AaCfGgKkMNnqsTtVvXxYy"
"""ssh(1)'s options that take a value, and those that do not."""
HOST_VARS = ("ansible_host", "ansible_ssh_host")
PORT_VARS = ("ansible_port", "ansible_ssh_port")
USER_VARS = ("ansible_user", "ansible_ssh_user")
KEY_VARS = ("ansible_private_key_file", "ansible_ssh_private_key_file")
ARGS_VARS = ("ansible_ssh_common_args", "ansible_ssh_extra_args")
"""Each in the order of Ansible's ssh connection plugin, where the last one set wins; the ssh
arguments are common then extra, as that plugin passes them."""
ROOT_VARS = ("gpuhost_root",)
"""pytest-gpuhost's own host variable: the host root on that machine (default ``/``)."""
SPEC_VARS = ("gpuhost_spec",)
"""pytest-gpuhost's own host (or group) variable: the spec the host runs instead of the run's
(a bundled spec's name, or a file relative to the inventory)."""
CONNECTION_VARS = ("ansible_connection",)
SSH_CONNECTIONS = ("ssh", "smart", "paramiko", "paramiko_ssh")
"""ansible_connection values that reach the host over ssh (``ansible.builtin.`` or not)."""
PYTHON_VARS = ("ansible_python_interpreter",)
DISCOVERED_PYTHON = ("auto", "auto_silent", "auto_legacy", "auto_legacy_silent")
"""ansible_python_interpreter values that ask Ansible to find a python: the agent then runs
under ``python3``, the target's default."""
_COMMENT = re.compile(r"(?:^|\s)#.*")


class InventoryError(Exception):
    """An inventory or targets file that cannot be used as it is; the message says why."""


class HostVariableError(InventoryError):
    """A host variable Ansible could not template (an undefined variable): Ansible fails that
    host and runs the others."""


class InventoryHost(msgspec.Struct, frozen=True):
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
    root: str = "/"
    """``gpuhost_root``: the host root there (``/``; another tree for tests and images)."""
    local: bool = False
    """``ansible_connection=local``: this machine, not an ssh destination."""
    python: str | None = None
    """``ansible_python_interpreter``: the python the agent runs under (None: ``python3``)."""
    spec: str | None = None
    """``gpuhost_spec``: the spec this host runs, as written (None: the run's)."""
    error: str | None = None
    """Why this host cannot be used (a variable Ansible could not template): with
    ``read_inventory(..., host_errors=True)`` such a host is still listed, and its checks are
    errors saying this, while the other hosts run."""

    def target(self, source: str, base: Path) -> TargetAddress:
        """The host as an ssh target named by its inventory name (``...@node01``), or, for
        ``ansible_connection=local``, this machine at its ``gpuhost_root`` (else at the run's
        root). A relative key file is relative to ``base`` (where pytest runs), as it is to
        where Ansible runs."""
        if not valid_name(self.name):
            raise InventoryError(f"host {self.name!r}: a target's name is letters, digits, '.', "
                                 "'_', ':' or '-' (it ends every check's id)")
        if self.error is not None:
            return TargetAddress(f"ssh://{self.name}/?name={self.name}", "ssh", host=self.name,
                                 name=self.name, source=source, error=self.error)
        if self.local:
            return TargetAddress(LOCAL, LOCAL, root=self.root, name=self.name, source=source,
                                 spec=self.spec)
        if not valid_host(self.address):
            raise InventoryError(f"host {self.name}: ansible_host={self.address!r} is not a "
                                 "host name or address")
        key = self.identity_file
        if key and not key.startswith(("/", "~")):
            key = str(base / key)
        host = f"[{self.address}]" if ":" in self.address else self.address
        url = (f"ssh://{f'{self.user}@' if self.user else ''}{host}"
               f"{f':{self.port}' if self.port else ''}{self.root}?name={self.name}")
        return TargetAddress(url, "ssh", host=self.address, user=self.user, port=self.port,
                             root=self.root, name=self.name, identity_file=key,
                             ssh_args=self.ssh_args, source=source, python=self.python,
                             spec=self.spec)


def refuse_bad_name(name: str, source: object) -> None:
    """InventoryError for a host name no target may have, before any message names it whole:
    a file that is no inventory (an env file's ``TOKEN=...`` lines) is read as host names."""
    if not valid_name(name):
        raise InventoryError(f"{source}: host {excerpt(name)}: a target's name is letters, "
                             "digits, '.', '_', ':' or '-' (it ends every check's id); is this "
                             "file an inventory?")


def not_ssh_options(words: Sequence[str]) -> str | None:
    """What is wrong with words given as ssh options: the first that is neither an option nor
    an option's value, or a last option that takes a value and has none (ssh would take the
    tool's own next option, ``-o``, as its value and the one after as the host)."""
    expects_value = False
    for word in words:
        if expects_value:
            expects_value = False
        elif word.startswith("-") and len(word) > 1 and word != "--":
            letters = word[1:]
            for index, letter in enumerate(letters):
                if letter in SSH_VALUE_OPTIONS:
                    expects_value = index == len(letters) - 1  # -oX=1 carries its own value
                    break
                if letter not in SSH_FLAGS:
                    return f"{word!r} is not an ssh option (ssh would read it as the host to " \
                           "reach)"
        else:
            return f"{word!r} is not an ssh option (ssh would read it as the host to reach)"
    if expects_value:
        return (f"{words[-1]!r} takes a value and none follows it (ssh would take the next of "
                "pytest-gpuhost's own options as its value): give it one")
    return None


class TargetLine(NamedTuple):
    """A line of a targets file: its number, the target, and the spec it runs (the second
    column; None: the run's)."""

    number: int
    target: str
    spec: str | None = None


def parse_targets(text: str, source: str) -> list[str]:
    """One target a line, optionally followed by the spec it runs; ``#`` starts a comment (at a
    line's start or after a space); blank lines are skipped. A line of more than two words, a
    target listed twice or a file with none is an error naming ``source:line``."""
    return [line.target for line in numbered_targets(text, source)]


def numbered_targets(text: str, source: str) -> list[TargetLine]:
    """``parse_targets`` with each target's line number and spec."""
    targets: list[TargetLine] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        words = line.split()
        if len(words) > 2:
            raise InventoryError(f"{source}:{number}: one target a line and optionally its "
                                 f"spec, got {excerpt(line)}")
        if words[0] in seen:
            raise InventoryError(f"{source}:{number}: {excerpt(words[0])} is listed twice "
                                 f"(first at line {seen[words[0]]})")
        seen[words[0]] = number
        targets.append(TargetLine(number, words[0], words[1] if len(words) > 1 else None))
    if not targets:
        raise InventoryError(f"{source}: no targets (every line is blank or a comment)")
    return targets


def read_targets_file(path: Path) -> list[str]:
    return [line.target for line in read_numbered_targets(path)]


def read_numbered_targets(path: Path) -> list[TargetLine]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{path}: no such targets file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InventoryError(f"{path}: cannot read the targets file: {exc}") from None
    return numbered_targets(text, str(path))
