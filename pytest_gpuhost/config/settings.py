"""The run's settings, resolved once from pytest's options and ini values into a frozen record.

Each option is declared once, in ``options.OPTIONS``; this module resolves what the
combinations mean. An option wins over its ini twin; every error names the source that was
wrong (``--gpuhost-root=/x: no such directory`` or ``gpuhost_root in tox.ini=/x: ...``) and is
a usage error (exit 4), raised before anything on a host is read or changed. No pytest here:
the plugin hands in the raw values (``RawOptions``), so tests and benchmarks build settings
directly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import msgspec

from .options import BY_NAME, ENVELOPE_MODES, OPTIONS, flag
from .options import RawOptions as RawOptions
from .specoptions import SpecOptionError, may_carry_specs, spec_path, spec_paths
from .targetoptions import TARGET_SOURCES as TARGET_SOURCES  # re-exported
from .targetoptions import (
    TargetOptionError,
    TargetSpecError,
    node_targets,
    refuse_foreign_node_health,
    resolve_targets,
)
from .targetoptions import target_record as target_record  # re-exported
from .targets import BUILTIN, Schemes, TargetAddress


class SettingsError(Exception):
    """A setting that cannot be used; the message names its source."""


class Settings(msgspec.Struct, frozen=True):
    """The run's resolved settings (made only by ``resolve``: the defaults are the table's)."""

    invocation: Path
    specs: tuple[Path, ...]
    """Every spec the run loads: the run's own, then the targets' own (``TargetAddress.spec``)."""
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
    targets: tuple[TargetAddress, ...]
    """The machines this run checks; without --gpuhost-target, this machine at the root."""
    ssh_config: Path | None
    connect_timeout: float
    target_timeout: float | None
    """--gpuhost-target-timeout: the seconds each process may spend on one remote target."""
    ssh_masters: Path | None
    """Under xdist: the run's directory of ssh control sockets, one per ssh target (the
    controller's collection connection is the master its workers' sessions ride on)."""
    after_reboot: bool
    """--gpuhost-rollback-after-reboot: restore runtime changes a reboot has reset since."""
    npd: bool
    """--gpuhost-npd, on the controller: answer as a node-problem-detector plugin."""
    nfd: Path | None
    capture: Path | None
    """--gpuhost-capture: where the captured spec goes (on the controller)."""
    capture_shown: str
    """--gpuhost-capture as given, for messages and the header."""
    capture_from: str | None
    capture_overwrite: bool
    catalog: bool
    """--gpuhost-capture without a spec: the built-in catalog is the spec, observed only."""
    fleet_html: Path | None
    topology: bool = False
    """--gpuhost-topology: print each target's GPU topology (and put it in the JSON report)."""
    accept_new_host_keys: bool = False
    """--gpuhost-accept-new-host-keys: a --fix or rollback obeys the ssh configuration's (or
    the inventory's) StrictHostKeyChecking instead of refusing host keys known_hosts lacks."""
    nfd_expiry: float = 3600.0
    """--gpuhost-nfd-expiry: the seconds the NFD labels stand after the run (# +expiry-time)."""
    connect_concurrency: int = 10
    """--gpuhost-connect-concurrency: remote targets connected at once, the whole run."""
    default_specs: tuple[Path, ...] | None = None
    """The specs a target without one of its own runs (--gpuhost-spec); None: ``specs``."""
    envelope: str = "on"
    """--gpuhost-envelope: each benchmark's envelope taken (on), an invalid one an error of
    its test (strict), or none taken (off)."""
    notes: tuple[str, ...] = ()
    """What the run says at its end of how it read its options (a spec of the ini ignored by
    a rollback)."""

    def specs_of(self, target: TargetAddress) -> tuple[Path, ...]:
        """The specs ``target`` runs: its own, the run's, or none for a target added to the
        run as another's host (``implied``: it runs their ``kernel`` checks only)."""
        if target.spec is not None:
            return (Path(target.spec),)
        if target.implied is not None:
            return ()
        return self.specs if self.default_specs is None else self.default_specs

    @property
    def remote(self) -> bool:
        """Whether ids and reports must name targets (anything but the one local target)."""
        return len(self.targets) > 1 or not self.targets[0].local

    @property
    def active(self) -> bool:
        """Whether this run has gpuhost work at all (a spec or a rollback)."""
        return bool(self.specs) or self.rollback is not None

    @property
    def node_targets(self) -> tuple[str, ...]:
        """The targets NFD's labels, NPD's condition and a Slurm drain speak for
        (``targetoptions.node_targets``)."""
        return node_targets(self.targets)

    def display(self, path: Path) -> str:
        """A path as the user named it: relative to where pytest was invoked, if inside it."""
        try:
            return str(path.relative_to(self.invocation))
        except ValueError:
            return str(path)


def _chosen(raw: RawOptions, name: str, *, empty: bool = False) -> tuple[str, Path] | None:
    """The option, else its ini twin: (its source and value as errors name them, the path it
    names: relative to where pytest was invoked, or to the ini file); None when neither is
    set (``empty``: an empty option counts as given)."""
    value = raw.text(name)
    if value is not None and (value or empty):
        return f"{flag(name)}={value}", raw.invocation / value
    ini = raw.ini_text(name)
    if ini:
        return f"{BY_NAME[name].ini} in {raw.ini_name}={ini}", raw.ini_base / ini
    return None


def _spec_paths(raw: RawOptions) -> tuple[Path, ...]:
    try:
        return spec_paths(raw)
    except SpecOptionError as exc:
        raise SettingsError(str(exc)) from None


def _root(raw: RawOptions) -> Path:
    chosen = _chosen(raw, "root", empty=True)
    if chosen is None:
        return Path("/")
    source, root = chosen
    if not root.exists():
        raise SettingsError(f"{source}: no such directory; the host root must be an "
                            "existing directory ('/' for this machine)")
    if not root.is_dir():
        raise SettingsError(f"{source}: not a directory; the host root is the directory a "
                            "machine's /proc, /sys and /etc are under ('/' for this machine)")
    return root


def _usage(raw: RawOptions, has_specs: bool) -> None:
    """What the options given mean together: a spec or a rollback, and what each needs."""
    rollback = raw.value("rollback") is not None
    if not has_specs and not rollback:
        for option in sorted(OPTIONS, key=lambda option: option.name == "root"):  # root last
            if option.needs_spec and raw.value(option.name):
                raise SettingsError(f"{option.flag} needs a spec: pass --gpuhost-spec=FILE "
                                    "(or name a .yaml spec as an argument)")
        return
    if raw.flag("after_reboot") and not rollback:
        raise SettingsError("--gpuhost-rollback-after-reboot only makes sense with "
                            "--gpuhost-rollback")
    if rollback:
        _rollback_usage(raw, has_specs)
        return
    for option in OPTIONS:
        if option.needs_fix and raw.value(option.name) and not raw.flag("fix"):
            raise SettingsError(f"{option.flag} only makes sense with --fix")


def _rollback_specs(raw: RawOptions, specs: tuple[Path, ...]) -> tuple[Path, ...]:
    """A rollback's specs: a spec of the ini is not one (the ini of a benchmark's directory
    names its spec for every run there; a rollback restores a journal): left out."""
    if raw.value("rollback") is None or raw.words("spec") or not raw.ini_words("spec"):
        return specs
    ini = {spec_path(raw.ini_base, p, f"gpuhost_spec in {raw.ini_name}").resolve()
           for p in raw.ini_words("spec")}
    return tuple(spec for spec in specs if spec not in ini)


def _rollback_usage(raw: RawOptions, has_specs: bool) -> None:
    if has_specs:
        given = " ".join([*(f"--gpuhost-spec={p}" for p in raw.words("spec")),
                          *(arg for arg in raw.args if Path(arg.split("::", 1)[0]).suffix
                            in (".yaml", ".yml"))])
        raise SettingsError(f"--gpuhost-rollback restores a journal (the originals it "
                            f"recorded), not a spec: drop {given or 'the spec'} from the "
                            "command line (a spec the ini names is left out of a rollback "
                            "by itself)")
    for name in ("persist", "journal"):
        if raw.value(name):
            raise SettingsError(f"{flag(name)} does not go with --gpuhost-rollback (a "
                                "rollback journals nothing and persists nothing)")
    if raw.flag("fix_retry"):
        raise SettingsError("--fix-retry does not go with --gpuhost-rollback (a rollback "
                            "restores every change of its journal that is not back)")
    if raw.numprocesses:
        raise SettingsError("--gpuhost-rollback runs serially, newest change first: drop -n")


def _seconds(raw: RawOptions, name: str) -> float | None:
    value = raw.seconds(name)
    problem = BY_NAME[name].seconds_problem(value) if value is not None else None
    if problem is not None:
        raise SettingsError(f"{flag(name)}={value:g}: {problem}")
    return value


def _count(raw: RawOptions, name: str) -> int:
    value = raw.count(name)
    if value < 1:
        raise SettingsError(f"{flag(name)}={value}: expected a whole number, 1 or more")
    return value


def _output(raw: RawOptions, name: str) -> Path | None:
    """A file the controller writes at the end (a report): checked now, None on a worker."""
    value = raw.text(name)
    if not value or raw.worker:
        return None
    from ..files import OutputError, check_output  # a report's: a verify asks for none

    try:
        return check_output(raw.invocation / value, f"{flag(name)}={value}")
    except OutputError as exc:
        raise SettingsError(str(exc)) from None


def _targets(raw: RawOptions) -> tuple[TargetAddress, ...]:
    try:
        return resolve_targets(raw, _schemes(raw), _target_spec)
    except TargetSpecError as exc:
        raise OwnSpecError(str(exc)) from None
    except TargetOptionError as exc:
        raise SettingsError(str(exc)) from None


def _target_spec(base: Path, value: str, source: str) -> Path:
    """A target's own spec: a file relative to ``base`` (where it was given), else a bundled
    spec's name; TargetSpecError where it is neither."""
    try:
        return spec_path(base, value, source).resolve()
    except SpecOptionError as exc:
        raise TargetSpecError(str(exc)) from None


class OwnSpecError(SettingsError):
    """A target's own spec cannot be used: said as it is (not as a run without a spec)."""


def _ssh_config(raw: RawOptions) -> Path | None:
    chosen = _chosen(raw, "ssh_config")
    if chosen is None:
        return None
    source, path = chosen
    if not path.is_file():
        raise SettingsError(f"{source}: no such file (an OpenSSH client configuration, given "
                            "to every ssh as -F FILE)")
    return path


def _capture(raw: RawOptions, specs: tuple[Path, ...]) -> tuple[Path | None, bool]:
    """(where the captured spec goes, whether the catalog is the spec)."""
    capture = raw.text("capture")
    if not capture:
        for name in ("capture_from", "capture_overwrite"):
            if raw.value(name):
                raise SettingsError(f"{flag(name)} goes with --gpuhost-capture=OUT.yaml")
        return None, False
    if raw.value("rollback") is not None:
        raise SettingsError("--gpuhost-capture does not go with --gpuhost-rollback (a rollback "
                            "restores a journal; capture after it, in a run of its own)")
    catalog = not specs
    for option in OPTIONS if catalog else ():
        if not option.catalog and raw.value(option.name):
            raise SettingsError(f"{option.flag} needs a spec: --gpuhost-capture without one "
                                "observes the built-in catalog and has no values to hold the "
                                "host to (pass --gpuhost-spec=FILE)")
    if raw.worker:
        return None, catalog
    if os.path.lexists(raw.invocation / capture) and not raw.flag("capture_overwrite"):
        raise SettingsError(f"--gpuhost-capture={capture}: the file exists; pass "
                            "--gpuhost-capture-overwrite to replace it, or name a new file")
    return _output(raw, "capture"), catalog


def _capture_from(raw: RawOptions, targets: Sequence[TargetAddress]) -> str:
    """The name of the target --gpuhost-capture writes down: --gpuhost-capture-from (a target's
    name or its URL as given), else the only target."""
    from ..capture.writer import pick_target

    chosen = raw.text("capture_from")
    named = [target for target in targets if target.implied is None]  # not a host it added
    by_url = {target.url: target.name for target in named}
    try:
        return pick_target([target.name for target in named], by_url.get(chosen or "", chosen))
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _journal(raw: RawOptions) -> Path | None:
    given = raw.text("journal")
    journal = raw.invocation / given if given else None
    if journal is not None and not raw.worker and journal.exists():
        raise SettingsError(f"--gpuhost-journal={given}: the file exists; a journal records "
                            "one run: name a new file")
    return journal


def _schemes(raw: RawOptions) -> Schemes:
    return raw.schemes if raw.schemes is not None else BUILTIN


def _all_targets(raw: RawOptions, specs: tuple[Path, ...]) -> tuple[TargetAddress, ...]:
    """The targets; a run with no spec of its own, whose targets cannot carry one either, says
    first that it needs one (as it did before targets could carry theirs). Where they may (a
    ``?spec=``, a targets file, an inventory), the mistake in them is what it says."""
    try:
        targets = _targets(raw)
    except OwnSpecError:
        raise
    except SettingsError:
        if not specs and raw.value("rollback") is None and not raw.text("capture") and \
                not may_carry_specs(raw):
            _usage(raw, False)
        raise
    return targets


def _with_target_specs(specs: tuple[Path, ...],
                       targets: Sequence[TargetAddress]) -> tuple[Path, ...]:
    """The run's specs, then every target's own (each once)."""
    unique = dict.fromkeys(specs)
    for target in targets:
        if target.spec is not None:
            unique.setdefault(Path(target.spec), None)
    return tuple(unique)


def resolve(raw: RawOptions) -> Settings:
    """The run's settings; SettingsError for the first thing that cannot be used."""
    given = _spec_paths(raw)
    specs = _rollback_specs(raw, given)
    notes = (f"{BY_NAME['spec'].ini} in {raw.ini_name} left out: --gpuhost-rollback restores "
             "a journal, not a spec",) if specs != given else ()
    targets = _all_targets(raw, specs)
    own = raw.value("rollback") is None and any(target.spec is not None for target in targets)
    capture, catalog = _capture(raw, specs or own_specs(targets))
    if catalog:
        from ..capture.catalog import CATALOG

        specs = (CATALOG,)
    _usage(raw, bool(specs) or own)
    rollback = raw.text("rollback")
    default_specs = specs
    if rollback is None:
        specs = _with_target_specs(specs, targets)
    active = bool(specs) or rollback is not None
    if raw.flag("persist") and len(default_specs) > 1:
        raise SettingsError("--fix-persist names its files after the spec: run it with one spec "
                            "at a time")
    lock_timeout = _seconds(raw, "lock_timeout")
    connect_timeout = _seconds(raw, "connect_timeout")
    nfd_expiry = _seconds(raw, "nfd_expiry")
    # they have defaults
    assert lock_timeout is not None and connect_timeout is not None and nfd_expiry is not None
    settings = Settings(
        invocation=raw.invocation, specs=specs, root=_root(raw) if active else Path("/"),
        fix=raw.flag("fix") or rollback is not None, dry_run=raw.flag("dry_run"),
        persist=raw.flag("persist"), fix_retry=raw.flag("fix_retry"), journal=_journal(raw),
        rollback=rollback, lock_timeout=lock_timeout, gate=raw.flag("gate"),
        report=_output(raw, "report"), prom=_output(raw, "prom"),
        alluredir=raw.invocation / raw.alluredir if raw.alluredir else None,
        worker=raw.worker, distributing=not raw.worker and bool(raw.numprocesses),
        targets=targets, ssh_config=_ssh_config(raw),
        connect_timeout=connect_timeout, target_timeout=_seconds(raw, "target_timeout"),
        ssh_masters=Path(raw.ssh_masters) if raw.ssh_masters else None,
        after_reboot=raw.flag("after_reboot"), npd=raw.flag("npd") and not raw.worker,
        nfd=_output(raw, "nfd"), capture=capture, capture_shown=raw.text("capture") or "",
        capture_from=_capture_from(raw, targets) if capture is not None or catalog else None,
        capture_overwrite=raw.flag("capture_overwrite"), catalog=catalog,
        fleet_html=_output(raw, "fleet_html"), notes=notes,
        topology=raw.flag("topology") and not raw.worker,
        accept_new_host_keys=raw.flag("accept_new_host_keys") or
        raw.ini_flag("accept_new_host_keys"),
        nfd_expiry=nfd_expiry, connect_concurrency=_count(raw, "connect_concurrency"),
        default_specs=default_specs, envelope=_envelope(raw))
    try:
        refuse_foreign_node_health(targets, nfd=settings.nfd is not None, npd=settings.npd)
    except TargetOptionError as exc:
        raise SettingsError(str(exc)) from None
    if not raw.worker:  # every output its own file, none an input of the run
        from ..fix.state import JOURNAL_DIR
        from .outputs import OutputClash, refuse_run_clashes
        from .targetoptions import target_files
        try:
            refuse_run_clashes(raw, settings, target_files(raw), settings.root / JOURNAL_DIR)
        except OutputClash as exc:
            raise SettingsError(str(exc)) from None
    return settings


def _envelope(raw: RawOptions) -> str:
    mode = (raw.text("envelope") or "on").strip()
    if mode not in ENVELOPE_MODES:
        raise SettingsError(f"{flag('envelope')}={mode!r}: expected one of "
                            f"{', '.join(ENVELOPE_MODES)}")
    return mode


def own_specs(targets: Sequence[TargetAddress]) -> tuple[Path, ...]:
    """The specs the targets carry themselves."""
    return tuple(dict.fromkeys(Path(t.spec) for t in targets if t.spec is not None))
