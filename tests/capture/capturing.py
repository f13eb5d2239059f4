"""Capture a tree and verify it with what was captured, through the tests' runner
(``tests/runner.py``): the round-trip tests use it on many trees quickly."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ..runner import Run, run_spec


def round_trip(root: Path, workdir: Path, specs: Sequence[Path] = (),
               name: str = "captured.yaml") -> tuple[str, Run]:
    """Capture ``root`` (for ``specs``' keys, or the catalog's), then verify it with the spec
    captured: (the captured text, the verifying run)."""
    run_spec(specs, root, workdir=workdir, capture=name)
    captured = workdir / name
    return captured.read_text(), run_spec([captured], root, workdir=workdir)
