"""One owner per setting: once every check is placed on the machine where its setting lives
(``containers.placed``), two checks of one setting on one machine that expect different values
would have a --fix set one and then the other (both "fixed", the second winning) and
--fix-persist write both; a run that may change anything refuses them before it does.

Two checks are of one setting when they are placed on one target with one id (``sysctl[KEY]``
on ``pve`` from the host's spec and from its container's ``?spec=``, or from two
``--gpuhost-spec``); they disagree when their expectations are written differently
(``describe``: what a report shows as expected). Only checks a fix may change count: two specs
that expect different GPU counts change nothing. The same expectation twice is no conflict: the
first fix makes the second pass, one change in the journal.

A run that changes nothing keeps both checks, each saying how the machine stands to its spec.
No pytest: the plugin calls ``refuse_two_owners`` before its collection, the xdist controller
before its workers start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..checks import Check
from ..printable import one_line
from .containers import RUN_OWN

if TYPE_CHECKING:
    from . import Session
    from .target import Target


class TwoOwners(Exception):
    """Two checks set one setting of one machine two ways; the message names both."""


def _changes(check: Check) -> bool:
    """Whether a fix may change the check's setting (a persistence file, a rollback's restore
    are the run's own)."""
    return bool(check.probe.fixable) and check.owner not in RUN_OWN


def placements(session: Session) -> list[tuple[Check, Target]]:
    """Every check of the run this process collects, with the target it runs on, as its
    collection places them (the expansions kept for it); a host that gets a check wakes. A
    spec whose expansion raises on a target (a plugin kind's bug) places nothing here: its
    collection expands it again and reports that error where it belongs, as a collection
    error of the spec (exit 2), not as an internal error of this early look."""
    found: list[tuple[Check, Target]] = []
    for spec in session.specs.values():
        for target in session.runs(spec):
            if not session.collects(target) or target.unreachable is not None:
                continue
            try:
                found += session.placed(spec, target)
            except Exception:  # reported by the spec's collection
                continue
    return found


def two_owners(session: Session) -> list[str]:
    """Each setting two checks of the run set two ways on one machine, as a line naming the
    setting, the machine, and each check's spec line and expectation."""
    first: dict[tuple[str, str], Check] = {}
    found: list[str] = []
    for check, on in placements(session):
        if not _changes(check):
            continue
        owner = first.setdefault((on.name, check.id), check)
        if owner.expect.describe() == check.expect.describe():
            continue
        found.append(
            f"{one_line(check.id)} on {on.name} ({one_line(on.host.describe())}) has two "
            f"owners: {one_line(owner.options.where)} expects "
            f"{one_line(owner.expect.describe())}, {one_line(check.options.where)} expects "
            f"{one_line(check.expect.describe())}")
    return found


def refuse_two_owners(session: Session) -> None:
    """TwoOwners (a usage error, exit 4) where a run that may change something has a setting
    with two owners: before any check runs, so before anything changes."""
    if not session.settings.fix or not session.specs:
        return
    found = two_owners(session)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise TwoOwners(
            f"{found[0]}{more}: --fix would set it one way and then the other, and "
            "--fix-persist write both; a setting has one owner in a run: make the specs "
            "agree, or leave the setting to one of them" + "".join(f"\n  {line}"
                                                                    for line in found[1:]))
