"""Benchmarks of pytest-gpuhost: the tax of being installed, overhead over pytest's floor
(serial and -n 2), an --gpuhost-npd run, against testinfra, scale (linear, and to 20,000
checks), --fix.

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python bench/bench.py                 # every figure, into bench/RESULTS.md
    .venv/bin/python bench/bench.py --repeat 3 --only floor,scale --out /tmp/r.md

The baseline of the overhead figures is pytest without the plugin (``-p no:gpuhost``): what the
same number of trivial tests costs where pytest-gpuhost is not installed.

Every measured run is a fresh ``python -m pytest`` subprocess (what a user pays) with
``-p no:cacheprovider`` and the same flags on both sides of a comparison. The cases of a figure
run alternately (A B, then B A, ...) after one unmeasured warm-up each; figures are ratios of
paired runs, reported as the median with the spread (min-max) over the rounds. Generated hosts,
specs and test files live in a temporary directory, never in the repository. The testinfra
figure reads this machine's /proc/sys and never writes to it (no --fix against the real root).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from pytest_gpuhost import builtin  # noqa: E402
from pytest_gpuhost.checks import Facts  # noqa: E402
from pytest_gpuhost.config.settings import RawOptions, Settings, resolve  # noqa: E402
from pytest_gpuhost.config.targets import TargetAddress  # noqa: E402
from pytest_gpuhost.fix.state import STATE_DIR  # noqa: E402
from pytest_gpuhost.gpu.nvml import default_factory  # noqa: E402
from pytest_gpuhost.host import Host, LocalHost  # noqa: E402
from pytest_gpuhost.session import Session  # noqa: E402
from pytest_gpuhost.specmodel import load_spec  # noqa: E402
from pytest_gpuhost.testing.counting import CountingHost  # noqa: E402
from pytest_gpuhost.testing.fakehost import FakeHost  # noqa: E402

EXAMPLE_HOST = REPO / "examples" / "hosts" / "blackwell8-untuned"
BLACKWELL8 = REPO / "specs" / "blackwell8.yaml"
COMMON = ("-q", "-p", "no:cacheprovider")
"""Flags of every measured run, on both sides of every comparison."""


def cached(name: str) -> tuple[str, ...]:
    """(1c)'s flags of a run as pytest runs by default, its cache on: the case's own cache
    directory, in which a gpuhost run's spec is kept once parsed
    (pytest_gpuhost/specmodel/cache.py)."""
    return ("-q", "-o", f"cache_dir=.cache-{name.replace(' ', '-')}")


FIGURES = ("autoload", "floor", "xdist", "npd", "testinfra", "scale", "scale20k", "fix")
NO_PLUGIN = ("-p", "no:gpuhost")
"""pytest as it is without pytest-gpuhost installed: the baseline of the overhead figures."""


# ---------------------------------------------------------------------------------------------
# Running and timing


@dataclass(frozen=True)
class Case:
    """One measured command: a fresh pytest process in ``cwd``; ``prepare`` runs untimed first."""

    name: str
    args: tuple[str, ...]
    cwd: Path
    expect_rc: int = 0
    prepare: Callable[[], None] | None = None
    after: Callable[[], None] | None = None
    """Untimed after the run (to read what it wrote: a report)."""
    env: tuple[tuple[str, str], ...] = ()
    """Added to the clean environment (the GC-time runs load bench/gctime.py through it)."""
    common: tuple[str, ...] = COMMON
    """The flags before ``args``: COMMON, or (1c)'s runs with pytest's cache (``CACHED``)."""

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", "pytest", *self.common, *self.args]

    def shown(self, base: Path) -> str:
        """The command as a user would type it, with the temporary directory as ``$BENCH``."""
        words = [*(f"{k}={v}" for k, v in self.env), "python", "-m", "pytest", *self.common,
                 *self.args]
        text = " ".join(shlex.quote(w) for w in words)
        return f"cd {self.cwd} && {text}".replace(str(base), "$BENCH").replace(str(REPO),
                                                                              "$REPO")


def clean_env() -> dict[str, str]:
    """This environment without pytest settings, and with bytecode caching on as in a user's
    install (a PYTHONDONTWRITEBYTECODE here would make every run compile every module)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    return env


PHASES = ("start-up", "collection", "checks", "reports", "end")
"""What bench/timeline.py's marks split a run into: up to the end of pytest_configure, of
collection, of the run loop, of session finish (the reports), then unconfigure and exit."""


@dataclass(frozen=True)
class RunMarks:
    """One run's marks as bench/timeline.py writes them: seconds at each mark, on the wall
    clock and on the process's CPU clock."""

    wall: dict[str, float]
    cpu: dict[str, float]


@dataclass
class Marks:
    """The phase marks of each run of one case (bench/timeline.py), read after the run."""

    path: Path
    runs: list[RunMarks] = field(default_factory=list)

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return (("PYTHONPATH", str(HERE)), ("GPUHOST_BENCH_TIMELINE", str(self.path)))

    def read(self) -> None:
        wall = json.loads(self.path.read_text())
        cpu = wall.pop("cpu")
        self.runs.append(RunMarks({k: float(v) for k, v in wall.items()},
                                  {k: float(v) for k, v in cpu.items()}))

    def beyond(self, repeat: int) -> list[float]:
        """Per measured run: seconds from the end of start-up (every plugin configured) to the
        end of the session (the reports written): a run without pytest's start-up and exit."""
        return [m.wall["finished"] - m.wall["configured"] for m in self.runs[-repeat:]]

    def split(self, walls: Sequence[float], *, cpu: bool = False) -> dict[str, list[float]]:
        """Seconds of each phase of the measured runs, whose wall times are ``walls``; with
        ``cpu``, CPU seconds of each phase of runs whose CPU times are ``walls``."""
        seconds: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for run, wall in zip(self.runs[-len(walls):], walls, strict=True):
            marks = run.cpu if cpu else run.wall
            bounds = [marks[k] for k in ("started", "configured", "collected", "ran",
                                         "finished")] + [marks["started"] + wall]
            for phase, (a, b) in zip(PHASES, itertools.pairwise(bounds), strict=True):
                seconds[phase].append(b - a)
        return seconds


@dataclass(frozen=True)
class Measured:
    """One fresh run: wall seconds, CPU seconds (user + system) of the process and its
    children, and its peak resident set size (the largest of the process's and its waited-for
    children's, as wait4 reports it) in KiB."""

    wall: float
    cpu: float
    peak_rss_kib: int


def run_once(case: Case) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process and its children) of one fresh run."""
    measured = measure(case)
    return measured.wall, measured.cpu


def measure(case: Case) -> Measured:
    """Run ``case`` once, fresh, and measure it."""
    if case.prepare is not None:
        case.prepare()
    with tempfile.TemporaryFile("w+") as output:
        start = time.perf_counter()
        process = subprocess.Popen(case.argv, cwd=case.cwd, env={**clean_env(), **dict(case.env)},
                                   stdout=output, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        elapsed = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != case.expect_rc:
            output.seek(0)
            tail = "\n".join(output.read().splitlines()[-30:])
            raise SystemExit(f"{case.name}: exit {process.returncode}, expected "
                             f"{case.expect_rc}:\n{' '.join(case.argv)}\n{tail}")
    if case.after is not None:
        case.after()
    return Measured(elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)


def instructions(case: Case, *, start_up: bool = False) -> int | None:
    """Instructions a run executes (valgrind's cachegrind, its ``I refs``: the largest count
    of its processes, a run may start git or a tool), or None without valgrind. A count, not
    a time: other work on the machine does not change it. With ``start_up``, the process ends
    once every plugin is configured (bench/stopconfigured.py): its start-up alone."""
    if shutil.which("valgrind") is None:
        return None
    argv = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
            *case.argv, *(("-p", "stopconfigured") if start_up else ())]
    env = {**clean_env(), **dict(case.env)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    if case.prepare is not None:
        case.prepare()
    done = subprocess.run(argv, cwd=case.cwd, env=env, capture_output=True, text=True,
                          check=False)
    counts = [int(n.replace(",", "")) for n in re.findall(r"I\s+refs:\s+([\d,]+)", done.stderr)]
    return max(counts) if counts else None


@dataclass
class Timings:
    """Per case name: the wall and CPU seconds of each measured round."""

    wall: dict[str, list[float]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, measured: tuple[float, float]) -> None:
        self.wall.setdefault(name, []).append(measured[0])
        self.cpu.setdefault(name, []).append(measured[1])

    def line(self, round_: int, repeat: int) -> str:
        return f"  round {round_ + 1}/{repeat}: " + ", ".join(
            f"{name} {values[-1]:.3f}s" for name, values in self.wall.items())


def alternate(cases: Sequence[Case], repeat: int, warmup: int) -> Timings:
    """Warm up each case, then ``repeat`` rounds, the order reversed every other round."""
    for _ in range(warmup):
        for case in cases:
            run_once(case)
    times = Timings()
    for round_ in range(repeat):
        for case in (cases if round_ % 2 == 0 else list(reversed(cases))):
            times.add(case.name, run_once(case))
        progress(times.line(round_, repeat))
    return times


@dataclass(frozen=True)
class Ratio:
    median: float
    low: float
    high: float

    @classmethod
    def paired(cls, numerator: Sequence[float], denominator: Sequence[float]) -> Ratio:
        ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
        return cls(statistics.median(ratios), min(ratios), max(ratios))

    def __str__(self) -> str:
        return f"{self.median:.3f} ({self.low:.3f}-{self.high:.3f})"


def med(values: Sequence[float]) -> float:
    return statistics.median(values)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Generated hosts and specs


def gpu_addresses(count: int) -> list[str]:
    """``count`` GPU addresses spread over the buses of PCI domain 0 (up to 85 GPUs)."""
    return [f"0000:{1 + 3 * i:02x}:00.0" for i in range(count)]


def bench_sysctls(count: int) -> dict[str, tuple[str, str]]:
    """``count`` sysctls: key -> (value on the host, the spec's entry), a blackwell8-like mix of
    exact integers, minimums, maximums and multi-value strings."""
    values: dict[str, tuple[str, str]] = {}
    for i in range(count):
        key = f"kernel.bench.g{i // 25:02d}.k{i % 25:02d}"
        kind = i % 4
        if kind == 0:
            values[key] = (str(i), f"{{value: {i}, why: 'bench entry {i}'}}")
        elif kind == 1:
            values[key] = (str(16777216 + i), f"{{min: 16777216, why: 'bench entry {i}'}}")
        elif kind == 2:
            values[key] = ("1", "{max: 1}")
        else:
            values[key] = (f"4096\t87380\t{16777216 + i}", f'"4096 87380 {16777216 + i}"')
    return values


def build_tuned_host(root: Path, *, gpus: int, cpus: int, sysctls: int,
                     states: Sequence[str] = ("POLL", "C1", "C2", "C3")) -> FakeHost:
    """A host on which every check of ``bench_spec`` passes."""
    host = FakeHost(root)
    for key, (value, _) in bench_sysctls(sysctls).items():
        host.sysctl(key, value)
    for n, address in enumerate(gpu_addresses(gpus)):
        host.gpu(address, numa_node=n * 2 // max(gpus, 1), max_read_request=4096)
    host.cpus(cpus, states=states, disabled=("C2", "C3"), nodes=2 if cpus > 1 else 1)
    for name in ("nvidia", "nvidia_uvm", "nvidia_peermem"):
        host.module(name)
    host.infiniband("mlx5_0")
    host.kmsg([(6, "Linux version 6.8.0-49-generic"), (4, "vxlan: non-ECT from 10.0.0.1 "
                                                         "with TOS=0x2")])
    host.modprobe(available=("nvidia", "nvidia_uvm", "nvidia_peermem", "nouveau"))
    return host


def bench_spec(*, gpus: int, sysctls: int) -> str:
    """The blackwell8 spec's shape (every section) with ``sysctls`` sysctl entries."""
    lines = ["version: 1", "name: bench", "sysctl:"]
    lines += [f"  {key}: {entry}" for key, (_, entry) in bench_sysctls(sysctls).items()]
    lines += [
        "gpus:", f"  count: {{value: {gpus}, why: 'every GPU on the bus'}}",
        "pcie:",
        "  max_read_request: {value: 4096, why: 'P2P read bandwidth'}",
        "  max_payload: {min: 256}",
        "  link_width: 16",
        "  max_link_speed: '32.0 GT/s'",
        "cpuidle:",
        "  disabled: [{name: C2, why: exit latency}, C3]",
        "modules:",
        "  nvidia: loaded",
        "  nvidia_uvm: {state: loaded, why: unified memory}",
        "  nouveau: absent",
        "  nvidia_peermem: {state: loaded, when: infiniband}",
        "dmesg:",
        "  levels: [emerg, alert, crit, err, warn]",
        "  allow: ['vxlan: non-ECT from .* with TOS=0x2']",
    ]
    return "\n".join(lines) + "\n"


def check_count(*, gpus: int, sysctls: int) -> int:
    """Checks of ``bench_spec``: sysctls, gpu_count, 4 pcie keys per GPU, 2 C-states,
    4 modules, dmesg."""
    return sysctls + 1 + 4 * gpus + 2 + 4 + 1


def plain_test_file(count: int) -> str:
    return ("import pytest\n\n\n"
            f"@pytest.mark.parametrize('n', range({count}))\n"
            "def test_trivial(n):\n"
            "    assert n >= 0\n")


def workdir(path: Path) -> Path:
    """A directory with an empty pytest.ini, so that no ini above it (the repo's) applies."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "pytest.ini").write_text("[pytest]\n")
    return path


@dataclass(frozen=True)
class SpecCase:
    directory: Path
    gpus: int
    cpus: int
    sysctls: int

    @property
    def args(self) -> tuple[str, ...]:
        return ("--gpuhost-spec=spec.yaml", "--gpuhost-root=host")

    @property
    def checks(self) -> int:
        return check_count(gpus=self.gpus, sysctls=self.sysctls)


def make_spec_case(directory: Path, *, gpus: int, cpus: int, sysctls: int) -> SpecCase:
    workdir(directory)
    build_tuned_host(directory / "host", gpus=gpus, cpus=cpus, sysctls=sysctls)
    (directory / "spec.yaml").write_text(bench_spec(gpus=gpus, sysctls=sysctls))
    return SpecCase(directory, gpus, cpus, sysctls)


def collection_reads(case: SpecCase) -> tuple[int, int]:
    """(host operations while expanding the spec into checks, number of checks), in-process."""
    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    spec = load_spec(case.directory / "spec.yaml", kinds, builtin.pytest_gpuhost_conditions())
    host = CountingHost(LocalHost(case.directory / "host"))
    facts = Facts(host)
    facts.prime(fact for section, model in spec.sections.items()
                for fact in getattr(kinds[section], "facts", lambda _: ())(model))
    checks = [c for section, model in spec.sections.items()
              for c in kinds[section].expand(model, facts)]
    return host.total, len(checks)


# ---------------------------------------------------------------------------------------------
# Figures


@dataclass
class Figure:
    label: str
    """``1b``: the section ``## (1b) ...`` and its summary row, replaced by a later run."""
    title: str
    goal: str
    result: str
    met: bool | None
    commands: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)


def both(times: Timings, numerator: str, denominator: str) -> tuple[Ratio, str]:
    """The wall-time ratio (the figure) and a line with the CPU-time ratio beside it."""
    wall = Ratio.paired(times.wall[numerator], times.wall[denominator])
    cpu = Ratio.paired(times.cpu[numerator], times.cpu[denominator])
    return wall, f"{numerator} / {denominator}: wall {wall}, CPU {cpu}"


def result_text(times: Timings, numerator: str, denominator: str) -> str:
    """A figure's result: the wall-time ratio (what the goal is judged on), then the CPU-time
    one, which other processes on a shared machine disturb less."""
    wall = Ratio.paired(times.wall[numerator], times.wall[denominator])
    cpu = Ratio.paired(times.cpu[numerator], times.cpu[denominator])
    return f"{wall}; CPU {cpu}"


def medians(times: Timings) -> str:
    return "medians (wall / CPU): " + ", ".join(
        f"{name} {med(times.wall[name]):.3f} s / {med(times.cpu[name]):.3f} s"
        for name in times.wall)


def figure_autoload(base: Path, repeat: int, warmup: int) -> list[Figure]:
    """(1a) What an installed pytest-gpuhost costs a run that gives no gpuhost option or ini
    value (every pytest run of its environment): a one-test run and a 200-test run, each with
    the plugin as installed vs ``-p no:gpuhost``. The effect is a few milliseconds in a run of
    hundreds, so this figure takes twice the rounds of the others, and says what the plugin's
    own work costs, measured in-process."""
    progress("autoload: the plugin installed, no gpuhost option given")
    directory = workdir(base / "autoload")
    (directory / "test_one.py").write_text(plain_test_file(1))
    (directory / "test_200.py").write_text(plain_test_file(200))
    off = ("-p", "no:testinfra")
    figures = []
    imported = gpuhost_modules(directory, (*off, "test_one.py"))
    import_ms = import_cost(repeat)
    hooks_ms = hook_cost(directory, (*off, "test_200.py"))
    for count, name in ((1, "test_one.py"), (200, "test_200.py")):
        installed = Case("installed", (*off, name), directory)
        without = Case("without", (*off, *NO_PLUGIN, name), directory)
        times = alternate([installed, without], 2 * repeat, warmup)
        ratio, line = both(times, "installed", "without")
        extra = med(times.wall["installed"]) - med(times.wall["without"])
        extra_cpu = med(times.cpu["installed"]) - med(times.cpu["without"])
        figures.append(Figure(
            "1a" if count == 1 else "1b",
            f"autoload tax: {count} trivial test{'s' if count > 1 else ''}, pytest-gpuhost "
            "installed but not asked for vs `-p no:gpuhost`",
            "installed / without <= 1.02 (at most ~5 ms)",
            result_text(times, "installed", "without"), ratio.median <= 1.02,
            [installed.shown(base), without.shown(base)],
            [line, medians(times),
             f"difference of the medians: wall {extra * 1000:+.1f} ms, CPU "
             f"{extra_cpu * 1000:+.1f} ms ({2 * repeat} rounds)",
             "pytest-gpuhost modules such a run imports: " + ", ".join(imported),
             f"the plugin's own work, measured in-process (a few ms are below what paired "
             f"runs resolve on a loaded machine): importing it {import_ms:.1f} ms (median of "
             f"{repeat} `python -X importtime -c 'import pytest; import "
             f"pytest_gpuhost.plugin'`), its hooks {hooks_ms:.1f} ms in a 200-test run (each "
             "hook function timed, median of 3 runs); beyond these, pytest's own work for 19 "
             "more options and one more plugin module"]))
    return figures


def import_cost(repeat: int) -> float:
    """Median ms of importing the plugin module (and what it imports) after pytest."""
    code = "import pytest; import pytest_gpuhost.plugin"
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=clean_env(),
                              capture_output=True, text=True, check=True)
        line = next(row for row in done.stderr.splitlines()
                    if row.rstrip().endswith("| pytest_gpuhost.plugin"))
        runs.append(int(line.split("|")[1]) / 1000)
    return med(runs)


def hook_cost(directory: Path, args: Sequence[str]) -> float:
    """ms spent in the plugin's hook functions during one run: each wrapped with a clock
    before pytest registers the module (median of three fresh runs)."""
    code = textwrap.dedent(f"""\
        import functools, sys, time
        import pytest
        import pytest_gpuhost.plugin as plugin
        spent = [0.0]
        def timed(function):
            @functools.wraps(function)
            def call(*args, **kwargs):
                start = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    spent[0] += time.perf_counter() - start
            return call
        for name in [n for n in dir(plugin) if n.startswith("pytest_")]:
            setattr(plugin, name, timed(getattr(plugin, name)))
        pytest.main({[*COMMON, *args]!r})
        print(spent[0] * 1000, file=sys.stderr)
        """)
    runs = []
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], cwd=directory, env=clean_env(),
                              capture_output=True, text=True, check=True)
        runs.append(float(done.stderr.split()[-1]))
    return med(runs)


def gpuhost_modules(directory: Path, args: Sequence[str]) -> list[str]:
    """The pytest_gpuhost modules a run imports (a run of its own, in a fresh process)."""
    code = ("import sys, pytest\n"
            f"pytest.main({[*COMMON, *args]!r})\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('pytest_gpuhost'))),"
            " file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=directory, env=clean_env(),
                          capture_output=True, text=True, check=True)
    return done.stderr.split()


def opened_paths(spec: SpecCase) -> list[str]:
    """The paths a gpuhost run of ``spec`` opens, directories included, in order (what
    bench/floorplug.py reads): a run of its own with the agent's opener wrapped."""
    listing = spec.directory / "opened.txt"
    code = textwrap.dedent(f"""\
        import pytest
        from pytest_gpuhost.host import agent
        opened, original = [], agent.Root._open
        def traced(self, rel, flags, mode=0):
            opened.append(rel)
            return original(self, rel, flags, mode)
        agent.Root._open = traced
        pytest.main({[*COMMON, "-p", "no:testinfra", *spec.args]!r})
        open({str(listing)!r}, "w").write("\\n".join(opened) + "\\n")
        """)
    subprocess.run([sys.executable, "-c", code], cwd=spec.directory, env=clean_env(),
                   capture_output=True, check=True)
    return listing.read_text().split()


def figure_floor(base: Path, repeat: int, warmup: int) -> Figure:
    """(1c) The full spec on a 128-CPU x 4-state, 8-GPU, 300-sysctl host vs a plain test file
    with the same number of trivial parametrized tests, run without the plugin; beside them, a
    lower bound (bench/floorplug.py: the same spec parsed, the same paths read, as many items),
    and where each run's time goes (bench/timeline.py, loaded by all three). The three run
    twice, alternated: with ``-p no:cacheprovider`` as every figure runs (the spec parsed each
    run), and with pytest's cache on, its default (the spec kept by the run before)."""
    progress("floor: overhead over pytest's floor")
    spec = make_spec_case(base / "floor", gpus=8, cpus=128, sysctls=300)
    (spec.directory / "test_plain.py").write_text(plain_test_file(spec.checks))
    paths = opened_paths(spec)
    # pytest-testinfra (installed for figure 2) is no part of a gpuhost run: off on every side.
    off = ("-p", "no:testinfra")
    marks: dict[str, Marks] = {}

    def timed(name: str, args: tuple[str, ...], *env: tuple[str, str],
              common: tuple[str, ...] = COMMON) -> Case:
        marks[name] = Marks(spec.directory / f"marks-{name.replace(' ', '-')}.json")
        return Case(name, (*args, "-p", "timeline"), spec.directory, after=marks[name].read,
                    env=(*marks[name].env, *env), common=common)

    lower_env = (("FLOORPLUG_PATHS", "opened.txt"), ("FLOORPLUG_ITEMS", str(spec.checks)))
    lower_args = (*off, *NO_PLUGIN, "-p", "floorplug", "spec.yaml")
    plain_args = (*off, *NO_PLUGIN, "test_plain.py")
    gpuhost = timed("gpuhost", (*off, *spec.args))
    lower = timed("reads only", lower_args, *lower_env)
    plain = timed("plain", plain_args)
    kept = timed("gpuhost cached", (*off, *spec.args), common=cached("gpuhost cached"))
    lower_c = timed("reads only cached", lower_args, *lower_env,
                    common=cached("reads only cached"))
    plain_c = timed("plain cached", plain_args, common=cached("plain cached"))
    times = alternate([gpuhost, lower, plain, kept, lower_c, plain_c], repeat, warmup)
    counted = {case.name: instructions(case, start_up=True)
               for case in (gpuhost, lower, kept, lower_c)}
    spec_cache = spec.directory / ".cache-gpuhost-cached" / "d" / "gpuhost-spec"
    first = dataclasses.replace(kept, name="gpuhost cached, first run",
                                prepare=lambda: shutil.rmtree(spec_cache, ignore_errors=True))
    counted[first.name] = instructions(first, start_up=True)
    ratio, line = both(times, "gpuhost", "plain")
    ratio_c, line_c = both(times, "gpuhost cached", "plain cached")
    _, lower_line = both(times, "reads only", "plain")
    extra = med(times.wall["gpuhost"]) - med(times.wall["plain"])
    split = {name: marks[name].split(times.wall[name]) for name in marks}
    cpu_split = {name: marks[name].split(times.cpu[name], cpu=True) for name in marks}

    def gaps(ours: str, bound: str, cpu: bool = False) -> dict[str, float]:
        by = cpu_split if cpu else split
        return {phase: med(by[ours][phase]) - med(by[bound][phase]) for phase in PHASES}

    def shown(gap: dict[str, float]) -> str:
        return ", ".join(f"{phase} {1000 * gap[phase]:+.0f} ms" for phase in PHASES)

    def paired(ours: str, bound: str, cpu: bool = False) -> list[float]:
        """Per round, ours' start-up less the lower bound's of the same round (the Rules'
        pairing of alternated runs, as each ratio is): the machine's drift between rounds,
        which moves both, cancels."""
        by = cpu_split if cpu else split
        return [a - b for a, b in zip(by[ours]["start-up"], by[bound]["start-up"], strict=True)]

    def shown_pairs(pairs: list[float]) -> str:
        return (f"{1000 * med(pairs):+.0f} ms ({1000 * min(pairs):+.0f} to "
                f"{1000 * max(pairs):+.0f} ms)")

    pairs_c = paired("gpuhost cached", "reads only cached")
    gap, cpu_gap = gaps("gpuhost", "reads only"), gaps("gpuhost", "reads only", cpu=True)
    gap_c = gaps("gpuhost cached", "reads only cached")
    cpu_gap_c = gaps("gpuhost cached", "reads only cached", cpu=True)
    startup = ", ".join(f"{name} {1000 * med(cpu_split[name]['start-up']):.0f} ms"
                        for name in marks)
    return Figure(
        "1c", f"overhead over pytest's floor: {spec.checks} checks (128 CPUs x 4 C-states, "
        "8 GPUs, 300 sysctls) vs as many trivial parametrized tests without the plugin",
        "gpuhost / plain <= 1.15 (serial), the start-up phase at most 25 ms over the lower "
        "bound's", f"{result_text(times, 'gpuhost', 'plain')}; start-up "
        f"{1000 * gap['start-up']:+.0f} ms over the lower bound (CPU "
        f"{1000 * cpu_gap['start-up']:+.0f} ms). With pytest's cache on (its default; the spec "
        f"kept by the run before): {result_text(times, 'gpuhost cached', 'plain cached')}; "
        f"start-up {1000 * gap_c['start-up']:+.0f} ms over the lower bound (CPU "
        f"{1000 * cpu_gap_c['start-up']:+.0f} ms); paired by round {shown_pairs(pairs_c)}",
        ratio.median <= 1.15 and ratio_c.median <= 1.15 and med(pairs_c) <= 0.025,
        [gpuhost.shown(base), lower.shown(base), plain.shown(base), kept.shown(base),
         lower_c.shown(base), plain_c.shown(base)],
        [line, line_c, medians(times),
         f"difference of the medians: {extra * 1000:.0f} ms, "
         f"{extra / spec.checks * 1e6:.0f} us a check",
         f"a lower bound, {lower_line} (bench/floorplug.py, a plugin that parses the same spec "
         f"with PyYAML's C loader, opens and reads the same {len(paths)} paths as the gpuhost "
         f"run, with os.open and no containment, and yields {spec.checks} items that compare a "
         "string): what the plugin costs beyond it is its own machinery, not the reading its "
         "checks need",
         "gpuhost against the lower bound, by phase (bench/timeline.py medians, the phases "
         f"of bench/ssh.py): {shown(gap)}; with pytest's cache on: {shown(gap_c)}",
         "the start-up phase over the lower bound's, paired by round (each round's gpuhost "
         "run less the same round's lower bound: median, min to max; what the goal is judged "
         "on, as each ratio is): without pytest's cache "
         f"{shown_pairs(paired('gpuhost', 'reads only'))}, CPU "
         f"{shown_pairs(paired('gpuhost', 'reads only', cpu=True))}; with it "
         f"{shown_pairs(pairs_c)}, CPU "
         f"{shown_pairs(paired('gpuhost cached', 'reads only cached', cpu=True))}",
         f"the same in CPU time (time.process_time() at each mark): {shown(cpu_gap)}; with "
         f"pytest's cache on: {shown(cpu_gap_c)}; the start-up phase's CPU time of each run "
         f"(medians): {startup}",
         start_up_instructions(counted, "gpuhost", "reads only"),
         "with pytest's cache on: " + start_up_instructions(
             counted, "gpuhost cached", "reads only cached") + "; a first run (the spec parsed "
         "and kept): " + start_up_instructions(counted, "gpuhost cached, first run",
                                               "reads only cached").split(": ", 1)[1]])


def start_up_instructions(counted: dict[str, int | None], ours: str, lower: str) -> str:
    """The start-up's instructions of two runs (``instructions``), and what ours adds."""
    if counted[ours] is None or counted[lower] is None:
        return "instructions of the start-up: not counted (no valgrind here)"
    mine, bound = counted[ours] or 0, counted[lower] or 0
    return (f"instructions of the start-up up to the end of pytest_configure (valgrind "
            f"--tool=cachegrind, I refs; a count the machine's load does not change): {ours} "
            f"{mine / 1e6:.0f} M, {lower} {bound / 1e6:.0f} M, {(mine - bound) / 1e6:+.0f} M "
            f"({100 * (mine - bound) / bound:+.1f}% of the lower bound's start-up)")


def xdist_cases(spec: SpecCase) -> list[Case]:
    """(1d)'s two runs: the spec case's checks and as many plain tests, each with ``-n 2``.

    Each names its own ``--basetemp`` in the case's directory. Without it, xdist's controller
    makes a numbered base temporary directory under ``/tmp/pytest-of-USER`` (for its workers'),
    and pytest's tmpdir plugin, at the run's end, deletes every numbered one there but the
    newest 3, whichever pytest run of this user's on the machine made them and filled them. On
    a machine shared with test runs, one measured run then deleted the tmp_path trees a test
    suite had left (this project's tests/fix/test_fix.py alone leaves 25,000 files): 26 s of
    a 29 s run in the controller's pytest_sessionfinish, which can fall on either side of the
    comparison (bench/targets.py gives its runs a --basetemp for the same reason)."""
    (spec.directory / "test_plain.py").write_text(plain_test_file(spec.checks))
    off = ("-p", "no:testinfra", "--basetemp=basetemp")
    return [Case("gpuhost -n 2", (*off, "-n", "2", *spec.args), spec.directory),
            Case("plain -n 2", (*off, *NO_PLUGIN, "-n", "2", "test_plain.py"), spec.directory)]


def figure_xdist(base: Path, repeat: int, warmup: int) -> Figure:
    """(1d) The floor's host and plain tests again, each serial and with ``-n 2``."""
    progress("xdist: the floor's run with -n 2")
    try:
        import xdist  # noqa: F401
    except ImportError:
        return Figure("1d", "-n 2: the floor's 340 checks vs as many trivial tests",
                      "gpuhost / plain <= 1.20 at -n 2", "not run: pytest-xdist is not "
                      "installed (pip install '.[xdist]')", None)
    spec = make_spec_case(base / "xdist", gpus=8, cpus=128, sysctls=300)
    cases = xdist_cases(spec)
    times = alternate(cases, repeat, warmup)
    ratio, line = both(times, "gpuhost -n 2", "plain -n 2")
    return Figure(
        "1d", f"-n 2: the floor's {spec.checks} checks vs as many trivial tests without the "
        "plugin, both with pytest-xdist's -n 2", "gpuhost / plain <= 1.20 at -n 2",
        result_text(times, "gpuhost -n 2", "plain -n 2"), ratio.median <= 1.20,
        [c.shown(base) for c in cases],
        [line, medians(times), "serial, the same two: figure (1c)"])


def _readable_sysctls() -> dict[str, str]:
    """Every single-line, stable, readable sysctl of this machine: dotted key -> raw value."""
    found: dict[str, str] = {}
    proc = Path("/proc/sys")
    for path in sorted(p for p in proc.rglob("*") if p.is_file()):
        parts = path.relative_to(proc).parts
        if any("." in part for part in parts):
            continue  # an interface name like eth0.100: its key needs the '/' form
        try:
            if not os.access(path, os.R_OK):
                continue
            raw = path.read_text()
        except (OSError, UnicodeDecodeError):
            continue
        value = raw.rstrip("\n")
        if not value.strip() or not value.replace("\t", " ").isprintable():
            continue
        if any(c in value for c in "'\"\\#:{}[],&*!|>%@`"):
            continue
        found[".".join(parts)] = value
    return found


def choose_sysctls(count: int) -> dict[str, str]:
    """``count`` keys chosen evenly from the sorted list of stable readable sysctls (values
    read twice, a moment apart, so counters like fs.file-nr are left out)."""
    first = _readable_sysctls()
    time.sleep(0.5)
    second = _readable_sysctls()
    stable = sorted(k for k, v in first.items() if second.get(k) == v)
    if len(stable) < count:
        raise SystemExit(f"only {len(stable)} stable readable sysctls here; need {count}")
    picked = [stable[i * len(stable) // count] for i in range(count)]
    return {key: first[key] for key in picked}


def testinfra_expected(raw: str) -> int | str:
    """What testinfra's host.sysctl returns for a value: int() of `sysctl -n`, else the text."""
    try:
        return int(raw)
    except ValueError:
        return raw


def figure_testinfra(base: Path, repeat: int, warmup: int, count: int) -> Figure:
    """(2) The same sysctl checks of this machine's /proc/sys: pytest-gpuhost vs testinfra."""
    progress(f"testinfra: {count} sysctls of this machine, read only")
    directory = workdir(base / "testinfra")
    chosen = choose_sysctls(count)
    spec = ["version: 1", "name: real-sysctls", "sysctl:"]
    spec += [f"  {key}: {json.dumps(value)}" for key, value in chosen.items()]
    (directory / "real.yaml").write_text("\n".join(spec) + "\n")
    params = ",\n".join(f"    ({key!r}, {testinfra_expected(v)!r})" for key, v in chosen.items())
    (directory / "test_testinfra.py").write_text(
        "import pytest\n\n"
        f"SYSCTLS = [\n{params},\n]\n\n\n"
        "@pytest.mark.parametrize('key, expected', SYSCTLS, ids=[k for k, _ in SYSCTLS])\n"
        "def test_sysctl(host, key, expected):\n"
        "    assert host.sysctl(key) == expected\n")
    (directory / "test_one.py").write_text(plain_test_file(1))
    gpuhost = Case("gpuhost", ("--gpuhost-spec=real.yaml",), directory)  # root /, no --fix
    testinfra = Case("testinfra", ("test_testinfra.py",), directory)
    startup = Case("startup", ("test_one.py",), directory)
    times = alternate([gpuhost, testinfra, startup], repeat, warmup)
    ratio, line = both(times, "gpuhost", "testinfra")

    def above(name: str) -> list[float]:
        return [t - s for t, s in zip(times.wall[name], times.wall["startup"], strict=True)]

    beyond = Ratio.paired(above("gpuhost"), above("testinfra"))
    bound = med(times.wall["startup"]) / med(times.wall["testinfra"])
    keys = list(chosen)
    return Figure(
        "2", f"against testinfra: {count} sysctl checks of this machine's /proc/sys (read only)",
        "gpuhost / testinfra <= 0.3", f"{ratio}", ratio.median <= 0.3,
        [gpuhost.shown(base), testinfra.shown(base), startup.shown(base)],
        [line, medians(times),
         f"beyond pytest's startup (each run minus the run of one trivial test in its round): "
         f"gpuhost / testinfra {beyond}; per check: gpuhost "
         f"{med(above('gpuhost')) / count * 1000:.2f} ms, testinfra "
         f"{med(above('testinfra')) / count * 1000:.2f} ms",
         f"pytest's startup alone is {bound:.3f}"
         " of testinfra's median: with checks that cost nothing, gpuhost / testinfra could not "
         "go below that",
         f"keys: {len(keys)} of the {len(keys)} evenly spaced in the sorted list of stable "
         f"readable sysctls, from {keys[0]} to {keys[-1]}"])


def fit_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares: (slope, intercept)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def _scale_axis(base: Path, axis: str, values: Sequence[int], fixed: dict[str, int],
                repeat: int, warmup: int) -> tuple[list[str], list[str], bool]:
    cases: list[Case] = []
    specs: dict[str, SpecCase] = {}
    for value in values:
        sizes = {**fixed, axis: value}
        name = f"{value} {axis}"
        spec = make_spec_case(base / "scale" / f"{axis}{value}", gpus=sizes["gpus"],
                              cpus=sizes["cpus"], sysctls=sizes["sysctls"])
        specs[name] = spec
        cases.append(Case(name, ("-p", "no:testinfra", *spec.args), spec.directory))
    progress(f"scale: {axis} {', '.join(map(str, values))}")
    times = alternate(cases, repeat, warmup)
    rows, reads = [], []
    first = cases[0].name
    for case in cases:
        spec = specs[case.name]
        total, checks = collection_reads(spec)
        reads.append((getattr(spec, axis), total))
        rows.append(f"| {case.name} | {checks} | {total} | {med(times.wall[case.name]):.3f} s | "
                    f"{Ratio.paired(times.wall[case.name], times.wall[first])} | "
                    f"{Ratio.paired(times.cpu[case.name], times.cpu[first])} |")
    unit = axis[:-1].upper()
    notes = []
    steps_of: dict[str, list[float]] = {}
    slopes: dict[str, float] = {}
    for clock, series in (("wall", times.wall), ("CPU", times.cpu)):
        points = [(getattr(specs[c.name], axis), med(series[c.name])) for c in cases]
        slope, intercept = fit_line(points)
        slopes[clock] = slope
        steps_of[clock] = [(y2 - y1) / (x2 - x1)
                           for (x1, y1), (x2, y2) in itertools.pairwise(points)]
        notes.append(f"{axis}, {clock} time = {intercept:.3f} s + {slope * 1000:.2f} ms per "
                     f"{unit} (least squares over the medians); per step: "
                     + ", ".join(f"{s * 1000:.2f} ms/{unit}" for s in steps_of[clock]))
    read_slope, read_intercept = fit_line(reads)
    read_steps = [(y2 - y1) / (x2 - x1) for (x1, y1), (x2, y2) in itertools.pairwise(reads)]
    notes.append(f"{axis}: linear or better means the wall cost per {unit} of the last step is "
                 "at most 1.5 x the least-squares slope + 0.5 ms, and the collection reads grow "
                 "by the same count per unit at every step")
    notes.append(f"{axis}: collection reads = {read_intercept:.0f} + {read_slope:g} per {unit} "
                 "(host operations while the spec expands into checks; per step: "
                 + ", ".join(f"{s:g}" for s in read_steps) + f" per {unit}, the same whatever "
                 "the number of checks)")
    # Linear or better: the cost per unit of the last, largest step is at most 1.5 times the
    # least-squares slope over all three points (+0.5 ms per unit for noise): a cost growing
    # faster than linearly concentrates in that step. And the collection reads grow by the same
    # count per unit at every step.
    wall_steps = steps_of["wall"]
    linear = wall_steps[-1] <= 1.5 * max(slopes["wall"], 0.0) + 0.0005 and \
        len(set(read_steps)) == 1
    return rows, notes + [c.shown(base) for c in cases], linear


def figure_scale(base: Path, repeat: int, warmup: int) -> Figure:
    """(3) Wall time for 1, 8, 64 GPUs (16 CPUs) and 16, 128, 512 CPUs (8 GPUs)."""
    rows = ["| host | checks | collection reads | median wall | wall ratio to the smallest "
            "| CPU ratio |", "| --- | ---: | ---: | ---: | --- | --- |"]
    gpu_rows, gpu_notes, gpu_linear = _scale_axis(
        base, "gpus", (1, 8, 64), {"cpus": 16, "sysctls": 20}, repeat, warmup)
    cpu_rows, cpu_notes, cpu_linear = _scale_axis(
        base, "cpus", (16, 128, 512), {"gpus": 8, "sysctls": 20}, repeat, warmup)
    notes = [n for n in gpu_notes + cpu_notes if not n.startswith("cd ")]
    commands = [n for n in gpu_notes + cpu_notes if n.startswith("cd ")]
    linear = gpu_linear and cpu_linear
    return Figure(
        "3a", "scale: 1, 8, 64 GPUs (16 CPUs x 4 C-states) and 16, 128, 512 CPUs (8 GPUs), "
        "20 sysctls", "cost grows linearly or better; collection reads O(1) per GPU/CPU",
        "linear" if linear else "worse than linear", linear, commands,
        rows[:2] + gpu_rows + cpu_rows + [""] + notes)


SCALE_SIZES = (1_000, 5_000, 20_000)


def gc_counted(case: Case, out: Path) -> Case:
    """``case`` with bench/gctime.py loaded (on both sides of a comparison: its cost, a clock
    read per collection, is the same for both), appending to ``out``."""
    return dataclasses.replace(
        case, args=("-p", "gctime", *case.args),
        env=(("PYTHONPATH", str(REPO / "bench")), ("GPUHOST_BENCH_GC", str(out))))


def gc_medians(out: Path) -> tuple[float, int, int]:
    """Median (GC seconds, collections, full collections) of the measured runs in ``out``."""
    rows = [line.split() for line in out.read_text().splitlines()]
    return (med([float(r[0]) for r in rows]), int(med([int(r[1]) for r in rows])),
            int(med([int(r[2]) for r in rows])))


def figure_scale20k(base: Path, repeat: int, warmup: int) -> Figure:
    """(3b) 1,000, 5,000 and 20,000 checks (8 GPUs, 128 CPUs x 4 C-states, the rest sysctls)
    each against as many trivial tests without the plugin, with the garbage collector's time."""
    rows = ["| checks | gpuhost / plain (wall) | CPU | median wall gpuhost / plain | "
            "GC gpuhost / plain (collections, full) |", "| ---: | --- | --- | --- | --- |"]
    commands, worst, worst_cpu = [], 0.0, 0.0
    for size in SCALE_SIZES:
        progress(f"scale20k: {size} checks")
        other = check_count(gpus=8, sysctls=0)
        spec = make_spec_case(base / "scale20k" / str(size), gpus=8, cpus=128,
                              sysctls=size - other)
        (spec.directory / "test_plain.py").write_text(plain_test_file(spec.checks))
        off = ("-p", "no:testinfra")
        gc_out = {name: spec.directory / f"gc-{name}" for name in ("gpuhost", "plain")}
        gpuhost = gc_counted(Case("gpuhost", (*off, *spec.args), spec.directory),
                             gc_out["gpuhost"])
        plain = gc_counted(Case("plain", (*off, *NO_PLUGIN, "test_plain.py"), spec.directory),
                           gc_out["plain"])
        # The largest size takes its warm-up from the smaller ones: a run of it is ~30 s here.
        times = alternate([gpuhost, plain], repeat, warmup if size < 20_000 else 0)
        wall = Ratio.paired(times.wall["gpuhost"], times.wall["plain"])
        cpu = Ratio.paired(times.cpu["gpuhost"], times.cpu["plain"])
        gc_g, gc_p = gc_medians(gc_out["gpuhost"]), gc_medians(gc_out["plain"])
        rows.append(f"| {spec.checks} | {wall} | {cpu} | {med(times.wall['gpuhost']):.2f} s / "
                    f"{med(times.wall['plain']):.2f} s | {gc_g[0] * 1000:.0f} ms ({gc_g[1]}, "
                    f"{gc_g[2]}) / {gc_p[0] * 1000:.0f} ms ({gc_p[1]}, {gc_p[2]}) |")
        commands += [gpuhost.shown(base), plain.shown(base)]
        if size >= 5_000:
            worst = max(worst, wall.median)
            worst_cpu = max(worst_cpu, cpu.median)
    return Figure(
        "3c", "scale to 20,000 checks: " + ", ".join(f"{n:,}" for n in SCALE_SIZES) +
        " checks (8 GPUs, 128 CPUs x 4 C-states, the rest sysctls) vs as many trivial tests "
        "without the plugin", "gpuhost / plain <= 1.10 at 5,000 and 20,000 checks",
        f"at most {worst:.3f} from 5,000 checks on (CPU: {worst_cpu:.3f})", worst <= 1.10,
        commands,
        [*rows, "", f"{repeat} measured rounds per size (--big-repeat), after a warm-up "
         "round except at 20,000; GC: the median time spent in the garbage collector over every "
         "run of the case (measured ones and warm-up), pytest's own final collections "
         "included, by bench/gctime.py (`-p gctime` with bench/ on PYTHONPATH, loaded on both "
         "sides)"])


def figure_fix(base: Path, repeat: int, warmup: int) -> Figure:
    """(4) --fix of a copy of the example host, then a second (idempotent) --fix of it, vs a
    plain verify run of an untouched copy."""
    progress("fix: --fix and a second --fix of the example host")
    directory = workdir(base / "fix")
    shutil.copy(BLACKWELL8, directory / "blackwell8.yaml")
    spec = ("--gpuhost-spec=blackwell8.yaml", "--gpuhost-report=report.json")

    def fresh(name: str) -> Callable[[], None]:
        def copy() -> None:
            shutil.rmtree(directory / name, ignore_errors=True)
            shutil.copytree(EXAMPLE_HOST, directory / name, symlinks=True)
        return copy

    # Every run fails somewhere (nvidia_peermem cannot load on the example host): exit 1.
    verify = Case("verify", (*spec, "--gpuhost-root=verify-host"), directory, 1,
                  fresh("verify-host"))
    first = Case("fix", (*spec, "--gpuhost-root=fix-host", "--fix"), directory, 1,
                 fresh("fix-host"))
    second = Case("second fix", (*spec, "--gpuhost-root=fix-host", "--fix"), directory, 1)
    times = Timings()
    summaries: dict[str, dict[str, int]] = {}
    modprobes: dict[str, int] = {}
    windows: dict[str, float] = {}
    for _ in range(warmup):
        for case in (verify, first, second):
            run_once(case)
    for round_ in range(repeat):
        order = (verify, first, second) if round_ % 2 == 0 else (first, second, verify)
        for case in order:
            times.add(case.name, run_once(case))
            report = json.loads((directory / "report.json").read_text())
            summaries[case.name] = report["summary"]
            modprobes[case.name] = sum(1 for c in report["checks"]
                                       if (c["action"] or "").startswith("modprobe"))
            windows[case.name] = sampled_window(report)
            if case is first:
                tuned = tree(directory / "fix-host")
        changed = sorted(k for k, v in tree(directory / "fix-host").items()
                         if tuned.get(k) != v and k != "dev/kmsg"
                         and not k.startswith(f"{STATE_DIR}/journal/"))
        if summaries["second fix"]["fixed"] != 0 or changed:
            raise SystemExit(f"the second --fix was not idempotent: {summaries['second fix']}, "
                             f"changed {changed[:5]}")
        progress(times.line(round_, repeat))
    fix_ratio, fix_line = both(times, "fix", "verify")
    again_ratio, again_line = both(times, "second fix", "verify")
    modprobe_s = time_fake_modprobe(directory, repeat)
    fsync_s = time_fsync(directory, 20)
    fixes = summaries["fix"]["fixed"] + summaries["fix"]["fix_failed"]

    def less_modprobe(name: str) -> str:
        ratio = (med(times.wall[name]) - modprobes[name] * modprobe_s) / med(times.wall["verify"])
        return f"{name} / verify {ratio:.3f} ({modprobes[name]} modprobe)"

    without = ", ".join(less_modprobe(name) for name in ("fix", "second fix"))

    def window_ratio(name: str) -> float:
        return (med(times.wall[name]) - windows[name]) / (med(times.wall["verify"])
                                                          - windows["verify"])

    def less_window(name: str) -> str:
        return f"{name} / verify {window_ratio(name):.3f}"

    cpu_ratio = Ratio.paired(times.cpu["fix"], times.cpu["verify"])

    sampled = ", ".join(f"{name} {windows[name]:g} s" for name in windows)
    shown = ", ".join(f"{k} {v}" for k, v in summaries["fix"].items() if v)
    shown_again = ", ".join(f"{k} {v}" for k, v in summaries["second fix"].items() if v)
    return Figure(
        "4", f"--fix of the example host ({sum(summaries['verify'].values())} checks), then a "
        "second --fix of the fixed copy",
        "fix / verify <= 1.3 on CPU time and on wall time less the spec's residency window "
        "(a sleep the spec asks for); second --fix changes nothing",
        f"fix / verify CPU {cpu_ratio}, wall less the window {window_ratio('fix'):.3f}, wall "
        f"{fix_ratio}; second fix / verify {again_ratio}",
        cpu_ratio.median <= 1.3 and window_ratio("fix") <= 1.3,
        [verify.shown(base), first.shown(base), second.shown(base) + "  (on the fixed copy)"],
        [fix_line, again_line, medians(times),
         f"the example host's modprobe (like its nvbandwidth) is a Python script behind a sh "
         f"(`{shebang(EXAMPLE_HOST / 'usr/sbin/modprobe')}`): {modprobe_s:.3f} s a run (median of "
         f"{repeat}), where a real modprobe is a C binary; less those runs, the medians give "
         f"{without}",
         f"each fix writes its journal lines with one fsync before it changes anything (the "
         f"journal's guarantee): {fixes} fixes, and an fsync here takes {fsync_s * 1000:.1f} ms "
         f"(median of 20 on the bench directory's file system): ~{fixes * fsync_s:.2f} s of "
         "the first --fix's wall time, little of its CPU time",
         "a run samples the disabled C-states' usage counters for the spec's residency window "
         "(a sleep: wall time, no CPU time), and the untuned verify has none disabled yet: "
         f"windows {sampled}; less them, {less_window('fix')}, {less_window('second fix')} "
         "(an upper bound: the window also overlaps other checks)",
         f"first --fix: {shown}; second --fix: {shown_again} (0 fixed; "
         f"{modprobes['second fix']} modprobe run: a fix that failed is not retried without "
         "--fix-retry)"])


def other_plugins() -> tuple[str, ...]:
    """``-p no:NAME`` for every pytest plugin installed here besides pytest-gpuhost (xdist,
    allure, pytest-benchmark, testinfra: the bench's and the tests' tools), so that a run is
    what it is where pytest-gpuhost is installed alone (examples/k8s/Dockerfile's image)."""
    from importlib.metadata import entry_points

    names = sorted(e.name for e in entry_points(group="pytest11") if e.name != "gpuhost")
    return tuple(word for name in names for word in ("-p", f"no:{name}"))


NPD_CACHE = "npd-cache"
"""(1e)'s cache directory, in the run's directory: the monitor rule's ``cache_dir``."""


def npd_arguments() -> tuple[str, ...]:
    """The arguments of examples/k8s/gpuhost-monitor.json's rule, its paths made relative: the
    spec, the host root, NFD's features file and pytest's cache directory (the image's
    /var/cache/gpuhost) in the run's directory."""
    config = json.loads((REPO / "examples" / "k8s" / "gpuhost-monitor.json").read_text())
    [rule] = config["rules"]
    relative = {"--gpuhost-spec=": "spec.yaml", "--gpuhost-root=": "host",
                "--gpuhost-nfd=": "features", "cache_dir=": NPD_CACHE}
    args = []
    for word in rule["args"]:
        if word == "-q":
            continue  # every measured run has it already
        prefix = next((p for p in relative if word.startswith(p)), None)
        args.append(word if prefix is None else prefix + relative[prefix])
    return tuple(args)


def figure_npd(base: Path, repeat: int, warmup: int) -> Figure:
    """(1e) What node-problem-detector pays every interval on every node: one run of the
    example monitor's rule (examples/k8s/gpuhost-monitor.json) on a copy of the example host,
    pytest-gpuhost the only plugin, against pytest's own start-up with one trivial test. The
    rule's runs keep the spec in pytest's cache: each run after a container's first loads it;
    the first (the cache emptied before it) is measured beside them."""
    progress("npd: the example monitor's run on the example host")
    directory = workdir(base / "npd")
    shutil.copy(BLACKWELL8, directory / "spec.yaml")
    shutil.copytree(EXAMPLE_HOST, directory / "host", symlinks=True)
    (directory / "test_one.py").write_text(plain_test_file(1))
    cache = directory / NPD_CACHE

    def empty_cache() -> None:
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(mode=0o700)  # the image's directory: root's alone

    empty_cache()
    alone = other_plugins()
    marks = Marks(directory / "marks-npd.json")
    arguments = (*alone, *npd_arguments(), "-p", "timeline")
    npd = Case("npd", arguments, directory, 1, after=marks.read, env=marks.env, common=("-q",))
    first_marks = Marks(directory / "marks-npd-first.json")
    first = Case("npd, first run", arguments, directory, 1, prepare=empty_cache,
                 after=first_marks.read, env=first_marks.env, common=("-q",))
    # Not a check passes on the untuned host's cpuidle, modules...: exit 1, one line.
    one = Case("pytest, one test", (*alone, *NO_PLUGIN, "test_one.py"), directory)
    cases = {"npd": npd, "first": first, "one": one}
    for _ in range(warmup):
        for case in cases.values():
            measure(case)
    runs: dict[str, list[Measured]] = {key: [] for key in cases}
    for round_ in range(repeat):
        for key, case in list(cases.items())[:: 1 if round_ % 2 == 0 else -1]:
            runs[key].append(measure(case))
        progress(f"  round {round_ + 1}/{repeat}: npd {runs['npd'][-1].cpu:.3f} s CPU, "
                 f"{runs['npd'][-1].peak_rss_kib / 1000:.1f} MB, first run "
                 f"{runs['first'][-1].cpu:.3f} s")
    counted = {"npd": instructions(npd), "one": instructions(one)}
    counted_first = instructions(first)
    cpu = [m.cpu for m in runs["npd"]]
    rss = [m.peak_rss_kib * 1024 / 1e6 for m in runs["npd"]]
    wall = [m.wall for m in runs["npd"]]
    first_cpu = [m.cpu for m in runs["first"]]
    first_rss = [m.peak_rss_kib * 1024 / 1e6 for m in runs["first"]]
    saved = [b.cpu - a.cpu for a, b in zip(runs["npd"], runs["first"], strict=True)]
    one_cpu = [m.cpu for m in runs["one"]]
    one_rss = [m.peak_rss_kib * 1024 / 1e6 for m in runs["one"]]
    split, cpu_split = marks.split(wall), marks.split(cpu, cpu=True)
    phases = ", ".join(f"{phase} {1000 * med(split[phase]):.0f} ms / "
                       f"{1000 * med(cpu_split[phase]):.0f} ms" for phase in PHASES)
    labels = [line for line in (directory / "features").read_text().splitlines()
              if not line.startswith("#")]
    return Figure(
        "1e", "an `--gpuhost-npd` run on the example host (examples/k8s/gpuhost-monitor.json's "
        "rule: what node-problem-detector runs every interval on every node)",
        "CPU <= 0.5 s, peak RSS <= 60 MB",
        f"CPU {med(cpu):.3f} s ({min(cpu):.3f}-{max(cpu):.3f}), peak RSS {med(rss):.1f} MB "
        f"({min(rss):.1f}-{max(rss):.1f}); a container's first run CPU {med(first_cpu):.3f} s "
        f"({min(first_cpu):.3f}-{max(first_cpu):.3f}), peak RSS {med(first_rss):.1f} MB",
        med(cpu) <= 0.5 and med(rss) <= 60 and med(first_cpu) <= 0.5 and med(first_rss) <= 60,
        [npd.shown(base), first.shown(base) + f"  # after emptying {NPD_CACHE}", one.shown(base)],
        [f"medians of {repeat} runs alternating with a container's first run and pytest's run "
         f"of one trivial test: CPU (user + system, the process and its children) "
         f"{med(cpu):.3f} s, wall {med(wall):.3f} s, peak RSS (VmHWM, wait4's ru_maxrss) "
         f"{med(rss):.1f} MB",
         "the rule keeps pytest's cache in a directory of the image only root can write "
         f"(`-o cache_dir=/var/cache/gpuhost`; here `{NPD_CACHE}`, mode 0700): every run after "
         "a container's first loads the spec the run before it parsed (pytest_gpuhost/specmodel/"
         f"cache.py). A first run, the cache emptied before it: CPU {med(first_cpu):.3f} s, "
         f"peak RSS {med(first_rss):.1f} MB; what the kept spec saves a run: "
         f"{1000 * med(saved):.0f} ms of CPU ({1000 * min(saved):.0f} to "
         f"{1000 * max(saved):.0f} ms, the same rounds' pairs)",
         f"pytest with one trivial test, the same plugins off: CPU {med(one_cpu):.3f} s "
         f"({min(one_cpu):.3f}-{max(one_cpu):.3f}), peak RSS {med(one_rss):.1f} MB: what "
         "any pytest run costs here before a check",
         f"where the npd run's time goes (bench/timeline.py, medians, wall / CPU): {phases}",
         "the other pytest plugins installed in the bench's environment are off "
         f"(`{' '.join(alone)}`), as in examples/k8s/Dockerfile's image, which installs "
         "pytest-gpuhost alone; `-p timeline` notes the phases (a few hooks)",
         f"the labels of NFD's features file the run wrote: {', '.join(labels)}",
         "instructions of the whole run (valgrind --tool=cachegrind, I refs; a count the "
         "machine's load does not change): " + (
             f"npd {(counted['npd'] or 0) / 1e6:.0f} M, a first run "
             f"{(counted_first or 0) / 1e6:.0f} M, pytest with one trivial test "
             f"{(counted['one'] or 0) / 1e6:.0f} M"
             if counted["npd"] and counted["one"] and counted_first
             else "not counted (no valgrind here)")])


def sampled_window(report: dict[str, Any]) -> float:
    """The residency window a run slept through (cpuidle's evidence: "sampled 0.25 s apart")."""
    windows = [float(found.group(1)) for check in report["checks"]
               for item in check.get("evidence") or ()
               if (found := re.search(r"sampled ([0-9.]+) s apart", str(item.get("raw", ""))))]
    return max(windows, default=0.0)


def time_fake_modprobe(directory: Path, repeat: int) -> float:
    """Median wall time of the example host's fake ``modprobe nvidia_peermem`` (which fails)."""
    scratch = directory / "modprobe-host"
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(EXAMPLE_HOST, scratch, symlinks=True)
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([str(scratch / "usr/sbin/modprobe"), "nvidia_peermem"], env=clean_env(),
                       capture_output=True, check=False)
        runs.append(time.perf_counter() - start)
    return med(runs)


def time_fsync(directory: Path, count: int) -> float:
    """Median seconds of an fsync after a small append, as the journal does, in ``directory``."""
    runs = []
    fd = os.open(directory / "fsync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(count):
            os.write(fd, b'{"event": "change"}\n')
            start = time.perf_counter()
            os.fsync(fd)
            runs.append(time.perf_counter() - start)
    finally:
        os.close(fd)
        os.unlink(directory / "fsync-probe")
    return med(runs)


def shebang(path: Path) -> str:
    with open(path, "rb") as script:
        return script.readline().decode().strip()


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------------
# Report


def version_of(module: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({module!r}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "not installed"


def machine() -> list[str]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    nproc = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout
    return [
        f"- `nproc`: {nproc.strip()} ({model})",
        f"- `python --version`: Python {platform.python_version()}",
        f"- pytest {version_of('pytest')}, pytest-testinfra {version_of('pytest-testinfra')}, "
        f"pytest-xdist {version_of('pytest-xdist')}, pytest-gpuhost "
        f"{version_of('pytest-gpuhost')}",
        f"- kernel {platform.release()}",
    ]


def render_section(figure: Figure, measured_by: str) -> list[str]:
    lines = [f"## ({figure.label}) {figure.title}", "",
             f"Goal: {figure.goal}. Result: {figure.result}.", "", f"Measured by {measured_by}.",
             ""]
    table = [d for d in figure.details if d.startswith("|")]
    text = [d for d in figure.details if d and not d.startswith("|")]
    if table:
        lines += [*table, ""]
    lines += [f"- {d}" for d in text]
    if figure.commands:
        lines += ["", "Commands:", "", "```", *figure.commands, "```"]
    return lines


def summary_row(figure: Figure) -> str:
    met = "n/a" if figure.met is None else ("yes" if figure.met else "**no**")
    return f"| ({figure.label}) {figure.title} | {figure.goal} | {figure.result} | {met} |"


def render(figures: Sequence[Figure], argv: Sequence[str], repeat: int, warmup: int,
           elapsed: float, previous: str = "") -> str:
    """RESULTS.md: this run's figures replace the sections and summary rows of the same labels
    in ``previous``; every other section (another figure's, or one that another tool such as
    bench/fleet.py appends) is kept where it was."""
    command = " ".join(["python", "bench/bench.py", *argv])
    ours = {f.label: f for f in figures}
    head = [
        "# Benchmark results",
        "",
        "Each figure's section says the `bench/bench.py` command that measured it and how long "
        "that took. Ratios are the median of the per-round ratios of paired runs (the cases "
        "of a figure alternate, A B then B A, after one unmeasured warm-up), with their min-max "
        f"in parentheses. Each run is a fresh `python -m pytest {' '.join(COMMON)} ...` "
        "process; `$BENCH` is the temporary directory of generated hosts, specs and test "
        "files. The baseline of the overhead figures is pytest without the plugin "
        "(`-p no:gpuhost`). The tools: `pip install -e '.[bench]'` (pytest-testinfra, "
        "pyinstrument, pytest-xdist); bench/ssh.py also needs OpenSSH's server and client.",
        "",
        "## Machine",
        "",
        *machine(),
        "",
    ]
    rows: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    order: list[str] = []
    for label, title, body in split_sections(previous):
        if title == "Summary":
            for line in body:
                found = LABEL.match(line)
                if found and found.group(1) in FIGURE_LABELS:
                    rows[found.group(1)] = line
        elif label is not None and label not in REPLACED_LABELS:
            sections[label] = [f"## {title}", *body]
            order.append(label)
    run = (f"`{command}` ({repeat} measured rounds after {warmup} warm-up unless said below; "
           f"the whole command took {elapsed:.0f} s)")
    for label, figure in ours.items():
        rows[label] = summary_row(figure)
        sections[label] = render_section(figure, run)
        if label not in order:
            order.append(label)
    order.sort(key=section_rank)
    lines = [*head, "## Summary", "", "| figure | goal | result | met |",
             "| --- | --- | --- | --- |", *(rows[key] for key in sorted(rows, key=section_rank))]
    for label in order:
        lines += ["", *trimmed(sections[label])]
    return "\n".join(lines) + "\n"


FIGURE_LABELS = ("1a", "1b", "1c", "1d", "1e", "2", "3a", "3c", "4")
"""The sections bench.py writes; others ((3b), (5) and later) belong to other tools."""
REPLACED_LABELS = ("1", "3")
"""Sections an older bench.py wrote, which (1a)-(1d) and (3a), (3c) replace: dropped."""
LABEL = re.compile(r"\| \((\w+)\) ")


def section_rank(label: str) -> tuple[int, str]:
    digits = "".join(c for c in label if c.isdigit())
    return int(digits or 0), label


def split_sections(text: str) -> list[tuple[str | None, str, list[str]]]:
    """The ``## `` sections of a RESULTS.md: (label of ``## (1c) ...`` or None, title, body)."""
    found: list[tuple[str | None, str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:]
            label = re.match(r"\((\w+)\) ", title)
            found.append((label.group(1) if label else None, title, []))
        elif found:
            found[-1][2].append(line)
    return [f for f in found if f[1] not in ("Machine",)]


def trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


# ---------------------------------------------------------------------------------------------
# Helpers bench/ssh.py shares (host calls, sections of RESULTS.md spliced by other scripts)


@dataclass(frozen=True)
class HostCalls:
    """Host calls of a verify run by phase, a batch counted as one (one round trip to a remote
    host): while the specs expand into checks, and while the checks run."""

    collection: int
    run: int
    checks: int
    by_method: dict[str, int]
    requests: int
    """Requests carried by the batches (a batch of 300 reads is one call, 300 requests)."""


def host_calls(directory: Path, specs: Sequence[Path], root: Path) -> HostCalls:
    """Count the calls of a verify run in this process, through the pytest-free session driven
    as the plugin drives it (expand, select, run in rank order, finish) on a CountingHost."""
    settings = resolve(RawOptions(invocation=directory, ini_base=directory,
                                  ini_name="the ini file", spec=tuple(map(str, specs)),
                                  root=str(root)))
    counted: list[CountingHost] = []

    def make_host(target: TargetAddress, settings: Settings) -> Host:
        counted.append(CountingHost(LocalHost(settings.root)))
        return counted[-1]

    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    session = Session(settings, kinds, builtin.pytest_gpuhost_conditions(), make_host,
                      default_factory)
    session.target.facts.sleep = lambda seconds: None  # a residency window: no waiting
    try:
        checks = sorted((c for spec in session.specs.values() for c in session.expand(spec)),
                        key=lambda c: c.order)
        [host] = counted
        collection = host.total
        session.target.select(checks)
        records = [session.run(check) for check in checks]
        session.finish(records)
    finally:
        session.close()
    return HostCalls(collection, host.total - collection, len(checks), dict(host.calls),
                     host.requests)


def sysctl_spec(chosen: dict[str, str]) -> str:
    """A spec that expects each sysctl of ``chosen`` to hold its value (raw text)."""
    spec = ["version: 1", "name: real-sysctls", "sysctl:"]
    spec += [f"  {key}: {json.dumps(value)}" for key, value in chosen.items()]
    return "\n".join(spec) + "\n"


def testinfra_file(chosen: dict[str, str]) -> str:
    """The same checks as a testinfra test module: one ``host.sysctl`` test per key."""
    params = ",\n".join(f"    ({key!r}, {testinfra_expected(v)!r})" for key, v in chosen.items())
    return ("import pytest\n\n"
            f"SYSCTLS = [\n{params},\n]\n\n\n"
            "@pytest.mark.parametrize('key, expected', SYSCTLS, ids=[k for k, _ in SYSCTLS])\n"
            "def test_sysctl(host, key, expected):\n"
            "    assert host.sysctl(key) == expected\n")


def sections(text: str) -> list[tuple[str, str]]:
    """(heading line, its text up to the next ``## ``) of every second-level section."""
    starts = [i for i, line in enumerate(text.splitlines(keepends=True)) if line.startswith("## ")]
    lines = text.splitlines(keepends=True)
    bounds = [*starts, len(lines)]
    return [(lines[a].rstrip("\n"), "".join(lines[a:b])) for a, b in itertools.pairwise(bounds)]


def put_section(text: str, section: str, *, after: str | None = None) -> str:
    """``text`` with ``section`` (which starts with its ``## `` heading) in place of the section
    of that heading; a new one goes after the section whose heading starts with ``after``, or
    at the end."""
    heading = section.splitlines()[0]
    section = section.rstrip("\n") + "\n\n"
    found = dict(sections(text))
    if heading in found:
        return text.replace(found[heading], section, 1)
    anchor = next((body for head, body in sections(text)
                   if after is not None and head.startswith(after)), None)
    if anchor is not None:
        return text.replace(anchor, anchor.rstrip("\n") + "\n\n" + section, 1)
    return text.rstrip("\n") + "\n\n" + section


def summary_table(figures: Sequence[Figure]) -> list[str]:
    """The figure | goal | result | met table of ``figures``."""
    return ["| figure | goal | result | met |", "| --- | --- | --- | --- |",
            *(summary_row(f) for f in figures)]


def figure_lines(figure: Figure, heading: str = "##") -> list[str]:
    """A figure's section: its heading, goal and result, table, notes and commands."""
    lines = [f"{heading} ({figure.label}) {figure.title}", "",
             f"Goal: {figure.goal}. Result: {figure.result}.", ""]
    table = [d for d in figure.details if d.startswith("|")]
    text = [d for d in figure.details if d and not d.startswith("|")]
    if table:
        lines += [*table, ""]
    lines += [f"- {d}" for d in text]
    return [*lines, "", "Commands:", "", "```", *figure.commands, "```"]



def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="measured rounds per figure")
    parser.add_argument("--big-repeat", type=int, default=3,
                        help="measured rounds of each size of the scale20k figure")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    parser.add_argument("--only", default=",".join(FIGURES),
                        help=f"comma-separated figures to run, of: {', '.join(FIGURES)}")
    parser.add_argument("--sysctls", type=int, default=100,
                        help="sysctls of this machine for the testinfra figure")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (printed) for a closer look")
    args = parser.parse_args(argv)
    unknown = set(args.only.split(",")) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figure(s): {', '.join(sorted(unknown))}")
    if args.repeat < 1 or args.big_repeat < 1:
        parser.error("--repeat and --big-repeat must be at least 1")
    return args


@dataclass
class TempDir:
    keep: bool
    path: Path = field(init=False)

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="gpuhost-bench-"))
        return self.path

    def __exit__(self, *exc: object) -> None:
        if self.keep:
            progress(f"kept {self.path}")
        else:
            shutil.rmtree(self.path, ignore_errors=True)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages (/proc/loadavg)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def with_load(make: Callable[[], Figure | list[Figure]]) -> list[Figure]:
    """The figures ``make`` measures, each with the load average at its start and end beside
    its result (on a shared machine, what else ran is part of the figure)."""
    before = load_average()
    made = make()
    after = load_average()
    load = f"load {before} at the start, {after} at the end"
    return [dataclasses.replace(f, result=f"{f.result} ({load})",
                                details=[*f.details, f"load average (1, 5, 15 min): {before} at "
                                         f"the figure's start, {after} at its end (`nproc` "
                                         f"{os.cpu_count()})"])
            for f in (made if isinstance(made, list) else [made])]


def run_figures(base: Path, args: argparse.Namespace) -> Iterator[Figure]:
    only = args.only.split(",")
    repeat, warmup = args.repeat, args.warmup
    makers: dict[str, Callable[[], Figure | list[Figure]]] = {
        "autoload": lambda: figure_autoload(base, repeat, warmup),
        "floor": lambda: figure_floor(base, repeat, warmup),
        "xdist": lambda: figure_xdist(base, repeat, warmup),
        "npd": lambda: figure_npd(base, repeat, warmup),
        "testinfra": lambda: figure_testinfra(base, repeat, warmup, args.sysctls),
        "scale": lambda: figure_scale(base, repeat, warmup),
        "scale20k": lambda: figure_scale20k(base, args.big_repeat, warmup),
        "fix": lambda: figure_fix(base, repeat, warmup),
    }
    for name in FIGURES:
        if name in only:
            yield from with_load(makers[name])


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    with TempDir(args.keep) as base:
        figures = list(run_figures(base, args))
    previous = args.out.read_text() if args.out.exists() else ""
    text = render(figures, argv, args.repeat, args.warmup, time.perf_counter() - start,
                  previous)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
