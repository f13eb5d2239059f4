"""The target scheduler (``plugin/scheduling.py``) driven with nodes of its own, as xdist's
tests drive its schedulers: a worker is given its units as soon as its own collection is in,
each target's checks go to one worker as one unit, and a dead worker's unfinished units wait
for a worker that holds them."""

from __future__ import annotations

from pytest_gpuhost.plugin.scheduling import TargetScheduling, scope_of, target_of


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.sent: list[list[int]] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(list(indices))

    def shutdown(self) -> None:
        self.shutting_down = True

    def __repr__(self) -> str:
        return self.name


def checks(target: str, count: int = 3) -> list[str]:
    return [f"spec.yaml::sysctl[k{number}]@{target}" for number in range(count)]


def test_ids_name_their_target_and_other_tests_their_module() -> None:
    assert target_of("spec.yaml::sysctl[vm.swappiness]@pve") == "pve"
    assert target_of("spec.yaml::sysctl[a@b]") is None
    assert target_of("test_x.py::test_y") is None
    assert scope_of("spec.yaml::dmesg@n1") == "gpuhost target n1"
    assert scope_of("test_x.py::TestA::test_y") == "test_x.py::TestA"


def test_a_worker_starts_on_its_targets_while_another_is_still_collecting() -> None:
    waiting = {"slow"}
    counted: list[int] = []
    scheduler = TargetScheduling(2, lambda: bool(waiting), counted.append)
    fast, slow = Node("fast"), Node("slow")
    scheduler.add_node(fast)
    scheduler.add_node(slow)
    assert not scheduler.collection_is_completed
    scheduler.add_node_collection(fast, checks("a") + checks("b"))
    assert scheduler.collection_is_completed  # the slow worker's collection is not in
    scheduler.schedule()
    assert fast.sent == [[0, 1, 2]]  # target a, whole
    assert not scheduler.tests_finished
    for index in (0, 1):
        scheduler.mark_test_complete(fast, index)
    assert fast.sent == [[0, 1, 2], [3, 4, 5]]  # two or fewer left: target b
    for index in (2, 3, 4, 5):
        scheduler.mark_test_complete(fast, index)
    assert fast.shutting_down  # nothing it holds is left
    assert not scheduler.tests_finished  # the slow worker has not collected
    waiting.clear()
    scheduler.add_node_collection(slow, checks("c"))
    scheduler.schedule()
    assert slow.sent == [[0, 1, 2]]
    for index in range(3):
        scheduler.mark_test_complete(slow, index)
    assert slow.shutting_down and scheduler.tests_finished
    assert counted[-1] == 9  # every worker's collection together


def test_a_unit_collected_by_every_worker_runs_once() -> None:
    scheduler = TargetScheduling(2, lambda: False)
    one, two = Node("one"), Node("two")
    scheduler.add_node(one)
    scheduler.add_node(two)
    everything = checks("a") + checks("b") + ["test_user.py::test_after"]
    scheduler.add_node_collection(one, everything)
    scheduler.add_node_collection(two, everything)
    scheduler.schedule()
    given = {tuple(indices) for node in (one, two) for indices in node.sent}
    assert given == {(0, 1, 2), (3, 4, 5)}
    assert {len(node.sent) for node in (one, two)} == {1}


def test_a_dead_workers_unfinished_target_goes_to_the_worker_that_holds_it() -> None:
    """Less the check it crashed on: xdist reports that one's crash, its record, and given
    out again it killed each replacement worker in turn, until xdist replaced no more."""
    scheduler = TargetScheduling(2, lambda: False)
    dead, replacement = Node("dead"), Node("replacement")
    scheduler.add_node(dead)
    scheduler.add_node_collection(dead, checks("a") + checks("b"))
    scheduler.schedule()
    scheduler.mark_test_complete(dead, 0)
    assert dead.sent == [[0, 1, 2], [3, 4, 5]]
    for index in (1, 2):
        scheduler.mark_test_complete(dead, index)
    assert scheduler.finished_scopes() == {"gpuhost target a"}
    assert scheduler.remove_node(dead) == "spec.yaml::sysctl[k0]@b"  # what it crashed on
    assert scheduler.has_pending
    scheduler.add_node(replacement)
    scheduler.add_node_collection(replacement, checks("b"))
    scheduler.schedule()
    assert replacement.sent == [[1, 2]]  # not what it crashed on: that would kill it too
    for index in (1, 2):
        scheduler.mark_test_complete(replacement, index)
    assert scheduler.tests_finished and replacement.shutting_down


def test_a_containers_checks_join_its_hosts_unit_in_collection_order() -> None:
    """A container's checks (``@lxc-101``) are one unit with its host's (``@local``): its P2P
    measurements follow the host's PCIe fixes on one worker, in rank order, as a serial run
    runs them; the other worker gets none of them."""
    scheduler = TargetScheduling(2, lambda: False, joined={"lxc-101": "local"})
    one, other = Node("one"), Node("other")
    collection = ["spec.yaml::sysctl[vm.swappiness]@local",
                  "spec.yaml::sysctl[net.ipv4.tcp_rmem]@lxc-101",
                  "spec.yaml::pcie.max_read_request[0000:01:00.0]@local",
                  "spec.yaml::p2p[0000:01:00.0->0000:21:00.0]@lxc-101",
                  "spec.yaml::dmesg@local"]
    for node in (one, other):
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    assert one.sent == [[0, 1, 2, 3, 4]]
    assert other.sent == [] and other.shutting_down
    assert scope_of(collection[3], {"lxc-101": "local"}) == "gpuhost target local"
    for index in range(5):
        scheduler.mark_test_complete(one, index)
    assert scheduler.finished_scopes() == {"gpuhost target local"}


def test_a_worker_given_two_checks_or_fewer_is_given_more_at_once_or_told_to_stop() -> None:
    """An xdist worker keeps the last test it was given until more come or it is told to stop
    (it needs the next item for the teardown): a worker given one target of one check, its
    other target left waiting, sent no completion and was never given anything again, and
    the run waited forever (targets of one check each: a reachable spec of one, or an
    unreachable target's error record)."""
    scheduler = TargetScheduling(2, lambda: False)
    early, late = Node("early"), Node("late")
    scheduler.add_node(early)
    scheduler.add_node(late)
    scheduler.add_node_collection(early, checks("b", 1))
    scheduler.schedule()
    scheduler.add_node_collection(late, checks("a", 1) + checks("c", 1))
    scheduler.schedule()
    assert late.sent == [[0], [1]] and late.shutting_down  # both its targets, then told
    assert early.sent == [[0]] and early.shutting_down
    assert not scheduler.waiting


def test_a_containers_check_that_killed_its_worker_is_not_given_out_again() -> None:
    """A container's checks are in its host's unit: the one its worker died on is taken out
    of that unit (its record is the crash), and the replacement gets the rest of it."""
    scheduler = TargetScheduling(2, lambda: False, joined={"lxc-101": "local"})
    dead, replacement = Node("dead"), Node("replacement")
    collection = ["spec.yaml::sysctl[vm.swappiness]@local",
                  "spec.yaml::p2p[0000:01:00.0->0000:21:00.0]@lxc-101",
                  "spec.yaml::dmesg@local"]
    scheduler.add_node(dead)
    scheduler.add_node_collection(dead, collection)
    scheduler.schedule()
    scheduler.mark_test_complete(dead, 0)
    assert scheduler.remove_node(dead) == collection[1]
    scheduler.add_node(replacement)
    scheduler.add_node_collection(replacement, collection)
    scheduler.schedule()
    assert replacement.sent == [[2]]
    scheduler.mark_test_complete(replacement, 2)
    assert scheduler.tests_finished and replacement.shutting_down
