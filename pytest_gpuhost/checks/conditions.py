"""Named host conditions for ``when:``: a check whose condition is false is skipped, with why."""

from __future__ import annotations

from collections.abc import Callable

from ..host import Host, HostError

ConditionFn = Callable[[Host], tuple[bool, str]]
"""Returns whether the condition holds and a reason that says what was seen."""

_CONTAINER_MARKERS = (".dockerenv", "run/.containerenv")
_CONTAINER_CGROUPS = ("docker", "kubepods", "containerd", "libpod", "lxc")


def infiniband(host: Host) -> tuple[bool, str]:
    devices = host.listdir("sys/class/infiniband") if host.exists("sys/class/infiniband") else []
    if devices:
        return True, f"RDMA devices under sys/class/infiniband: {', '.join(devices)}"
    return False, "no RDMA device under sys/class/infiniband"


def container(host: Host) -> tuple[bool, str]:
    for marker in _CONTAINER_MARKERS:
        if host.exists(marker):
            return True, f"{marker} exists"
    try:
        cgroup = host.read_text("proc/1/cgroup")
    except HostError:
        cgroup = ""
    for word in _CONTAINER_CGROUPS:
        if word in cgroup:
            return True, f"proc/1/cgroup names {word}"
    return False, "no container marker (.dockerenv, run/.containerenv, a container cgroup)"


BUILTIN_CONDITIONS: dict[str, ConditionFn] = {"infiniband": infiniband, "container": container}
