"""The run's targets as its options name them: ``--gpuhost-target``, the hosts of
``--gpuhost-inventory`` (after ``--gpuhost-limit``) and the lines of ``--gpuhost-targets-file``,
or their ini twins; and a resolved target as an xdist worker receives it.

Part of resolving the settings (``settings.py`` makes each TargetOptionError a SettingsError,
the same message): no pytest, and an inventory's ansible-core only when one is named.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from .options import BY_NAME, RawOptions, flag
from .targets import (
    LOCAL,
    Schemes,
    TargetAddress,
    TargetError,
    name_targets,
    parse_target,
    parse_target_line,
)


class TargetOptionError(Exception):
    """A target option that cannot be used; the message names its source."""


def target_record(target: TargetAddress) -> dict[str, object]:
    """A target as JSON, for the workers of an xdist run (``RawOptions.resolved_targets``)."""
    return msgspec.structs.asdict(target)


def _resolved(records: Sequence[Mapping[str, Any]]) -> tuple[TargetAddress, ...]:
    return tuple(TargetAddress(**{**record, "ssh_args": tuple(record.get("ssh_args") or ())})
                 for record in records)


TARGET_SOURCES = ("targets", "inventory", "targets_file")
"""The options that name targets: given on the command line, they replace all their ini twins."""


def resolve_targets(raw: RawOptions, schemes: Schemes) -> tuple[TargetAddress, ...]:
    """Every target the run names: --gpuhost-target, the hosts of --gpuhost-inventory (after
    --gpuhost-limit) and the lines of --gpuhost-targets-file, together; any of them on the
    command line replaces all of their ini twins. Without any, this machine at the root. An
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
                found.append(replace(parse_target(text, schemes), source=named["targets"]))
            except TargetError as exc:
                raise TargetOptionError(f"{named['targets']}: {exc}") from None
    if inventory:
        found += _inventory_targets(raw, base / inventory, f"{named['inventory']}={inventory}")
    if listed:
        found += _listed_targets(base / listed, f"{named['targets_file']}={listed}", schemes)
    if not found:
        return (TargetAddress(LOCAL, LOCAL),)
    try:
        return tuple(name_targets(found, schemes))
    except TargetError as exc:
        raise TargetOptionError(str(exc)) from None


def _inventory_targets(raw: RawOptions, path: Path, source: str) -> list[TargetAddress]:
    from .inventory import InventoryError, read_inventory

    limit = raw.text("limit")
    if limit is not None and not limit.strip():
        raise TargetOptionError("--gpuhost-limit is empty: expected an Ansible host pattern "
                            "(node01, gpu, 'gpu:!node02', 'node0*')")
    try:
        hosts = read_inventory(path, limit, host_errors=True)
        return [host.target(source, raw.invocation) for host in hosts]
    except InventoryError as exc:
        given = f" --gpuhost-limit={limit}" if limit is not None else ""
        raise TargetOptionError(f"{source}{given}: {exc}") from None


def _listed_targets(path: Path, source: str, schemes: Schemes) -> list[TargetAddress]:
    from .inventory import InventoryError, read_numbered_targets

    try:
        lines = read_numbered_targets(path)
    except InventoryError as exc:
        raise TargetOptionError(f"{source}: {exc}") from None
    found = []
    for number, text in lines:
        try:
            found.append(replace(parse_target_line(text, schemes),
                                 source=f"{source}:{number}"))
        except TargetError as exc:
            raise TargetOptionError(f"{source}: {path}:{number}: {exc}") from None
    return found
