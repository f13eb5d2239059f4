"""The old import path of ``pytest_gpuhost.config.inventory``: the run's configuration
moved into ``config/``, and its names are re-exported here."""

from __future__ import annotations

from .config.inventory import *  # noqa: F403
