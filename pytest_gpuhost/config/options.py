"""Every option of pytest-gpuhost, declared once: its flag, ini twin, default, type, what it needs
and its help, as ansible-core's ``config/base.yml`` declares its settings.

Everything else is made from this table: ``plugin.pytest_addoption`` (flags and ini values),
whether a run asks anything of gpuhost, the raw options ``settings.RawOptions`` holds, the
flag an error names, the checks of what needs a spec or ``--fix``, and the command-line table
of docs/reference.md (``python -m pytest_gpuhost.options`` prints it; tests/test_docs.py
holds the page to it). No pytest here, and nothing heavy: every pytest run imports it.

A new option is one ``Option`` below; its value reaches ``settings.resolve`` as
``raw.value(NAME)`` (or ``raw.flag``, ``raw.text``, ``raw.words``, ``raw.seconds``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from .targets import Scheme

FLAG, TEXT, WORDS, SECONDS, OPTIONAL, COUNT = ("flag", "text", "words", "seconds", "optional",
                                              "count")
"""What an option takes: nothing (a switch), one value, a value each time it is given, a
number of seconds, an optional value (``--gpuhost-rollback[=JOURNAL]``), or a whole number
of at least 1."""


class Option:
    """One option: how pytest is told about it and what the settings make of it."""

    __slots__ = (
        "above_zero",
        "catalog",
        "default",
        "doc",
        "flag",
        "help",
        "ini",
        "ini_help",
        "ini_list",
        "kind",
        "metavar",
        "name",
        "needs_fix",
        "needs_spec",
    )

    def __init__(self, name: str, flag: str, kind: str, *, help: str, doc: str,
                 metavar: str | None = None, default: object = None, ini: str | None = None,
                 ini_help: str = "", ini_list: bool = False, needs_spec: bool = True,
                 needs_fix: bool = False, catalog: bool = True,
                 above_zero: bool = False) -> None:
        self.name = name
        """Its key in ``RawOptions`` (and, mostly, the field of ``Settings`` it becomes)."""
        self.flag = flag
        self.kind = kind
        self.help = help
        """``pytest --help``'s text (``{default}`` and ``{bundled}`` are filled in)."""
        self.doc = doc
        """The meaning column of docs/reference.md's table (Markdown; ``{default}`` filled)."""
        self.metavar = metavar
        self.default = [] if kind == WORDS else False if kind == FLAG else default
        self.ini = ini
        """The ini value it replaces, read when the option is not given."""
        self.ini_help = ini_help
        self.ini_list = ini_list
        """The ini value holds one a line (``linelist``), else words (``args``) or a string."""
        self.needs_spec = needs_spec
        """Given without a spec (or a rollback), the run is refused (exit 4)."""
        self.needs_fix = needs_fix
        """Given without --fix (and not in a rollback), the run is refused."""
        self.catalog = catalog
        """Allowed with a capture of the built-in catalog (which observes only)."""
        self.above_zero = above_zero
        """Seconds: 0 is refused too (every number of seconds must be finite, not negative)."""

    @property
    def dest(self) -> str:
        """pytest's name of its value (``config.option.gpuhost_root``)."""
        return self.flag.lstrip("-").replace("-", "_")

    def form(self) -> str:
        """How it is written with its value: ``=DIR``, ``[=JOURNAL]``, or nothing."""
        if self.kind == FLAG:
            return ""
        return f"[={self.metavar}]" if self.kind == OPTIONAL else f"={self.metavar}"

    def filled(self, text: str, bundled: str = "") -> str:
        default = self.default if isinstance(self.default, (int, float)) else 0
        return text.format(default=default, bundled=bundled)

    def help_text(self, bundled: str = "") -> str:
        text = self.filled(self.help, bundled)
        if self.ini is not None:
            text += f" ini: {self.ini}" + (" (one per line)" if self.ini_list else "")
        return text

    def doc_row(self) -> str:
        form = self.form().replace("|", "\\|")
        ini = f"`{self.ini}`" + (" (one per line)" if self.ini_list else "") if self.ini else ""
        return f"| `{self.flag}{form}` |{f' {ini}' if ini else ''} | {self.filled(self.doc)} |"

    def seconds_problem(self, value: float) -> str | None:
        """None when ``value`` is a number of seconds this option takes, else what it takes."""
        if math.isfinite(value) and value >= 0 and not (self.above_zero and value == 0):
            return None
        return ("expected a finite number of seconds"
                f"{' above 0' if self.above_zero else ', 0 or more'}")

    def given(self, value: object) -> bool:
        """Whether ``value`` (pytest's) is other than the option's default."""
        return value != self.default


OPTIONS: tuple[Option, ...] = (
    Option("spec", "--gpuhost-spec", WORDS, metavar="FILE|NAME", needs_spec=False,
           ini="gpuhost_spec", ini_help="spec file(s) or bundled spec name(s) of the host's "
                                        "tuning",
           help="spec of the host's tuning: a YAML file, or the name of a bundled spec "
                "({bundled}); may be given more than once.",
           doc="the spec (may be repeated): a YAML file, or a bare name (no `/`, no `.yaml` "
               "suffix, no file of that name) naming a bundled spec; `pytest --help` lists them "
               "(today `blackwell8`, [pytest_gpuhost/bundled/blackwell8.yaml](../pytest_gpuhost/"
               "bundled/blackwell8.yaml)); an unknown name is exit 4, listing them, and so is a "
               "bundled spec's file name where no such file is "
               "(`--gpuhost-spec=blackwell8.yaml`: the message names "
               "`--gpuhost-spec=blackwell8`). A `.yaml` spec "
               "named as an argument (`pytest FILE.yaml`) works too. With no test paths given, "
               "only the spec is collected; with test paths, the spec runs beside them."),
    Option("root", "--gpuhost-root", TEXT, metavar="DIR", ini="gpuhost_root",
           ini_help="host root (default /)",
           help="host root that every read, write and command goes through (default /; a fake "
                "tree for tests and offline checks).",
           doc="the host root (default `/`). Every read and write happens under it; commands "
               "(modprobe) resolve in `DIR/usr/sbin`, `DIR/usr/bin`, `DIR/sbin`, `DIR/bin`, "
               "without a shell, and from `PATH` only when DIR is `/`."),
    Option("fix", "--fix", FLAG, catalog=False,
           help="apply the spec's value to each failing fixable check, read it back and "
                "re-assert",
           doc="for each failing fixable check: record the value, apply the spec's value, read "
               "back, re-assert ([fix safety](fix-safety.md))."),
    Option("fix_retry", "--fix-retry", FLAG, needs_fix=True, catalog=False,
           help="with --fix: try again the fixes that failed in an earlier run on the same boot "
                "(by default they are fix_failed, naming the journal line, and nothing is run)",
           doc="with `--fix`: try again the fixes that failed in an earlier run (by default they "
               "are `fix_failed` naming the journal line, and nothing runs: [fix safety]"
               "(fix-safety.md#a-fix-that-failed-is-not-retried))."),
    Option("persist", "--fix-persist", FLAG, needs_fix=True, catalog=False,
           help="with --fix: also write the files under the root that make the fixes survive a "
                "reboot (sysctl.d, modules-load.d, modprobe.d, udev, tmpfiles.d; the grub.d "
                "drop-in of boot-time fixes)",
           doc="with `--fix`: also write the files that make the fixes survive a reboot "
               "([persistence](fix-safety.md#persistence))."),
    Option("dry_run", "--gpuhost-dry-run", FLAG, needs_fix=True, catalog=False,
           help="with --fix or --gpuhost-rollback: print and report the plan (each change: path "
                "or command, from, to) and write nothing",
           doc="with `--fix` (or `--gpuhost-rollback`): print and report the plan, each change "
               "with its path or command, from and to; write nothing."),
    Option("journal", "--gpuhost-journal", TEXT, metavar="FILE", needs_fix=True, catalog=False,
           help="journal of the changes --fix makes (default: ROOT/var/lib/pytest-gpuhost/"
                "journal/<time>-<spec>-<pid>.jsonl; <pid>-<n> for a process's n-th journal)",
           doc="where `--fix` journals its changes (default `ROOT/var/lib/pytest-gpuhost/"
               "journal/<time>-<spec>-<pid>.jsonl`; `<time>-<spec>-<pid>-<n>.jsonl` for a "
               "process's n-th journal name when it makes more than one: a `--fix` run names "
               "one journal on each target, in the order of the targets (a container before "
               "its host), and writes it only where there is something to change, so a run "
               "of `lxc://101` whose changes were all its host's writes only the host's, "
               "ending in `-2`; the summary names each journal written)."),
    Option("rollback", "--gpuhost-rollback", OPTIONAL, metavar="JOURNAL", needs_spec=False,
           help="restore the originals recorded in JOURNAL, newest change first (default: the "
                "newest journal under the root not yet rolled back)",
           doc="restore the originals of a journal, newest change first, each read back "
               "(default: the newest journal under the root not yet rolled back). Runs without "
               "a spec, serially: a spec the ini names (`gpuhost_spec`, as in "
               "`examples/benchmark/`) is left out, and the summary says so; one on the command "
               "line is exit 4."),
    Option("after_reboot", "--gpuhost-rollback-after-reboot", FLAG, needs_spec=False,
           help="with --gpuhost-rollback: restore the runtime changes of a journal written "
                "before the host's last reboot (refused by default: the reboot reset them)",
           doc="with `--gpuhost-rollback`: also restore the runtime changes of a journal written "
               "before the host's last reboot (refused by default: [undo](fix-safety.md#undo))."),
    Option("lock_timeout", "--gpuhost-lock-timeout", SECONDS, metavar="SECONDS", default=120.0,
           needs_spec=False,
           help="how long a --fix run waits for another run's lock on the root (default "
                "{default:g})",
           doc="how long a `--fix` run waits for another run's lock on the same root (default "
               "{default:g}; a finite number, 0 or more: `nan`, `inf` and negative values are "
               "refused)."),
    Option("report", "--gpuhost-report", TEXT, metavar="OUT.json",
           help="write a machine-readable JSON report of every check",
           doc="the JSON report ([below](#json-report))."),
    Option("prom", "--gpuhost-prom", TEXT, metavar="FILE",
           help="write the checks as a Prometheus textfile (node_exporter's textfile "
                "collector), atomically",
           doc="a Prometheus textfile of the checks ([below](#junit-prometheus-allure))."),
    Option("gate", "--gpuhost-gate", FLAG, catalog=False,
           help="run the host checks first; if any fails, the session's other tests do not run "
                "and are reported as errors naming the failed checks",
           doc="run the host checks before the session's other tests; when one fails, the "
               "others are errors naming it ([gate a benchmark](schedulers.md#gate-a-benchmark))."),
    Option("npd", "--gpuhost-npd", FLAG,
           help="node-problem-detector custom plugin: exit 0 (all good), 1 (a check failed) or 2 "
                "(could not run), one line on stdout; pytest's output goes to stderr",
           doc="node-problem-detector custom-plugin mode: exit 0/1/2 and one line on stdout "
               "([schedulers](schedulers.md#node-problem-detector))."),
    Option("nfd", "--gpuhost-nfd", TEXT, metavar="FILE",
           help="write a Node Feature Discovery feature file "
                "(feature.node.kubernetes.io/gpuhost.tuned, .../gpuhost.failed), atomically",
           doc="a Node Feature Discovery feature file "
               "(`feature.node.kubernetes.io/gpuhost.tuned`, `.../gpuhost.failed`, after NFD's "
               "`# +expiry-time=`), atomically, mode 0644 ([schedulers](schedulers.md"
               "#node-feature-discovery))."),
    Option("nfd_expiry", "--gpuhost-nfd-expiry", SECONDS, metavar="SECONDS", default=3600.0,
           above_zero=True, needs_spec=False,
           help="with --gpuhost-nfd: how long the labels stand once written (NFD's "
                "# +expiry-time), so they lapse when the checks stop running (default "
                "{default:g})",
           doc="with `--gpuhost-nfd`: how long the labels stand after the run (default "
               "{default:g}; a finite number above 0), so they lapse when the checks stop "
               "running."),
    Option("targets", "--gpuhost-target", WORDS, metavar="TARGET", ini="gpuhost_targets",
           ini_list=True, ini_help="targets, one per line (see --gpuhost-target)",
           help="a machine to check: local (this one, at --gpuhost-root), "
                "ssh://[USER@]HOST[:PORT][/ROOT], lxc://CTID[/ROOT] or ssh://USER@HOST?lxc=CTID; "
                "may be given more than once.",
           doc="a machine to check: `local`, `ssh://[USER@]HOST[:PORT][/ROOT]`, "
               "`lxc://CTID[/ROOT]` or `ssh://USER@HOST?lxc=CTID` (may be repeated; [remote "
               "targets](remote.md)); `?spec=SPEC` gives it a spec of its own. A container's "
               "`kernel` checks run on its host ([where a setting lives](#where-a-setting-"
               "lives))."),
    Option("host", "--gpuhost-host", TEXT, metavar="URL", ini="gpuhost_host",
           ini_help="the machine whose kernel this one runs on (see --gpuhost-host)",
           help="from inside a container: the machine whose kernel it runs on "
                "(ssh://[USER@]HOST[:PORT][/ROOT]); the local run's kernel checks run and "
                "are fixed there: every sysctl but a namespace's own (the per-namespace net.*, "
                "the IPC and UTS ones; the global net.* such as net.core.rmem_max go there), "
                "modules, PCIe, C-states, cpufreq, IOMMU, NVML device settings, dmesg (docs/"
                "reference.md#where-a-setting-lives).",
           doc="from inside a container: the machine whose kernel it runs on "
               "(`ssh://[USER@]HOST[:PORT][/ROOT]`, named as a target is). The `local` "
               "target's `kernel` checks run, are fixed and journaled there, reported under "
               "its name; the rest run here ([where a setting lives](#where-a-setting-lives)). "
               "Without it, in a container, a `kernel` check that does not pass is an `error` "
               "saying where to check it."),
    Option("ssh_config", "--gpuhost-ssh-config", TEXT, metavar="FILE",
           ini="gpuhost_ssh_config", ini_help="OpenSSH client configuration for the ssh targets",
           help="OpenSSH client configuration given to every ssh as -F FILE.",
           doc="an OpenSSH client configuration given to every ssh as `-F FILE`."),
    Option("accept_new_host_keys", "--gpuhost-accept-new-host-keys", FLAG, needs_spec=False,
           ini="gpuhost_accept_new_host_keys", ini_help="see --gpuhost-accept-new-host-keys",
           help="let --fix and --gpuhost-rollback reach an ssh target whose host key known_hosts "
                "lacks where the ssh configuration or the inventory says StrictHostKeyChecking "
                "accept-new or no (refused by default: root writes there).",
           doc="let `--fix` and `--gpuhost-rollback` obey the ssh configuration's or an "
               "inventory's `StrictHostKeyChecking` (`accept-new`, `no`); by default they reach "
               "only a target whose host key `known_hosts` holds ([host keys](remote.md))."),
    Option("connect_timeout", "--gpuhost-connect-timeout", SECONDS, metavar="SECONDS",
           default=10.0, needs_spec=False, above_zero=True,
           help="how long connecting to a target may take (default {default:g})",
           doc="how long connecting to a target may take (default {default:g})."),
    Option("connect_concurrency", "--gpuhost-connect-concurrency", COUNT, metavar="N",
           default=10, needs_spec=False,
           help="how many remote targets the run connects to at once (default {default}; "
                "under -n shared out among the workers). Each target's key exchange and login "
                "is the costly part; sshd's default MaxStartups refuses some unauthenticated "
                "connections past 10, which matters when every target is reached through one "
                "bastion",
           doc="how many remote targets the run connects to at once, all its processes together "
               "(default {default}: under `-n N` each worker connects to its own share of the "
               "targets, the count split among them, at least one each). A target's key "
               "exchange, login and agent start are most of what it costs. A default sshd "
               "(`MaxStartups 10:30:100`) starts refusing unauthenticated connections past 10: "
               "keep it at 10 or under when the targets are reached through one bastion "
               "(`ProxyJump`) whose sshd has that default ([fleets](fleets.md#many-targets-"
               "with--n-n))."),
    Option("inventory", "--gpuhost-inventory", TEXT, metavar="FILE", ini="gpuhost_inventory",
           ini_help="Ansible inventory of the targets (see --gpuhost-inventory)",
           help="check every host of an Ansible inventory (INI, YAML, a directory) over ssh, "
                "named by its inventory name; needs pytest-gpuhost[ansible].",
           doc="every host of an Ansible inventory (INI, YAML, a directory) as an ssh target "
               "named by its inventory name, with its `ansible_host`, `ansible_port`, "
               "`ansible_user`, key file, ssh arguments and `gpuhost_root` ([fleets]"
               "(fleets.md)); needs `pytest-gpuhost[ansible]`."),
    Option("limit", "--gpuhost-limit", TEXT, metavar="PATTERN",
           help="with --gpuhost-inventory: only the hosts this Ansible pattern selects, as "
                "ansible --limit does (node01, gpu, 'gpu:!node02', 'node0*')",
           doc="with an inventory: only the hosts an Ansible pattern selects, as `ansible "
               "--limit` does (`gpu:!node02`, `node0*`); none selected is exit 4."),
    Option("targets_file", "--gpuhost-targets-file", TEXT, metavar="FILE",
           ini="gpuhost_targets_file",
           ini_help="file of targets, one a line (see --gpuhost-targets-file)",
           help="targets, one a line (a target URL or [USER@]HOST[:PORT] for ssh, then "
                "optionally its spec; # comments).",
           doc="targets, one a line: a target URL or `[USER@]HOST[:PORT]` for ssh, then "
               "optionally the spec it runs (a bundled name, or a file relative to the targets "
               "file); `#` comments."),
    Option("target_timeout", "--gpuhost-target-timeout", SECONDS, metavar="SECONDS",
           above_zero=True,
           help="the most time one ssh or lxc target may take (each pytest process counts its "
                "waits on it); past it, its remaining checks are errors naming what it hung in, "
                "and the other targets go on (default: none)",
           doc="the most time one pytest process may wait on one ssh or lxc target, all steps "
               "summed; past it that target's remaining checks are errors naming the step it "
               "hung in, and the others go on (default: none; `nan`, `inf`, 0 and negative "
               "values are refused)."),
    Option("capture", "--gpuhost-capture", TEXT, metavar="OUT.yaml", needs_spec=False,
           help="write a spec of what the target holds now, for the keys of the given spec(s), "
                "or without one for every key of the built-in catalog; never over an existing "
                "file (see --gpuhost-capture-overwrite)",
           doc="write a spec of what the target holds now, for the keys of the given spec(s), "
               "or, with no spec, of the built-in catalog ([capture](capture-and-drift.md)). "
               "Refuses an existing file (exit 4)."),
    Option("capture_from", "--gpuhost-capture-from", TEXT, metavar="TARGET", needs_spec=False,
           help="with --gpuhost-capture and several targets: the golden one to capture",
           doc="with several targets: the golden one to capture (an unknown name is exit 4, "
               "listing the targets)."),
    Option("capture_overwrite", "--gpuhost-capture-overwrite", FLAG, needs_spec=False,
           help="let --gpuhost-capture replace an existing file",
           doc="let `--gpuhost-capture` replace an existing file (atomically)."),
    Option("fleet_html", "--gpuhost-fleet-html", TEXT, metavar="FILE",
           help="write the fleet view of this run's targets (matrix, details, drift) as one "
                "self-contained HTML page",
           doc="the fleet page of this run's targets ([fleet view](capture-and-drift.md"
               "#fleet-view-and-drift)), atomically."),
    Option("topology", "--gpuhost-topology", FLAG,
           help="print each target's GPU x GPU PCIe topology as nvidia-smi topo -m does (from "
                "sysfs: no driver needed), with links, MaxReadReq, the bridges' ACS and each "
                "measured pair's GB/s; the JSON report gets it",
           doc="after the summary, each target's GPU x GPU PCIe topology as `nvidia-smi topo -m` "
               "draws it, from sysfs alone, with links, MaxReadReq, IOMMU types, the bridges' "
               "ACS and the measured pairs ([the path, shown](#the-path-shown---gpuhost-"
               "topology)); the JSON report carries it as `topology`. Needs a spec (any: `-m "
               "gpuhost_slow` keeps a run to the P2P checks)."),
    Option("envelope", "--gpuhost-envelope", TEXT, metavar="on|off|strict",
           ini="gpuhost_envelope",
           help="the envelope of each benchmark (what the host did while it ran, judged by the "
                "spec's envelope: limits): on (default: kept beside its result, an invalid one "
                "named in the summary), strict (an invalid one is an error of its test), off",
           doc="each benchmark's envelope: what the host did while it ran (throttling, other "
               "processes, new Xids and AER errors, a host check changed), judged by the "
               "spec's `envelope:` limits; `on` (the default) keeps it beside the result "
               "(pytest-benchmark's `extra_info[\"gpuhost_envelope\"]`, the JSON report's "
               "`benchmarks`) and names an invalid one in the summary, `strict` makes an "
               "invalid one an error of its test, `off` takes none "
               "([the envelope](benchmarks.md#the-envelope-what-happened-while-it-ran))."),
)
ENVELOPE_MODES = ("on", "off", "strict")

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
SPEC_SUFFIXES = (".yaml", ".yml")


class RawOptions:
    """What the command line and the ini file said, unresolved: each option of
    ``options.OPTIONS`` by its name (``spec=("a.yaml",)``, ``fix=True``), the ini twins' values
    in ``ini`` by the same names; an option not given has its default."""

    def __init__(self, invocation: Path, ini_base: Path, ini_name: str = "the ini file", *,
                 args: Sequence[str] = (), ini: Mapping[str, object] | None = None,
                 alluredir: str | None = None, junitxml: str | None = None,
                 numprocesses: object = None,
                 worker: bool = False, resolved_targets: Sequence[Mapping[str, Any]] = (),
                 ssh_masters: str | None = None, schemes: Mapping[str, Scheme] | None = None,
                 **given: object) -> None:
        twins = {option.name for option in OPTIONS if option.ini is not None}
        unknown = sorted(set(given) - set(BY_NAME)) + sorted(set(ini or {}) - twins)
        if unknown:
            raise TypeError(f"no gpuhost option (or ini twin) named {', '.join(unknown)}")
        self.invocation = invocation
        self.ini_base = ini_base
        self.ini_name = ini_name
        """The ini file as errors name it (``tox.ini``), or ``the ini file``."""
        self.args = tuple(args)
        self.alluredir = alluredir
        self.junitxml = junitxml
        """pytest's ``--junitxml`` (an output of the run, as the reports are)."""
        self.numprocesses = numprocesses
        self.worker = worker
        self.resolved_targets = tuple(resolved_targets)
        """On an xdist worker: the targets as its controller resolved them (``target_record``)."""
        self.ssh_masters = ssh_masters
        """On an xdist worker: its controller's directory of ssh control sockets."""
        self.schemes = schemes
        """The target schemes the plugins registered (``builtin.target_schemes``); None: the
        built-in ones."""
        self._given = given
        self._ini = dict(ini or {})

    def value(self, name: str) -> object:
        return self._given.get(name, BY_NAME[name].default)

    def flag(self, name: str) -> bool:
        return bool(self.value(name))

    def text(self, name: str) -> str | None:
        value = self.value(name)
        return None if value is None else str(value)

    def words(self, name: str) -> tuple[str, ...]:
        return _words(self.value(name))

    def seconds(self, name: str) -> float | None:
        value = self.value(name)
        return None if value is None else float(str(value))

    def count(self, name: str) -> int:
        return int(str(self.value(name)))

    def ini_flag(self, name: str) -> bool:
        return bool(self._ini.get(name))

    def ini_text(self, name: str) -> str:
        return str(self._ini.get(name) or "")

    def ini_words(self, name: str) -> tuple[str, ...]:
        return _words(self._ini.get(name))


def _words(value: object) -> tuple[str, ...]:
    if value is None or isinstance(value, str):
        return (value,) if value else ()
    assert isinstance(value, Iterable), value
    return tuple(str(word) for word in value)


def flag(name: str) -> str:
    """The flag of the option named ``name`` (``persist`` -> ``--fix-persist``)."""
    return BY_NAME[name].flag


def docs_table() -> str:
    """docs/reference.md's command-line table."""
    return "\n".join(["| option | ini | meaning |", "| --- | --- | --- |",
                      *(option.doc_row() for option in OPTIONS)]) + "\n"


def main(argv: Sequence[str] | None = None, prog: str = "python -m pytest_gpuhost.config.options"
         ) -> int:
    """``python -m pytest_gpuhost.config.options``: print docs/reference.md's table of
    options (``--help`` says so)."""
    import argparse

    argparse.ArgumentParser(prog=prog, description="Print the table of pytest-gpuhost's "
                            "options and ini values that docs/reference.md holds (Markdown)."
                            ).parse_args(argv)
    print(docs_table(), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
