"""``-p stopconfigured`` (with bench/ on PYTHONPATH): end the process as soon as every plugin is
configured, so that a run measures its start-up alone (bench.py counts its instructions)."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
