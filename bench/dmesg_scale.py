"""How long the dmesg check takes on a large kernel log (issue 9, item 10): linear, not quadratic.

    .venv/bin/python bench/dmesg_scale.py [RECORDS ...]      # default: 40000 200000 1000000

Each size is a fake dev/kmsg of vxlan noise that the spec allows, plus two real errors; the time
is one observe of the dmesg check (read, parse, decode, filter), as a run pays it.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from pytest_gpuhost.checks import Facts
from pytest_gpuhost.checks.dmesg import DmesgKind
from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.specmodel import Node, SpecContext

ALLOW = "{allow: ['vxlan: non-ECT from .* with TOS=0x2']}"


def measure(records: int, root: Path) -> float:
    lines = [f"4,{n},{n * 1000},-;vxlan: non-ECT from 10.233.{n // 250 % 250}.{n % 250} with "
             f"TOS=0x2" for n in range(records)]
    lines += [f"3,{records},0,-;NVRM: Xid 79", f"2,{records + 1},0,-;AER: fatal"]
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev/kmsg").write_text("\n".join(lines) + "\n")
    import yaml

    kind = DmesgKind()
    composed = yaml.compose(ALLOW)
    assert composed is not None
    section = kind.parse(Node(composed, "bench"), SpecContext(frozenset()))
    host = LocalHost(root)
    probe = kind.expand(section, Facts(host))[0].probe
    start = time.perf_counter()
    observed = probe.observe(host)
    elapsed = time.perf_counter() - start
    assert observed.value == "2", observed
    return elapsed


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or [40_000, 200_000, 1_000_000]
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            print(f"{size:>9} records: {measure(size, Path(tmp)):6.2f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
