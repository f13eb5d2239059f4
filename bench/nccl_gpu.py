"""The nccl check on real GPUs: all_reduce_perf (built from nccl-tests, on PATH) run by the
plugin on this machine's GPUs twice, with NCCL's defaults and with ``NCCL_P2P_DISABLE=1``, and
both records printed as bench/RESULTS.md records them (busbw, the bound, the causes).

    .venv/bin/python bench/nccl_gpu.py [--bytes 1G] [--root /]

``--root``: another host root (a fake tree, as the tests run it); the default is this machine.
The floor is 1 GB/s: the point is each record and its explanation, not a verdict.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CASES: tuple[tuple[str, dict[str, str]], ...] = (
    ("NCCL's defaults", {}), ("NCCL_P2P_DISABLE=1", {"NCCL_P2P_DISABLE": "1"}))


def spec_text(size: str, env: dict[str, str]) -> str:
    shown = ", ".join(f"{k}: \"{v}\"" for k, v in env.items())
    return (f"version: 1\nnccl:\n  all_reduce: {{bytes: {size}, min_busbw: 1, retry: 0}}\n"
            f"  env: {{{shown}}}\n")


def run_case(root: str, size: str, env: dict[str, str], work: Path) -> dict[str, object]:
    spec = work / "spec.yaml"
    spec.write_text(spec_text(size, env))
    report = work / "report.json"
    subprocess.run([sys.executable, "-m", "pytest", str(spec), f"--gpuhost-root={root}",
                    f"--gpuhost-report={report}", "-p", "no:cacheprovider", "-q"],
                   cwd=work, check=False, stdout=subprocess.DEVNULL)
    [record] = [c for c in json.loads(report.read_text())["checks"] if c["kind"] == "nccl"]
    return dict(record)


def lines(title: str, record: dict[str, object]) -> list[str]:
    details = record.get("details")
    assert isinstance(details, dict)
    causes = details.get("explain") or []
    assert isinstance(causes, list)
    return [f"- {title}: {record['outcome']}, busbw {details.get('busbw')} GB/s over "
            f"{details.get('gpus')} GPUs (NCCL {details.get('nccl_version')}, "
            f"{details.get('channels')} channels, transports {details.get('transports')}); "
            f"bound {details.get('limit_gbps')} GB/s ({details.get('limit_by')} of "
            f"{details.get('limit_hop')}), {details.get('fraction')} of it",
            *(f"  - {c['cause']} at {c['at']}: {c['observed']}" for c in causes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bytes", default="1G")
    parser.add_argument("--root", default="/")
    args = parser.parse_args()
    out = []
    for title, env in CASES:
        with tempfile.TemporaryDirectory() as work:
            record = run_case(args.root, args.bytes, env, Path(work))
        if record["outcome"] == "error":
            out.append(f"- {title}: error: {record['message']}")
        else:
            out += lines(title, record)
    print("\n".join(out))


if __name__ == "__main__":
    main()
