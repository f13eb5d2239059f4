"""Targets: the machines a run checks, named by URL (``--gpuhost-target``, ``gpuhost_targets``).

- ``local``: this machine at ``--gpuhost-root``.
- ``ssh://[USER@]HOST[:PORT][/ROOT]``: a machine reached with the OpenSSH client and the user's
  ssh configuration. The path is the host root there (``ssh://root@pve`` and ``ssh://root@pve/``
  mean ``/``; ``ssh://h:2222/tmp/tree`` means ``/tmp/tree``).
- ``lxc://CTID[/ROOT]``: an LXC container of the machine pytest runs on, entered with
  ``lxc-attach -n CTID --`` (what Proxmox's ``pct exec`` runs); ``ssh://root@pve?lxc=101``: a
  container of a remote host, entered the same way over ssh.
- A plugin adds a scheme (``docker://``...): ``Scheme``, registered with the
  ``pytest_gpuhost_target_schemes`` hook as the three above are (``builtin``); its hosts are
  made by ``pytest_gpuhost_make_host``, which gets the parsed ``TargetAddress``.
- ``?name=NAME`` names a target in ids and reports; by default a target is named by its host
  (``pve``), then host and port, then with its root, whichever makes the names unique.
  ``?spec=SPEC`` (any scheme) is the spec the target runs instead of ``--gpuhost-spec``.
- A container by construction (``lxc://``, ``ssh://HOST?lxc=CTID``, a plugin's scheme that
  declares ``Scheme.host``) runs on a kernel of another machine, its host:
  ``targetoptions.place_kernels`` adds that host to the run (or finds it among the targets)
  and names it in ``kernel_on``,
  where the session runs the container's ``kernel`` checks. ``--gpuhost-host`` does the same
  for this machine (the ``local`` target) from inside a container.
- In a targets file (``--gpuhost-targets-file``), a bare ``[USER@]HOST[:PORT]`` means
  ``ssh://[USER@]HOST[:PORT]``. Hosts of an Ansible inventory (``inventory``) are ssh targets
  named by their inventory names, with a key file and ssh arguments of their own.

The same target twice is refused wherever the two came from: the same name given twice, the same
URL, the same machine and root (over the same ssh arguments) under two names or two spellings
(``ssh://h/R``, ``ssh://h:22/R/``, ``ssh://h/./R``: ``normal_root``, ``destination``), or a target
named after its host when another source names a target so. Two names of one machine that its URLs
do not tell apart (two aliases, a name and an address) are told by the machine itself once reached
(``session/machines.py``).

Pure: parsing and naming only, by the schemes a run was given (``BUILTIN`` by default); hosts
are made by the ``pytest_gpuhost_make_host`` hook.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit, urlunsplit

import msgspec
from msgspec.structs import replace

LOCAL = "local"
# Patterns as strings: ``re`` compiles (and keeps) each at its first use, which a run of this
# machine alone may never make.
_NAME = r"[A-Za-z0-9][A-Za-z0-9._:-]*\Z"
_HOST = r"[A-Za-z0-9_.:\[\]-]+\Z"
_CONTAINER = r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z"
_SCHEME = r"[a-z][a-z0-9+.-]*\Z"
"""A scheme's name: lowercase, as ``urlsplit`` gives it (a URL's own may be any case)."""
_UNNAMED = r"[^A-Za-z0-9._:-]"
SHARED_PARAMETERS = ("name", "spec")
"""The ``?KEY=VALUE`` parameters every scheme takes: the target's name and its own spec."""


class TargetError(ValueError):
    """A target that cannot be used; the message says what was expected."""


class TargetAddress(msgspec.Struct, frozen=True):
    url: str
    scheme: str
    """``local``, ``ssh``, ``lxc`` or a plugin's (``Scheme.name``)."""
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
    python: str | None = None
    """The python the agent runs under there (an inventory's ``ansible_python_interpreter``);
    None: ``python3``."""
    error: str | None = None
    """Why this target cannot be used (an inventory host whose variables Ansible could not
    resolve): its checks are errors saying so, and the other targets run."""
    spec: str | None = None
    """The spec this target runs instead of the run's (``?spec=``, an inventory's
    ``gpuhost_spec``, a targets file's second column): as given, then (``settings``) the
    resolved path."""
    kernel_on: str | None = None
    """The name of the target whose kernel this one runs on (a container's host), where its
    ``kernel`` checks run; None: its own (``place_kernels``)."""
    implied: str | None = None
    """Why the run has this target though no option named it (``the host of lxc://101``): it
    runs only the ``kernel`` checks of the targets on it."""

    @property
    def local(self) -> bool:
        return self.scheme == LOCAL

    @property
    def shown(self) -> str:
        """The target for a message: its URL and where it was given."""
        return f"{self.url} ({self.source})" if self.source else self.url


def valid_name(text: str) -> bool:
    """Whether ``text`` can name a target in ids (it ends them: ``...@NAME``)."""
    return bool(re.match(_NAME, text))


def valid_host(text: str) -> bool:
    """Whether ``text`` is a host name or address ssh can be given (never an option)."""
    return bool(re.match(_HOST, text)) and not text.startswith("-")


# -- schemes ---------------------------------------------------------------------------------------


class TargetUrl(msgspec.Struct, frozen=True):
    """A target URL as every scheme's parser gets it, once what all schemes share is checked:
    no ``#fragment``, only known ``?parameters``, an absolute root, a valid ``name=``."""

    text: str
    parts: SplitResult
    query: Mapping[str, str]
    """Each ``?KEY=VALUE`` (the last of a key given twice), ``name`` included."""
    root: str
    name: str
    """``?name=NAME``, or "" to name the target after its host."""


class Scheme(msgspec.Struct, frozen=True):
    """A kind of target, found by its URL's scheme: how its URLs look and parse, and how its
    targets are named by default. A plugin registers one with ``pytest_gpuhost_target_schemes``
    and makes its hosts with ``pytest_gpuhost_make_host``, as the built-in ones are."""

    name: str
    """The URL's scheme (``docker`` for ``docker://...``); for a ``bare`` one, the whole URL."""
    forms: tuple[str, ...]
    """Its URLs as messages show them (``docker://CONTAINER[/ROOT]``)."""
    parse: Callable[[TargetUrl], TargetAddress]
    """The address of a URL; TargetError saying what is wrong and what was expected."""
    parameters: tuple[str, ...] = ()
    """The ``?KEY=VALUE`` parameters it takes beyond ``name``."""
    base_name: Callable[[TargetAddress], str] | None = None
    """A target's shortest default name; None: its host, else ``SCHEME-CONTAINER``."""
    bare: bool = False
    """Its URL is its name alone, with nothing more (``local``)."""
    host: Callable[[TargetAddress], TargetAddress | None] | None = None
    """For a scheme of containers: the machine a target runs on, whose kernel it shares (its
    ``kernel`` checks run there); None, or a None answer: the target is its own kernel's."""


Schemes = Mapping[str, Scheme]


def _default_base_name(target: TargetAddress) -> str:
    if target.host:
        return target.host
    return f"{target.scheme}-{target.container}" if target.container else target.scheme


def _parse_local(url: TargetUrl) -> TargetAddress:
    return TargetAddress(LOCAL, LOCAL)


def _parse_lxc(url: TargetUrl) -> TargetAddress:
    container = unquote(url.parts.netloc)
    if not re.match(_CONTAINER, container):
        raise TargetError(f"{url.text!r}: lxc://CTID needs a container id or name")
    return TargetAddress(url.text, "lxc", container=container, root=url.root, name=url.name)


def _parse_ssh(url: TargetUrl) -> TargetAddress:
    raw, parts = url.text, url.parts
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
    if user is not None and (not user or user.startswith("-") or not re.match(_NAME, user)):
        raise TargetError(f"{raw!r}: {user!r} is not a user name")
    inside = url.query.get("lxc")
    if inside is not None and not re.match(_CONTAINER, inside):
        raise TargetError(f"{raw!r}: lxc={inside!r} is not a container id or name")
    return TargetAddress(raw, "ssh", host=host, user=user, port=port, root=url.root,
                         container=inside, name=url.name)


def _ssh_base_name(target: TargetAddress) -> str:
    host = target.host or ""
    return f"{host}-lxc-{target.container}" if target.container is not None else host


def _lxc_base_name(target: TargetAddress) -> str:
    return f"lxc-{target.container}"


def _lxc_host(target: TargetAddress) -> TargetAddress:
    """An LXC container of this machine runs on this machine's kernel (at --gpuhost-root)."""
    return TargetAddress(LOCAL, LOCAL)


def _ssh_host(target: TargetAddress) -> TargetAddress | None:
    """``ssh://HOST/ROOT?lxc=CTID`` runs on ``ssh://HOST/ROOT``: the same login (user, port, key,
    ssh arguments, python), without the container."""
    if target.container is None:
        return None
    parts = urlsplit(target.url)
    return replace(target, url=urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "",
                                           "")), container=None, name="", spec=None,
                   error=None, kernel_on=None, implied=None)


BUILTIN_SCHEMES = (
    Scheme(LOCAL, (LOCAL,), _parse_local, bare=True),
    Scheme("ssh", ("ssh://[USER@]HOST[:PORT][/ROOT]", "ssh://USER@HOST?lxc=CTID"), _parse_ssh,
           parameters=("lxc",), base_name=_ssh_base_name, host=_ssh_host),
    Scheme("lxc", ("lxc://CTID[/ROOT]",), _parse_lxc, base_name=_lxc_base_name,
           host=_lxc_host),
)
"""This machine, ssh and LXC: registered through ``pytest_gpuhost_target_schemes`` as a
plugin's scheme is (``builtin``)."""


def scheme_registry(batches: Iterable[Iterable[Scheme]]) -> dict[str, Scheme]:
    """The schemes of every plugin, by name; two different schemes of one name are refused
    (the same one twice is a re-exported hook)."""
    registry: dict[str, Scheme] = {}
    for batch in batches:
        for scheme in batch:
            if not re.match(_SCHEME, scheme.name):
                raise TargetError(f"target scheme {scheme.name!r} is not a URL scheme: lowercase "
                                  "letters, digits, '+', '-', '.', starting with a letter")
            claimed = registry.setdefault(scheme.name, scheme)
            if claimed != scheme:
                raise TargetError(f"two plugins register the target scheme {scheme.name!r}: "
                                  f"{claimed.forms[0]} and {scheme.forms[0]}")
    return registry


BUILTIN: Schemes = MappingProxyType(scheme_registry([BUILTIN_SCHEMES]))


def _forms(schemes: Schemes) -> str:
    forms = [form for scheme in schemes.values() for form in scheme.forms]
    return ", ".join(forms[:-1]) + f" or {forms[-1]}" if len(forms) > 1 else "".join(forms)


def _url(raw: str, scheme: Scheme) -> TargetUrl:
    """What every scheme's URL must be (see ``TargetUrl``); never another exception than
    TargetError, whatever the text (a URL that does not parse, a password)."""
    try:
        parts = urlsplit(raw)
        password = parts.password
    except ValueError as exc:  # an unclosed '[', a bracketed host that is no IPv6 address
        raise TargetError(f"{raw!r} is not a URL ({exc}): expected {scheme.forms[0]}") from None
    if password is not None:
        shown = raw.replace(f":{password}@", ":***@", 1)
        raise TargetError(f"{shown!r}: a target URL takes no password (ssh runs with "
                          "BatchMode=yes: keys, an agent and your ssh configuration); it would "
                          "only be written into the reports: remove it")
    if scheme.bare:
        return TargetUrl(raw, parts, {}, "/", "")
    if parts.fragment:
        raise TargetError(f"{raw!r}: a target has no #fragment; name it with ?name=NAME")
    query = {key: values[-1] for key, values in parse_qs(parts.query, strict_parsing=False,
                                                         keep_blank_values=True).items()}
    unknown = sorted(set(query) - {*SHARED_PARAMETERS, *scheme.parameters})
    if unknown:
        takes = [f"{p}=" for p in (*SHARED_PARAMETERS, *scheme.parameters)]
        raise TargetError(f"{raw!r}: unknown parameter(s) {', '.join(unknown)}; a "
                          f"{scheme.name}:// target takes {', '.join(takes[:-1])} and "
                          f"{takes[-1]}")
    spec = query.get("spec")
    if spec is not None and (not spec.strip() or "\0" in spec):
        raise TargetError(f"{raw!r}: spec= names a spec: a bundled spec's name or a YAML file")
    root = unquote(parts.path) or "/"
    if "\0" in root or not root.startswith("/"):
        raise TargetError(f"{raw!r}: the root must be an absolute path")
    root = normal_root(root)
    name = query.get("name")
    if name is not None and not re.match(_NAME, name):
        raise TargetError(f"{raw!r}: name={name!r} must be letters, digits, '.', '_', ':' or "
                          "'-'")
    return TargetUrl(raw, parts, query, root, name or "")


def normal_root(root: str) -> str:
    """An absolute root as one spelling: ``.`` and repeated or trailing ``/`` dropped
    (``/./srv//tree/`` is ``/srv/tree``), as the kernel resolves them. ``..`` stays: behind a
    link it leads elsewhere than the text says, so only the machine can resolve it."""
    return "/" + "/".join(part for part in root.split("/") if part not in ("", "."))


def parse_target(text: str, schemes: Schemes = BUILTIN) -> TargetAddress:
    """One target URL, parsed by the scheme that owns it; TargetError saying what is wrong and
    what was expected. ``?spec=`` is every scheme's: the target carries it as given."""
    raw = text.strip()
    scheme = schemes.get(raw.split("://", 1)[0].lower() if "://" in raw else raw)
    if scheme is None or scheme.bare != ("://" not in raw):
        raise TargetError(f"{raw!r} is not a target: expected {_forms(schemes)}")
    url = _url(raw, scheme)
    address = scheme.parse(url)
    spec = url.query.get("spec")
    return replace(address, spec=spec.strip()) if spec is not None else address


def parse_target_line(text: str, schemes: Schemes = BUILTIN) -> TargetAddress:
    """A line of a targets file: a target URL, or a bare ``[USER@]HOST[:PORT]`` for ssh."""
    raw = text.strip()
    bare = raw in schemes and schemes[raw].bare
    return parse_target(raw if bare or "://" in raw else f"ssh://{raw}", schemes)


SSH_PORT = 22
"""ssh's own port: ``ssh://h:22`` and ``ssh://h`` reach one sshd (unless the user's ssh
configuration gives ``h`` another port, a setup the docs tell to name with its port)."""


def destination(target: TargetAddress) -> tuple[object, ...]:
    """What makes two targets the same machine and root by their URLs, whatever they are named
    or however they are spelt (the root normalised, ssh's port 22 the same as none). The
    machine itself says the rest once reached (``session/machines.py``)."""
    port = None if target.scheme == "ssh" and target.port == SSH_PORT else target.port
    return (target.scheme, target.host, port, normal_root(target.root), target.container,
            target.ssh_args)


def _refuse_duplicates(targets: Sequence[TargetAddress], schemes: Schemes) -> None:
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
        other = by_place.setdefault(destination(target), target)
        if other is not target:
            raise TargetError(f"{other.shown} and {target.shown} are the same target (the same "
                              "machine and root): give it once")
    for target in targets:
        clash = by_name.get(_candidates(target, schemes)[0]) if not target.name else None
        if clash is not None:
            raise TargetError(f"{target.shown} would be named {clash.name}, as {clash.shown} "
                              "is: give one of them ?name=NAME, or drop the duplicate")


def _candidates(target: TargetAddress, schemes: Schemes) -> list[str]:
    """Names from short to unique: the scheme's base name (the host; ``lxc-CTID``), with the
    port, with the root, the URL; each kept to the characters a name may hold (``_name``)."""
    if target.local:
        return [LOCAL]
    scheme = schemes.get(target.scheme)
    base = (scheme.base_name if scheme and scheme.base_name else _default_base_name)(target)
    with_port = f"{base}:{target.port}" if target.port else base
    rooted = with_port if target.root == "/" else \
        f"{with_port}:{target.root.strip('/').replace('/', '.')}"
    return [_name(base), _name(with_port), _name(rooted), _name(target.url)]


def _name(text: str) -> str:
    """``text`` as a target's name: each character a name may not hold (a root's newline,
    ``<``, a space; a URL's ``/``) written ``_``, so that a derived name keeps the rule an
    explicit ``?name=`` is held to (it ends every check's id and is shown everywhere)."""
    name = re.sub(_UNNAMED, "_", text)
    return name if re.match(_NAME, name) else f"t{name}"


def name_targets(targets: Sequence[TargetAddress],
                 schemes: Schemes = BUILTIN) -> list[TargetAddress]:
    """Each target with a name no other has; explicit names (``?name=``, an inventory's) win
    and must be unique; the same target twice is refused (see the module's docstring)."""
    _refuse_duplicates(targets, schemes)
    for level in range(4):
        names = [t.name or _candidates(t, schemes)[level] for t in targets]
        if len(set(names)) == len(names):
            return [replace(t, name=n) for t, n in zip(targets, names, strict=True)]
    # roots that differ only in characters a name cannot hold: numbered in the order given
    return [replace(t, name=t.name or f"{_candidates(t, schemes)[2]}-{number}")
            for number, t in enumerate(targets, 1)]


def parse_targets(texts: Sequence[str], schemes: Schemes = BUILTIN) -> list[TargetAddress]:
    return name_targets([parse_target(text, schemes) for text in texts], schemes)
