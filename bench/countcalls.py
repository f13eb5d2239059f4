"""A pytest plugin for bench/ssh.py: every host of the run counted by method, written out.

    GPUHOST_BENCH_CALLS=calls.json PYTHONPATH=bench python -m pytest -p countcalls ...

Wraps each host the run makes (``pytest_gpuhost_make_host``, tried first) in
pytest_gpuhost.testing.counting.CountingHost and, at unconfigure, writes ``{method: calls}``
summed over them to the file GPUHOST_BENCH_CALLS names: what each call to a remote host would
cost, a round trip, by what made it.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from pytest_gpuhost.config.settings import Settings
from pytest_gpuhost.host import Host, LocalHost
from pytest_gpuhost.testing.counting import CountingHost

HOSTS: list[CountingHost] = []


@pytest.hookimpl(tryfirst=True)
def pytest_gpuhost_make_host(url: str, settings: Settings) -> Host:
    HOSTS.append(CountingHost(LocalHost(settings.root)))
    return HOSTS[-1]


def pytest_unconfigure(config: pytest.Config) -> None:
    calls: Counter[str] = Counter()
    for host in HOSTS:
        calls.update(host.calls)
    with open(os.environ["GPUHOST_BENCH_CALLS"], "w", encoding="utf-8") as file:
        json.dump(dict(calls), file)
