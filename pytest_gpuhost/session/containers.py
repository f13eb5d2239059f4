"""Where a check runs: a container and its host checked as one machine.

A container shares its host's kernel, so the ``kernel`` checks of a container's spec (non-``net.*``
sysctls, modules, PCIe, C-states, NVML device settings, dmesg...) run on the machine that runs
that kernel, and the rest (its network namespace's sysctls, its files and tools) inside it:

- a container by construction (``lxc://CTID``, ``ssh://HOST?lxc=CTID``: ``TargetAddress.kernel_on``)
  and this machine under ``--gpuhost-host``: their ``kernel`` checks are expanded on that host's
  facts, run, fixed, journaled and persisted there, and named after it (``check@pve``);
  ``placed`` says where each check of a spec runs;
- a ``when:`` condition of a check placed on another target is asked of the targets its entry
  was written for (``written_for``): ``when: container`` in a container's spec holds there,
  though its check runs on the host;
- a target recognised as a container the way systemd-detect-virt does (``CONTAINER``) with no
  host named: its ``kernel`` checks are read as they are, never changed from inside (a change
  there is refused, or changes the host behind its back), and one that does not pass is an
  ``error`` saying where to check it (``guarded``), never a misleading ``failed``.

No pytest here: the session uses it, and the plugin only names items after ``placed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from ..checks import KERNEL, Check, Fact
from ..checks.conditions import CONTAINER_READS, ConditionFn, recognise_container
from ..engine import OFFERS
from ..result import CheckResult, Outcome

if TYPE_CHECKING:
    from ..config.targets import TargetAddress
    from .target import Target

CONTAINER = Fact("container", CONTAINER_READS, recognise_container)
"""Whether a target's root is a container, and what said so: read with the collection's facts."""
HERE = "this is a container: check it where the kernel lives (--gpuhost-host=ssh://HOST)"
"""What a ``kernel`` check that does not pass in an unplaced container says first (this
machine's run: ``--gpuhost-host`` names its host)."""
THERE = ("this is a container: check it where the kernel lives (name the container "
         "ssh://HOST?lxc=CTID, or check HOST itself)")
"""The same, of a remote target that is a container: its host is reached through ssh."""
RUN_OWN = ("persist", "rollback")
"""The run's own work (its --fix-persist files, a rollback's restores): files of the root it
runs in and changes it made itself, never refused as another machine's."""
PASSING = (Outcome.PASSED, Outcome.SKIPPED, Outcome.FIXED)
LXC_ROOTFS = "var/lib/lxc/{ctid}/rootfs"
"""Where LXC keeps container CTID's tree on its host (its default lxcpath; Proxmox mounts every
running container's root file system there): a container's file as a path of its host."""


def own_root(address: TargetAddress) -> str:
    """The root a container target's agent runs at, inside it: an ``lxc://CTID/ROOT``'s
    ``ROOT``; ``/`` for ``ssh://HOST/ROOT?lxc=CTID``, whose ``ROOT`` is its host's."""
    return address.root if address.scheme == "lxc" or address.container is None else "/"


def on_host(container: Target, path: str) -> str | None:
    """``path`` (under the container target's root) as a path of the machine whose kernel it
    runs on, which the operator can open there: the LXC container's tree under its host's root
    (``/var/lib/lxc/101/rootfs/var/lib/...``). None for a target that is no LXC container, and
    for one whose host is this machine but that keeps its tree elsewhere (another lxcpath):
    what is shown must open."""
    host, address = container.kernel_on, container.address
    if host is None or address.container is None:
        return None
    inside = "/".join(part for part in (own_root(address).strip("/"), path.strip("/")) if part)
    under = f"{LXC_ROOTFS.format(ctid=address.container)}/{inside}"
    local = host.connection.local_path(under)  # a directory of this machine: seen to open
    if local is not None:
        return str(local) if local.exists() else None
    return f"{host.address.root.rstrip('/')}/{under}"


def in_kernel(check: Check) -> bool:
    """Whether the check's setting lives in the kernel (its scope; none declared: ``kernel``)."""
    return (check.scope or KERNEL) == KERNEL and check.owner not in RUN_OWN


def kernel_target(target: Target) -> Target:
    """The target whose kernel ``target`` runs on: its host's host, ... (a container of a
    container), or itself."""
    seen = [target]
    while seen[-1].kernel_on is not None and seen[-1].kernel_on not in seen:
        seen.append(seen[-1].kernel_on)
    return seen[-1]


def placed(target: Target, expand: Callable[[Target], Sequence[Check]]
           ) -> list[tuple[Check, Target]]:
    """Each check of a spec on ``target`` with the target it runs on: all on ``target`` when it
    is its own kernel's; else its ``kernel`` checks as expanded on the kernel's target (the
    GPUs, bridges and modules are that machine's), then the rest as expanded on ``target``.
    The kernel's target is read only when the spec has a ``kernel`` check there (``expand``
    on ``target`` says)."""
    checks = expand(target)
    host = kernel_target(target)
    if host is target:
        return [(check, target) for check in checks]
    own = [(check, target) for check in checks if not in_kernel(check)]
    if len(own) == len(checks):
        return own
    return [(check, host) for check in expand(host) if in_kernel(check)] + own


def guarded(check: Check, result: CheckResult, reason: str, *, local: bool) -> CheckResult:
    """The record of a ``kernel`` check on a container whose host the run does not know: as it
    was when it passed (the container reads its host's kernel), else an ``error`` saying where
    to check it, with what was seen (a ``failed`` would say --fix could fix it here)."""
    if result.outcome in PASSING:
        return result
    words = HERE if local else THERE
    seen = result.message
    for offer in OFFERS:  # --fix changes no kernel setting from here
        seen = seen.removesuffix(offer)
    return msgspec.structs.replace(
        result, outcome=Outcome.ERROR,
        message=f"{words}; here ({reason}): {seen}" if seen else f"{words}; here ({reason})")


def unjudged(messages: Sequence[str]) -> str | None:
    """What a run says once, before its failures, where a container's ``kernel`` checks could
    not be judged (``guarded``): how many, and the option that judges them; None where none."""
    here = sum(message.startswith(HERE) for message in messages)
    there = sum(message.startswith(THERE) for message in messages)
    if not here and not there:
        return None
    where = ("name its host with --gpuhost-host=ssh://[USER@]HOST[:PORT][/ROOT] (the machine "
             "whose kernel it runs on)" if here else
             "name the container as ssh://HOST?lxc=CTID, or check HOST itself")
    return (f"this is a container: {here + there} of its kernel checks (sysctls other than its "
            "own namespaces', modules, PCIe registers, C-states, NVML device settings, dmesg) "
            f"cannot be judged from inside it, and --fix changes none of them here: {where} "
            "(docs/remote.md)")


def written_for(check: Check, where: Target, asked: Sequence[Target]
                ) -> Mapping[str, ConditionFn] | None:
    """The answer to ``check``'s ``when:`` as the targets its entry was written for give it
    (``asked``: a container whose ``kernel`` check runs on ``where``, its host; the host
    too when it runs the same spec), or None when that is ``where`` alone. The check runs
    where any of them asks for it (one setting, one check); it is skipped only where every one
    says no, with what each saw. Asked when the check runs, inside its error handling: a
    target that cannot be read makes it an error."""
    when = check.options.when
    if when is None or [target.name for target in asked] in ([], [where.name]):
        return None

    def answer(_host: object) -> tuple[bool, str]:
        seen = []
        for target in asked:
            holds, reason = target.conditions[when.name](target.host)
            if holds != when.negate:
                return holds, f"{target.name}: {reason}"
            seen.append(f"{target.name}: {reason}")
        return when.negate, "; ".join(seen)

    return {when.name: answer}
