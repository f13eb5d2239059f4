"""The C-states of a host's online CPUs, for the cpuidle kind: where each named state's
``disable`` file is on each CPU (one fact, one batch for any count of CPUs), and a state's
``usage`` and ``time`` counters beside it.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..host import Glob, Host, HostError, Read, Reply, Request, unreadable
from ..linux.cpulist import parse_cpu_list
from . import Fact, NotApplicable

CPU = "sys/devices/system/cpu"
DRIVER = f"{CPU}/cpuidle/current_driver"


class IdleStates(msgspec.Struct, frozen=True):
    """Where each named state's ``disable`` file is, per online CPU; read once per session."""

    driver: str
    cpus: tuple[int, ...]
    by_name: dict[str, tuple[tuple[int, str], ...]]
    problem: str | None = None
    """Why the online CPUs could not be read (a damaged ``online``): each check is an error."""

    def names(self) -> list[str]:
        return sorted(self.by_name)


def _parse_idle_states(replies: Sequence[Reply]) -> IdleStates:
    online, driver, names = replies
    text = online.text() if online.error is None else ""  # none: no CPUs, each check says so
    try:
        cpus = tuple(parse_cpu_list(text))
    except ValueError as exc:
        shown = text.strip() if len(text) <= 80 else text.strip()[:77] + "..."
        return IdleStates("unknown", (), {}, problem=f"{CPU}/online: {shown!r} is not a CPU "
                                                      f"list: {exc}")
    wanted = set(cpus)
    by_name: dict[str, list[tuple[int, int, str]]] = {}
    failed: list[tuple[str, HostError]] = []
    for path, data in names.matches() if names.error is None else ():
        # sys/devices/system/cpu/cpuN/cpuidle/stateM/name
        parts = path.split("/")
        cpu, state = parts[-4].removeprefix("cpu"), parts[-2].removeprefix("state")
        if not (cpu.isdigit() and state.isdigit()) or int(cpu) not in wanted:
            continue
        if unreadable(data):
            failed.append((path, data))  # which state it is on that CPU is unknown
        if not isinstance(data, bytes):
            continue
        name = data.decode("utf-8", errors="replace").strip()
        by_name.setdefault(name, []).append((int(cpu), int(state),
                                             path.rsplit("/", 1)[0] + "/disable"))
    shown = driver.text().strip() if driver.error is None else "unknown"
    problem = None
    if names.error is not None:  # the CPUs whose states could not be listed are unknown
        problem = f"the cpuidle states of the CPUs are unknown: {names.error}"
    elif failed:  # a CPU whose state is left out would pass as one without that state
        path, error = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        problem = f"which cpuidle state {path} names is unknown: {error}{more}"
    return IdleStates(shown, cpus, {name: tuple((cpu, path) for cpu, _, path in sorted(paths))
                                    for name, paths in by_name.items()}, problem)


IDLE_STATES = Fact("cpuidle states", (Read(f"{CPU}/online"), Read(DRIVER),
                                      Glob(f"{CPU}/cpu*/cpuidle/state*/name")),
                   _parse_idle_states)
"""Where each named state's ``disable`` file is, per online CPU: one batch for any count."""


def find_idle_states(host: Host) -> IdleStates:
    return IDLE_STATES.read(host)


def counter_reads(paths: Sequence[tuple[int, str]]) -> tuple[Request, ...]:
    """The usage and time counters of one state on each CPU, from its ``disable`` paths."""
    return tuple(Read(f"{disable.rsplit('/', 1)[0]}/{name}") for _, disable in paths
                 for name in ("usage", "time"))


def read_counters(host: Host, paths: Sequence[tuple[int, str]]) -> dict[int, tuple[int, int]]:
    """cpu -> (usage, time in us) of one state, from the ``disable`` paths' directories."""
    bases = [(cpu, disable.rsplit("/", 1)[0]) for cpu, disable in paths]
    replies = host.batch(counter_reads(paths))  # one batch per sample, any number of CPUs
    counters = {}
    for number, (cpu, base) in enumerate(bases):
        try:
            usage, spent = (int(reply.text().strip())
                            for reply in replies[2 * number:2 * number + 2])
        except (HostError, ValueError) as exc:
            raise NotApplicable(f"{base} has no usage/time counters ({exc})") from None
        counters[cpu] = (usage, spent)
    return counters
