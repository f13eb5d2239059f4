"""The built-in check kinds, conditions, target schemes, hosts and reports, registered through
the public hooks.

A kind's module is imported when a run first needs the kind (its section is in a spec, or a
catalog capture asks every kind): a run pays for the kinds its spec uses, not for all twelve.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .checks import kind_name as kind_name
from .config.targets import BUILTIN_SCHEMES, Scheme, TargetAddress, TargetError, scheme_registry
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from types import ModuleType

    import pluggy

    from .checks import Check, Facts, Kind
    from .checks.conditions import ConditionFn
    from .config.settings import Settings
    from .config.targets import TargetAddress
    from .gpu.nvml import NvmlFactory
    from .host import Host
    from .reports import Report
    from .specmodel import Node, SpecContext

BUILTIN_KINDS = (
    ("sysctl", "sysctl", "SysctlKind"),
    ("kernel", "kernel", "KernelKind"),
    ("cpufreq", "cpufreq", "CpufreqKind"),
    ("memory", "memory", "MemoryKind"),
    ("gpus", "gpus", "GpusKind"),
    ("pcie", "pcie", "PcieKind"),
    ("iommu", "iommu", "IommuKind"),
    ("cpuidle", "cpuidle", "CpuidleKind"),
    ("modules", "modules", "ModulesKind"),
    ("p2p", "p2p", "P2pKind"),
    ("nccl", "nccl", "NcclKind"),
    ("dmesg", "dmesg", "DmesgKind"),
)
"""(section, module of pytest_gpuhost.checks, class), in the order their sections run."""


class BuiltinKind:
    """A built-in kind by name: its module is imported on the first parse, expand or look at its
    optional half (``checks.kind.StandIn``)."""

    def __init__(self, section: str, module: str, name: str) -> None:
        self.section = section
        self.module = module
        self.name = name
        self._kind: Kind | None = None
        self._of: ModuleType | None = None

    @property
    def kind(self) -> Kind:
        """The kind, of its module as Python has it now. A module pytester dropped after an
        inline run is imported anew by the next one, and a spec loaded from the cache holds
        that import's classes (``spec/cache.py``): the kind must be the same import's, or its
        ``isinstance`` checks would not know its own models."""
        name = f"{__package__}.checks.{self.module}"
        module = sys.modules.get(name)
        if self._kind is None or module is not self._of:
            module = importlib.import_module(name)
            self._kind, self._of = getattr(module, self.name)(), module
        assert self._kind is not None
        return self._kind

    def parse(self, node: Node, context: SpecContext) -> object:
        return self.kind.parse(node, context)

    def expand(self, section: Any, facts: Facts) -> Sequence[Check]:
        return self.kind.expand(section, facts)

    def standing_for(self) -> Kind:
        """Its optional half (``checks.kind``) is the kind's."""
        return self.kind

    def loaded(self) -> Kind | None:
        """The kind if a parse, facts or expand of this run imported it (its persistence lines
        are of its records: a kind never loaded has none)."""
        return self._kind

    @property
    def qualname(self) -> str:
        """The kind's class, as messages name it (without importing it)."""
        return f"{__package__}.checks.{self.module}.{self.name}"

    def __repr__(self) -> str:
        return f"<built-in kind {self.section}: {self.qualname}>"


_KINDS = [BuiltinKind(*names) for names in BUILTIN_KINDS]


@hookimpl
def pytest_gpuhost_check_kinds() -> Sequence[Kind]:
    return _KINDS


@hookimpl
def pytest_gpuhost_conditions() -> Mapping[str, ConditionFn]:
    from .checks.conditions import BUILTIN_CONDITIONS

    return BUILTIN_CONDITIONS


@hookimpl
def pytest_gpuhost_target_schemes() -> Sequence[Scheme]:
    return BUILTIN_SCHEMES


def target_schemes(pluginmanager: pluggy.PluginManager) -> dict[str, Scheme]:
    """Every plugin's target schemes, the built-in ones among them (this module is registered
    first if it is not yet); SettingsError when two plugins claim one scheme."""
    from .config.settings import SettingsError

    this = sys.modules[__name__]
    if not pluginmanager.is_registered(this):
        pluginmanager.register(this, "gpuhost-builtin")
    try:
        return scheme_registry(pluginmanager.hook.pytest_gpuhost_target_schemes())
    except TargetError as exc:
        raise SettingsError(str(exc)) from None


@hookimpl(tryfirst=True)
def pytest_gpuhost_reports() -> Mapping[str, Report]:
    from .reports import REPORTS

    return REPORTS


@hookimpl(trylast=True)
def pytest_gpuhost_make_host(settings: Settings, target: TargetAddress) -> Host | None:
    """This machine at the run's root, an ssh target, an LXC container (of this machine or
    of an ssh target); other schemes are for the plugins that know them."""
    from .host import LocalHost

    if target.local:
        # an inventory's ansible_connection=local host at its gpuhost_root, else the run's root
        given = bool(target.source) and target.root != "/"
        return LocalHost(Path(target.root) if given else settings.root)
    if target.scheme not in ("ssh", "lxc"):
        return None
    from .host.remote import AgentHost, agent_command, lxc_argv, ssh_argv
    from .host.ssh import lxc_under

    inner = agent_command(target.root, target.python)
    if target.scheme == "lxc":  # entered with this machine's lxc-attach, under the run's root
        assert target.container is not None
        attach = LocalHost(settings.root).which("lxc-attach") \
            if settings.root != Path("/") else None  # at /: on PATH, as a shell finds it
        inner = lxc_argv(target.container, inner, attach or "lxc-attach")
    elif target.container is not None:  # the URL's root is the host's; the container's is /
        inner = lxc_under(target.root, target.container, agent_command("/", target.python),
                          target.python)
    argv = inner
    if target.scheme == "ssh":
        assert target.host is not None
        master = settings.ssh_masters / str(_master_of(settings, target)) \
            if settings.ssh_masters is not None else None
        argv = ssh_argv(target.host, port=target.port, user=target.user,
                        config=settings.ssh_config, connect_timeout=settings.connect_timeout,
                        inner=inner, identity_file=target.identity_file, extra=target.ssh_args,
                        master=master, strict_host_keys=strict_host_keys(settings))
    return AgentHost(target.url, argv, target.root, connect_timeout=settings.connect_timeout,
                     time_limit=settings.target_timeout, name=target.name,
                     refused_key_hint=refused_key_hint(settings, target))


def _master_of(settings: Settings, target: TargetAddress) -> int:
    """Which of the run's ssh connections ``target`` rides on: its own, or, for a container of
    an ssh host, its host's (one ssh login for both)."""
    names = [each.name for each in settings.targets]
    if target.kernel_on is not None and target.kernel_on in names:
        return names.index(target.kernel_on)
    return settings.targets.index(target)


def strict_host_keys(settings: Settings) -> bool:
    """A run that changes a target (--fix, a rollback) reaches it only with a host key its
    known_hosts already holds, unless --gpuhost-accept-new-host-keys says otherwise."""
    return settings.fix and not settings.accept_new_host_keys


def refused_key_hint(settings: Settings, target: TargetAddress) -> Callable[[], str] | str:
    """What to do when ssh refuses the target's host key in a run that changes it, made when
    ssh refuses it: ssh-keyscan is given the HostName and port the ssh configuration
    resolves an alias to (``ssh -G``), which it cannot resolve itself."""
    if not strict_host_keys(settings):
        return ""
    what = "--gpuhost-rollback" if settings.rollback is not None else "--fix"

    def hint() -> str:
        from .host.ssh import keyscan_address  # only once ssh refused a key


        name, port = keyscan_address(target.host or "", port=target.port,
                                     config=settings.ssh_config, extra=target.ssh_args)
        shown = f"-p {port} " if port != 22 else ""
        return (f" ({what} changes the target as root, so it takes only a host key "
                "known_hosts already holds, whatever StrictHostKeyChecking the ssh "
                "configuration or the inventory sets: check the key's fingerprint (ssh-keyscan "
                f"{shown}{name} | ssh-keygen -lf -, against ssh-keygen -lf "
                "/etc/ssh/ssh_host_ed25519_key.pub run there) and add it to known_hosts; "
                "--gpuhost-accept-new-host-keys lets the configuration's StrictHostKeyChecking "
                "(accept-new, no) decide instead)")

    return hint


@hookimpl(trylast=True)
def pytest_gpuhost_nvml(host: Host) -> NvmlFactory:
    from .gpu.nvml import default_factory

    return default_factory(host)



@hookimpl(trylast=True)
def pytest_gpuhost_envelope_sampler(host: Host) -> Any:
    """The host's own NVIDIA driver, asked by its agent (the library, else nvidia-smi);
    why there is none where the host cannot sample its GPUs."""
    from .host import GpuSampling

    if not isinstance(host, GpuSampling):
        return f"{host.describe()} has no NVIDIA driver of its own to sample"
    from .envelope.nvml import NvmlSampler

    return NvmlSampler(host)
