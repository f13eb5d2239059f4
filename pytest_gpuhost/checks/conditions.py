"""Named host conditions for ``when:``: a check whose condition is false is skipped, with why.

A condition is any ``host -> (holds, reason)`` callable (the hook's contract). A session asks
each one once per target and remembers the answer; a condition with ``requests`` (the built-in
ones) has what it reads fetched in the same batch as the checks' observations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ..host import Host, HostError, ListDir, Read, Reply, Request, Stat, Which

ConditionFn = Callable[[Host], tuple[bool, str]]
"""Returns whether the condition holds and a reason that says what was seen."""

class HostCondition(msgspec.Struct, frozen=True):
    """A condition together with the host reads it makes."""

    test: ConditionFn
    requests: Sequence[Request] = ()

    def __call__(self, host: Host) -> tuple[bool, str]:
        return self.test(host)


CONTAINER_READS: tuple[Request, ...] = (
    Stat("proc/vz"), Stat("proc/bc"), Read("run/host/container-manager"),
    Read("run/systemd/container"), Read("proc/1/environ"), Stat("run/.containerenv"),
    Stat(".dockerenv"), Read("proc/1/cgroup"))
"""What tells a container from a machine, read in one batch: systemd-detect-virt's markers in
its order (OpenVZ's proc/vz without proc/bc; the file a container manager leaves in
run/host/container-manager; run/systemd/container, which systemd in a container writes from its
``container=``; PID 1's environment ``container=``; Podman's run/.containerenv; Docker's
.dockerenv), then the cgroup paths of PID 1 that container managers make (``CGROUP_MARKS``)."""
CGROUP_MARKS = ("lxc.payload", "lxc", "docker", "kubepods", "libpod")
"""A component of PID 1's cgroup path that names a container manager (``lxc.payload.101``,
``/lxc/101``, ``docker-ID.scope``, ``kubepods-burstable.slice``, ``libpod-ID.scope``). A cgroup
namespace hides them (LXC's default: PID 1 reads ``0::/``): the markers above still say."""


def _text_of(reply: Reply) -> str:
    return reply.text().strip() if reply.error is None else ""


def recognise_container(replies: Sequence[Reply]) -> tuple[bool, str]:
    """Whether the replies to ``CONTAINER_READS`` say this root is a container, and what said
    so (or what was looked at)."""
    vz, bc, manager, systemd, environ, podman, docker, cgroup = replies
    if vz.error is None and bc.error is not None:
        return True, "proc/vz exists without proc/bc (OpenVZ)"
    for path, reply in (("run/host/container-manager", manager),
                        ("run/systemd/container", systemd)):
        if _text_of(reply):
            return True, f"{path} says {_text_of(reply)[:40]!r}"
    if environ.error is None:
        for entry in environ.data().split(b"\0"):
            if entry.startswith(b"container=") and entry != b"container=":
                shown = entry[10:50].decode("utf-8", "replace")
                return True, f"PID 1's environment holds container={shown}"
    for path, reply in (("run/.containerenv", podman), (".dockerenv", docker)):
        if reply.error is None:
            return True, f"{path} exists"
    for line in _text_of(cgroup).splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            mark = next((m for m in CGROUP_MARKS if part == m or part.startswith(
                (f"{m}.", f"{m}-"))), None)
            if mark is not None:
                return True, f"PID 1's cgroup {line.split(':', 2)[-1][:80]} names {mark}"
    return False, ("no container marker (run/systemd/container, PID 1's container=, "
                   ".dockerenv, run/.containerenv, a container manager's cgroup)")


def _container(host: Host) -> tuple[bool, str]:
    return recognise_container(host.batch(CONTAINER_READS))


def _infiniband(host: Host) -> tuple[bool, str]:
    devices = host.listdir("sys/class/infiniband") if host.exists("sys/class/infiniband") else []
    if devices:
        return True, f"RDMA devices under sys/class/infiniband: {', '.join(devices)}"
    return False, "no RDMA device under sys/class/infiniband"


def _nccl_tests(host: Host) -> tuple[bool, str]:
    found = host.which("all_reduce_perf")
    if found is not None:
        return True, f"nccl-tests' all_reduce_perf is at {found}"
    return False, "no all_reduce_perf (nccl-tests) in the root's bin directories or on PATH"


infiniband = HostCondition(_infiniband, (ListDir("sys/class/infiniband"),))
nccl_tests = HostCondition(_nccl_tests, (Which("all_reduce_perf"),))
container = HostCondition(_container, CONTAINER_READS)

def in_container(host: Host) -> bool:
    """Whether the host is a container (the ``container`` condition), for a message."""
    try:
        return container(host)[0]
    except HostError:
        return False


BUILTIN_CONDITIONS: dict[str, ConditionFn] = {"infiniband": infiniband, "container": container,
                                              "nccl_tests": nccl_tests}
