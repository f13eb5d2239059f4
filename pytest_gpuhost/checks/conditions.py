"""Named host conditions for ``when:``: a check whose condition is false is skipped, with why.

A condition is any ``host -> (holds, reason)`` callable (the hook's contract). A session asks
each one once per target and remembers the answer; a condition with ``requests`` (the built-in
ones) has what it reads fetched in the same batch as the checks' observations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ..host import Host, HostError, ListDir, Read, Request, Stat

ConditionFn = Callable[[Host], tuple[bool, str]]
"""Returns whether the condition holds and a reason that says what was seen."""

_CONTAINER_MARKERS = (".dockerenv", "run/.containerenv")
_CONTAINER_CGROUPS = ("docker", "kubepods", "containerd", "libpod", "lxc")


class HostCondition(msgspec.Struct, frozen=True):
    """A condition together with the host reads it makes."""

    test: ConditionFn
    requests: Sequence[Request] = ()

    def __call__(self, host: Host) -> tuple[bool, str]:
        return self.test(host)


def _infiniband(host: Host) -> tuple[bool, str]:
    devices = host.listdir("sys/class/infiniband") if host.exists("sys/class/infiniband") else []
    if devices:
        return True, f"RDMA devices under sys/class/infiniband: {', '.join(devices)}"
    return False, "no RDMA device under sys/class/infiniband"


def _container(host: Host) -> tuple[bool, str]:
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


infiniband = HostCondition(_infiniband, (ListDir("sys/class/infiniband"),))
container = HostCondition(_container, (*(Stat(m) for m in _CONTAINER_MARKERS),
                                       Read("proc/1/cgroup")))

def in_container(host: Host) -> bool:
    """Whether the host is a container (the ``container`` condition), for a message."""
    try:
        return container(host)[0]
    except HostError:
        return False


BUILTIN_CONDITIONS: dict[str, ConditionFn] = {"infiniband": infiniband, "container": container}
