"""The run's targets as its options name them: ``--gpuhost-target``, the hosts of
``--gpuhost-inventory`` (after ``--gpuhost-limit``) and the lines of ``--gpuhost-targets-file``,
or their ini twins; and a resolved target as an xdist worker receives it.

Part of resolving the settings (``settings.py`` makes each TargetOptionError a SettingsError,
the same message): no pytest, and an inventory's ansible-core only when one is named.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from ..specmodel.specfile import excerpt
from .options import BY_NAME, RawOptions, flag
from .targets import (
    BUILTIN,
    LOCAL,
    Schemes,
    TargetAddress,
    TargetError,
    destination,
    name_targets,
    parse_target,
    parse_target_line,
)


class TargetOptionError(Exception):
    """A target option that cannot be used; the message names its source."""


class TargetSpecError(TargetOptionError):
    """A target's own spec cannot be used (said as it is, not as a run without a spec)."""


SpecPath = Callable[[Path, str, str], Path]
"""(base, the spec as given, where it was given) -> the spec's file; TargetSpecError if none."""


def target_record(target: TargetAddress) -> dict[str, object]:
    """A target as JSON, for the workers of an xdist run (``RawOptions.resolved_targets``)."""
    return msgspec.structs.asdict(target)


def _resolved(records: Sequence[Mapping[str, Any]]) -> tuple[TargetAddress, ...]:
    return tuple(TargetAddress(**{**record, "ssh_args": tuple(record.get("ssh_args") or ())})
                 for record in records)


TARGET_SOURCES = ("targets", "inventory", "targets_file")
"""The options that name targets: given on the command line, they replace all their ini twins."""


def resolve_targets(raw: RawOptions, schemes: Schemes, spec_path: SpecPath
                    ) -> tuple[TargetAddress, ...]:
    """Every target the run names: --gpuhost-target, the hosts of --gpuhost-inventory (after
    --gpuhost-limit) and the lines of --gpuhost-targets-file, together; any of them on the
    command line replaces all of their ini twins. Without any, this machine at the root. Each
    container's host placed (--gpuhost-host for this machine's kernel checks, where given). An
    xdist worker takes its controller's: the same targets, the inventory read once."""
    if raw.resolved_targets:
        return _resolved(raw.resolved_targets)
    if any(raw.value(name) for name in TARGET_SOURCES):
        urls, inventory, listed = raw.words("targets"), raw.text("inventory"), \
            raw.text("targets_file")
        base, named = raw.invocation, {name: flag(name) for name in TARGET_SOURCES}
    else:
        urls, inventory, listed = raw.ini_words("targets"), raw.ini_text("inventory"), \
            raw.ini_text("targets_file")
        base, named = raw.ini_base, {name: f"{BY_NAME[name].ini} in {raw.ini_name}"
                                     for name in TARGET_SOURCES}
    limit = raw.text("limit")
    if limit is not None and not inventory:
        raise TargetOptionError(f"--gpuhost-limit={limit} selects hosts of an inventory: pass "
                                "--gpuhost-inventory=FILE too")
    found: list[TargetAddress] = []
    for text in urls:
        if text.strip():
            try:
                target = parse_target(text, schemes)
            except TargetError as exc:
                raise TargetOptionError(f"{named['targets']}: {exc}") from None
            found.append(_own_spec(replace(target, source=named["targets"]), base,
                                   f"{named['targets']}={text.strip()}: spec", spec_path))
    if inventory:
        found += _inventory_targets(raw, base / inventory, f"{named['inventory']}={inventory}",
                                    spec_path)
    if listed:
        found += _listed_targets(base / listed, f"{named['targets_file']}={listed}", schemes,
                                 spec_path)
    host = _kernel_host(raw, schemes)
    try:
        return tuple(place_kernels(found or [TargetAddress(LOCAL, LOCAL)], schemes, host))
    except TargetError as exc:
        raise TargetOptionError(str(exc)) from None


def target_files(raw: RawOptions) -> list[tuple[str, Path]]:
    """The files the run reads its targets from, as ``resolve_targets`` chooses them: (how a
    message names it, its path) for the inventory and the targets file."""
    given = any(raw.value(name) for name in TARGET_SOURCES)
    files = []
    for name in ("inventory", "targets_file"):
        value = raw.text(name) if given else raw.ini_text(name)
        if value:
            source = f"{flag(name)}={value}" if given else \
                f"{BY_NAME[name].ini} in {raw.ini_name}={value}"
            files.append((source, (raw.invocation if given else raw.ini_base) / value))
    return files


def _own_spec(target: TargetAddress, base: Path, source: str, spec_path: SpecPath
              ) -> TargetAddress:
    """``target`` with its own spec (if it has one) resolved: a file relative to ``base`` (where
    it was given), else a bundled spec's name."""
    if target.spec is None:
        return target
    return replace(target, spec=str(spec_path(base, target.spec, source)))


def _kernel_host(raw: RawOptions, schemes: Schemes) -> TargetAddress | None:
    """--gpuhost-host (else its ini twin): the machine this one's kernel checks run on."""
    given = raw.text("host")
    source = f"--gpuhost-host={given}" if given else \
        f"{BY_NAME['host'].ini} in {raw.ini_name}={raw.ini_text('host')}"
    text = given or raw.ini_text("host")
    if not text:
        return None
    try:
        host = parse_target(text, schemes)
    except TargetError as exc:
        raise TargetOptionError(f"{source}: {exc}") from None
    if host.local or host.container is not None or kernel_host(host, schemes) is not None:
        raise TargetOptionError(f"{source}: the host is the machine whose kernel this one runs "
                                "on, reached as ssh://[USER@]HOST[:PORT][/ROOT] (not this "
                                "machine, not a container)")
    if host.spec is not None:
        raise TargetOptionError(f"{source}: the host runs this run's kernel checks, not a spec "
                                "of its own: drop ?spec= (name it with --gpuhost-target to "
                                "check it whole)")
    return replace(host, source=source.split("=", 1)[0])


def _inventory_targets(raw: RawOptions, path: Path, source: str, spec_path: SpecPath
                       ) -> list[TargetAddress]:
    from .inventory import InventoryError, read_inventory

    limit = raw.text("limit")
    if limit is not None and not limit.strip():
        raise TargetOptionError("--gpuhost-limit is empty: expected an Ansible host pattern "
                                "(node01, gpu, 'gpu:!node02', 'node0*')")
    try:
        hosts = read_inventory(path, limit, host_errors=True)
        return [_own_spec(host.target(source, raw.invocation),
                          path.parent if path.is_file() else path,
                          f"{source}: host {host.name}: gpuhost_spec", spec_path)
                for host in hosts]
    except InventoryError as exc:
        given = f" --gpuhost-limit={limit}" if limit is not None else ""
        raise TargetOptionError(f"{source}{given}: {exc}") from None


def _listed_targets(path: Path, source: str, schemes: Schemes, spec_path: SpecPath
                    ) -> list[TargetAddress]:
    from .inventory import InventoryError, read_numbered_targets

    try:
        lines = read_numbered_targets(path)
    except InventoryError as exc:
        raise TargetOptionError(f"{source}: {exc}") from None
    found = []
    for number, text, spec in lines:
        try:
            target = parse_target_line(text, schemes)
        except TargetError as exc:  # each quoted part of the line bounded: a file that is
            # no targets file (an env file with a token) is shown no further than an excerpt
            reason = re.sub(r"'([^'\n]*)'", lambda found: excerpt(found.group(1)), str(exc))
            raise TargetOptionError(f"{source}: {path}:{number}: {reason}") from None
        if spec is not None and target.spec is not None:
            raise TargetSpecError(f"{source}: {path}:{number}: the spec is given twice (?spec= "
                                  "and the second column): give it once")
        found.append(_own_spec(replace(target, source=f"{source}:{number}",
                                       spec=spec or target.spec), path.parent,
                               f"{source}: {path}:{number}: spec", spec_path))
    return found


def kernel_host(target: TargetAddress, schemes: Schemes = BUILTIN) -> TargetAddress | None:
    """The machine whose kernel ``target`` runs on, when it is a container by construction (its
    scheme's ``host``); None: its own."""
    scheme = schemes.get(target.scheme)
    return scheme.host(target) if scheme is not None and scheme.host is not None else None


def place_kernels(targets: Sequence[TargetAddress], schemes: Schemes = BUILTIN,
                  host: TargetAddress | None = None) -> list[TargetAddress]:
    """The run's targets, named, each that runs on another machine's kernel told which target
    that is (``kernel_on``): a container by construction its host (``kernel_host``), and with
    ``host`` (--gpuhost-host) this machine's ``local`` targets that one. A host that is already
    a target of the run is that target (its ``kernel`` checks then run once); any other is
    added after the named ones (``implied``), as ``name_targets`` names it; an added one is
    placed in turn (``local`` implied as ``lxc://101``'s host is still the container
    --gpuhost-host declares)."""
    placed = list(targets)
    kernel_of: dict[int, int] = {}
    by_place = {destination(target): index for index, target in enumerate(targets)}
    index = -1
    while index + 1 < len(placed):  # grows as hosts are added: each is placed in turn
        index += 1
        target = placed[index]
        wanted = host if host is not None and target.local else kernel_host(target, schemes)
        if wanted is None:
            continue
        at = by_place.get(destination(wanted))
        if at is None:
            at = len(placed)
            placed.append(replace(wanted, implied=f"the host of {target.url}",
                                  source=target.source))
            by_place[destination(wanted)] = at
        if at == index:
            raise TargetError(f"{target.shown} cannot be the host of itself")
        kernel_of[index] = at
    named = name_targets(placed, schemes)
    return [replace(target, kernel_on=named[kernel_of[index]].name) if index in kernel_of
            else target for index, target in enumerate(named)]


def node_targets(targets: Sequence[TargetAddress]) -> tuple[str, ...]:
    """The targets that describe the machine the run runs on: this machine (``local``), the
    containers on its kernel, and the host ``--gpuhost-host`` added for its kernel checks."""
    local = {target.name for target in targets if target.local}
    hosts = {target.kernel_on for target in targets if target.local}
    return tuple(target.name for target in targets if target.name in local or
                 target.kernel_on in local or (target.name in hosts and target.implied))


def refuse_foreign_node_health(targets: Sequence[TargetAddress], *, nfd: bool, npd: bool) -> None:
    """NFD's labels and NPD's condition are this node's, never another machine's verdict."""
    asked = ["--gpuhost-nfd"] * nfd + ["--gpuhost-npd"] * npd
    if asked and not node_targets(targets):
        raise TargetOptionError(f"{' and '.join(asked)}: no target is this node ("
                                f"{', '.join(t.name for t in targets)}): they speak for the node "
                                "the run runs on (this machine, a container on it): add "
                                "--gpuhost-target=local, or run it on that machine")
