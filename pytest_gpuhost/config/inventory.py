"""Fleets as operators already write them down: an Ansible inventory, or a plain targets file.

A building block for remote targets: it reads, and connects to nothing. An inventory is read
through ansible-core's own API (``InventoryManager`` and ``DataLoader``; variables through
``VariableManager``, so group_vars/host_vars beside it and children groups count as they do for
Ansible, and a ``limit`` selects hosts as ``ansible --limit`` does). ansible-core is an extra
(``pip install 'pytest-gpuhost[ansible]'``), imported only here, only when an inventory is read.

As Ansible's own commands do: vault secrets come from ``ANSIBLE_VAULT_PASSWORD_FILE`` (or
``vault_password_file`` in ansible.cfg) and the vault ids of ``ANSIBLE_VAULT_IDENTITY_LIST``
(``vault_identity_list``), so an encrypted ``group_vars/all/vault.yml`` reads as it does for
``ansible-inventory``; ``ansible_connection=local`` is this machine and
``ansible_python_interpreter`` the python the agent runs under; and a host whose variables
Ansible cannot template fails alone (``host_errors``), as Ansible fails that host and runs the
rest.
Whatever ansible-core raises becomes one line (``InventoryError``), never a traceback.
The hosts it makes (``InventoryHost``), their errors and plain targets files are ``hostlist.py``'s,
re-exported here.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..bounded import StillRunning, within
from ..specmodel.specfile import excerpt
from .hostlist import (  # the host variables Ansible's ssh plugin and pytest-gpuhost read
    ARGS_VARS,
    CONNECTION_VARS,
    DISCOVERED_PYTHON,
    HOST_VARS,
    KEY_VARS,
    PORT_VARS,
    PYTHON_VARS,
    ROOT_VARS,
    SPEC_VARS,
    SSH_CONNECTIONS,
    USER_VARS,
    not_ssh_options,
    refuse_bad_name,
)
from .hostlist import HostVariableError as HostVariableError  # re-exported
from .hostlist import InventoryError as InventoryError  # re-exported
from .hostlist import InventoryHost as InventoryHost  # re-exported
from .hostlist import TargetLine as TargetLine  # re-exported
from .hostlist import numbered_targets as numbered_targets  # re-exported
from .hostlist import parse_targets as parse_targets  # re-exported
from .hostlist import read_numbered_targets as read_numbered_targets  # re-exported
from .hostlist import read_targets_file as read_targets_file  # re-exported
from .targets import valid_host

MISSING_EXTRA = ("reading an Ansible inventory needs ansible-core, which is not installed: "
                 "pip install 'pytest-gpuhost[ansible]' (from a checkout: pip install "
                 "'.[ansible]')")
PROMPTS = ("prompt", "prompt_ask_vault_pass")
VAULT_HINT = ("set ANSIBLE_VAULT_PASSWORD_FILE=FILE (or vault_password_file in ansible.cfg, or "
              "vault ids in ANSIBLE_VAULT_IDENTITY_LIST), as ansible-inventory needs")
INVENTORY_TIMEOUT_S = 120.0
"""The longest Ansible may take to read an inventory. Its script plugin (on by default: an
executable inventory file) waits on the script without a limit, and a plugin that asks a CMDB
or a cloud API may wait as long on the network."""


def read_inventory(path: Path, limit: str | None = None, *,
                   host_errors: bool = False) -> list[InventoryHost]:
    """The hosts of the inventory at ``path`` (INI, YAML, a directory, or any inventory plugin
    Ansible's configuration enables), selected by ``limit`` (``gpu``, ``node01``, ``gpu:!login``,
    ``gpu:&rack1``, ``node0*``, ``~node0[12]``), sorted by name.

    A host variable Ansible cannot template (an undefined variable) is an InventoryError, or,
    with ``host_errors``, a host whose ``error`` says why, the others as they are (Ansible fails
    that host and runs the rest). A value pytest-gpuhost cannot use (a port that is no number,
    a connection that is neither ssh nor local) and an inventory that cannot be read at all (a
    vault without its secret, a file Ansible cannot parse) are always an InventoryError, in one
    line.

    Read in a daemon thread, waited for INVENTORY_TIMEOUT_S: an inventory script that never
    answers is an error then, not a run that never starts (the script is left to itself)."""
    if not path.exists():
        raise InventoryError(f"{path}: no such inventory file")
    path = path.absolute()  # Ansible's INI plugin refuses a relative source
    try:
        return within(INVENTORY_TIMEOUT_S, lambda: _read_inventory(path, limit, host_errors),
                      name="inventory")
    except StillRunning:
        raise InventoryError(f"{path}: Ansible did not finish reading the inventory within "
                             f"{INVENTORY_TIMEOUT_S:g} s: an inventory script or plugin that "
                             "waits on something (a CMDB or cloud API that does not answer); run "
                             "ansible-inventory -i FILE --list to see it hang, or write the hosts "
                             "to a static inventory") from None


def _read_inventory(path: Path, limit: str | None, host_errors: bool) -> list[InventoryHost]:
    data_loader, inventory_manager, variable_manager, templar = _ansible()
    loader = data_loader()
    labels: list[str] = []
    try:
        labels = _vault_secrets(loader)
        return _read_with(path, limit, host_errors, loader, inventory_manager,
                          variable_manager, templar)
    except InventoryError:
        raise
    except Exception as exc:  # whatever ansible-core raises: one line, never a traceback
        raise InventoryError(f"{path}: {_one_line(exc, labels)}") from None


def _one_line(exc: BaseException, labels: Sequence[str] = ()) -> str:
    """What Ansible said, on one line, after the file it was about where it knows it, with
    what to do where it is about the vault (``labels``: the vault ids that were given)."""
    text = " ".join(str(getattr(exc, "message", None) or exc or type(exc).__name__).split())
    where = _origin(exc)
    if where and where not in text:
        text = f"{where}: {text}"
    if not _about_the_vault(exc):
        return text
    if labels:
        return (f"{text} (encrypted with Ansible Vault; the vault ids given, "
                f"{', '.join(labels)}, do not decrypt it: check the password file, or add the "
                "vault id it was encrypted with to ANSIBLE_VAULT_IDENTITY_LIST)")
    return f"{text} (encrypted with Ansible Vault: {VAULT_HINT})"


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _origin(exc: BaseException) -> str | None:
    """``FILE[:LINE[:COL]]`` of what an exception of the chain was about, where Ansible
    tagged it (2.19's Origin tag; earlier versions' ``ansible_pos``)."""
    for each in _chain(exc):
        obj = getattr(each, "obj", None)
        if obj is None:
            continue
        if isinstance(getattr(obj, "path", None), str) and hasattr(obj, "line_num"):
            return str(obj)  # 2.19's YAML errors hold the Origin itself
        try:
            from ansible._internal._datatag._tags import Origin  # 2.19+; not a public API

            origin = Origin.get_tag(obj)
        except Exception:  # another version: its own attribute, or nothing
            origin = None
        if origin is not None and getattr(origin, "path", None):
            return str(origin)
        position = getattr(obj, "ansible_pos", None)
        if isinstance(position, tuple) and position and position[0]:
            return ":".join(str(part) for part in position)
    return None


VAULT_ERRORS = ("AnsibleVaultError", "UndecryptableVaultError", "AnsibleVaultPasswordError")
"""ansible-core's exceptions for what could not be decrypted (by class name: they moved
between versions). An undefined ``vault_*`` variable is none of them: it fails its host."""


def _about_the_vault(exc: BaseException) -> bool:
    return any(type(each).__name__ in VAULT_ERRORS or "decrypt" in str(each).lower()
               for each in _chain(exc))


def _vault_secrets(loader: Any) -> list[str]:
    """The vault secrets Ansible's commands load without a prompt: the vault ids of
    DEFAULT_VAULT_IDENTITY_LIST, then DEFAULT_VAULT_PASSWORD_FILE (what ``--vault-id`` and
    ``--vault-password-file`` add to on the command line), each a file or a script. A prompt
    cannot be answered in a pytest run: it is an error saying so. Read from the environment at
    each call (a run's ANSIBLE_VAULT_PASSWORD_FILE), the configuration file as Ansible found it.
    The labels of the secrets loaded."""
    from ansible import constants
    from ansible.parsing.vault import get_file_vault_secret

    def setting(name: str) -> Any:
        return constants.config.get_config_value(name)

    default_id = str(setting("DEFAULT_VAULT_IDENTITY") or "default")
    slugs = [str(slug) for slug in setting("DEFAULT_VAULT_IDENTITY_LIST") or ()]
    password_file = setting("DEFAULT_VAULT_PASSWORD_FILE")
    if password_file:
        slugs.append(f"{default_id}@{password_file}")
    secrets: list[tuple[str, Any]] = []
    failures: list[str] = []
    for slug in slugs:
        label, at, source = slug.partition("@")
        label, source = (label, source) if at else (default_id, slug)
        if source in PROMPTS:
            raise InventoryError(f"vault id {slug!r} asks for its password at a prompt, which a "
                                 "pytest run cannot answer: give it in a file (ANSIBLE_VAULT_"
                                 "PASSWORD_FILE=FILE, or vault ids LABEL@FILE)")
        try:
            secret = get_file_vault_secret(filename=source, vault_id=label, loader=loader)
            secret.load()
        except Exception as exc:  # Ansible warns and tries the next, as here
            failures.append(f"vault id {label}@{source}: "
                            + " ".join(str(getattr(exc, "message", None) or exc).split()))
            continue
        secrets.append((label, secret))
    if failures and not secrets:
        raise InventoryError("; ".join(failures))
    loader.set_vault_secrets(secrets)
    labels = [label for label, _ in secrets]
    try:  # ansible-core 2.19 decrypts inline !vault values through a process-wide context
        from ansible.parsing.vault import VaultSecretsContext
    except ImportError:
        return labels
    current = VaultSecretsContext.current(optional=True)
    if current is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:  # a second inventory in this process: its secrets, as a new command would have
        current.secrets = secrets
    return labels


def _read_with(path: Path, limit: str | None, host_errors: bool, loader: Any,
               inventory_manager: Any, variable_manager: Any, templar: Any
               ) -> list[InventoryHost]:
    inventory = inventory_manager(loader=loader, sources=[str(path)], parse=False)
    with _AnsibleSays() as said:  # what it would print, it says through our messages
        if not inventory.parse_source(str(path)):
            raise InventoryError(f"{path}: Ansible could not parse it as an inventory (INI, "
                                 f"YAML or an enabled inventory plugin){said.why(path)}")
        inventory.reconcile_inventory()
        everything = len(inventory.get_hosts("all"))
        if not everything:
            raise InventoryError(f"{path}: the inventory defines no hosts")
        hosts = _select(inventory, limit)
    if not hosts:
        raise InventoryError(f"the limit {limit!r} matches none of the {everything} hosts in "
                             f"{path}")
    variables = variable_manager(loader=loader, inventory=inventory)
    found = []
    for host in hosts:
        values = variables.get_vars(host=host, include_hostvars=False)
        name = str(host.name)  # a plain str: Ansible 2.19 tags what it parsed (its origin)
        try:
            found.append(_host(name, _Resolver(templar(loader=loader, variables=values),
                                               values, name, path)))
        except HostVariableError as exc:
            if not host_errors:
                raise
            found.append(InventoryHost(name, name, error=f"{exc} (Ansible would fail this "
                                                         "host and run the others; so does "
                                                         "this run)"))
    return sorted(found, key=lambda h: h.name)


def _select(inventory: Any, limit: str | None) -> list[Any]:
    if not limit:
        return list(inventory.get_hosts("all"))
    try:
        inventory.subset(limit)
        return list(inventory.get_hosts("all"))
    except Exception as exc:  # Ansible's own pattern parser: IndexError, AnsibleError
        raise InventoryError(f"the limit {limit!r} is not a pattern Ansible accepts: "
                             f"{type(exc).__name__}: {exc}") from None


class _AnsibleSays:
    """What Ansible reports while it parses a source, kept instead of printed: each inventory
    plugin's failure (ansible-core 2.19 hands the exception, with a file:line:column where its
    YAML parser knew one; earlier versions a warning line)."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, BaseException]] = []
        self.warnings: list[str] = []

    def __enter__(self) -> _AnsibleSays:
        from ansible.utils.display import Display

        self.display = Display()  # Ansible's one display

        def failed(msg: str, exception: BaseException, **_: object) -> None:
            self.failures.append((msg, exception))

        def warned(msg: str, *_: object, **__: object) -> None:
            self.warnings.append(" ".join(str(msg).split()))

        self.display.error_as_warning = failed
        self.display.warning = warned
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("error_as_warning", "warning"):
            self.display.__dict__.pop(name, None)

    def why(self, path: Path) -> str:
        """``: FILE:LINE:COL: message (Ansible's yaml plugin)``, the failure that says most."""
        found = []
        for msg, exc in self.failures:
            origin = getattr(exc, "obj", None)
            line, column = getattr(origin, "line_num", None), getattr(origin, "col_num", None)
            plugin = msg.split("'")[1] if msg.count("'") >= 2 else "an inventory"
            text = " ".join(str(getattr(exc, "message", None) or exc).split())
            where = f"{path}:{line}:{column}: " if line is not None and column is not None \
                else f"{path}:{line}: " if line is not None else ""
            suits = plugin == ("yaml" if path.suffix in (".yml", ".yaml", ".json") else "ini")
            found.append((line is not None, suits, f"{where}{text} (Ansible's {plugin} plugin)"))
        if found:
            return ": " + max(found, key=lambda f: (f[0], f[1]))[2]
        failed = [w for w in self.warnings if "Failed to parse" in w]
        return f": {failed[0].lstrip('* ')}" if failed else ""


def _ansible() -> tuple[Any, Any, Any, Any]:
    try:
        from ansible.inventory.manager import InventoryManager
        from ansible.parsing.dataloader import DataLoader
        from ansible.template import Templar
        from ansible.vars.manager import VariableManager
    except ImportError:
        raise InventoryError(MISSING_EXTRA) from None
    return DataLoader, InventoryManager, VariableManager, Templar


class _Resolver(msgspec.Struct, frozen=True):
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
            if _about_the_vault(exc):  # an inline !vault value without its secret: all hosts
                raise
            raise HostVariableError(f"{self.source}: host {self.host}: {name}: "
                                    f"{_one_line(exc)}") from None


def _host(name: str, variables: _Resolver) -> InventoryHost:
    """One host of an inventory, each of its variables checked in turn (the first wrong one
    is the error, naming the inventory and the host)."""
    refuse_bad_name(name, variables.source)
    port = _port(name, variables)
    args = _ssh_args(name, variables)
    root = _root(name, variables)
    connection = _connection(name, variables)
    python = _python(name, variables)
    address = variables.last(HOST_VARS) or name
    if connection != "local" and not valid_host(address):
        raise InventoryError(f"{variables.source}: host {name}: ansible_host="
                             f"{excerpt(address)} is not a host name or address")
    spec = _spec(name, variables)
    return InventoryHost(name=name, address=address, port=port,
                         user=variables.last(USER_VARS),
                         identity_file=variables.last(KEY_VARS), ssh_args=args,
                         root=root, local=connection == "local", python=python, spec=spec)


def _port(name: str, variables: _Resolver) -> int | None:
    port = variables.last(PORT_VARS)
    if port is not None and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise InventoryError(f"{variables.source}: host {name}: ansible_port must be a port "
                             f"number (1-65535), got {excerpt(port)}")
    return int(port) if port is not None else None


def _ssh_args(name: str, variables: _Resolver) -> tuple[str, ...]:
    """The ssh options a host's variables add, each a word ssh reads as an option."""
    args: list[str] = []
    for var in ARGS_VARS:
        if variables.values.get(var) is not None:
            text = variables.template(var)
            try:
                words = shlex.split(text)
            except ValueError as exc:
                raise InventoryError(f"{variables.source}: host {name}: {var}: {exc}: "
                                     f"{excerpt(text)}") from None
            stray = not_ssh_options(words)
            if stray is not None:
                raise InventoryError(f"{variables.source}: host {name}: {var}: {stray}: "
                                     f"{excerpt(text)}")
            args += words
    return tuple(args)


def _root(name: str, variables: _Resolver) -> str:
    root = variables.last(ROOT_VARS) or "/"
    if not root.startswith("/") or "\0" in root:
        raise InventoryError(f"{variables.source}: host {name}: gpuhost_root must be an absolute "
                             f"path, got {excerpt(root)}")
    return root


def _connection(name: str, variables: _Resolver) -> str:
    """``ssh`` (or one of its plugins' names) or ``local``: how the host is reached."""
    connection = (variables.last(CONNECTION_VARS) or "ssh").removeprefix("ansible.builtin.")
    if connection not in (*SSH_CONNECTIONS, "local"):
        raise InventoryError(f"{variables.source}: host {name}: ansible_connection="
                             f"{connection}: pytest-gpuhost reaches a host over ssh, or with "
                             "local this machine; give the host ssh access (or check its "
                             "containers through ssh://HOST?lxc=CTID)")
    return connection


def _python(name: str, variables: _Resolver) -> str | None:
    """The host's python where the inventory names one (None: discovered, as Ansible does)."""
    python = variables.last(PYTHON_VARS)
    if python is not None and (python in DISCOVERED_PYTHON or not python):
        return None
    if python is not None and (python.startswith("-") or
                               (not python.startswith("/") and "/" in python) or
                               any(c.isspace() or c == "\0" for c in python)):
        raise InventoryError(f"{variables.source}: host {name}: ansible_python_interpreter "
                             f"must be a command or an absolute path, got {excerpt(python)}")
    return python


def _spec(name: str, variables: _Resolver) -> str | None:
    spec = variables.last(SPEC_VARS)
    if spec is not None and (not spec.strip() or "\0" in spec):
        raise InventoryError(f"{variables.source}: host {name}: gpuhost_spec must name a spec "
                             f"(a bundled spec's name or a YAML file), got {excerpt(spec)}")
    return spec.strip() if spec is not None else None
