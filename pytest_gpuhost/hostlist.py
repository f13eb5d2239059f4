"""The old import path of ``pytest_gpuhost.config.hostlist``: the run's configuration
moved into ``config/``, and its names are re-exported here."""

from __future__ import annotations

from .config.hostlist import *  # noqa: F403
