"""One machine of a run, as the session drives it: its host behind the phase cache, its facts,
its fixer and journal, reads batched by phase, and what it says of itself for the reports.

A target that cannot be reached stays a target: its host is then an ``UnreachableHost`` whose
every read fails with the reason, so its checks are errors that say why and the others run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from ..checks import Check, Fact, Facts, reads_of
from ..checks.conditions import ConditionFn
from ..checks.gpus import GPUS
from ..config.settings import Settings
from ..config.targets import TargetAddress
from ..engine import RunOptions, error_result, run_check
from ..fix.run import FixRun
from ..gpu.nvml import NvmlFactory, NvmlSource, NvmlUnavailable
from ..host import (
    CachedHost,
    Closable,
    Connection,
    Host,
    HostError,
    Releasable,
    Reply,
    Request,
    doing,
    reply_from_wire,
    reply_to_wire,
    request_from_wire,
)
from ..host.agent.wire import decode, encode
from ..reports import TargetInfo
from ..result import CheckResult
from .containers import CONTAINER, guarded, in_kernel, kernel_target, on_host, written_for
from .hostfacts import HOST_FACTS as HOST_FACTS  # re-exported (session)
from .hostfacts import HostFacts as HostFacts  # re-exported (session)

if TYPE_CHECKING:
    from ..checks.p2p_path import PathFacts

LOCAL = "local"


class _RememberedConditions(Mapping[str, ConditionFn]):
    """Each ``when:`` condition asked once per target: the answer does not change mid-run."""

    def __init__(self, conditions: Mapping[str, ConditionFn]) -> None:
        self._conditions = conditions
        self._answers: dict[str, tuple[bool, str]] = {}

    def __getitem__(self, name: str) -> ConditionFn:
        condition = self._conditions[name]

        def remembered(host: Host) -> tuple[bool, str]:
            if name not in self._answers:
                self._answers[name] = condition(host)
            return self._answers[name]

        return remembered

    def __iter__(self) -> Any:
        return iter(self._conditions)

    def __len__(self) -> int:
        return len(self._conditions)

    def requests(self, name: str) -> Sequence[Request]:
        if name in self._answers:
            return ()
        return tuple(getattr(self._conditions.get(name), "requests", ()))

    def known(self, name: str, answer: tuple[bool, str]) -> None:
        """The condition's answer, known without reading the host (a container by
        construction is a container, whatever its cgroup says)."""
        self._answers[name] = answer


class Target:
    """One machine of the run: its host (with the phase cache), facts, fixer and journal."""

    def __init__(self, name: str, host: Host, settings: Settings,
                 conditions: Mapping[str, ConditionFn], nvml_for: Callable[[Host], NvmlFactory],
                 shared_dir: Path | None, *, url: str = LOCAL,
                 address: TargetAddress | None = None) -> None:
        self.name = name
        self.url = url
        self.address = address or TargetAddress(url, LOCAL if url == LOCAL else "", name=name)
        self.kernel_on: Target | None = None
        """The target whose kernel this one runs on (a container's host; this machine's under
        --gpuhost-host), where its ``kernel`` checks run (``containers.placed``)."""
        self.asked_of: dict[int, dict[str, Target]] = {}
        """Each check placed here with a ``when:`` (by id), and the targets its entry was
        written for, whose answer it runs by (``containers.written_for``)."""
        self.spec_names: list[str] = []
        """The specs whose checks run here (its own, its containers'), for the reports."""
        self.dormant = self.address.implied is not None
        """A target the run added as another's host, before any check was placed on it: it
        reads nothing, opens no journal and is in no report."""
        self.unreachable: str | None = None
        """Why the target could not be reached (its checks are errors saying so)."""
        self.connection = host
        self.remote = host if isinstance(host, Connection) else None
        """The connection's own members (``host.Connection``), where the host has one."""
        self.host = CachedHost(host)
        self.conditions = _RememberedConditions(conditions)
        self.nvml = NvmlSource(nvml_for(self.host))  # through the cache: recorded facts too
        self.facts = Facts(self.host, nvml=self.nvml, shared_dir=shared_dir)
        self.fixrun = FixRun(None, None, persist=settings.persist)
        self._pending: dict[int, Check] = {}
        self._batched: set[int] = set()
        """The checks whose reads the last batch fetched (ids), while nothing has changed."""
        self._generation = -1
        self._phase_start = True
        """The next batch is a phase's first: every pending check of the phase."""
        self.round_trips = self.remote is not None
        """Whether a read costs a round trip (a remote target's agent counts them): then every
        re-read after a fix is batched too, for the pending checks of the phase."""
        self._fresh = False
        self._host_facts: HostFacts | None = None
        self._topology: PathFacts | str | None = None
        """``topology``'s paths as read (``PathFacts``), or why they could not be."""
        self._finished = False
        """``finish``: this process is done with the target (its fixer is closed)."""
        self._container: tuple[bool, str] | None = None
        self.root: str | None = None
        """The real path of its root, as its host says once reached (``Host.identity``): kept
        at collection, so that telling machines apart (``machines.py``) connects to none."""
        if self.address.kernel_on is not None:  # by construction, or --gpuhost-host's word
            self.conditions.known("container", (True, f"{self.url} is a container of "
                                                      f"{self.address.kernel_on}" + (
                "" if self.address.container else " (--gpuhost-host)")))

    # -- reads by phase ---------------------------------------------------------------------

    def select(self, checks: Iterable[Check]) -> None:
        """The checks this process will run, whose observations are read together."""
        self._pending = {id(check): check for check in checks}

    def _reads(self, check: Check) -> list[Request]:
        reads = list(reads_of(check.probe))
        if check.options.when is not None:
            reads += self.conditions.requests(check.options.when.name)
        return reads

    def prefetch(self, check: Check) -> None:
        """Before ``check`` runs: read what it and every other pending check of its phase will
        read, in one batch, unless that is still cached. The phases: every check that reads
        the host as it stands, then the fresh ones (dmesg, AER), which start from live reads
        so they see what the checks before them caused. A change made through the host (a
        fix, a command) makes the next read live anyway: on a remote target in one batch for
        the phase's pending checks again (one round trip), on this machine only what the
        check reads (re-reading every pending check's files after each fix read the example
        host's files 17,000 times in a --fix of 198 checks)."""
        if check.fresh and not self._fresh:
            self._fresh = True
            self._phase_start = True
            self.host.invalidate()
        if id(check) in self._batched and self.host.generation == self._generation:
            return  # read by this phase's batch, and nothing changed since
        reads = self._reads(check)
        if all(self.host.cached(r) for r in reads):
            return
        if not (self._phase_start or self.round_trips):
            self.host.prefetch(reads)
            return
        group = [c for c in self._pending.values() if c.fresh == check.fresh]
        self.host.prefetch(r for c in [check, *group] for r in self._reads(c))
        self._batched = {id(c) for c in group}
        self._generation = self.host.generation
        self._phase_start = False

    def fresh_turn(self) -> bool:
        """Whether every check this process has yet to run here is a fresh one (dmesg, AER):
        those that read the host as it stands have all run, and the fresh phase has not begun."""
        return (not self._fresh and self.unreachable is None and bool(self._pending)
                and not self.reads_as_it_stands())

    def reads_as_it_stands(self) -> bool:
        """Whether a check this process has yet to run here reads the host as it stands (is
        not a fresh one)."""
        return any(not check.fresh for check in self._pending.values())

    def start_fresh(self) -> None:
        """Begin the fresh phase now, as its first check would: ``prefetch`` of one of the
        pending checks (all fresh: ``fresh_turn``) reads every one's in one batch."""
        self.prefetch(next(iter(self._pending.values())))

    def run(self, check: Check, options: RunOptions, *, named: bool = False) -> CheckResult:
        lost = self.remote.lost if self.remote is not None else None
        if lost is not None and self.unreachable is None:
            self._unreachable(lost)  # lost mid-run: what was read before it is not used
        self._pending.pop(id(check), None)
        if self.unreachable is not None:
            # nothing of it was read: a check whose expansion saw no GPUs must not say '0 GPUs'
            result = error_result(check, self.unreachable)
        else:
            with doing("reading the observations"), contextlib.suppress(HostError):
                self.prefetch(check)  # when it fails, the check's own read says why
            seen = self.container() if in_kernel(check) else None
            if seen is not None:  # a container whose host the run does not know: read only
                options = msgspec.structs.replace(options, fix=False, dry_run=False)
            conditions = written_for(check, self, list(self.asked_of.get(id(check), {}).values()))
            with doing(f"checking {check.id}"):
                result = run_check(check, self.host, conditions or self.conditions, options,
                                   self.fixrun.fixer, self.fixrun.history)
            if seen is not None:
                result = guarded(check, result, seen, local=self.url == LOCAL)
        return msgspec.structs.replace(result, target=self.name) if named else result

    def container(self) -> str | None:
        """Why this target is a container whose host the run does not know (its ``kernel``
        checks are then read only, ``containers.guarded``), or None: it is a machine, or
        the run knows its host (``kernel_on``), or it could not be told."""
        if self.kernel_on is not None:
            return None
        if self._container is None:
            try:
                self._container = self.facts.get(CONTAINER)
            except HostError:
                self._container = (False, "")
        holds, reason = self._container
        return reason if holds else None

    def lose(self, reason: HostError) -> None:
        """The target cannot be reached: every read from now on fails with ``reason``."""
        self._unreachable(reason)
        self.fixrun.fixer = None

    def _unreachable(self, reason: HostError) -> None:
        from .unreachable import UnreachableHost  # a lost target's

        self.unreachable = str(reason)
        self.host.host = UnreachableHost(self.url, reason)
        self.host.invalidate()

    def export(self) -> dict[str, object]:
        """What collection read of the target (JSON-ready), for another process to ``seed``."""
        replies = [] if self.unreachable else [
            [request.wire(), reply_to_wire(request, reply)] for request, reply in
            self.host.replies().items()]
        return {"lost": self.unreachable,
                "spent": self.remote.spent if self.remote is not None else 0.0,
                "replies": encode(replies), "root": self.root}

    def seed(self, collected: Mapping[str, object]) -> None:
        """Start from what another process of the run read (``export``): the same facts, the
        same lost target, and the time it already spent on the target."""
        if collected.get("lost"):
            self.lose(HostError(str(collected["lost"])))
            return
        wired = decode(collected.get("replies") or [])
        assert isinstance(wired, list)
        replies: dict[Request, Reply] = {}
        for wire, answer in wired:
            request = request_from_wire(wire)
            replies[request] = reply_from_wire(request, answer)
        self.host.seed(replies)
        root = collected.get("root")
        self.root = root if isinstance(root, str) else None
        spent = collected.get("spent")
        if isinstance(spent, (int, float)) and self.remote is not None:
            self.remote.spent += spent

    def collect_facts(self, facts: Sequence[Fact[Any]], shared_dir: Path | None) -> None:
        """Read the facts a spec's expansion needs in one batch; a target that cannot be
        reached is lost (its checks are errors that say why)."""
        kernel = kernel_target(self)
        with doing("collecting facts"):
            try:
                self.facts.kernel = kernel.connection if kernel is not self else None
                self.facts.prime(facts)
            except HostError as exc:
                self.lose(exc)
                self.facts = Facts(self.host, nvml=self.nvml, shared_dir=shared_dir)
                self.facts.prime(facts)
            self.host_facts()  # from the batch just read: what reports say of the target
            if self.root is None and self.unreachable is None:
                with contextlib.suppress(HostError):  # reached: its agent's hello says it
                    self.root = self.host.identity().root

    def info(self) -> TargetInfo:
        """The target as it reported itself, and its connection's cost so far. Never makes a
        connection for it: a remote target not reached yet is only its name and URL."""
        traffic = self.remote.traffic if self.remote is not None else None
        cost: dict[str, Any] = traffic.as_dict() if traffic is not None else {}
        known = self.facts.known(HOST_FACTS) or (not self.dormant and (
            self.connection.local_machine() or traffic is None))
        facts = self.host_facts() if known and self.unreachable is None else \
            HostFacts(None, None, None, (), ())
        journal = self.fixrun.journal_path
        lost = self.remote.lost if self.remote is not None else None  # at its last check too
        unreachable = self.unreachable or (str(lost) if lost is not None else None)
        used = journal is not None and self.fixrun.journal_used()
        return TargetInfo(self.name, self.url, facts.hostname, facts.kernel, facts.driver,
                          facts.gpus, facts.gpu_models, unreachable,
                          journal.shown if journal and used else None,
                          on_host(self, journal.path) if journal and used else None,
                          self.fixrun.journal_changes() if used else None, **cost,
                          specs=tuple(self.spec_names),
                          kernel_on=self.kernel_on.name if self.kernel_on else None)

    def disconnect(self) -> None:
        """End a remote target's connection for now (the next read connects again), without
        waiting for its process to exit: ``close`` reaps it."""
        if isinstance(self.connection, Closable) and not self.connection.local_machine():
            if isinstance(self.connection, Releasable):
                self.connection.let_go()
            else:
                self.connection.close()

    def finish(self) -> None:
        """This process ran its last check of the target (an xdist worker, its own target):
        its fixer closed (the journal's last lines synced, its locks released) and its
        connection ended, so a run of many targets holds no idle agent session. Its records,
        facts and cost stay for the reports."""
        if self.fixrun.fixer is not None and not self._finished:
            with contextlib.suppress(HostError):  # a lost agent released its locks with it
                self.fixrun.fixer.close()
        self._finished = True
        self.disconnect()

    def close(self, *, wait: bool = True) -> None:
        """The run is done with the target (``wait``: for its connection's process too; else
        ``reap`` does, once every target was let go)."""
        if self.fixrun.fixer is not None and not self._finished:
            self.fixrun.fixer.close()
        self._finished = True
        if not wait:
            self.disconnect()
            return
        self.reap()

    def reap(self) -> None:
        """Close the connection and wait for what it had let go."""
        if isinstance(self.connection, Closable):
            self.connection.close()
        self.host.clear()
        self._pending.clear()
        self._batched.clear()

    def topology(self, between_sockets: float | None = None) -> dict[str, Any]:
        """--gpuhost-topology: the GPUs' PCIe topology as the target holds it at the end, read
        once (one batch; none where the p2p checks' reads are still cached); a pair across
        sockets is limited by ``between_sockets`` GB/s, the figure its p2p checks were given
        (None: the default)."""
        if self._topology is None:
            from ..checks.p2p_path import read_path_facts

            try:
                gpus = self.facts.get(GPUS)
                self._topology = read_path_facts(self.host, gpus)
            except HostError as exc:
                self._topology = str(exc)
        if isinstance(self._topology, str):
            return {"problem": self._topology}
        return self._topology.topology(between_sockets)

    def host_facts(self) -> HostFacts:
        """What the target says about itself, read with the collection's facts and kept: the
        reports use it at the end without reading the host again."""
        if self._host_facts is None:
            self._host_facts = self._read_host_facts()
        return self._host_facts

    def _read_host_facts(self) -> HostFacts:
        try:
            hostname, kernel, driver = self.facts.get(HOST_FACTS)
        except HostError:
            return HostFacts(None, None, None, (), ())
        try:
            gpus = self.facts.get(GPUS)
        except HostError:  # the GPU checks say why; the report lists no GPU
            gpus = ()
        if driver is None:
            try:
                driver = self.nvml.get().driver_version()
            except (NvmlUnavailable, Exception):  # a report never fails for want of a driver
                driver = None
        models = sorted({f"NVIDIA 10de:{gpu.device_id.removeprefix('0x')}" for gpu in gpus})
        return HostFacts(hostname, kernel, driver, tuple(g.address for g in gpus),
                         tuple(models))


