"""Targets: the machines a run checks, named by URL (``--gpuhost-target``, ``gpuhost_targets``).

- ``local``: this machine at ``--gpuhost-root``.
- ``ssh://[USER@]HOST[:PORT][/ROOT]``: a machine reached with the OpenSSH client and the user's
  ssh configuration. The path is the host root there (``ssh://root@pve`` and ``ssh://root@pve/``
  mean ``/``; ``ssh://h:2222/tmp/tree`` means ``/tmp/tree``).
- ``lxc://CTID[/ROOT]``: an LXC container of the machine pytest runs on, entered with
  ``lxc-attach -n CTID --`` (what Proxmox's ``pct exec`` runs); ``ssh://root@pve?lxc=101``: a
  container of a remote host, entered the same way over ssh.
- ``?name=NAME`` names a target in ids and reports; by default a target is named by its host
  (``pve``), then host and port, then with its root, whichever makes the names unique.
- In a targets file (``--gpuhost-targets-file``), a bare ``[USER@]HOST[:PORT]`` means
  ``ssh://[USER@]HOST[:PORT]``. Hosts of an Ansible inventory (``inventory``) are ssh targets
  named by their inventory names, with a key file and ssh arguments of their own.

The same target twice is refused wherever the two came from: the same name given twice, the same
URL, the same machine and root (over the same ssh arguments) under two names, or a target named
after its host when another source names a target so.

Pure: parsing and naming only; hosts are made by the ``pytest_gpuhost_make_host`` hook.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

LOCAL = "local"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*\Z")
_HOST = re.compile(r"[A-Za-z0-9_.:\[\]-]+\Z")
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_UNNAMED = re.compile(r"[^A-Za-z0-9._:-]")


class TargetError(ValueError):
    """A target that cannot be used; the message says what was expected."""


@dataclass(frozen=True)
class TargetAddress:
    url: str
    scheme: str
    """``local``, ``ssh`` or ``lxc``."""
    host: str | None = None
    user: str | None = None
    port: int | None = None
    root: str = "/"
    container: str | None = None
    name: str = LOCAL
    identity_file: str | None = None
    """ssh ``-i FILE`` (an inventory's ``ansible_ssh_private_key_file``)."""
    ssh_args: tuple[str, ...] = ()
    """More ssh arguments, before the run's own (an inventory's ``ansible_ssh_common_args``)."""
    source: str = ""
    """Where the target was given (``--gpuhost-inventory=hosts.ini``), for messages."""

    @property
    def local(self) -> bool:
        return self.scheme == LOCAL

    @property
    def shown(self) -> str:
        """The target for a message: its URL and where it was given."""
        return f"{self.url} ({self.source})" if self.source else self.url


def valid_name(text: str) -> bool:
    """Whether ``text`` can name a target in ids (it ends them: ``...@NAME``)."""
    return bool(_NAME.match(text))


def valid_host(text: str) -> bool:
    """Whether ``text`` is a host name or address ssh can be given (never an option)."""
    return bool(_HOST.match(text)) and not text.startswith("-")


def parse_target(text: str) -> TargetAddress:
    """One target URL; TargetError saying what is wrong and what was expected (never another
    exception, whatever the text: a URL that does not parse, an option where a host belongs)."""
    raw = text.strip()
    if raw == LOCAL:
        return TargetAddress(LOCAL, LOCAL)
    try:
        parts = urlsplit(raw)
        password = parts.password
    except ValueError as exc:  # an unclosed '[', a bracketed host that is no IPv6 address
        raise TargetError(f"{raw!r} is not a URL ({exc}): expected local, "
                          "ssh://[USER@]HOST[:PORT][/ROOT] or lxc://CTID[/ROOT]") from None
    if password is not None:
        shown = raw.replace(f":{parts.password}@", ":***@", 1)
        raise TargetError(f"{shown!r}: a target URL takes no password (ssh runs with "
                          "BatchMode=yes: keys, an agent and your ssh configuration); it would "
                          "only be written into the reports: remove it")
    if parts.scheme not in ("ssh", "lxc"):
        raise TargetError(f"{raw!r} is not a target: expected local, ssh://[USER@]HOST[:PORT]"
                          "[/ROOT], lxc://CTID[/ROOT] or ssh://USER@HOST?lxc=CTID")
    if parts.fragment:
        raise TargetError(f"{raw!r}: a target has no #fragment; name it with ?name=NAME")
    query = _query(raw, parts.query)
    root = unquote(parts.path) or "/"
    if "\0" in root or not root.startswith("/"):
        raise TargetError(f"{raw!r}: the root must be an absolute path")
    name = query.get("name")
    if name is not None and not _NAME.match(name):
        raise TargetError(f"{raw!r}: name={name!r} must be letters, digits, '.', '_', ':' or "
                          "'-'")
    if parts.scheme == "lxc":
        return _lxc_target(raw, parts.netloc, query, root, name or "")
    return _ssh_target(raw, parts, query, root, name or "")


def _query(raw: str, text: str) -> dict[str, str]:
    query = {key: values[-1] for key, values in parse_qs(text, strict_parsing=False,
                                                         keep_blank_values=True).items()}
    unknown = sorted(set(query) - {"name", "lxc"})
    if unknown:
        raise TargetError(f"{raw!r}: unknown parameter(s) {', '.join(unknown)}; a target "
                          "takes name= and, for ssh, lxc=")
    return query


def _lxc_target(raw: str, netloc: str, query: dict[str, str], root: str,
                name: str) -> TargetAddress:
    container = unquote(netloc)
    if not _CONTAINER.match(container):
        raise TargetError(f"{raw!r}: lxc://CTID needs a container id or name")
    if "lxc" in query:
        raise TargetError(f"{raw!r}: lxc= belongs to ssh:// targets")
    return TargetAddress(raw, "lxc", container=container, root=root, name=name)


def _ssh_target(raw: str, parts: SplitResult, query: dict[str, str], root: str,
                name: str) -> TargetAddress:
    host = parts.hostname
    if not host or not valid_host(host):
        raise TargetError(f"{raw!r}: ssh:// needs a host name or address (and no option-like "
                          "name)")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is not None and not 0 < port < 65536:
        raise TargetError(f"{raw!r}: the port must be a number from 1 to 65535")
    user = unquote(parts.username) if parts.username else None
    if user is not None and (not user or user.startswith("-") or not _NAME.match(user)):
        raise TargetError(f"{raw!r}: {user!r} is not a user name")
    inside = query.get("lxc")
    if inside is not None and not _CONTAINER.match(inside):
        raise TargetError(f"{raw!r}: lxc={inside!r} is not a container id or name")
    return TargetAddress(raw, "ssh", host=host, user=user, port=port, root=root,
                         container=inside, name=name)


def parse_target_line(text: str) -> TargetAddress:
    """A line of a targets file: a target URL, or a bare ``[USER@]HOST[:PORT]`` for ssh."""
    raw = text.strip()
    return parse_target(raw if raw == LOCAL or "://" in raw else f"ssh://{raw}")


def _destination(target: TargetAddress) -> tuple[object, ...]:
    """What makes two targets the same machine and root, whatever they are named."""
    return (target.scheme, target.host, target.port, target.root, target.container,
            target.ssh_args)


def _refuse_duplicates(targets: Sequence[TargetAddress]) -> None:
    by_name: dict[str, TargetAddress] = {}
    for target in targets:
        other = by_name.setdefault(target.name, target) if target.name else target
        if other is not target:
            raise TargetError(f"two targets are named {target.name}: {other.shown} and "
                              f"{target.shown}")
    by_url: dict[str, TargetAddress] = {}
    by_place: dict[tuple[object, ...], TargetAddress] = {}
    for target in targets:
        other = by_url.setdefault(target.url, target)
        if other is not target:
            raise TargetError(f"target {target.url} is given twice" + (
                f" ({other.source} and {target.source})" if other.source or target.source
                else ""))
        other = by_place.setdefault(_destination(target), target)
        if other is not target:
            raise TargetError(f"{other.shown} and {target.shown} are the same target (the same "
                              "machine and root): give it once")
    for target in targets:
        clash = by_name.get(_candidates(target)[0]) if not target.name else None
        if clash is not None:
            raise TargetError(f"{target.shown} would be named {clash.name}, as {clash.shown} "
                              "is: give one of them ?name=NAME, or drop the duplicate")


def _candidates(target: TargetAddress) -> list[str]:
    """Names from short to unique: host, host:port, host:port/root (containers: lxc-CTID),
    each kept to the characters a name may hold (``_name``)."""
    if target.local:
        return [LOCAL]
    base = target.host or ""
    if target.container is not None:
        base = f"{base}-lxc-{target.container}" if base else f"lxc-{target.container}"
    with_port = f"{base}:{target.port}" if target.port else base
    rooted = with_port if target.root == "/" else \
        f"{with_port}:{target.root.strip('/').replace('/', '.')}"
    return [_name(base), _name(with_port), _name(rooted), _name(target.url)]


def _name(text: str) -> str:
    """``text`` as a target's name: each character a name may not hold (a root's newline,
    ``<``, a space; a URL's ``/``) written ``_``, so that a derived name keeps the rule an
    explicit ``?name=`` is held to (it ends every check's id and is shown everywhere)."""
    name = _UNNAMED.sub("_", text)
    return name if _NAME.match(name) else f"t{name}"


def name_targets(targets: Sequence[TargetAddress]) -> list[TargetAddress]:
    """Each target with a name no other has; explicit names (``?name=``, an inventory's) win
    and must be unique; the same target twice is refused (see the module's docstring)."""
    _refuse_duplicates(targets)
    for level in range(4):
        names = [t.name or _candidates(t)[level] for t in targets]
        if len(set(names)) == len(names):
            return [replace(t, name=n) for t, n in zip(targets, names, strict=True)]
    # roots that differ only in characters a name cannot hold: numbered in the order given
    return [replace(t, name=t.name or f"{_candidates(t)[2]}-{number}")
            for number, t in enumerate(targets, 1)]


def parse_targets(texts: Sequence[str]) -> list[TargetAddress]:
    return name_targets([parse_target(text) for text in texts])
