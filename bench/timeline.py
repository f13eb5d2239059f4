"""A pytest plugin for bench/ssh.py: when a run's phases end, as wall-clock times.

    GPUHOST_BENCH_TIMELINE=marks.json PYTHONPATH=bench python -m pytest -p timeline ...

Writes ``{"started": t, "configured": t, "collected": t, "ran": t, "finished": t, "cpu": {...}}``
(``time.time()``; under ``cpu`` the same marks in CPU seconds of the process,
``time.process_time()``, from 0 at its start: a split that other work on a shared machine
disturbs less) to the file named by GPUHOST_BENCH_TIMELINE at the end of the run: the process
started (from /proc, to 10 ms), every plugin is configured (gpuhost's session made, its spec
loaded), the checks are collected (gpuhost: the connection and the facts' batch), the last
check ran, the session's reports are written. What follows (unconfigure, where gpuhost closes
its connections, and the interpreter's exit) is the rest of the process's wall time.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Generator

import pytest


def process_start() -> float:
    """When this process started, as ``time.time()``: its start in clock ticks after boot
    (/proc/self/stat) against the uptime now."""
    with open("/proc/self/stat", encoding="ascii") as file:
        fields = file.read().rsplit(")", 1)[1].split()
    with open("/proc/uptime", encoding="ascii") as file:
        uptime = float(file.read().split()[0])
    ticks = int(fields[19])  # starttime, the 22nd field; fields[0] is the 3rd
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


MARKS: dict[str, float] = {"started": process_start()}
CPU: dict[str, float] = {"started": 0.0}


def mark(name: str) -> None:
    MARKS[name] = time.time()
    CPU[name] = time.process_time()


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    mark("configured")


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    mark("collected")


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Generator[None, object, object]:
    try:
        return (yield)
    finally:
        mark("ran")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    mark("finished")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("GPUHOST_BENCH_TIMELINE")
    if path:
        with open(path, "w", encoding="utf-8") as file:
            json.dump({**MARKS, "cpu": CPU}, file)
