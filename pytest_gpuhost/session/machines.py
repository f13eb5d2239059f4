"""Machine identity: a target is known by what it is, not by what it was called.

Two URLs that differ (two ssh aliases of one machine, its name and its address, an inventory
that lists it twice) may reach one machine and root; under --fix both would change it, each
with its own journal on the one root. Once reached, a target says what it is: its
``/etc/machine-id``, its kernel's boot id (``/proc/sys/kernel/random/boot_id``) and its
hostname, read (inside its root) in the first batch of collection (``MACHINE``), and the real
path of its root as its agent opened it (``Host.identity``, kept at collection: ``Target.root``).
Two targets with all of these equal are one target under two names, refused as the same URL
twice is, before anything changes (exit 4). A target that lacks a machine-id or a boot id
is not compared: it is told apart by its URL alone (``targets.destination``), as before.

A container and the target its ``kernel`` checks go to share a kernel, so a known boot id of
each must be the same: a container's host written as another machine (an alias or port that
reaches another sshd) is refused before its kernel checks change the wrong machine.

The machine-id is a secret of the machine (machine-id(5)): it is compared here, and what
leaves the run (a state's ``machine``, ``Machine.key``) is a keyed hash of it, never the id.
No pytest: the plugin calls ``refuse_one_machine_twice`` with the owners' check.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..checks import Fact
from ..host import HostError, Read, Reply
from ..printable import one_line

if TYPE_CHECKING:
    from . import Session
    from .target import Target

MACHINE_ID = "etc/machine-id"
BOOT_ID = "proc/sys/kernel/random/boot_id"
HOSTNAME = "proc/sys/kernel/hostname"
APP_KEY = b"pytest-gpuhost machine"
"""The key of the hash that stands for a machine-id outside the run (as systemd's
``sd_id128_get_machine_app_specific`` keys its own)."""


class Machine(msgspec.Struct, frozen=True):
    """What a reached target is: its machine, its kernel's boot and its root there."""

    machine_id: str
    boot_id: str
    hostname: str | None
    root: str

    @property
    def key(self) -> str:
        """The machine and root as a state names them: the same across reboots and names,
        and no machine-id in it (a keyed hash)."""
        return hmac.new(APP_KEY, f"{self.machine_id}\0{self.root}".encode(),
                        hashlib.sha256).hexdigest()[:32]


class SameMachine(Exception):
    """One machine and root under two names, or a container whose host is another kernel."""


def _line(reply: Reply) -> str | None:
    if reply.error is not None:
        return None
    text = reply.text().strip()
    line = text.splitlines()[0].strip() if text else ""
    return line if line and line != "uninitialized" else None  # systemd's, early at boot


def _parse(replies: Sequence[Reply]) -> tuple[str | None, ...]:
    return tuple(_line(reply) for reply in replies)


MACHINE = Fact("machine", (Read(MACHINE_ID), Read(BOOT_ID), Read(HOSTNAME)), _parse)
"""A target's machine-id, boot id and hostname: read with the collection's first batch."""


def machine_of(target: Target) -> Machine | None:
    """What ``target`` is, once reached; None where it cannot be told (unreachable, or no
    machine-id or boot id to read)."""
    if target.unreachable is not None or target.root is None or \
            not target.facts.known(MACHINE):  # never read for this (a report's question)
        return None
    try:
        machine_id, boot_id, hostname = target.facts.get(MACHINE)
    except HostError:
        return None
    if machine_id is None or boot_id is None:
        return None
    return Machine(machine_id, boot_id, hostname, target.root)


def _boot_id(target: Target) -> str | None:
    try:
        return target.facts.get(MACHINE)[1]
    except HostError:
        return None


def _shown(target: Target) -> str:
    return one_line(target.address.shown)


def _read(session: Session, targets: Sequence[Target]) -> None:
    """Every target's machine read: with the first batch of its collection where that is not
    read yet (the facts of every spec, as ``collect_remote`` reads them)."""
    facts: list[Fact[Any]] = list(dict.fromkeys(
        f for spec in session.specs.values() for f in session.facts_of(spec))) or [MACHINE]
    for target in targets:
        if not target.facts.known(MACHINE):
            target.collect_facts(facts, session.shared_dir)


def refuse_one_machine_twice(session: Session) -> None:
    """SameMachine where two of the run's targets are one machine and root, or a container's
    known boot id is not its host's (see the module's docstring)."""
    if not session.specs:  # a rollback checks its journal's own identity
        return
    from .owners import placements

    placements(session)  # a host added for a container's checks wakes only if it gets one
    targets = [t for t in session.targets.values()
               if session.collects(t) and t.unreachable is None and not t.dormant]
    if len(targets) < 2:
        return
    _read(session, targets)
    machines = {target.name: machine_of(target) for target in targets}
    seen: dict[Machine, Target] = {}
    for target in targets:
        machine = machines[target.name]
        if machine is None:
            continue
        other = seen.setdefault(machine, target)
        if other is not target:
            raise SameMachine(
                f"{_shown(other)} and {_shown(target)} are the same target (one machine and "
                f"root: the same machine-id, boot id and hostname, root "
                f"{machine.root.encode('unicode_escape').decode('ascii')}), under two names: "
                "give it once")
    for target in targets:
        host = target.kernel_on
        if host is None or host not in targets:
            continue
        mine, theirs = _boot_id(target), _boot_id(host)
        if mine is not None and theirs is not None and mine != theirs:
            raise SameMachine(
                f"{_shown(target)} runs on another kernel than {_shown(host)}, where its "
                "kernel checks would go (their boot ids differ): name the container's host "
                "as the target that reaches it (the same host, port and ssh configuration)")
