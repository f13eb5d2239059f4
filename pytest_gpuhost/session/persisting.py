"""--fix-persist's side of the session: the files each target's records may be written to, as
collected and at the end of its run; a container's hold only what it owns (``scope``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..checks import KERNEL, Check, persistence_of, persists_to_of
from ..host import doing
from ..result import CheckResult
from .containers import in_kernel

if TYPE_CHECKING:
    from ..specmodel import Spec
    from . import Session
    from .target import Target


def contained(session: Session, target: Target) -> bool:
    """Whether ``target`` is a container: by construction, under --gpuhost-host, or
    recognised (its boot configuration then holds only what it owns)."""
    return target.address.container is not None or target.kernel_on is not None or \
        target.container() is not None

def persistence_files(session: Session, checks: Sequence[Check], spec: Spec,
                      target: Target) -> list[Check]:
    """The check of each file --fix-persist may write for ``spec``'s ``checks`` on one
    target, as collected: what it holds is known at its turn (``persistence_checks``). A
    container's files hold only what it owns: never a GRUB drop-in, modprobe.d,
    modules-load.d or udev rule (its host's kernel reads those)."""
    from ..fix.persist import candidate_files, pending_check

    if contained(session, target):
        checks = [check for check in checks if not in_kernel(check)]

    def targets_of(check: Check) -> Sequence[str]:
        kind = session.kinds.get(check.owner)
        return persists_to_of(kind)(check) if kind is not None else ()

    return [pending_check(path, session.settings.display(spec.path))
            for path in candidate_files(spec.name, checks, targets_of)]

def persistence_checks(session: Session, target: Target, results: Sequence[CheckResult],
                       spec: Spec | None = None) -> dict[str, Check]:
    """File -> its check, from the records of ``spec``'s checks on the target at the end
    of its run (a file with nothing to hold has none; in a container, of what it owns)."""
    from ..fix.persist import persistence_checks as checks_of

    spec = spec or next(iter(session.specs.values()))
    if contained(session, target):
        results = [r for r in results if (r.scope or KERNEL) != KERNEL]
    supplies = [supply for supply in map(persistence_of, session.kinds.values()) if supply]
    with doing("reading what the persistence files hold"):
        checks = checks_of(spec.name, session.settings.display(spec.path), results,
                                    target.host, supplies)
    return {str(check.key): check for check in checks}
