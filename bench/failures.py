"""(8) failing checks: what a run of N failing checks costs against the same N passing ones.

    .venv/bin/python bench/failures.py                       # 1,000, 5,000 and 20,000 checks
    .venv/bin/python bench/failures.py --sizes 1000,5000 --repeat 3 --out /tmp/r.md

A first run over an untuned fleet fails most of its checks. pytest's failure summary looked at
every report of the run for each failure (its teardown sections), so 5,000 failing sysctls took
45 s and 10,000 took 200 s. Goal (issue 25, item 8; issue 26): linear, a failing run <= 2x the
time of a passing run of as many checks.

Both cases check the same spec (N sysctls, each expecting 1) with the same flags (pytest's
defaults: the failure summary, the short summary), against two fake trees: one where every
sysctl holds 0, one where every one holds 1. They alternate after one unmeasured warm-up each
(bench/bench.py's ``alternate``); each figure is the median of the per-round ratios with their
min-max, the load average (1 minute) read before each size beside it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import (  # noqa: E402
    Case,
    Ratio,
    TempDir,
    alternate,
    med,
    progress,
    put_section,
)
from pytest_gpuhost.testing.fakehost import FakeHost  # noqa: E402

GOAL = 2.0
HEADING = "## (8) failing checks"


def build(base: Path, count: int) -> tuple[Case, Case]:
    """The spec and the two trees of ``count`` sysctls; (failing case, passing case)."""
    base.mkdir(parents=True, exist_ok=True)
    keys = [f"bench.f{i:05d}" for i in range(count)]
    (base / "spec.yaml").write_text("version: 1\nname: failing\nsysctl:\n"
                                    + "".join(f"  {key}: 1\n" for key in keys))
    for name, value in (("failing", "0"), ("passing", "1")):
        tree = FakeHost(base / name)
        directory = tree.root / "proc/sys/bench"
        directory.mkdir(parents=True, exist_ok=True)
        for key in keys:
            (directory / key.rsplit(".", 1)[1]).write_text(f"{value}\n")
    args = ("--gpuhost-spec=spec.yaml", "-p", "no:testinfra")
    return (Case(f"failing-{count}", (*args, "--gpuhost-root=failing"), base, expect_rc=1),
            Case(f"passing-{count}", (*args, "--gpuhost-root=passing"), base))


def load() -> float:
    return os.getloadavg()[0]


def measure(base: Path, sizes: list[int], repeat: int) -> list[str]:
    rows, commands = [], []
    for count in sizes:
        failing, passing = build(base / str(count), count)
        before = load()
        progress(f"{count} checks (load {before:.2f})")
        start = time.monotonic()
        times = alternate([failing, passing], repeat if count < 20000 else max(1, repeat - 2),
                          warmup=1 if count < 20000 else 0)
        ratio = Ratio.paired(times.wall[failing.name], times.wall[passing.name])
        cpu = Ratio.paired(times.cpu[failing.name], times.cpu[passing.name])
        rows.append(f"| {count} | {ratio} | {cpu} | {med(times.wall[failing.name]):.2f} s / "
                    f"{med(times.wall[passing.name]):.2f} s | {len(times.wall[failing.name])} | "
                    f"{before:.2f} / {load():.2f} | {time.monotonic() - start:.0f} s |")
        commands += [case.shown(base) for case in (failing, passing)]
    return ["| checks | failing / passing (wall) | CPU | median wall failing / passing "
            "| rounds | load average before / after | took |",
            "| ---: | --- | --- | --- | ---: | --- | ---: |", *rows, "", "Commands:", "",
            "```", *commands, "```"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--repeat", type=int, default=5,
                        help="measured rounds per size (20,000: two fewer, no warm-up)")
    parser.add_argument("--out", type=Path, default=HERE / "RESULTS.md")
    parser.add_argument("--label", default="",
                        help="what was measured ('before', 'after'): the section's heading")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    started = time.monotonic()
    with TempDir(keep=False) as base:
        table = measure(Path(base), sizes, args.repeat)
    command = shlex.join(["python", "bench/failures.py", *(argv if argv is not None
                                                           else sys.argv[1:])])
    took = time.monotonic() - started
    heading = f"{HEADING}: {args.label or 'latest'}"
    section = "\n".join([
        f"{heading} ({', '.join(f'{s:,}' for s in sizes)} failing checks vs as many passing)",
        "", f"Goal: failing / passing <= {GOAL:g}, linear. Measured by `{command}` "
        f"({took:.0f} s in all).", "", *table, ""])
    text = args.out.read_text() if args.out.exists() else "# Benchmark results\n"
    args.out.write_text(put_section(text, section))
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
