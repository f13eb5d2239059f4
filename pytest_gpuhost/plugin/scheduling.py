"""xdist's scheduler for a run with targets (``distributing.py`` makes it): each target's
checks go to one worker, as one unit, and a worker starts on its units as soon as its own
collection is in, whatever the other workers are still collecting.

xdist's own schedulers wait until every worker has collected and insist that all collected the
same tests. Under the target scheduler a worker collects only its own remote targets (and this
machine's checks and the user's tests, which every worker collects): its collection holds its
targets' checks and no other's, so it can be given them the moment it has them, while a target
that is slow to connect holds up only the worker collecting it. Where every worker collects
everything (the controller collected for them), this is xdist's ``--dist loadscope`` with each
target one scope.

A container's checks join its host's unit (``joined``): its P2P measurements read the GPUs its
host's PCIe fixes change, so they run after them on one worker in rank order, as a serial run
runs them (on two workers they raced them and measured the unfixed path).

A unit (a target's checks, or a test module's tests) goes to a worker whose collection holds
it, in that worker's collection order (so a test that waits for the host checks comes after
the checks the worker runs itself), once. A worker is given units while it has two tests or
fewer left, as ``--dist loadscope`` gives them, and is told to stop once nothing it could run
is left: never left holding two tests or fewer while a unit it holds waits (xdist's worker
keeps its last test back until more come or it is told to stop: the run would wait forever). A
worker that goes down gives its unfinished units back, less the test it crashed on (it would
crash the next worker too): another worker that collected them takes them, or the worker that
replaces it (which collects the targets the dead one had not finished).

No pytest here, and nothing of xdist but the shape of its nodes: ``tests/plugin/
test_scheduling.py`` drives it with nodes of its own, as xdist's tests drive its schedulers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

Node = Any
"""An xdist ``WorkerController``: ``send_runtest_some(indices)``, ``shutdown()``,
``shutting_down``."""


def target_scope(name: str) -> str:
    """The unit of a target's checks."""
    return f"gpuhost target {name}"


def target_of(nodeid: str) -> str | None:
    """The target an id names (``spec.yaml::sysctl[vm.swappiness]@pve`` -> ``pve``)."""
    name = nodeid.rsplit("::", 1)[-1]
    head, at, target = name.rpartition("@")
    if not at or not head or "]" in target or "[" in target:
        return None
    return target


def scope_of(nodeid: str, joined: Mapping[str, str] | None = None) -> str:
    """A check's unit is its target's (a container's: the host's whose unit it ``joined``);
    any other test's, its module or class (as ``--dist loadscope`` groups them)."""
    target = target_of(nodeid)
    if target is None:
        return nodeid.rsplit("::", 1)[0]
    return target_scope((joined or {}).get(target, target))


class TargetScheduling:
    """xdist's ``Scheduling`` protocol over per-worker collections.

    ``numnodes``: the workers the run starts; ``awaiting``: whether a worker the run started
    (or a replacement) has still to send its collection; ``counted``: told how many distinct
    tests all collections hold (xdist takes the last collection's length for the session's
    count, which here is one worker's share); ``joined``: a container's name -> its host's,
    whose unit its checks join."""

    def __init__(self, numnodes: int, awaiting: Callable[[], bool],
                 counted: Callable[[int], None] = lambda count: None,
                 log: Callable[..., None] = lambda *args: None, *,
                 joined: Mapping[str, str] | None = None) -> None:
        self.joined = dict(joined or {})
        self.numnodes = numnodes
        self.awaiting = awaiting
        self.counted = counted
        self.log = log
        self.assigned: dict[Node, dict[str, dict[str, bool]]] = {}
        """Node -> the units it was given: scope -> nodeid -> done."""
        self.collections: dict[Node, list[str]] = {}
        self.positions: dict[Node, dict[str, int]] = {}
        """Node -> nodeid -> its index in that node's collection (what xdist sends)."""
        self.orders: dict[Node, dict[str, None]] = {}
        """Node -> the units its collection holds, in its order."""
        self.units: dict[str, dict[str, bool]] = {}
        """Every unit seen: scope -> nodeid -> done."""
        self.waiting: dict[str, None] = {}
        """Units no live node holds, in the order they were first seen."""
        self.ids: set[str] = set()

    # -- the protocol's properties ----------------------------------------------------------

    @property
    def nodes(self) -> list[Node]:
        return list(self.assigned)

    @property
    def collection_is_completed(self) -> bool:
        """A node can be given work as soon as its own collection is in."""
        return bool(self.collections)

    @property
    def tests_finished(self) -> bool:
        if not self.collections or self.awaiting():
            return False
        if any(self._runnable(scope) for scope in self.waiting):
            return False
        return all(_pending(workload) < 2 for workload in self.assigned.values())

    @property
    def has_pending(self) -> bool:
        return bool(self.waiting) or any(_pending(w) for w in self.assigned.values())

    # -- nodes and their collections --------------------------------------------------------

    def add_node(self, node: Node) -> None:
        assert node not in self.assigned
        self.assigned[node] = {}

    def add_node_collection(self, node: Node, collection: Sequence[str]) -> None:
        assert node in self.assigned
        self.collections[node] = list(collection)
        positions: dict[str, int] = {}
        order: dict[str, None] = {}
        for index, nodeid in enumerate(collection):
            positions.setdefault(nodeid, index)
            scope = scope_of(nodeid, self.joined)
            order[scope] = None
            unit = self.units.get(scope)
            if unit is None:
                unit = self.units[scope] = {}
                self.waiting[scope] = None
            if scope in self.waiting:
                unit.setdefault(nodeid, False)
        self.positions[node] = positions
        self.orders[node] = order
        self.ids.update(collection)
        self.counted(len(self.ids))

    def remove_node(self, node: Node) -> str | None:
        """The node is gone (finished, or down): its unfinished units wait for another node
        that holds them; the first test it had not finished is what it crashed on, whose
        record is that crash (xdist reports it): it is not given out again, where it would
        kill each replacement worker in turn."""
        workload = self.assigned.pop(node)
        self.collections.pop(node, None)
        self.positions.pop(node, None)
        self.orders.pop(node, None)
        unit_of, crashed = next(((unit, nodeid) for unit in workload.values()
                                 for nodeid, done in unit.items() if not done), ({}, None))
        if crashed is not None:  # its record is the crash's: never given to another worker
            unit_of[crashed] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.waiting[scope] = None
        if crashed is not None:
            for other in self.nodes:
                self._reschedule(other)
        return crashed

    # -- running ----------------------------------------------------------------------------

    def schedule(self) -> None:
        for node in self.nodes:
            if node in self.collections:
                self._reschedule(node)

    def mark_test_complete(self, node: Node, item_index: int, duration: float = 0) -> None:
        nodeid = self.collections[node][item_index]
        self.assigned[node][scope_of(nodeid, self.joined)][nodeid] = True
        self._reschedule(node)

    def mark_test_pending(self, item: str) -> None:
        raise NotImplementedError

    def remove_pending_tests_from_node(self, node: Node, indices: Sequence[int]) -> None:
        raise NotImplementedError

    def finished_scopes(self) -> set[str]:
        """The units every test of which has run."""
        return {scope for scope, unit in self.units.items()
                if scope not in self.waiting and unit and all(unit.values())}

    def _runnable(self, scope: str) -> bool:
        """Whether a live node that has not been told to stop holds the unit."""
        return any(scope in order for node, order in self.orders.items()
                   if not node.shutting_down)

    def _reschedule(self, node: Node) -> None:
        """Give the node units while it has two tests or fewer left; tell it to stop once
        nothing it holds is left to give. Never leave it short while a unit it holds waits:
        an xdist worker keeps its last test back until more come or it is told to stop, so a
        worker left with one or two tests sends no completion, is never rescheduled, and the
        run waits forever (targets of one check each: an unreachable one's error record)."""
        if node.shutting_down or node not in self.collections:
            return
        if _pending(self.assigned[node]) > 2:
            return
        scope = next((s for s in self.orders[node] if s in self.waiting), None)
        if scope is None:
            node.shutdown()
            return
        del self.waiting[scope]
        unit = self.units[scope]
        positions = self.positions[node]
        for nodeid in [n for n in unit if n not in positions]:  # this node lacks them
            self.log(f"{nodeid}: not collected by {node}, not run")
            del unit[nodeid]
        self.assigned[node][scope] = unit
        indices = [positions[nodeid] for nodeid, done in unit.items() if not done]
        if indices:
            node.send_runtest_some(indices)
        self._reschedule(node)


def _pending(workload: dict[str, dict[str, bool]]) -> int:
    return sum(1 for unit in workload.values() for done in unit.values() if not done)
