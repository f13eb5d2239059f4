"""The built-in check kinds and conditions, registered through the public hooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .checks import Kind
from .checks.cpuidle import CpuidleKind
from .checks.dmesg import DmesgKind
from .checks.gpus import GpusKind
from .checks.modules import ModulesKind
from .checks.pcie import PcieKind
from .checks.sysctl import SysctlKind
from .conditions import BUILTIN_CONDITIONS, ConditionFn
from .hookspecs import hookimpl


@hookimpl
def pytest_gpuhost_check_kinds() -> Sequence[Kind]:
    return [SysctlKind(), GpusKind(), PcieKind(), CpuidleKind(), ModulesKind(), DmesgKind()]


@hookimpl
def pytest_gpuhost_conditions() -> Mapping[str, ConditionFn]:
    return BUILTIN_CONDITIONS
