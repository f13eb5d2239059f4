"""A pytest plugin for bench/ssh.py: when a run's phases end, as wall-clock times.

    GPUHOST_BENCH_TIMELINE=marks.json PYTHONPATH=bench python -m pytest -p timeline ...

Writes ``{"configured": t, "collected": t, "ran": t, "finished": t}`` (``time.time()``) to the
file named by GPUHOST_BENCH_TIMELINE at the end of the run: start-up ends when every plugin is
configured (gpuhost's session made, its spec loaded), collection when the checks are expanded
(the connection and the facts' batch), the run when the last check ran, and ``finished`` when
the session's reports are written, before the connection is closed at unconfigure.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import pytest

MARKS: dict[str, float] = {}


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    MARKS["configured"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    MARKS["collected"] = time.time()


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        MARKS["ran"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    MARKS["finished"] = time.time()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("GPUHOST_BENCH_TIMELINE")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump(MARKS, file)
