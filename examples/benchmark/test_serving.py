"""A benchmark that is not a pytest test, run from one that asks for the host's state and
writes it beside the benchmark's own result.

    GPUHOST_BENCH_COMMAND   the benchmark, without --output-file (default: serving_standin.py)
    GPUHOST_BENCH_OUT       where each run's directory goes (default: bench-results)

Each run writes ``bench-results/<UTC time>-<pid>/serving.jsonl`` (the benchmark's result) and
``gpuhost-state.json`` (the state: ``python -m pytest_gpuhost.state diff`` compares two).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

STANDIN = Path(__file__).with_name("serving_standin.py")
COMMAND = os.environ.get("GPUHOST_BENCH_COMMAND",
                         shlex.join([sys.executable, str(STANDIN), "--num-prompts", "200"]))


@pytest.mark.gpuhost  # gated: only on a host that holds its spec
def test_serving_throughput(gpuhost_state: Mapping[str, Any]) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(os.environ.get("GPUHOST_BENCH_OUT", "bench-results")) / f"{stamp}-{os.getpid()}"
    out.mkdir(parents=True)
    result = out / "serving.jsonl"
    subprocess.run([*shlex.split(COMMAND), "--output-file", str(result)], check=True,
                   timeout=3600)
    (out / "gpuhost-state.json").write_text(
        json.dumps(gpuhost_state.as_dict(), indent=2) + "\n")  # type: ignore[attr-defined]
    assert result.read_text().strip(), f"{COMMAND} wrote no result to {result}"
