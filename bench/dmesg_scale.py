"""How long the dmesg check takes on a large kernel log (issue 9, item 10; issue 39): linear, not
quadratic, and a record that is not an NVIDIA driver's costs what it did before the GPU events
were judged.

    .venv/bin/python bench/dmesg_scale.py [--case noise|flood] [--rounds N] [RECORDS ...]
    .venv/bin/python bench/dmesg_scale.py --baseline CHECKOUT ...   # and older code, each its own

Cases (each a fake dev/kmsg, plus two real errors the spec does not allow):

- ``noise`` (default sizes 40,000, 200,000, 500,000): vxlan records that the spec allows; no
  record of NVIDIA's modules;
- ``flood`` (default 50,000): NVIDIA's Xid 119 (a GSP timeout) of one GPU, each record with its
  own pid and function, as a GPU whose GSP stopped answering writes them.

The time is one observe of the dmesg check (read, parse, decode, filter, judge), as a run pays
it: wall and CPU, the median of ``--rounds`` (min-max). With ``--baseline``, each round runs
this checkout's code and each CHECKOUT's (its own ``.venv``, as ``python3 -m venv .venv &&
.venv/bin/pip install -e .`` makes it), each in a fresh process, the order reversed every
other round, and each ratio is the median of the rounds' ratios.

The largest default size is 500,000 records (34 MB of dev/kmsg): about the most records of
this size a ring buffer of 32 MiB holds, the largest ``CONFIG_LOG_BUF_SHIFT`` gives (each
record's text takes its length and 8 bytes, rounded up to 8). 1,000,000 of them (68 MB) are
more than the check reads (``KMSG_LIMIT``, 64 MiB): it refuses such a log rather than read
it, and this bench says so for a size over the limit instead of timing it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ALLOW = "{allow: ['vxlan: non-ECT from .* with TOS=0x2']}"
CASES = {"noise": (40_000, 200_000, 500_000), "flood": (50_000,)}
ERRORS = ("NVRM: Xid 79", "AER: fatal")
"""At err and crit: two offending records in every case (an Xid without its GPU is no event
the catalog judges, and was none before it either)."""


def record(case: str, n: int) -> str:
    if case == "noise":
        return (f"4,{n},{n * 1000},-;vxlan: non-ECT from 10.233.{n // 250 % 250}.{n % 250} "
                "with TOS=0x2")
    return (f"3,{n},{n * 1000},-;NVRM: Xid (PCI:0000:9b:00): 119, pid={2024380 + n % 7919}, "
            "name=nvidia-smi, Timeout after 6s of waiting for RPC response from GPU4 GSP! "
            f"Expected function {n % 120} (GSP_RM_CONTROL) (0x20801813 0x4c).")


def write_log(case: str, records: int, root: Path) -> int:
    """The fake tree's dev/kmsg; its size in bytes."""
    lines = [record(case, n) for n in range(records)]
    lines += [f"{3 - i},{records + i},0,-;{text}" for i, text in enumerate(ERRORS)]
    (root / "dev").mkdir(parents=True, exist_ok=True)
    data = ("\n".join(lines) + "\n").encode()
    (root / "dev/kmsg").write_bytes(data)
    return len(data)


def expected(case: str, records: int) -> str:
    """The check's observed value: the two errors, and in a flood every Xid (class driver,
    action reset_gpu: each fails the check, as each failed it by its level before)."""
    return str(len(ERRORS) + (records if case == "flood" else 0))


def observe(root: Path) -> tuple[float, float, str | None]:
    """(wall, CPU, observed value) of one observe of the dmesg check on ``root``."""
    import yaml

    from pytest_gpuhost.checks import Facts
    from pytest_gpuhost.checks.dmesg import DmesgKind
    from pytest_gpuhost.host import LocalHost
    from pytest_gpuhost.specmodel import Node, SpecContext

    kind = DmesgKind()
    composed = yaml.compose(ALLOW)
    assert composed is not None
    section = kind.parse(Node(composed, "bench"), SpecContext(frozenset()))
    host = LocalHost(root)
    probe = kind.expand(section, Facts(host))[0].probe
    wall, cpu = time.perf_counter(), time.process_time()
    observed = probe.observe(host)
    return time.perf_counter() - wall, time.process_time() - cpu, observed.value


def in_process(root: Path, _python: str, _checkout: Path) -> tuple[float, float, str | None]:
    return observe(root)


def in_child(root: Path, python: str, checkout: Path) -> tuple[float, float, str | None]:
    """``observe`` in a fresh process of ``python``, which must import pytest_gpuhost from
    ``checkout`` (an editable install of it)."""
    done = subprocess.run([python, __file__, "--observe", str(root)], check=True,
                          capture_output=True, text=True)
    wall, cpu, value, package = json.loads(done.stdout)
    if not Path(package).resolve().is_relative_to(checkout.resolve()):
        raise SystemExit(f"{python} imports pytest_gpuhost from {package}, not {checkout}")
    return wall, cpu, value


def summary(values: list[float]) -> str:
    return (f"{statistics.median(values):.3f} s ({min(values):.3f}-{max(values):.3f})"
            if values else "-")


def ratio(ours: list[float], theirs: list[float]) -> str:
    ratios = [a / b for a, b in zip(ours, theirs, strict=True) if b > 0]
    return (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
            if ratios else "-")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("sizes", nargs="*", type=int, metavar="RECORDS")
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT", action="append",
                        default=[])
    parser.add_argument("--observe", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.observe is not None:  # one measurement, in a process of its own
        import pytest_gpuhost

        print(json.dumps([*observe(args.observe), pytest_gpuhost.__file__]))
        return 0
    from pytest_gpuhost.host.agent import KMSG_LIMIT

    here = Path(__file__).resolve().parent.parent
    sides = [("this checkout", sys.executable, here, in_child if args.baseline else in_process)]
    for checkout in args.baseline:
        python = checkout / ".venv" / "bin" / "python"
        if not python.exists():
            parser.error(f"{python} does not exist: a baseline needs a venv of its own")
        sides.append((f"baseline {checkout}", str(python), checkout, in_child))
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the start", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.case or list(CASES):
            for size in args.sizes or CASES[case]:
                root = Path(tmp) / f"{case}-{size}"
                size_bytes = write_log(case, size, root)
                what = f"{case} {size:>9} records ({size_bytes / 1e6:.0f} MB)"
                if size_bytes > KMSG_LIMIT:
                    print(f"{what}: over the check's read limit ({KMSG_LIMIT // 2**20} MiB), "
                          "which refuses it: not timed", flush=True)
                    continue
                times: dict[str, tuple[list[float], list[float]]] = {
                    name: ([], []) for name, _, _, _ in sides}
                for round_ in range(args.rounds):
                    for name, python, checkout, run in (sides if round_ % 2 == 0
                                                        else sides[::-1]):
                        wall, cpu, value = run(root, python, checkout)
                        if value != expected(case, size):
                            raise SystemExit(f"{name}: {what}: observed {value!r}, expected "
                                             f"{expected(case, size)!r}")
                        times[name][0].append(wall)
                        times[name][1].append(cpu)
                for name, (walls, cpus) in times.items():
                    print(f"{what}, {name}: wall {summary(walls)}, CPU {summary(cpus)}",
                          flush=True)
                ours, our_cpu = times["this checkout"]
                for name, (theirs, their_cpu) in list(times.items())[1:]:
                    print(f"{what}, this / {name}: wall {ratio(ours, theirs)}, CPU "
                          f"{ratio(our_cpu, their_cpu)}", flush=True)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
