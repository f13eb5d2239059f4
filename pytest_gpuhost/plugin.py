"""pytest-gpuhost's entry point: its options, and the hooks of a gpuhost run.

Every pytest run in an environment where the plugin is installed imports this module, so it
imports nothing of its own until a run asks for gpuhost work (a spec, a rollback, or one of its
options): then ``hooks.GpuhostRun`` is registered and does the rest. A run without any pays for
this module and its options only.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

from . import hookspecs, specs

MARKERS = (
    "gpuhost: on a generated host check: its kind; on a test of yours: run it only after every "
    "host check passed (--gpuhost-gate does this for every test)",
    "gpuhost_slow: a host check that takes long (the p2p bandwidth checks); -m 'not "
    "gpuhost_slow' is the fast subset a scheduler's health check can afford",
)
_OPTIONS = ("gpuhost_spec", "gpuhost_root", "fix", "gpuhost_report", "gpuhost_dry_run",
            "gpuhost_journal", "gpuhost_rollback", "fix_persist", "gpuhost_gate", "gpuhost_prom",
            "gpuhost_npd", "gpuhost_nfd", "gpuhost_target", "gpuhost_ssh_config",
            "gpuhost_rollback_after_reboot", "gpuhost_capture", "gpuhost_capture_from",
            "gpuhost_capture_overwrite", "gpuhost_fleet_html", "fix_retry", "gpuhost_inventory",
            "gpuhost_limit", "gpuhost_targets_file", "gpuhost_target_timeout")
_SPEC_SUFFIXES = (".yaml", ".yml")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuhost", "GPU host tuning checks (pytest-gpuhost)")
    group.addoption("--gpuhost-spec", action="append", default=[], metavar="FILE|NAME",
                    help="spec of the host's tuning: a YAML file, or the name of a bundled "
                         f"spec ({', '.join(specs.names())}); may be given more than once. "
                         "ini: gpuhost_spec")
    group.addoption("--gpuhost-root", default=None, metavar="DIR",
                    help="host root that every read, write and command goes through "
                         "(default /; a fake tree for tests and offline checks). ini: gpuhost_root")
    group.addoption("--fix", action="store_true", default=False,
                    help="apply the spec's value to each failing fixable check, read it back "
                         "and re-assert")
    group.addoption("--gpuhost-report", default=None, metavar="OUT.json",
                    help="write a machine-readable JSON report of every check")
    group.addoption("--gpuhost-dry-run", action="store_true", default=False,
                    help="with --fix or --gpuhost-rollback: print and report the plan (each "
                         "change: path or command, from, to) and write nothing")
    group.addoption("--gpuhost-journal", default=None, metavar="FILE",
                    help="journal of the changes --fix makes (default: ROOT/var/lib/pytest-gpuhost/"
                         "journal/<time>-<spec>-<pid>.jsonl)")
    group.addoption("--gpuhost-rollback", nargs="?", const="", default=None, metavar="JOURNAL",
                    help="restore the originals recorded in JOURNAL, newest change first (default:"
                         " the newest journal under the root not yet rolled back)")
    group.addoption("--fix-persist", action="store_true", default=False,
                    help="with --fix: also write the files under the root that make the fixes "
                         "survive a reboot (sysctl.d, modules-load.d, modprobe.d, udev, "
                         "tmpfiles.d; the grub.d drop-in of boot-time fixes)")
    group.addoption("--fix-retry", action="store_true", default=False,
                    help="with --fix: try again the fixes that failed in an earlier run on the "
                         "same boot (by default they are fix_failed, naming the journal line, "
                         "and nothing is run)")
    group.addoption("--gpuhost-rollback-after-reboot", action="store_true", default=False,
                    help="with --gpuhost-rollback: restore the runtime changes of a journal "
                         "written before the host's last reboot (refused by default: the "
                         "reboot reset them)")
    group.addoption("--gpuhost-lock-timeout", type=float, default=120.0, metavar="SECONDS",
                    help="how long a --fix run waits for another run's lock on the root "
                         "(default 120)")
    group.addoption("--gpuhost-gate", action="store_true", default=False,
                    help="run the host checks first; if any fails, the session's other tests "
                         "do not run and are reported as errors naming the failed checks")
    group.addoption("--gpuhost-prom", default=None, metavar="FILE",
                    help="write the checks as a Prometheus textfile (node_exporter's textfile "
                         "collector), atomically")
    group.addoption("--gpuhost-npd", action="store_true", default=False,
                    help="node-problem-detector custom plugin: exit 0 (all good), 1 (a check "
                         "failed) or 2 (could not run), one line on stdout; pytest's output "
                         "goes to stderr")
    group.addoption("--gpuhost-nfd", default=None, metavar="FILE",
                    help="write a Node Feature Discovery feature file (gpuhost.tuned, "
                         "gpuhost.failed), atomically")
    group.addoption("--gpuhost-target", action="append", default=[], metavar="TARGET",
                    help="a machine to check: local (this one, at --gpuhost-root), "
                         "ssh://[USER@]HOST[:PORT][/ROOT], lxc://CTID[/ROOT] or "
                         "ssh://USER@HOST?lxc=CTID; may be given more than once. "
                         "ini: gpuhost_targets (one per line)")
    group.addoption("--gpuhost-ssh-config", default=None, metavar="FILE",
                    help="OpenSSH client configuration given to every ssh as -F FILE. "
                         "ini: gpuhost_ssh_config")
    group.addoption("--gpuhost-inventory", default=None, metavar="FILE",
                    help="check every host of an Ansible inventory (INI, YAML, a directory) "
                         "over ssh, named by its inventory name; needs pytest-gpuhost[ansible]. "
                         "ini: gpuhost_inventory")
    group.addoption("--gpuhost-limit", default=None, metavar="PATTERN",
                    help="with --gpuhost-inventory: only the hosts this Ansible pattern selects, "
                         "as ansible --limit does (node01, gpu, 'gpu:!node02', 'node0*')")
    group.addoption("--gpuhost-targets-file", default=None, metavar="FILE",
                    help="targets, one a line (a target URL or [USER@]HOST[:PORT] for ssh; "
                         "# comments). ini: gpuhost_targets_file")
    group.addoption("--gpuhost-connect-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="how long connecting to a target may take (default 10)")
    group.addoption("--gpuhost-target-timeout", type=float, default=None, metavar="SECONDS",
                    help="the most time one ssh or lxc target may take (each pytest process "
                         "counts its waits on it); past it, its remaining checks are errors "
                         "naming what it hung in, and the other targets go on (default: none)")
    group.addoption("--gpuhost-capture", default=None, metavar="OUT.yaml",
                    help="write a spec of what the target holds now, for the keys of the given "
                         "spec(s), or without one for every key of the built-in catalog; "
                         "never over an existing file (see --gpuhost-capture-overwrite)")
    group.addoption("--gpuhost-capture-from", default=None, metavar="TARGET",
                    help="with --gpuhost-capture and several targets: the golden one to "
                         "capture")
    group.addoption("--gpuhost-capture-overwrite", action="store_true", default=False,
                    help="let --gpuhost-capture replace an existing file")
    group.addoption("--gpuhost-fleet-html", default=None, metavar="FILE",
                    help="write the fleet view of this run's targets (matrix, details, drift) "
                         "as one self-contained HTML page")
    parser.addini("gpuhost_spec", "spec file(s) or bundled spec name(s) of the host's tuning",
                  type="args", default=[])
    parser.addini("gpuhost_targets", "targets, one per line (see --gpuhost-target)",
                  type="linelist", default=[])
    parser.addini("gpuhost_ssh_config", "OpenSSH client configuration for the ssh targets",
                  type="string", default="")
    parser.addini("gpuhost_inventory", "Ansible inventory of the targets (see "
                  "--gpuhost-inventory)", type="string", default="")
    parser.addini("gpuhost_targets_file", "file of targets, one a line (see "
                  "--gpuhost-targets-file)", type="string", default="")
    parser.addini("gpuhost_root", "host root (default /)", type="string", default="")



def _asked(config: pytest.Config) -> bool:
    """Whether anything of gpuhost was asked for: an option, an ini value, a .yaml argument."""
    option = config.option
    if any(getattr(option, name, None) not in (None, False, [], "") for name in _OPTIONS):
        return True
    if option.gpuhost_rollback is not None or option.gpuhost_lock_timeout != 120.0 or \
            option.gpuhost_connect_timeout != 10.0:
        return True
    if any(config.getini(name) for name in ("gpuhost_spec", "gpuhost_root", "gpuhost_targets",
                                            "gpuhost_ssh_config", "gpuhost_inventory",
                                            "gpuhost_targets_file")):
        return True
    return any(arg.split("::", 1)[0].endswith(_SPEC_SUFFIXES) for arg in config.args)


def _raw_options(config: pytest.Config) -> Any:
    from .settings import RawOptions

    option = config.option
    workerinput = getattr(config, "workerinput", None)
    shared: dict[str, Any] = {}
    if workerinput is not None:  # an xdist worker: the targets its controller resolved
        from .workers import SSH_MASTERS_KEY, TARGETS_KEY

        shared = {"resolved_targets": tuple(workerinput.get(TARGETS_KEY, ())),
                  "ssh_masters": workerinput.get(SSH_MASTERS_KEY)}
    ini_base = config.inipath.parent if config.inipath else config.rootpath
    return RawOptions(
        invocation=config.invocation_params.dir, ini_base=ini_base,
        ini_name=str(config.inipath) if config.inipath else "the ini file",
        spec=tuple(option.gpuhost_spec), ini_spec=tuple(config.getini("gpuhost_spec")),
        args=tuple(config.args), root=option.gpuhost_root,
        ini_root=str(config.getini("gpuhost_root") or ""), fix=option.fix,
        dry_run=option.gpuhost_dry_run, persist=option.fix_persist,
        fix_retry=option.fix_retry,
        journal=option.gpuhost_journal, rollback=option.gpuhost_rollback,
        lock_timeout=option.gpuhost_lock_timeout, gate=option.gpuhost_gate,
        report=option.gpuhost_report, prom=option.gpuhost_prom, npd=option.gpuhost_npd,
        nfd=option.gpuhost_nfd, capture=option.gpuhost_capture,
        capture_from=option.gpuhost_capture_from,
        capture_overwrite=option.gpuhost_capture_overwrite,
        fleet_html=option.gpuhost_fleet_html,
        alluredir=getattr(option, "allure_report_dir", None),
        numprocesses=getattr(option, "numprocesses", None),
        worker=hasattr(config, "workerinput"), targets=tuple(option.gpuhost_target),
        ini_targets=tuple(config.getini("gpuhost_targets")),
        ssh_config=option.gpuhost_ssh_config,
        ini_ssh_config=str(config.getini("gpuhost_ssh_config") or ""),
        connect_timeout=option.gpuhost_connect_timeout,
        inventory=option.gpuhost_inventory,
        ini_inventory=str(config.getini("gpuhost_inventory") or ""),
        limit=option.gpuhost_limit, targets_file=option.gpuhost_targets_file,
        ini_targets_file=str(config.getini("gpuhost_targets_file") or ""),
        target_timeout=option.gpuhost_target_timeout,
        after_reboot=option.gpuhost_rollback_after_reboot, **shared)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """--gpuhost-npd: NPD reads standard output as the condition's message, so the terminal
    reporter (made at configure, from sys.stdout) writes to stderr; the real stdout is kept for
    the one line."""
    if config.option.gpuhost_npd and not hasattr(config, "workerinput"):
        from .reports.npd import STDOUT

        config.stash[STDOUT] = sys.stdout
        sys.stdout = sys.stderr


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not _asked(config):
        return
    if not config.option.gpuhost_npd or hasattr(config, "workerinput"):
        _configure_run(config)
        return
    from .reports.npd import STDOUT, cannot_run

    try:
        _configure_run(config)
    except Exception as exc:  # a bad spec or root, a held lock, a bug: NPD's "unknown"
        message = exc.msg if isinstance(exc, pytest.exit.Exception) else str(exc)
        reply = cannot_run(message or type(exc).__name__)
        print(reply.message, file=config.stash[STDOUT], flush=True)
        pytest.exit(message, returncode=reply.status)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.option.gpuhost_npd and not hasattr(config, "workerinput"):
        from .reports.npd import STDOUT

        stdout = config.stash.get(STDOUT, None)
        if stdout is not None and sys.stdout is sys.stderr:
            sys.stdout = stdout


def _configure_run(config: pytest.Config) -> None:
    from . import interrupts, long_lived

    with long_lived.paused():
        from .hooks import GpuhostRun
        from .items import RUN
        from .settings import SettingsError, resolve

        try:
            settings = resolve(_raw_options(config))
            if not settings.active:
                return
            config.add_cleanup(interrupts.install())  # SIGTERM, SIGHUP: as SIGINT does
            run = GpuhostRun(config, settings)
        except SettingsError as exc:
            raise pytest.UsageError(str(exc)) from None
    config.add_cleanup(long_lived.thaw)
    long_lived.freeze()  # the modules, the spec's model and the session live to the end
    config.stash[RUN] = run
    config.pluginmanager.register(run, "gpuhost-run")
    if settings.rollback is not None:
        config.args = [str(run.session.rollback_file)]
    else:
        _add_spec_args(config, settings.specs)
    run.start()


def _add_spec_args(config: pytest.Config, paths: Any) -> None:
    """Collect the specs: alone when no test paths were given, else beside the given ones (a
    bundled spec's check named by its id, ``blackwell8.yaml::dmesg``, found at its path)."""
    base = config.invocation_params.dir
    if config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(path) for path in paths]
        return
    args = [specs.from_argument(a, paths, base) for a in config.args]
    given = {(base / a.split("::", 1)[0]).resolve() for a in args}
    config.args = [*args, *(str(path) for path in paths if path not in given)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpuhost in a run without gpuhost checks: each fails at its setup, saying
    what to pass. Looked for once here rather than in a setup hook of every test of every run."""
    if config.pluginmanager.get_plugin("gpuhost-run") is not None:
        return  # the run's own hooks gate them
    marked = {item.nodeid for item in items
              if "gpuhost" in item.keywords and item.get_closest_marker("gpuhost") is not None}
    if marked and not config.pluginmanager.has_plugin("gpuhost-unmet"):
        config.pluginmanager.register(_NoSpec(marked), "gpuhost-unmet")


class _NoSpec:
    def __init__(self, nodeids: set[str]) -> None:
        self.nodeids = nodeids

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        __tracebackhide__ = True
        if item.nodeid in self.nodeids:
            pytest.fail(f"{item.nodeid} is marked gpuhost (it needs the host checks to pass) "
                        "but no gpuhost spec was given: pass --gpuhost-spec=FILE", pytrace=False)
