"""The run's settings, resolved once from pytest's options and ini values into a frozen record.

An option wins over its ini twin; every error names the source that was wrong
(``--gpuhost-root=/x: no such directory`` or ``gpuhost_root in tox.ini=/x: ...``) and is a usage
error (exit 4), raised before anything on a host is read or changed. No pytest here: the plugin
hands in the raw values (``RawOptions``), so tests and benchmarks build settings directly.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .files import OutputError, check_output
from .targets import (
    LOCAL,
    TargetAddress,
    TargetError,
    name_targets,
    parse_target,
    parse_target_line,
)

SPEC_SUFFIXES = (".yaml", ".yml")


class SettingsError(Exception):
    """A setting that cannot be used; the message names its source."""


@dataclass(frozen=True)
class RawOptions:
    """What the command line and the ini file said, unresolved."""

    invocation: Path
    ini_base: Path
    ini_name: str
    """The ini file as errors name it (``tox.ini``), or ``the ini file``."""
    spec: Sequence[str] = ()
    ini_spec: Sequence[str] = ()
    args: Sequence[str] = ()
    root: str | None = None
    ini_root: str = ""
    fix: bool = False
    dry_run: bool = False
    persist: bool = False
    fix_retry: bool = False
    journal: str | None = None
    rollback: str | None = None
    lock_timeout: float = 120.0
    gate: bool = False
    report: str | None = None
    prom: str | None = None
    npd: bool = False
    nfd: str | None = None
    alluredir: str | None = None
    numprocesses: object = None
    worker: bool = False
    targets: Sequence[str] = ()
    ini_targets: Sequence[str] = ()
    ssh_config: str | None = None
    ini_ssh_config: str = ""
    connect_timeout: float = 10.0
    inventory: str | None = None
    ini_inventory: str = ""
    limit: str | None = None
    targets_file: str | None = None
    ini_targets_file: str = ""
    target_timeout: float | None = None
    resolved_targets: Sequence[Mapping[str, Any]] = ()
    """On an xdist worker: the targets as its controller resolved them (``target_record``)."""
    ssh_masters: str | None = None
    """On an xdist worker: its controller's directory of ssh control sockets."""
    after_reboot: bool = False
    capture: str | None = None
    capture_from: str | None = None
    capture_overwrite: bool = False
    fleet_html: str | None = None
    accept_new_host_keys: bool = False
    ini_accept_new_host_keys: bool = False
    nfd_expiry: float = 3600.0


@dataclass(frozen=True)
class Settings:
    invocation: Path
    specs: tuple[Path, ...]
    root: Path
    fix: bool
    """--fix (or a rollback, which fixes back to the originals)."""
    dry_run: bool
    persist: bool
    fix_retry: bool
    """--fix-retry: try again the fixes that failed in an earlier run (fix/history.py)."""
    journal: Path | None
    """--gpuhost-journal as given (resolved against the invocation directory)."""
    rollback: str | None
    """None: not a rollback; "": the newest journal under the root; else the journal's path."""
    lock_timeout: float
    gate: bool
    report: Path | None
    prom: Path | None
    alluredir: Path | None
    worker: bool
    distributing: bool
    """On an xdist controller that starts workers."""
    targets: tuple[TargetAddress, ...] = (TargetAddress(LOCAL, LOCAL),)
    """The machines this run checks; without --gpuhost-target, this machine at the root."""
    ssh_config: Path | None = None
    connect_timeout: float = 10.0
    target_timeout: float | None = None
    """--gpuhost-target-timeout: the seconds each process may spend on one remote target."""
    ssh_masters: Path | None = None
    """Under xdist: the run's directory of ssh control sockets, one per ssh target (the
    controller's collection connection is the master its workers' sessions ride on)."""
    after_reboot: bool = False
    """--gpuhost-rollback-after-reboot: restore runtime changes a reboot has reset since."""
    npd: bool = False
    """--gpuhost-npd, on the controller: answer as a node-problem-detector plugin."""
    nfd: Path | None = None
    capture: Path | None = None
    """--gpuhost-capture: where the captured spec goes (on the controller)."""
    capture_shown: str = ""
    """--gpuhost-capture as given, for messages and the header."""
    capture_from: str | None = None
    capture_overwrite: bool = False
    catalog: bool = False
    """--gpuhost-capture without a spec: the built-in catalog is the spec, observed only."""
    fleet_html: Path | None = None
    accept_new_host_keys: bool = False
    """--gpuhost-accept-new-host-keys: a --fix or rollback obeys the ssh configuration's (or
    the inventory's) StrictHostKeyChecking instead of refusing host keys known_hosts lacks."""
    nfd_expiry: float = 3600.0
    """--gpuhost-nfd-expiry: the seconds the NFD labels stand after the run (# +expiry-time)."""

    @property
    def remote(self) -> bool:
        """Whether ids and reports must name targets (anything but the one local target)."""
        return len(self.targets) > 1 or not self.targets[0].local

    @property
    def active(self) -> bool:
        """Whether this run has gpuhost work at all (a spec or a rollback)."""
        return bool(self.specs) or self.rollback is not None

    def display(self, path: Path) -> str:
        """A path as the user named it: relative to where pytest was invoked, if inside it."""
        try:
            return str(path.relative_to(self.invocation))
        except ValueError:
            return str(path)


def _spec_path(base: Path, value: str, source: str) -> Path:
    """A spec file, or, for a bare name that is no file (``blackwell8``: no ``/``, no ``.yaml``
    suffix), the bundled spec of that name."""
    path = base / value
    if "/" in value or value.endswith(SPEC_SUFFIXES) or path.exists():
        return path
    from . import specs

    bundled = specs.find(value)
    if bundled is None:
        raise SettingsError(f"{source}={value}: no such file, and no bundled spec of that "
                            f"name; the bundled specs: {', '.join(specs.names()) or 'none'} "
                            "(or name a YAML file)")
    return bundled


def _spec_paths(raw: RawOptions) -> tuple[Path, ...]:
    """Specs from --gpuhost-spec (else the ini), then .yaml files named as arguments."""
    paths = [_spec_path(raw.invocation, p, "--gpuhost-spec") for p in raw.spec]
    if not paths:
        paths = [_spec_path(raw.ini_base, p, f"gpuhost_spec in {raw.ini_name}")
                 for p in raw.ini_spec]
    from . import specs

    for arg in raw.args:  # a bundled spec's check by its id (blackwell8.yaml::dmesg) too
        candidate = Path(specs.from_argument(arg, paths, raw.invocation).split("::", 1)[0])
        if candidate.suffix in SPEC_SUFFIXES:
            paths.append(raw.invocation / candidate)
    unique: dict[Path, None] = {}
    for path in paths:
        unique.setdefault(path.resolve(), None)
    return tuple(unique)


def _root(raw: RawOptions) -> Path:
    if raw.root is not None:
        source, value, root = "--gpuhost-root", raw.root, raw.invocation / raw.root
    elif raw.ini_root:
        source, value = f"gpuhost_root in {raw.ini_name}", raw.ini_root
        root = raw.ini_base / value
    else:
        return Path("/")
    if not root.exists():
        raise SettingsError(f"{source}={value}: no such directory; the host root must be an "
                            "existing directory ('/' for this machine)")
    if not root.is_dir():
        raise SettingsError(f"{source}={value}: not a directory; the host root is the "
                            "directory a machine's /proc, /sys and /etc are under ('/' for "
                            "this machine)")
    return root


_NEEDS_SPEC = ("fix", "report", "root", "gate", "prom", "persist", "dry_run", "journal", "npd",
               "nfd", "targets", "ssh_config", "fleet_html", "fix_retry", "inventory", "limit",
               "targets_file", "target_timeout")
_FLAGS = {"fix": "--fix", "report": "--gpuhost-report", "root": "--gpuhost-root",
          "gate": "--gpuhost-gate", "prom": "--gpuhost-prom", "persist": "--fix-persist",
          "dry_run": "--gpuhost-dry-run", "journal": "--gpuhost-journal",
          "fix_retry": "--fix-retry",
          "npd": "--gpuhost-npd", "nfd": "--gpuhost-nfd", "targets": "--gpuhost-target",
          "ssh_config": "--gpuhost-ssh-config", "fleet_html": "--gpuhost-fleet-html",
          "inventory": "--gpuhost-inventory", "limit": "--gpuhost-limit",
          "targets_file": "--gpuhost-targets-file",
          "target_timeout": "--gpuhost-target-timeout",
          "capture_from": "--gpuhost-capture-from",
          "capture_overwrite": "--gpuhost-capture-overwrite"}
_NOT_WITH_CATALOG = ("fix", "persist", "dry_run", "journal", "gate", "fix_retry")
"""What a catalog capture (no spec) cannot do: it observes, and has no values to fix to."""


def _usage(raw: RawOptions, has_specs: bool) -> None:
    rollback = raw.rollback is not None
    if not has_specs and not rollback:
        for name in _NEEDS_SPEC:
            if getattr(raw, name):
                raise SettingsError(f"{_FLAGS[name]} needs a spec: pass --gpuhost-spec=FILE "
                                    "(or name a .yaml spec as an argument)")
        return
    if raw.after_reboot and not rollback:
        raise SettingsError("--gpuhost-rollback-after-reboot only makes sense with "
                            "--gpuhost-rollback")
    if rollback and has_specs:
        raise SettingsError("--gpuhost-rollback restores a journal; run it without a spec")
    if rollback:
        for name in ("persist", "journal"):
            if getattr(raw, name):
                raise SettingsError(f"{_FLAGS[name]} does not go with --gpuhost-rollback (a "
                                    "rollback journals nothing and persists nothing)")
        if raw.fix_retry:
            raise SettingsError("--fix-retry does not go with --gpuhost-rollback (a rollback "
                                "restores every change of its journal that is not back)")
        if raw.numprocesses:
            raise SettingsError("--gpuhost-rollback runs serially, newest change first: drop -n")
        return
    for name in ("dry_run", "persist", "journal", "fix_retry"):
        if getattr(raw, name) and not raw.fix:
            raise SettingsError(f"{_FLAGS[name]} only makes sense with --fix")


def _lock_timeout(value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise SettingsError(f"--gpuhost-lock-timeout={value:g}: expected a finite number of "
                            "seconds, 0 or more")
    return value


def _output(raw: RawOptions, value: str | None, flag: str) -> Path | None:
    if not value:
        return None
    try:
        return check_output(raw.invocation / value, f"{flag}={value}")
    except OutputError as exc:
        raise SettingsError(str(exc)) from None


def target_record(target: TargetAddress) -> dict[str, object]:
    """A target as JSON, for the workers of an xdist run (``RawOptions.resolved_targets``)."""
    return {field: getattr(target, field) for field in TargetAddress.__dataclass_fields__}


def _resolved(records: Sequence[Mapping[str, Any]]) -> tuple[TargetAddress, ...]:
    return tuple(TargetAddress(**{**record, "ssh_args": tuple(record.get("ssh_args") or ())})
                 for record in records)


def _targets(raw: RawOptions) -> tuple[TargetAddress, ...]:
    """Every target the run names: --gpuhost-target, the hosts of --gpuhost-inventory (after
    --gpuhost-limit) and the lines of --gpuhost-targets-file, together; any of them on the
    command line replaces all of their ini twins. Without any, this machine at the root. An
    xdist worker takes its controller's: the same targets, the inventory read once."""
    if raw.resolved_targets:
        return _resolved(raw.resolved_targets)
    command_line = bool(raw.targets or raw.inventory or raw.targets_file)
    if command_line:
        urls, inventory, listed = raw.targets, raw.inventory, raw.targets_file
        base, named = raw.invocation, {"targets": "--gpuhost-target",
                                       "inventory": "--gpuhost-inventory",
                                       "targets_file": "--gpuhost-targets-file"}
    else:
        urls, inventory, listed = raw.ini_targets, raw.ini_inventory, raw.ini_targets_file
        base, named = raw.ini_base, {"targets": f"gpuhost_targets in {raw.ini_name}",
                                     "inventory": f"gpuhost_inventory in {raw.ini_name}",
                                     "targets_file": f"gpuhost_targets_file in {raw.ini_name}"}
    if raw.limit is not None and not inventory:
        raise SettingsError(f"--gpuhost-limit={raw.limit} selects hosts of an inventory: pass "
                            "--gpuhost-inventory=FILE too")
    found: list[TargetAddress] = []
    for text in urls:
        if text.strip():
            try:
                found.append(replace(parse_target(text), source=named["targets"]))
            except TargetError as exc:
                raise SettingsError(f"{named['targets']}: {exc}") from None
    if inventory:
        found += _inventory_targets(raw, base / inventory, f"{named['inventory']}={inventory}")
    if listed:
        found += _listed_targets(base / listed, f"{named['targets_file']}={listed}", raw)
    if not found:
        return (TargetAddress(LOCAL, LOCAL),)
    try:
        return tuple(name_targets(found))
    except TargetError as exc:
        raise SettingsError(str(exc)) from None


def _inventory_targets(raw: RawOptions, path: Path, source: str) -> list[TargetAddress]:
    from .inventory import InventoryError, read_inventory

    if raw.limit is not None and not raw.limit.strip():
        raise SettingsError("--gpuhost-limit is empty: expected an Ansible host pattern "
                            "(node01, gpu, 'gpu:!node02', 'node0*')")
    try:
        hosts = read_inventory(path, raw.limit, host_errors=True)
        return [host.target(source, raw.invocation) for host in hosts]
    except InventoryError as exc:
        limit = f" --gpuhost-limit={raw.limit}" if raw.limit is not None else ""
        raise SettingsError(f"{source}{limit}: {exc}") from None


def _listed_targets(path: Path, source: str, raw: RawOptions) -> list[TargetAddress]:
    from .inventory import InventoryError, read_numbered_targets

    try:
        lines = read_numbered_targets(path)
    except InventoryError as exc:
        raise SettingsError(f"{source}: {exc}") from None
    found = []
    for number, text in lines:
        try:
            found.append(replace(parse_target_line(text), source=f"{source}:{number}"))
        except TargetError as exc:
            raise SettingsError(f"{source}: {path}:{number}: {exc}") from None
    return found


def _ssh_config(raw: RawOptions) -> Path | None:
    if raw.ssh_config:
        source, path = f"--gpuhost-ssh-config={raw.ssh_config}", raw.invocation / raw.ssh_config
    elif raw.ini_ssh_config:
        source = f"gpuhost_ssh_config in {raw.ini_name}={raw.ini_ssh_config}"
        path = raw.ini_base / raw.ini_ssh_config
    else:
        return None
    if not path.is_file():
        raise SettingsError(f"{source}: no such file (an OpenSSH client configuration, given "
                            "to every ssh as -F FILE)")
    return path


def _connect_timeout(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"--gpuhost-connect-timeout={value:g}: expected a number of "
                            "seconds above 0")
    return value


def _nfd_expiry(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"--gpuhost-nfd-expiry={value:g}: expected a finite number of "
                            "seconds above 0 (how long the labels stand after a run)")
    return value


def _target_timeout(value: float | None) -> float | None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise SettingsError(f"--gpuhost-target-timeout={value:g}: expected a finite number "
                            "of seconds above 0")
    return value

def _capture(raw: RawOptions, specs: tuple[Path, ...]) -> tuple[Path | None, bool]:
    """(where the captured spec goes, whether the catalog is the spec)."""
    if not raw.capture:
        for name in ("capture_from", "capture_overwrite"):
            if getattr(raw, name):
                raise SettingsError(f"{_FLAGS[name]} goes with --gpuhost-capture=OUT.yaml")
        return None, False
    if raw.rollback is not None:
        raise SettingsError("--gpuhost-capture does not go with --gpuhost-rollback (a rollback "
                            "restores a journal; capture after it, in a run of its own)")
    catalog = not specs
    if catalog:
        for name in _NOT_WITH_CATALOG:
            if getattr(raw, name):
                raise SettingsError(f"{_FLAGS[name]} needs a spec: --gpuhost-capture without "
                                    "one observes the built-in catalog and has no values to "
                                    "hold the host to (pass --gpuhost-spec=FILE)")
    if raw.worker:
        return None, catalog
    path = raw.invocation / raw.capture
    if os.path.lexists(path) and not raw.capture_overwrite:
        raise SettingsError(f"--gpuhost-capture={raw.capture}: the file exists; pass "
                            "--gpuhost-capture-overwrite to replace it, or name a new file")
    return _output(raw, raw.capture, "--gpuhost-capture"), catalog


def _capture_from(raw: RawOptions, targets: Sequence[TargetAddress]) -> str:
    """The name of the target --gpuhost-capture writes down: --gpuhost-capture-from (a target's
    name or its URL as given), else the only target."""
    from .capture.writer import pick_target

    chosen = raw.capture_from
    by_url = {target.url: target.name for target in targets}
    try:
        return pick_target([target.name for target in targets], by_url.get(chosen or "", chosen))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def resolve(raw: RawOptions) -> Settings:
    """The run's settings; SettingsError for the first thing that cannot be used."""
    specs = _spec_paths(raw)
    capture, catalog = _capture(raw, specs)
    if catalog:
        from .capture.catalog import CATALOG

        specs = (CATALOG,)
    _usage(raw, bool(specs))
    active = bool(specs) or raw.rollback is not None
    root = _root(raw) if active else Path("/")
    if raw.persist and len(specs) > 1:
        raise SettingsError("--fix-persist names its files after the spec: run it with one spec "
                            "at a time")
    targets = _targets(raw)
    capture_from = _capture_from(raw, targets) if capture is not None or catalog else None
    journal = raw.invocation / raw.journal if raw.journal else None
    if journal is not None and not raw.worker and journal.exists():
        raise SettingsError(f"--gpuhost-journal={raw.journal}: the file exists; a journal "
                            "records one run: name a new file")
    return Settings(
        invocation=raw.invocation, specs=specs, root=root,
        fix=raw.fix or raw.rollback is not None, dry_run=raw.dry_run, persist=raw.persist,
        fix_retry=raw.fix_retry,
        journal=journal, rollback=raw.rollback, lock_timeout=_lock_timeout(raw.lock_timeout),
        gate=raw.gate,
        report=_output(raw, raw.report, "--gpuhost-report") if not raw.worker else None,
        prom=_output(raw, raw.prom, "--gpuhost-prom") if not raw.worker else None,
        alluredir=raw.invocation / raw.alluredir if raw.alluredir else None,
        worker=raw.worker, distributing=not raw.worker and bool(raw.numprocesses),
        npd=raw.npd and not raw.worker,
        nfd=_output(raw, raw.nfd, "--gpuhost-nfd") if not raw.worker else None,
        targets=targets, ssh_config=_ssh_config(raw),
        ssh_masters=Path(raw.ssh_masters) if raw.ssh_masters else None,
        connect_timeout=_connect_timeout(raw.connect_timeout),
        target_timeout=_target_timeout(raw.target_timeout), after_reboot=raw.after_reboot,
        capture=capture, capture_shown=raw.capture or "", capture_from=capture_from,
        capture_overwrite=raw.capture_overwrite, catalog=catalog,
        fleet_html=_output(raw, raw.fleet_html, "--gpuhost-fleet-html")
        if not raw.worker else None,
        accept_new_host_keys=raw.accept_new_host_keys or raw.ini_accept_new_host_keys,
        nfd_expiry=_nfd_expiry(raw.nfd_expiry))
