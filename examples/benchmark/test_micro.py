"""A CPU-only micro-benchmark (pytest-benchmark), gated on the host checks: it runs only when
every check of inference-node.yaml passed or was fixed, and the file it saves carries the
host's state in machine_info["gpuhost"]."""

from __future__ import annotations

import math
import random

import pytest
from pytest_benchmark.fixture import BenchmarkFixture

pytestmark = pytest.mark.gpuhost  # run only on a host that holds its spec

ROW = [random.Random(0).uniform(-8.0, 8.0) for _ in range(4096)]


def softmax(row: list[float]) -> list[float]:
    """What a sampler does for every token over a vocabulary slice, in pure Python."""
    top = max(row)
    exps = [math.exp(x - top) for x in row]
    total = sum(exps)
    return [e / total for e in exps]


def test_softmax_4096(benchmark: BenchmarkFixture) -> None:
    probabilities = benchmark(softmax, ROW)
    assert math.isclose(sum(probabilities), 1.0)
