"""``python -m pytest_gpuhost.fakehost DIR`` (docs/layout.md) and the old import path of
the fake host trees: both now live in ``pytest_gpuhost.testing.fakehost``."""

from __future__ import annotations

import sys

from .testing.fakehost import *  # noqa: F403
from .testing.fakehost import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
