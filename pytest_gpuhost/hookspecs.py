"""Hooks through which check kinds, ``when:`` conditions, target schemes, hosts and NVML are
provided.

pytest only treats names that start with ``pytest_`` as hooks, hence the prefix.

pytest-gpuhost's own kinds use these hooks too, so a third-party package (a pytest11 plugin)
adds a kind, a condition, a target scheme, a kind of host or a report exactly the way the
built-in ones are added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:  # imported by every pytest run: nothing heavy at import time
    from .checks import Kind
    from .checks.conditions import ConditionFn
    from .config.settings import Settings
    from .config.targets import Scheme, TargetAddress
    from .envelope.facts import GpuSampler
    from .gpu.nvml import NvmlFactory
    from .host import Host
    from .reports import Report

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


@hookspec
def pytest_gpuhost_target_schemes() -> Sequence[Scheme]:
    """Return target schemes to add (``targets.Scheme``): how a ``docker://...`` URL parses and
    names its target. Asked before any target is parsed; the built-in ``local``, ``ssh://``
    and ``lxc://`` come through this hook too. Pair it with ``pytest_gpuhost_make_host``."""
    raise NotImplementedError


@hookspec(firstresult=True)
def pytest_gpuhost_make_host(url: str, settings: Settings, target: TargetAddress) -> Host | None:
    """Return the ``Host`` for a target, or None to let another plugin make it. ``target`` is
    the parsed address (its ``scheme``, ``host``, ``container``, ``root``, ``name``...); ``url``
    is ``target.url``. The one place a run's hosts are made: a plugin adds a kind of host by
    answering for its scheme. A conftest may wrap the host the built-in one makes (a counting
    host in the tests). An implementation may take only the arguments it needs (``url,
    settings`` as before ``target`` was added)."""
    raise NotImplementedError


@hookspec(firstresult=True)
def pytest_gpuhost_nvml(host: Host) -> NvmlFactory | None:
    """Return a factory that opens NVML for ``host`` (called at most once, when a check first
    needs NVML; it raises ``NvmlUnavailable`` with the reason). The built-in implementation runs
    last: the real library on ``/``, a recorded snapshot in a fake tree. A conftest returns
    ``lambda: FakeNvml(...)`` to run the NVML checks against a fake."""
    raise NotImplementedError


@hookspec(firstresult=True)
def pytest_gpuhost_envelope_sampler(host: Host) -> GpuSampler | str | None:
    """Return what samples the GPUs of ``host`` for a benchmark's envelope
    (``envelope.facts.GpuSampler``: ``describe()`` and ``sample()``, every GPU's facts by PCI
    address), a sentence saying why there is none (the envelope then holds its host half and
    says the GPU half is missing), or None to let another plugin answer. The built-in
    implementation runs last. ``host`` is where the GPUs are (a container target's host). A
    conftest returns a fake sampler to test a benchmark's envelope without a GPU."""
    raise NotImplementedError


@hookspec
def pytest_gpuhost_reports() -> Mapping[str, Report]:
    """Return reports the run can write, by name (``reports.Report``: the setting or option that
    asks for one, and what makes its reporter). The built-in ones (``reports.REPORTS``) come
    through this hook too; a name is claimed once."""
    raise NotImplementedError
