"""Hooks through which check kinds and ``when:`` conditions are registered.

pytest only treats names that start with ``pytest_`` as hooks, hence the prefix.

pytest-gpuhost's own kinds use these hooks too, so a third-party package (a pytest11 plugin)
adds a kind exactly the way the built-in ones are added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pluggy

from .checks import Kind
from .checks.conditions import ConditionFn
from .gpu.nvml import NvmlFactory
from .host import Host

hookspec = pluggy.HookspecMarker("pytest")
hookimpl = pluggy.HookimplMarker("pytest")


@hookspec
def pytest_gpuhost_check_kinds() -> Sequence[Kind]:
    """Return check kinds to add; each owns the top-level spec section named by its ``section``."""
    raise NotImplementedError


@hookspec
def pytest_gpuhost_conditions() -> Mapping[str, ConditionFn]:
    """Return named conditions usable as ``when: NAME`` in a spec."""
    raise NotImplementedError


@hookspec(firstresult=True)
def pytest_gpuhost_nvml(host: Host) -> NvmlFactory | None:
    """Return a factory that opens NVML for ``host`` (called at most once, when a check first
    needs NVML; it raises ``NvmlUnavailable`` with the reason). The built-in implementation runs
    last: the real library on ``/``, a recorded snapshot in a fake tree. A conftest returns
    ``lambda: FakeNvml(...)`` to run the NVML checks against a fake."""
    raise NotImplementedError
