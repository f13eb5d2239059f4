"""Benchmarks of remote targets over ssh (issue 11) and of host calls per phase (issue 10).

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/ssh.py              # every figure (about 4 minutes), writes its
                                               # sections (6) and (3b) into bench/RESULTS.md
    .venv/bin/python bench/ssh.py --repeat 3 --only example,latency --out /tmp/r.md

All ssh goes to an OpenSSH server this script starts on 127.0.0.1 with keys, known_hosts and a
client configuration made under its temporary directory (pytest_gpuhost.testing.sshd): neither
this machine's sshd nor anyone's ~/.ssh is used. Timing is bench/bench.py's: every measured run
is a fresh ``python -m pytest`` process, cases alternate (A B, then B A, ...) after a warm-up,
and figures are medians of per-round ratios with their min-max. Only pytest-gpuhost's own
plugin is loaded in its runs (``-p no:testinfra``) and only testinfra's in testinfra's
(``-p no:gpuhost``), as a user of one tool would have it.

Figures: (6a) the example host over ssh against the same local run, with the round trips, bytes
and connect seconds of the JSON report; (6b) 100 sysctls of this machine's /proc/sys over ssh,
pytest-gpuhost against pytest-testinfra with and without ControlMaster; (6c) the example host
with 10, 100 and 1000 more sysctls over a link with 50 ms of round-trip latency (a ProxyCommand,
bench/latency_relay.py); (6d) a --fix of the example host over ssh, its round trips (and the
same --fix's host calls by method, through bench/countcalls.py); (3b) host calls per phase
on fake hosts of 1, 8, 64 GPUs and 16, 128, 512 CPUs, counted in-process through a counting
host, and the round trips of the same runs over ssh. The runs of (6b) load bench/timeline.py,
a pytest plugin that marks the end of each phase: where each run's time goes, and its cost
without the start-up and exit of its process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import (  # noqa: E402
    BLACKWELL8,
    EXAMPLE_HOST,
    PHASES,
    REPO,
    Case,
    Figure,
    Marks,
    Ratio,
    TempDir,
    Timings,
    alternate,
    bench_spec,
    bench_sysctls,
    both,
    build_tuned_host,
    choose_sysctls,
    clean_env,
    figure_lines,
    fit_line,
    host_calls,
    machine,
    med,
    medians,
    plain_test_file,
    progress,
    put_section,
    run_once,
    sections,
    summary_table,
    sysctl_spec,
    testinfra_file,
    workdir,
)
from pytest_gpuhost.testing.sshd import SshServer, find_sshd, start_sshd  # noqa: E402

FIGURES = ("example", "testinfra", "latency", "fix", "calls")
SSH_SECTION = "## (6) remote targets over ssh"
CALLS_SECTION = "## (3b) host calls per phase"
RELAY = HERE / "latency_relay.py"
ROUND_TRIP_LIMIT = 6
"""Issue 11: a verify of specs/blackwell8.yaml over ssh, the connection included."""
SLOPE_LIMIT = 0.002
"""(6c): what 50 ms of round-trip latency may add per check, in seconds (1/25 of a round trip)."""
NO_DOTFILES = "SetEnv SHLVL=1\n"
"""The test sshd's sessions start with SHLVL=1, so bash (built by Debian to source ~/.bashrc
for commands that sshd runs) takes them for nested shells and leaves ~/.bashrc out: the
figures measure the tools, not this account's shell start-up (see --dotfiles)."""
ONLY_GPUHOST = ("-p", "no:testinfra")
ONLY_TESTINFRA = ("-p", "no:gpuhost")


@dataclass
class Traffic:
    """A target's cost as the JSON report records it, per measured run."""

    round_trips: list[int] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    bytes_received: list[int] = field(default_factory=list)
    connect_seconds: list[float] = field(default_factory=list)
    outcomes: dict[str, str] = field(default_factory=dict)
    """The first run's outcome of each check."""
    varied: list[str] = field(default_factory=list)
    """Runs whose outcomes differed from the first run's (each run's report is kept)."""

    def measured(self, repeat: int) -> Traffic:
        """The last ``repeat`` runs' figures: the warm-up's left out."""
        return Traffic(self.round_trips[-repeat:], self.connections[-repeat:],
                       self.bytes_sent[-repeat:], self.bytes_received[-repeat:],
                       self.connect_seconds[-repeat:], self.outcomes, self.varied)

    def reader(self, report: Path) -> Callable[[], None]:
        """What a Case runs after each measured run: read its report."""
        def read() -> None:
            kept = report.with_name(f"{report.stem}-run{len(self.round_trips) + 1}.json")
            shutil.copy(report, kept)
            data = json.loads(report.read_text())
            [target] = data["targets"]
            self.round_trips.append(target["round_trips"])
            self.connections.append(target["connections"])
            self.bytes_sent.append(target["bytes_sent"])
            self.bytes_received.append(target["bytes_received"])
            self.connect_seconds.append(target["connect_seconds"])
            seen = outcomes(data)
            changed = [f"{key} {self.outcomes.get(key)} -> {value}"
                       for key, value in seen.items() if self.outcomes.get(key) != value]
            if self.outcomes and changed:
                more = f" and {len(changed) - 2} more" if len(changed) > 2 else ""
                self.varied.append(f"{kept.name}: {', '.join(changed[:2])}{more}")
            self.outcomes = self.outcomes or seen
        return read

    @property
    def exchanges(self) -> int:
        """Round trips with the connection included (its hello is one), the most seen."""
        return max(r + c for r, c in zip(self.round_trips, self.connections, strict=True))

    def spread(self) -> str:
        """The round trips with the connection of every run: ``6`` or ``6 (6-7)``."""
        each = [r + c for r, c in zip(self.round_trips, self.connections, strict=True)]
        return str(each[0]) if len(set(each)) == 1 else \
            f"{statistics.median(each):g} ({min(each)}-{max(each)})"

    def shown(self) -> str:
        return (f"{self.spread()} round trips with the connection ({max(self.round_trips)} "
                f"batches and commands + {max(self.connections)} connection), "
                f"{kib(med(self.bytes_sent))} sent, {kib(med(self.bytes_received))} received, "
                f"connect {spread(self.connect_seconds)}")


def outcomes(report: dict[str, object]) -> dict[str, str]:
    """Check id (without its ``@target``) -> outcome."""
    checks = report["checks"]
    assert isinstance(checks, list)
    return {check["id"].rsplit("@", 1)[0] if check.get("target") else check["id"]:
            check["outcome"] for check in checks}


def kib(size: float) -> str:
    return f"{size / 1024:.1f} KiB"


def spread(values: Sequence[float], unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    return (f"{statistics.median(values) * scale:.{digits}f} {unit} "
            f"({min(values) * scale:.{digits}f}-{max(values) * scale:.{digits}f})")


# ---------------------------------------------------------------------------------------------
# The server and its client configurations


@dataclass(frozen=True)
class Link:
    """The test sshd and the client configurations the figures use."""

    server: SshServer
    plain: Path
    """The server's own client configuration: no multiplexing, no delay."""
    master: Path
    """The same with a ControlPath under the temporary directory (testinfra adds
    ControlMaster=auto and ControlPersist=60s on its command line)."""
    delayed: Path
    """The same as ``plain`` through bench/latency_relay.py: 25 ms each way."""
    delay: float

    def url(self, root: Path | str) -> str:
        return self.server.url(root)

    def stop_master(self) -> None:
        """End a ControlMaster left by an earlier run, so that each run makes its own."""
        subprocess.run(["ssh", "-F", str(self.master), "-O", "exit", self.server.alias],
                       capture_output=True, check=False, env=clean_env())


def start_link(base: Path, *, delay: float, dotfiles: bool) -> Link:
    if find_sshd() is None or shutil.which("ssh") is None:
        raise SystemExit("needs OpenSSH: Debian's openssh-server and openssh-client")
    server = start_sshd(base / "sshd", extra_config="" if dotfiles else NO_DOTFILES)
    plain = server.client_config
    text = plain.read_text()
    master = base / "sshd" / "ssh_config.master"
    master.write_text(text + f"  ControlPath {base / 'cm-%C'}\n")
    delayed = base / "sshd" / "ssh_config.delayed"
    delayed.write_text(text + f"  ProxyCommand {sys.executable} {RELAY} %h %p {delay / 2}\n")
    link = Link(server, plain, master, delayed, delay)
    for config in (plain, delayed):
        done = subprocess.run(["ssh", "-F", str(config), server.alias, "true"],
                              capture_output=True, text=True, check=False, timeout=30,
                              env=clean_env())
        if done.returncode != 0:
            server.stop()
            raise SystemExit(f"ssh to the test sshd failed ({config.name}): {done.stderr}")
    return link


def ssh_args(link: Link, root: Path | str, config: Path | None = None) -> tuple[str, ...]:
    return (f"--gpuhost-target={link.url(root)}",
            f"--gpuhost-ssh-config={config or link.plain}")


def copy_example(directory: Path, name: str) -> Path:
    target = directory / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(EXAMPLE_HOST, target, symlinks=True)
    return target


# ---------------------------------------------------------------------------------------------
# (6a) the example host over ssh and locally


def figure_example(base: Path, link: Link, repeat: int, warmup: int) -> Figure:
    progress("example: the example host over ssh and locally")
    directory = workdir(base / "example")
    shutil.copy(BLACKWELL8, directory / "blackwell8.yaml")
    copy_example(directory, "local-host")
    remote = copy_example(directory, "ssh-host")
    spec = (*ONLY_GPUHOST, "--gpuhost-spec=blackwell8.yaml")
    here, there = Traffic(), Traffic()

    def local_outcomes() -> None:
        here.outcomes = outcomes(json.loads((directory / "local.json").read_text()))

    # The untuned example host fails many checks: exit 1 on both sides.
    local = Case("local", (*spec, "--gpuhost-root=local-host", "--gpuhost-report=local.json"),
                 directory, 1, after=local_outcomes)
    ssh = Case("ssh", (*spec, *ssh_args(link, remote), "--gpuhost-report=ssh.json"),
               directory, 1, after=there.reader(directory / "ssh.json"))
    times = alternate([local, ssh], repeat, warmup)
    there = there.measured(repeat)
    ratio, line = both(times, "ssh", "local")
    same = here.outcomes == there.outcomes and not there.varied
    exchanges = there.exchanges
    met = exchanges <= ROUND_TRIP_LIMIT and same
    added = [w - lw for w, lw in zip(times.wall["ssh"], times.wall["local"], strict=True)]
    return Figure(
        "6a", f"the example host (specs/blackwell8.yaml, {len(there.outcomes)} checks) over ssh "
        "to 127.0.0.1 against the same local run",
        f"at most {ROUND_TRIP_LIMIT} round trips, the connection included, whatever the number "
        "of checks; the same outcomes; wall time: report",
        f"{there.spread()} round trips; ssh / local wall {ratio}",
        met,
        [local.shown(base), ssh.shown(base)],
        [f"over ssh: {there.shown()} (the JSON report's targets[0]: round_trips, connections, "
         "bytes_sent, bytes_received, connect_seconds)",
         f"outcomes over ssh and locally: {'the same' if same else '**different**'} for every "
         f"one of the {len(there.outcomes)} checks"
         + (f" (runs over ssh that differed: {', '.join(there.varied)})" if there.varied else ""),
         "the same count whatever the number of checks, GPUs and CPUs: (6c) adds 10 to 1000 "
         "sysctls to this host, (3b) varies GPUs and CPUs",
         line, medians(times),
         f"what ssh adds, per round (ssh - local): {spread(added)}; the connection alone "
         f"(ssh, key exchange, authentication, python3 started there, the agent sent and "
         f"started) takes {spread(there.connect_seconds)}: the reads themselves cost less over "
         "ssh than here, where the run reads in its own process (the agent reads on the other "
         "core); CPU is the pytest process and its children (the ssh client), not the agent"])


# ---------------------------------------------------------------------------------------------
# (6d) --fix of the example host over ssh: its round trips


def figure_fix(base: Path, link: Link, repeat: int, warmup: int) -> Figure:
    """Report only: a --fix makes calls that a verify batches away (each change, its read
    back and its journal lines; each fixed check's live re-reads), each a round trip over
    ssh. Counted from the JSON report over ssh, and by method in-process on a local copy."""
    progress("fix: --fix of the example host over ssh")
    directory = workdir(base / "fix")
    shutil.copy(BLACKWELL8, directory / "blackwell8.yaml")
    spec = (*ONLY_GPUHOST, "--gpuhost-spec=blackwell8.yaml", "--fix")
    fixed, verified = Traffic(), Traffic()

    def fresh(name: str) -> Callable[[], None]:
        def copy() -> None:
            copy_example(directory, name)
        return copy

    ssh = Case("ssh --fix", (*spec, *ssh_args(link, directory / "ssh-host"),
                             "--gpuhost-report=fix.json"), directory, 1, fresh("ssh-host"),
               after=fixed.reader(directory / "fix.json"))
    local = Case("local --fix", (*spec, "--gpuhost-root=local-host"), directory, 1,
                 fresh("local-host"))
    times = alternate([local, ssh], repeat, warmup)
    fixed = fixed.measured(repeat)
    calls_file = directory / "calls.json"
    counted = Case("counted --fix", (*spec, "--gpuhost-root=counted-host", "-p", "countcalls"),
                   directory, 1, fresh("counted-host"),
                   env=(("PYTHONPATH", str(HERE)), ("GPUHOST_BENCH_CALLS", str(calls_file))))
    run_once(counted)
    by_method: dict[str, int] = json.loads(calls_file.read_text())
    verify = Case("ssh verify", (*ONLY_GPUHOST, "--gpuhost-spec=blackwell8.yaml",
                                 *ssh_args(link, copy_example(directory, "verify-host")),
                                 "--gpuhost-report=verify.json"), directory, 1,
                  after=verified.reader(directory / "verify.json"))
    run_once(verify)
    report = json.loads((directory / "fix.json").read_text())
    summary = report["summary"]
    fixes = summary["fixed"] + summary["fix_failed"]
    trips = max(r + c for r, c in zip(fixed.round_trips, fixed.connections, strict=True))
    ratio, line = both(times, "ssh --fix", "local --fix")
    methods = ", ".join(f"{m} {n}" for m, n in sorted(by_method.items(), key=lambda p: -p[1]))
    return Figure(
        "6d", f"--fix of the example host ({len(report['checks'])} checks, {fixes} fixes) "
        "over ssh to 127.0.0.1 against the same local --fix",
        "report only (no goal): the round trips a --fix makes", f"{fixed.spread()} round trips "
        f"(a verify: {verified.spread()}); ssh / local wall {ratio}", None,
        [local.shown(base), ssh.shown(base), counted.shown(base), verify.shown(base)],
        [f"over ssh: {fixed.shown()}",
         f"the same --fix counted in-process by method (bench/countcalls.py, a CountingHost "
         f"around the local host; each call is one round trip over ssh): {methods}",
         f"at 50 ms a round trip (a bastion, another region) they would add about "
         f"{trips * 0.05:.0f} s; at 1 ms (one data centre) {trips * 0.001:.1f} s",
         "where they come from: each change is its own write (the C-state fix of 64 CPUs "
         "is 64 writes; a config-space write first reads its register again, live); each "
         "fix re-reads its check under the lock, journals its changes (one write, one "
         "fsync), reads back what its writes left (one batch), writes their outcome lines "
         "(one write), asserts again, and the next check's reads are live (one batch of "
         "every pending check); a verify batches all of its reads",
         line, medians(times)])


# ---------------------------------------------------------------------------------------------
# (6b) 100 sysctls over ssh: pytest-gpuhost against pytest-testinfra


def time_ssh(link: Link, rounds: int) -> list[float]:
    """Seconds of ``ssh ALIAS true``: ssh's own connection (handshake, authentication, a
    session whose command does nothing)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(["ssh", "-F", str(link.plain), link.server.alias, "true"], check=True,
                       env=clean_env(), capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def figure_testinfra(base: Path, link: Link, repeat: int, warmup: int, slow_repeat: int,
                     count: int) -> Figure:
    progress(f"testinfra: {count} sysctls of this machine over ssh, read only")
    directory = workdir(base / "testinfra")
    chosen = choose_sysctls(count)
    first = dict(list(chosen.items())[:1])
    (directory / "many.yaml").write_text(sysctl_spec(chosen))
    (directory / "one.yaml").write_text(sysctl_spec(first))
    (directory / "test_many.py").write_text(testinfra_file(chosen))
    (directory / "test_one.py").write_text(testinfra_file(first))
    (directory / "test_plain_many.py").write_text(plain_test_file(count))
    (directory / "test_plain_one.py").write_text(plain_test_file(1))
    traffic, traffic_one = Traffic(), Traffic()
    target = ssh_args(link, "/")  # this machine's /proc/sys, read only: no --fix
    marks: dict[str, Marks] = {}

    def timed(name: str, args: tuple[str, ...], *, prepare: Callable[[], None] | None = None,
              traffic: Traffic | None = None, report: str = "") -> Case:
        """A case whose runs also mark their phases (bench/timeline.py)."""
        marks[name] = Marks(directory / f"marks-{name.replace(' ', '-')}.json")

        def after() -> None:
            marks[name].read()
            if traffic is not None:
                traffic.reader(directory / report)()
        return Case(name, (*args, "-p", "timeline"), directory, prepare=prepare, after=after,
                    env=marks[name].env)

    def gpuhost(name: str, spec: str, traffic: Traffic) -> Case:
        report = f"{spec.removesuffix('.yaml')}.json"
        return timed(name, (*ONLY_GPUHOST, f"--gpuhost-spec={spec}", *target,
                            f"--gpuhost-report={report}"), traffic=traffic, report=report)

    def testinfra(name: str, module: str) -> Case:
        return timed(name, (*ONLY_TESTINFRA, f"--hosts=ssh://{link.server.alias}",
                            f"--ssh-config={link.master}", module), prepare=link.stop_master)

    def plain(name: str, module: str) -> Case:
        return timed(name, (*ONLY_GPUHOST, "-p", "no:gpuhost", module))

    def without_master(name: str, module: str) -> Case:
        return Case(name, (*ONLY_TESTINFRA, f"--hosts=ssh://{link.server.alias}",
                           f"--ssh-config={link.plain}", module), directory)

    cases = [gpuhost("gpuhost", "many.yaml", traffic),
             gpuhost("gpuhost one", "one.yaml", traffic_one),
             testinfra("testinfra CM", "test_many.py"),
             testinfra("testinfra CM one", "test_one.py"),
             plain("pytest", "test_plain_many.py"), plain("pytest one", "test_plain_one.py")]
    slow = [without_master("testinfra", "test_many.py"),
            without_master("testinfra one", "test_one.py")]
    try:
        times = alternate(cases, repeat, warmup)
        progress(f"testinfra without ControlMaster: {slow_repeat} round(s)")
        slow_times = alternate(slow, slow_repeat, 0)
    finally:
        link.stop_master()
    traffic, traffic_one = traffic.measured(repeat), traffic_one.measured(repeat)
    handshake = time_ssh(link, repeat)

    def per_check(name: str) -> list[float]:
        """Per round: (run - one-check run) / (count - 1), each without its start-up and
        exit (the end of pytest_configure to the end of the session)."""
        many, one = marks[name].beyond(repeat), marks[f"{name} one"].beyond(repeat)
        return [(a - b) / (count - 1) for a, b in zip(many, one, strict=True)]

    def whole_per_check(series: Timings, name: str) -> list[float]:
        """Per round: (run - one-check run) / (count - 1), whole processes."""
        many, one = series.wall[name], series.wall[f"{name} one"]
        return [(a - b) / (count - 1) for a, b in zip(many, one, strict=True)]

    def ratio(theirs: list[float], ours: list[float]) -> Ratio:
        rounds = [t / o if o > 0 else float("inf") for t, o in zip(theirs, ours, strict=True)]
        return Ratio(med(rounds), min(rounds), max(rounds))

    ours, theirs, floor = per_check("gpuhost"), per_check("testinfra CM"), per_check("pytest")
    faster = ratio(theirs, ours)
    whole_ours = whole_per_check(times, "gpuhost")
    whole_theirs = whole_per_check(times, "testinfra CM")
    whole_faster = ratio(whole_theirs, whole_ours)
    without = whole_per_check(slow_times, "testinfra")
    whole, line = both(times, "gpuhost", "testinfra CM")
    met = faster.median >= 20 and whole.median <= 1 / 3
    keys = list(chosen)
    wall = {name: med(values) for name, values in times.wall.items()}
    fixed = wall["pytest one"] + med(traffic.connect_seconds)
    split = {name: marks[name].split(times.wall[name])
             for name in ("gpuhost", "testinfra CM", "pytest one")}
    ms = 1000
    return Figure(
        "6b", f"{count} sysctl checks of this machine's /proc/sys over ssh to 127.0.0.1 (read "
        "only): pytest-gpuhost against pytest-testinfra with ControlMaster",
        "beyond pytest's start-up (each side minus a one-check run of itself), testinfra's "
        "time per check at least 20 x gpuhost's; the whole run at most 1/3 of testinfra's",
        f"{faster} x less per check; whole run gpuhost / testinfra {whole}",
        met,
        [c.shown(base) for c in (*cases, *slow)],
        [f"per check beyond pytest's start-up: each run minus the one-check run of the same "
         f"tool in its round, / {count - 1}, both timed from the end of pytest_configure (every "
         "plugin loaded and configured) to the end of the session (bench/timeline.py), so that "
         "neither the start-up nor the exit of two processes, the noisiest parts on a shared "
         f"machine, is in the difference; median (min-max) over the rounds: gpuhost "
         f"{spread(ours, 'ms', ms, 2)}, testinfra with ControlMaster "
         f"{spread(theirs, 'ms', ms, 2)}; pytest's own cost of a trivial parametrized test, "
         f"measured the same way: {spread(floor, 'ms', ms, 2)}",
         f"testinfra per check / gpuhost per check, the median of the per-round ratios: "
         f"{faster}",
         f"the same from whole processes (run - one-check run, start-up and exit included): "
         f"gpuhost {spread(whole_ours, 'ms', ms, 2)}, testinfra with ControlMaster "
         f"{spread(whole_theirs, 'ms', ms, 2)}, ratio {whole_faster}; testinfra without "
         f"ControlMaster {spread(without, 'ms', ms, 1)} ({slow_repeat} round(s) of "
         f"{med(slow_times.wall['testinfra']):.1f} s)",
         line,
         f"whole runs (medians): gpuhost {wall['gpuhost']:.3f} s, testinfra with ControlMaster "
         f"{wall['testinfra CM']:.3f} s, without {med(slow_times.wall['testinfra']):.3f} s; "
         f"one-check runs: gpuhost {wall['gpuhost one']:.3f} s, testinfra with ControlMaster "
         f"{wall['testinfra CM one']:.3f} s, without "
         f"{med(slow_times.wall['testinfra one']):.3f} s; pytest with one trivial test "
         f"{wall['pytest one']:.3f} s, with {count} {wall['pytest']:.3f} s",
         f"pytest's start-up with one trivial test and the ssh connection alone are "
         f"{fixed / wall['testinfra CM']:.2f} of testinfra's whole run: with checks that cost "
         "nothing, gpuhost / testinfra could not go below that",
         *split_rows(split, count, med(traffic.connect_seconds), med(handshake)),
         f"gpuhost over ssh: {traffic.shown()}; its one-check run: {traffic_one.shown()}",
         medians(times),
         "why this machine's /proc/sys and not a fake root: testinfra's host.sysctl runs "
         "`sysctl -n KEY`, which reads /proc/sys and nothing else, so only the real tree gives "
         "both tools the same files to read; nothing is written (no --fix)",
         "ControlMaster: testinfra's ssh backend adds -o ControlMaster=auto -o "
         "ControlPersist=60s, which multiplex only with a ControlPath: the 'with' runs get a "
         "client configuration that adds `ControlPath $BENCH/cm-%C`; before each such run the "
         "master of the previous one is ended (untimed), so every run makes its own connection "
         "as gpuhost's does",
         f"keys: {len(keys)} evenly spaced in the sorted list of stable readable sysctls, from "
         f"{keys[0]} to {keys[-1]}; the one-check runs check {keys[0]}"])


def split_rows(split: dict[str, dict[str, list[float]]], count: int, connect: float,
               handshake: float) -> list[str]:
    """The table of where each run's time goes, and what it says."""
    rows = ["| run (bench/timeline.py, medians) | " + " | ".join(PHASES) + " | whole |",
            "| --- |" + " ---: |" * (len(PHASES) + 1)]
    for name, seconds in split.items():
        parts = [med(seconds[phase]) for phase in PHASES]
        whole = med([sum(run) for run in zip(*seconds.values(), strict=True)])
        rows.append(f"| {name} | " + " | ".join(f"{p:.3f} s" for p in parts)
                    + f" | {whole:.3f} s |")
    ours, plain = split["gpuhost"], split["pytest one"]
    return [*rows, "",
            f"where gpuhost's run of {count} checks goes (the table's medians): start-up "
            f"{med(ours['start-up']):.3f} s, of which pytest's own (its run of one trivial "
            f"test) {med(plain['start-up']):.3f} s and the rest the plugin's import, its "
            f"settings and the spec; collection {med(ours['collection']):.3f} s, nearly all "
            f"the ssh connection ({connect:.3f} s in the JSON report; `ssh ALIAS true` alone "
            f"takes {handshake:.3f} s, the rest is python3 starting there and the agent sent, "
            f"compiled and started) and the facts' batch; the {count} checks "
            f"{med(ours['checks']):.3f} s (one batch, then pytest's per-item machinery); the "
            f"reports {med(ours['reports']):.3f} s; the end {med(ours['end']):.3f} s "
            f"(pytest's own: {med(plain['end']):.3f} s; the rest is unconfigure, where the "
            "connection is closed and its agent's exit awaited, about 15 ms on an idle machine, "
            "and the exit of an interpreter with more modules loaded)",
            f"testinfra's run: its {count} checks take {med(split['testinfra CM']['checks']):.3f}"
            " s, one ssh channel, one remote shell and one `sysctl -n` process each (its first "
            "check also makes the ControlMaster connection)"]


# ---------------------------------------------------------------------------------------------
# (6c) 50 ms of round-trip latency


def latency_case(directory: Path, extra: int) -> Path:
    """A copy of the example host with ``extra`` more sysctls (all tuned), and
    specs/blackwell8.yaml with their entries: returns the spec."""
    directory.mkdir(parents=True, exist_ok=True)
    root = copy_example(directory, "host")
    entries = []
    for key, (value, entry) in bench_sysctls(extra).items():
        path = root / "proc/sys" / key.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
        entries.append(f"  {key}: {entry}\n")
    text = BLACKWELL8.read_text()
    anchor = "\nsysctl:\n"
    assert anchor in text
    spec = directory / "spec.yaml"
    spec.write_text(text.replace(anchor, anchor + "".join(entries), 1))
    return spec


def echo_times(config: Path, alias: str, count: int = 5) -> list[float]:
    """Seconds for a line to come back through ``ssh ALIAS cat``: the link's round trip."""
    process = subprocess.Popen(["ssh", "-F", str(config), alias, "cat"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env=clean_env())
    assert process.stdin is not None and process.stdout is not None
    times = []
    try:
        for n in range(count + 1):
            start = time.perf_counter()
            process.stdin.write(b"ping\n")
            process.stdin.flush()
            process.stdout.readline()
            if n:  # the first waits for the session to open
                times.append(time.perf_counter() - start)
    finally:
        process.stdin.close()
        process.wait(timeout=30)
    return times


def figure_latency(base: Path, link: Link, repeat: int, warmup: int,
                   sizes: Sequence[int]) -> Figure:
    progress(f"latency: the example host and {', '.join(map(str, sizes))} more sysctls, "
             f"{link.delay * 1000:.0f} ms round trips")
    directory = workdir(base / "latency")
    cases: list[Case] = []
    traffic: dict[str, Traffic] = {}
    for extra in sizes:
        where = directory / f"plus{extra}"
        spec = latency_case(where, extra)
        for delayed in (False, True):
            name = f"{'delayed' if delayed else 'direct'} +{extra}"
            report = f"{'delayed' if delayed else 'direct'}{extra}.json"
            traffic[name] = Traffic()
            config = link.delayed if delayed else link.plain
            cases.append(Case(name, (*ONLY_GPUHOST, f"--gpuhost-spec={spec.relative_to(directory)}",
                                     *ssh_args(link, where / "host", config),
                                     f"--gpuhost-report={report}"), directory, 1,
                              after=traffic[name].reader(directory / report)))
    times = alternate(cases, repeat, warmup)
    echoes = {name: echo_times(config, link.server.alias)
              for name, config in (("direct", link.plain), ("delayed", link.delayed))}
    traffic = {name: t.measured(repeat) for name, t in traffic.items()}
    checks = {extra: len(traffic[f"direct +{extra}"].outcomes) for extra in sizes}
    added = {extra: [d - p for d, p in zip(times.wall[f"delayed +{extra}"],
                                            times.wall[f"direct +{extra}"], strict=True)]
             for extra in sizes}
    rows = ["| checks | direct ssh | with 50 ms round trips | added by the latency | round trips "
            "(with the connection), direct / delayed | connect, direct / delayed |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for extra in sizes:
        direct_t, delayed_t = traffic[f"direct +{extra}"], traffic[f"delayed +{extra}"]
        rows.append(f"| {checks[extra]} | {med(times.wall[f'direct +{extra}']):.3f} s | "
                    f"{med(times.wall[f'delayed +{extra}']):.3f} s | {spread(added[extra])} | "
                    f"{direct_t.spread()} / {delayed_t.spread()} | "
                    f"{med(direct_t.connect_seconds):.3f} s / "
                    f"{med(delayed_t.connect_seconds):.3f} s |")
    # The figure: per round, the least-squares slope of what the latency added against the
    # number of checks (each difference paired within its round); their median and spread.
    slopes = [fit_line([(checks[e], added[e][n]) for e in sizes])[0] for n in range(repeat)]
    slope = Ratio(med(slopes), min(slopes), max(slopes))
    delayed_slope, delayed_base = fit_line([(checks[e], med(times.wall[f"delayed +{e}"]))
                                            for e in sizes])
    direct_slope, _ = fit_line([(checks[e], med(times.wall[f"direct +{e}"])) for e in sizes])
    exchanges = {t.exchanges for t in traffic.values()}
    varied = [name for t in traffic.values() for name in t.varied]
    most = max(t.exchanges for t in traffic.values())
    # The round trips are counted exactly; the slope confirms them in wall time, within the
    # noise of a shared machine (medians of -1.6 to +0.6 ms a check over six runs here).
    met = len(exchanges) == 1 and most <= ROUND_TRIP_LIMIT and abs(slope.median) <= SLOPE_LIMIT
    rtt_ms = link.delay * 1000
    ms = 1000
    return Figure(
        "6c", f"the example host plus {', '.join(map(str, sizes))} sysctls "
        f"({', '.join(str(checks[e]) for e in sizes)} checks) over ssh with {rtt_ms:.0f} ms of "
        "round-trip latency",
        "wall time does not grow with the checks: what the latency adds grows by at most "
        f"{SLOPE_LIMIT * ms:g} ms per check (a round trip per check would add {rtt_ms:.0f} ms), "
        "and every run has the "
        f"same round trips, at most {ROUND_TRIP_LIMIT}",
        f"the latency adds {slope.median * ms:+.2f} ms per check "
        f"({slope.low * ms:+.2f} to {slope.high * ms:+.2f}); "
        + (f"{most} round trips in every run" if len(exchanges) == 1 else
           f"round trips vary: {', '.join(map(str, sorted(exchanges)))}"),
        met,
        [c.shown(base) for c in cases],
        [*rows, "",
         f"what the latency adds per check: the least-squares slope of (delayed - direct) "
         f"against the checks, per round: median {slope.median * ms:+.3f} ms, "
         f"{slope.low * ms:+.3f} to {slope.high * ms:+.3f} ms over the {repeat} rounds",
         f"wall time (least squares over the medians): with the latency {delayed_base:.3f} s + "
         f"{delayed_slope * ms:.2f} ms per check; without it {direct_slope * ms:.2f} ms per "
         "check: pytest's own cost of an item, which no latency changes",
         f"the latency's cost is a constant: {med(added[sizes[0]]):.2f} s, about "
         f"{med(added[sizes[0]]) / link.delay:.0f} round trips of {rtt_ms:.0f} ms: ssh's "
         "handshake (key exchange, authentication, session: the connect column's difference) "
         f"and the agent's {most - 1} exchanges after its hello",
         "outcomes: " + ("the same in every run of a size" if not varied else
                         f"**differed** in {', '.join(varied)} (kept under $BENCH/latency)"),
         f"the delay: ProxyCommand `{Path(sys.executable).name} bench/latency_relay.py %h %p "
         f"{link.delay / 2}` holds every chunk {link.delay / 2 * ms:.0f} ms in each direction "
         "(a line with a delay: chunks in flight overlap, bandwidth is not limited); a line "
         f"sent through `ssh ALIAS cat` comes back in {spread(echoes['delayed'], 'ms', ms, 1)}"
         f" through it, {spread(echoes['direct'], 'ms', ms, 1)} without. Chosen over a network "
         "namespace with netem, which needs root, `ip` and the sch_netem module",
         medians(times)])


# ---------------------------------------------------------------------------------------------
# (3b) host calls per phase


def figure_calls(base: Path, link: Link | None) -> Figure:
    progress("calls: host calls per phase")
    directory = workdir(base / "calls")
    hosts: list[tuple[str, Path, Path]] = []
    for gpus, cpus in ((1, 16), (8, 16), (64, 16), (8, 128), (8, 512)):
        where = directory / f"g{gpus}c{cpus}"
        build_tuned_host(where / "host", gpus=gpus, cpus=cpus, sysctls=20)
        (where / "spec.yaml").write_text(bench_spec(gpus=gpus, sysctls=20))
        hosts.append((f"{gpus} GPUs, {cpus} CPUs", where / "spec.yaml", where / "host"))
    hosts.append(("the example host (specs/blackwell8.yaml)", BLACKWELL8,
                  copy_example(directory, "example")))
    rows = ["| host | checks | collection | run | requests in the batches | by method | "
            "round trips over ssh (with the connection) |",
            "| --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    seen: list[tuple[int, int]] = []
    commands = []
    for name, spec, root in hosts:
        calls = host_calls(directory, [spec], root)
        if root.name == "host":
            seen.append((calls.collection, calls.run))
        trips = "-"
        if link is not None:
            report = root.parent / f"{root.parent.name}-{root.name}.json"
            traffic = Traffic()
            case = Case(name, (*ONLY_GPUHOST, f"--gpuhost-spec={spec}", *ssh_args(link, root),
                               f"--gpuhost-report={report}"), directory,
                        1 if root.name == "example" else 0, after=traffic.reader(report))
            run_once(case)
            trips = str(traffic.exchanges)
            commands.append(case.shown(base))
        methods = ", ".join(f"{m} {n}" for m, n in sorted(calls.by_method.items()))
        rows.append(f"| {name} | {calls.checks} | {calls.collection} | {calls.run} | "
                    f"{calls.requests} | {methods} | {trips} |")
    constant = len(set(seen)) == 1
    return Figure(
        "3b", "host calls per phase (a batch = one call, one round trip to a remote host)",
        "the calls of each phase do not grow with the GPUs (1, 8, 64) or the CPUs (16, 128, 512)",
        (f"{seen[0][0]} at collection, {seen[0][1]} at run, at every size" if constant
         else "they grow: " + ", ".join(f"{c} / {r}" for c, r in seen)),
        constant,
        ["python bench/ssh.py --only calls   # counted in-process, then each run over ssh:",
         *commands],
        [*rows, "",
         "counted in this process through pytest_gpuhost.testing.counting.CountingHost around "
         "the local host, in a session driven as the plugin drives it (bench.host_calls: expand "
         "every spec, select, run every check in rank order, finish); a verify run, no --fix",
         "collection: the facts of every kind in one batch; run: one batch of every observation "
         "of the checks that read the host as it stands, one live batch for the fresh ones "
         "(dmesg reads the log after the other checks); the example host's spec adds an "
         "nvbandwidth run for p2p (`run 1`) and, where a cpuidle residency window applies, a "
         "live batch for its second sample",
         "round trips over ssh: the JSON report's round_trips + connections of the same run "
         "over the test sshd: the connection's hello plus one exchange per host call",
         "tests/run/test_batched_reads.py asserts the same counts; this figure only reports "
         "them"])


# ---------------------------------------------------------------------------------------------
# Report


def openssh() -> str:
    done = subprocess.run(["ssh", "-V"], capture_output=True, text=True, check=False)
    return (done.stderr or done.stdout).strip()


def ssh_section(figures: Sequence[Figure], argv: Sequence[str], args: argparse.Namespace,
                elapsed: float) -> str:
    lines = [
        SSH_SECTION, "",
        f"Produced by `{' '.join(['python', 'bench/ssh.py', *argv])}` in {elapsed:.0f} s "
        f"({args.repeat} measured rounds per figure after {args.warmup} warm-up; testinfra "
        f"without ControlMaster {args.slow_repeat} round(s)). Each run is a fresh `python -m "
        "pytest -q -p no:cacheprovider ...` process; ratios are medians of per-round ratios "
        "with their min-max; `$BENCH` is the temporary directory, `$REPO` the repository.",
        "",
        *machine(),
        f"- load average (1 min) at the start and the end: {args.load[0]:.2f}, "
        f"{args.load[1]:.2f} on {os.cpu_count()} CPUs shared with other work: expect noise",
        f"- {openssh()}; the target's python3: the same machine's /usr/bin/python3",
        "",
        "How to run the ssh benchmarks: `.venv/bin/pip install -e '.[bench]'` (pytest-testinfra, "
        "pyinstrument), Debian's openssh-server and openssh-client, then `.venv/bin/python "
        "bench/ssh.py` (about 4 minutes; `--repeat N`, `--slow-repeat N` for testinfra without "
        "ControlMaster, `--sizes 10,100,1000`, "
        "`--latency 0.05`, `--only example,testinfra,latency,fix,calls`, `--out FILE`, `--keep`). "
        "It "
        "starts its own sshd on a free port of 127.0.0.1 with keys, known_hosts and client "
        "configurations under the temporary directory (pytest_gpuhost.testing.sshd; never "
        "this machine's sshd or ~/.ssh) and stops it at the end; it rewrites only its sections "
        "(6) and (3b) of bench/RESULTS.md.",
        "",
        "The test sshd sets `SetEnv SHLVL=1`: Debian's bash sources ~/.bashrc for every "
        "command sshd runs, and this machine's root ~/.bashrc runs `pyenv init` (0.14 s) and "
        "puts pyenv's shim (0.13 s) before /usr/bin/python3; that is this account's start-up, "
        "paid by testinfra on every check and by gpuhost once per connection, not the tools'. "
        "`--dotfiles` measures with it.",
        "",
        *summary_table(figures),
    ]
    for figure in figures:
        lines += ["", *figure_lines(figure, "###")]
    return "\n".join(lines) + "\n"


def calls_section(figure: Figure, argv: Sequence[str]) -> str:
    lines = [CALLS_SECTION, "",
             f"Produced by `{' '.join(['python', 'bench/ssh.py', *argv])}` (issue 10: host "
             "calls counted by phase on fake hosts; table (3) reports the same calls, where "
             "before reads were batched it showed 112 to 3123 host operations at collection, "
             "growing with the GPUs and CPUs).", "",
             *summary_table([figure]), "", *figure_lines(figure, "###")]
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="measured rounds per figure")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--slow-repeat", type=int, default=1,
                        help="rounds of testinfra without ControlMaster (about 30 s each)")
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"comma-separated figures to run, of: {', '.join(FIGURES)}")
    parser.add_argument("--sysctls", type=int, default=100,
                        help="sysctls of this machine for the testinfra figure")
    parser.add_argument("--sizes", default="10,100,1000",
                        help="sysctls added to the example host for the latency figure")
    parser.add_argument("--latency", type=float, default=0.050,
                        help="round-trip latency added, in seconds")
    parser.add_argument("--dotfiles", action="store_true",
                        help="let the remote shell read ~/.bashrc (see the section's notes)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (printed) for a closer look")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s): {', '.join(sorted(unknown))}")
    if args.repeat < 1 or args.slow_repeat < 1:
        parser.error("--repeat and --slow-repeat must be at least 1")
    args.sizes = [int(n) for n in args.sizes.split(",")]
    return args


def run_figures(base: Path, link: Link, args: argparse.Namespace) -> Iterator[Figure]:
    only = args.only.split(",")
    if "example" in only:
        yield figure_example(base, link, args.repeat, args.warmup)
    if "testinfra" in only:
        yield figure_testinfra(base, link, args.repeat, args.warmup, args.slow_repeat,
                               args.sysctls)
    if "latency" in only:
        yield figure_latency(base, link, args.repeat, args.warmup, args.sizes)
    if "fix" in only:
        yield figure_fix(base, link, args.repeat, args.warmup)
    if "calls" in only:
        yield figure_calls(base, link)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    load = os.getloadavg()[0]
    with TempDir(args.keep) as base:
        link = start_link(base, delay=args.latency, dotfiles=args.dotfiles)
        try:
            figures = list(run_figures(base, link, args))
        finally:
            link.server.stop()
    elapsed = time.perf_counter() - start
    args.load = (load, os.getloadavg()[0])
    text = args.out.read_text() if args.out.exists() else "# Benchmark results\n"
    remote = [f for f in figures if f.label != "3b"]
    calls = [f for f in figures if f.label == "3b"]
    if remote:
        text = put_section(text, ssh_section(remote, argv, args, elapsed))
    for figure in calls:
        text = put_section(text, calls_section(figure, argv), after="## (3)")
    args.out.write_text(text)
    for heading in (SSH_SECTION, CALLS_SECTION):
        print(dict(sections(text)).get(heading, ""))
    return 0 if all(f.met is not False for f in figures) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
