"""The built-in check kinds and conditions, registered through the public hooks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .checks import Kind
from .checks.conditions import BUILTIN_CONDITIONS, ConditionFn
from .checks.cpufreq import CpufreqKind
from .checks.cpuidle import CpuidleKind
from .checks.dmesg import DmesgKind
from .checks.gpus import GpusKind
from .checks.iommu import IommuKind
from .checks.kernel import KernelKind
from .checks.memory import MemoryKind
from .checks.modules import ModulesKind
from .checks.p2p import P2pKind
from .checks.pcie import PcieKind
from .checks.sysctl import SysctlKind
from .gpu.nvml import NvmlFactory, default_factory
from .hookspecs import hookimpl
from .host import Host, LocalHost
from .settings import Settings


@hookimpl
def pytest_gpuhost_check_kinds() -> Sequence[Kind]:
    return [SysctlKind(), KernelKind(), CpufreqKind(), MemoryKind(), GpusKind(), PcieKind(),
            IommuKind(), CpuidleKind(), ModulesKind(), P2pKind(), DmesgKind()]


@hookimpl
def pytest_gpuhost_conditions() -> Mapping[str, ConditionFn]:
    return BUILTIN_CONDITIONS


@hookimpl(trylast=True)
def pytest_gpuhost_make_host(url: str, settings: Settings) -> Host | None:
    """This machine at the run's root, an ssh target, an LXC container (of this machine or
    of an ssh target); other schemes are for the plugins that know them."""
    target = next((t for t in settings.targets if t.url == url), None)
    if url == "local" or (target is not None and target.local):
        return LocalHost(settings.root)
    if target is None or target.scheme not in ("ssh", "lxc"):
        return None
    from .host.remote import AgentHost, agent_command, lxc_argv, ssh_argv

    inner = agent_command(target.root)
    if target.container is not None:
        inner = lxc_argv(target.container, inner)
    argv = inner
    if target.scheme == "ssh":
        assert target.host is not None
        master = settings.ssh_masters / str(settings.targets.index(target)) \
            if settings.ssh_masters is not None else None
        argv = ssh_argv(target.host, port=target.port, user=target.user,
                        config=settings.ssh_config, connect_timeout=settings.connect_timeout,
                        inner=inner, identity_file=target.identity_file, extra=target.ssh_args,
                        master=master)
    return AgentHost(url, argv, target.root, connect_timeout=settings.connect_timeout,
                     time_limit=settings.target_timeout, name=target.name)


@hookimpl(trylast=True)
def pytest_gpuhost_nvml(host: Host) -> NvmlFactory:
    return default_factory(host)
