"""The old import path of ``pytest_gpuhost.config.options``, and ``python -m
pytest_gpuhost.options`` (docs/reference.md's table of options): the run's configuration moved
into ``config/``, and its names are re-exported here."""

from __future__ import annotations

from .config.options import *  # noqa: F403
from .config.options import main

if __name__ == "__main__":
    raise SystemExit(main(prog="python -m pytest_gpuhost.options"))
