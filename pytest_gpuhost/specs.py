"""The old import path of ``pytest_gpuhost.bundled``, the specs that ship with the package
(renamed apart from ``spec/``, the code that reads a spec): its names are re-exported here."""

from __future__ import annotations

from .bundled import *  # noqa: F403
