"""The fleet view at scale: merging 1,000 reports of 150 checks each, and the HTML page of 1,000
targets drawn in headless Chromium.

    .venv/bin/python bench/fleet.py                       # 5 rounds, prints the section
    .venv/bin/python bench/fleet.py --results bench/RESULTS.md   # and puts it there

The reports are made from one real run: the example host's records under specs/blackwell8.yaml
(the first 150 checks, dmesg last), copied per node with the differences a fleet has: a few
nodes on another driver, one GPU trained at Gen4 on some, swappiness left at 60 on others, and
one node in a hundred unreachable (every check an error). Goals: the merge (``python -m
pytest_gpuhost.fleet DIR --html FILE``, a fresh process: read, matrix, drift, page) under 10 s;
the page's first draw (``performance.now()`` when the script has drawn, from navigation start)
under 3 s, also measured as the whole Chromium run. Medians over the rounds, with min-max.
"""

from __future__ import annotations

import argparse
import copy
import html
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench.py before the bench/ folder

from pytest_gpuhost.fleet import read_reports  # noqa: E402
from pytest_gpuhost.fleet.drift import find_drift  # noqa: E402
from pytest_gpuhost.fleet.matrix import matrix_lines  # noqa: E402
from pytest_gpuhost.fleet.page import render  # noqa: E402
from pytest_gpuhost.reports import RunInfo  # noqa: E402
from pytest_gpuhost.reports.jsonfile import json_report  # noqa: E402
from pytest_gpuhost.testing.fakehost import blackwell8_untuned  # noqa: E402

BLACKWELL8 = REPO / "specs" / "blackwell8.yaml"
SECTION = "## (5) fleet view at scale"
CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                      "google-chrome")) if p), None)
DRAWN = """<script>window.addEventListener("load", () => {
  const cells = document.querySelectorAll("#matrix td.cell").length;
  const start = performance.now();
  const kind = document.getElementById("f-section");
  kind.value = kind.options[kind.options.length - 1].value;
  kind.dispatchEvent(new Event("change"));
  const outcome = document.getElementById("f-outcome");
  outcome.value = "failed";
  outcome.dispatchEvent(new Event("change"));
  const filtered = performance.now() - start;
  const pre = document.createElement("pre"); pre.id = "drawn";
  pre.textContent = `${document.body.dataset.renderedMs} ${cells} ${Math.round(filtered)}`;
  document.body.appendChild(pre); });</script>"""


def template(workdir: Path, checks: int) -> dict[str, Any]:
    """One real report of the example host: its first ``checks`` records, dmesg kept last."""
    from tests.runner import run_spec

    root = workdir / "host"
    blackwell8_untuned(root, cpus=16)
    done = run_spec([BLACKWELL8], root, workdir=workdir)
    records = [r for r in done.records if r.kind != "dmesg"][:checks - 1]
    records += [r for r in done.records if r.kind == "dmesg"]
    info = RunInfo(specs=(("specs/blackwell8.yaml", "blackwell8"),), root="/",
                   hostname="node0000", kernel="6.5.0-44-generic", driver="580.95.05",
                   gpus=tuple(f"0000:{i:02x}:00.0" for i in range(8)))
    return json_report(records, info)


def make_reports(base: dict[str, Any], directory: Path, nodes: int) -> None:
    """``nodes`` reports (indent 2, as --gpuhost-report writes them), each node's own."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(nodes):
        report = copy.deepcopy(base)
        report["host"] = f"node{n:04d}"
        for record in report["checks"]:
            key, kind = record.get("key"), record["kind"]
            if n % 100 == 99:
                record.update(outcome="error", observed=None, message="ssh: connect to host "
                              f"node{n:04d} port 22: Connection timed out")
            elif kind == "sysctl" and key == "vm.swappiness" and n % 50 == 7:
                record.update(observed="60", outcome="failed", message="'60' != '10'")
            elif kind == "pcie.max_link_speed" and key == "0000:81:00.0" and n % 40 == 3:
                record.update(observed="16.0 GT/s PCIe", outcome="failed")
            elif kind == "gpus.driver_version" and n % 30 == 5:
                record.update(observed="580.105.08")
            elif kind == "p2p" and record.get("observed"):
                record["observed"] = f"{float(record['observed']) + (n % 13) * 0.07:.2f}"
        (directory / f"node{n:04d}.json").write_text(json.dumps(report, indent=2) + "\n")


def timed(argv: Sequence[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                   timeout=600)
    return time.perf_counter() - start


def in_process(directory: Path) -> dict[str, float]:
    """The merge's parts, timed in this process (one round)."""
    parts: dict[str, float] = {}
    start = time.perf_counter()
    targets = read_reports([directory])
    parts["read"] = time.perf_counter() - start
    start = time.perf_counter()
    drifts = find_drift(targets)
    parts["drift"] = time.perf_counter() - start
    start = time.perf_counter()
    matrix_lines(targets)
    parts["matrix"] = time.perf_counter() - start
    start = time.perf_counter()
    render(targets, drifts, "bench")
    parts["page"] = time.perf_counter() - start
    return parts


def draw(page: Path) -> tuple[float, float, int, float]:
    """(the page's first draw in ms, the Chromium process's seconds, cells drawn, ms to
    choose a kind and an outcome in the filters)."""
    assert CHROMIUM is not None
    driven = page.with_name("drawn.html")
    driven.write_text(page.read_text().replace("</body>", DRAWN + "</body>"))
    start = time.perf_counter()
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", "--window-size=1500,1000", "--dump-dom",
                           driven.as_uri()], capture_output=True, text=True, timeout=120,
                          check=True)
    wall = time.perf_counter() - start
    found = re.search(r'<pre id="drawn">(\d+) (\d+) (\d+)</pre>', html.unescape(done.stdout))
    if found is None:
        raise SystemExit(f"the page did not draw: {done.stdout[-500:]}")
    return float(found.group(1)), wall, int(found.group(2)), float(found.group(3))


def blank_run(work: Path) -> float:
    """The same Chromium run of an empty page: what Chromium itself costs here."""
    assert CHROMIUM is not None
    blank = work / "blank.html"
    blank.write_text("<!DOCTYPE html><title>blank</title><p>blank</p>")
    start = time.perf_counter()
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1500,1000", "--dump-dom",
                    blank.as_uri()], capture_output=True, text=True, timeout=120, check=True)
    return time.perf_counter() - start


def spread(values: Sequence[float], unit: str = "s", digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} {unit} ({min(values):.{digits}f}-"
            f"{max(values):.{digits}f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--checks", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--results", type=Path, help="put the section into this file")
    args = parser.parse_args()
    if CHROMIUM is None:
        raise SystemExit("no Chromium (apt-get install chromium)")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        base = template(work, args.checks)
        reports = work / "reports"
        make_reports(base, reports, args.nodes)
        size = sum(p.stat().st_size for p in reports.iterdir())
        page = work / "fleet.html"
        cli = [sys.executable, "-m", "pytest_gpuhost.fleet", str(reports), "--html", str(page)]
        merges, parts, draws, walls, blanks, filters = [], [], [], [], [], []
        timed(cli)  # warm-up: the file cache and the bytecode
        for round_ in range(args.repeat):
            merges.append(timed(cli))
            parts.append(in_process(reports))
            drawn, wall, cells, filtered = draw(page)
            draws.append(drawn)
            filters.append(filtered)
            walls.append(wall)
            blanks.append(blank_run(work))
            print(f"  round {round_ + 1}/{args.repeat}: merge {merges[-1]:.2f} s, first draw "
                  f"{drawn:.0f} ms, chromium {wall:.2f} s", file=sys.stderr, flush=True)
        page_size = page.stat().st_size
    elapsed = time.perf_counter() - began
    merge_ok, draw_ok = statistics.median(merges) < 10, statistics.median(draws) < 3000
    breakdown = ", ".join(f"{name} {statistics.median([p[name] for p in parts]):.2f} s"
                          for name in parts[0])
    section = f"""{SECTION}

Produced by `python bench/fleet.py --repeat {args.repeat} --results bench/RESULTS.md` in \
{elapsed:.0f} s on this machine (`nproc` {os.cpu_count()}, Python {platform.python_version()}, \
{subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()}): \
{args.nodes} reports of {len(base["checks"])} checks each ({size / 2**20:.0f} MiB of JSON, \
indent 2), made from the example host's records under specs/blackwell8.yaml with a fleet's \
differences (another driver on 1 node in 30, a Gen4 link on 1 in 40, swappiness 60 on 1 in \
50, 1 in 100 unreachable). Medians of {args.repeat} rounds after a warm-up, min-max in \
parentheses.

| figure | goal | result | met |
| --- | --- | --- | --- |
| merge: `python -m pytest_gpuhost.fleet DIR --html fleet.html` (a fresh process: read every \
report, matrix, drift, page) | < 10 s | {spread(merges)} | {"yes" if merge_ok else "**no**"} |
| the page of {args.nodes} targets drawn in headless Chromium (`performance.now()` when its \
script has drawn the first page of rows and the drift table) | < 3 s | \
{spread([d / 1000 for d in draws])} | {"yes" if draw_ok else "**no**"} |
| the whole Chromium run (`--dump-dom`: start, load, draw, exit) | | {spread(walls)} | |
| the same Chromium run of an empty page (Chromium's own start and exit) | | \
{spread(blanks)} | |

- in one process: {breakdown}
- the filters on {args.nodes} targets (a kind, then an outcome, each redrawing): \
{spread(filters, "ms", 0)}
- the page: {page_size / 2**20:.1f} MiB (one JSON blob, every string once), {cells} cells \
drawn (100 rows a page by {cells // 100} kinds)

Commands:

```
python bench/fleet.py --nodes {args.nodes} --checks {args.checks} --repeat {args.repeat}
python -m pytest_gpuhost.fleet $BENCH/reports --html $BENCH/fleet.html
chromium --headless --no-sandbox --disable-gpu --dump-dom file://$BENCH/drawn.html
```
"""
    print(section)
    if args.results is not None:
        from bench import put_section  # bench/bench.py: RESULTS.md's sections, one way

        assert section.startswith(SECTION)
        text = args.results.read_text() if args.results.exists() else ""
        args.results.write_text(put_section(text, section))
    return 0 if merge_ok and draw_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
