"""The same machines are the same state whatever they were called: a state names each target's
machine (a keyed hash of its machine-id and root, ``session/machines.py``), and two states pair
their targets by it before their names."""

from __future__ import annotations

from pytest_gpuhost.state import (
    Entry,
    build,
    changes,
    diff_lines,
    invalid_reason,
    same,
    spec_digest,
)

SPEC = [spec_digest("pair", b"version: 1\nname: pair\n")]
HOST, CONTAINER = "a" * 32, "b" * 32


def entries(host: str, container: str, *, swappiness: str = "10") -> list[Entry]:
    return [Entry("sysctl[vm.swappiness]", host, swappiness, "passed"),
            Entry("sysctl[net.ipv4.tcp_rmem]", container, "4096 87380 268435456", "passed"),
            Entry("sysctl[net.ipv4.tcp_rmem]", host, "4096 87380 268435456", "passed")]


def test_a_container_pair_under_two_sets_of_names_is_the_same_state() -> None:
    """``lxc://101`` on the host's root, and ``ssh://HOST/ROOT?lxc=101`` from elsewhere."""
    here = build(entries("local", "lxc-101"), SPEC,
                 machines={"local": HOST, "lxc-101": CONTAINER})
    there = build(entries("pve", "pve-lxc-101"), SPEC,
                  machines={"pve": HOST, "pve-lxc-101": CONTAINER})
    assert invalid_reason(here) is None and invalid_reason(there) is None
    assert here["targets"]["local"]["machine"] == HOST
    assert same(here, there) and same(there, here)
    assert changes(here, there) == []
    assert diff_lines(here, there, old_label="OLD", new_label="NEW")[0].startswith(
        "same host state")


def test_a_change_on_a_machine_under_another_name_is_named_by_both_names() -> None:
    here = build(entries("local", "lxc-101"), SPEC,
                 machines={"local": HOST, "lxc-101": CONTAINER})
    there = build(entries("pve", "pve-lxc-101", swappiness="60"), SPEC,
                  machines={"pve": HOST, "pve-lxc-101": CONTAINER})
    assert not same(here, there)
    lines = diff_lines(here, there, old_label="OLD", new_label="NEW")
    assert lines[0].endswith("1 check changed")
    assert lines[1] == "  sysctl[vm.swappiness]@local/pve: 10 -> 60"


def test_machines_pair_targets_before_their_names_and_names_pair_the_rest() -> None:
    here = build(entries("pve", "ct"), SPEC, machines={"pve": HOST, "ct": CONTAINER})
    renamed = build(entries("ct", "pve"), SPEC, machines={"ct": HOST, "pve": CONTAINER})
    assert same(here, renamed)  # each machine holds what it held, under the other's name
    swapped = build(entries("ct", "pve"), SPEC, machines={"pve": HOST, "ct": CONTAINER})
    assert not same(here, swapped)  # each machine now holds what the other held
    assert "  sysctl[vm.swappiness]@pve: only in OLD (10)" in diff_lines(
        here, swapped, old_label="OLD", new_label="NEW")
    elsewhere = build(entries("pve", "ct"), SPEC, machines={"pve": "c" * 32, "ct": "d" * 32})
    assert same(here, elsewhere)  # other machines in the same state, as one target's is


def test_states_without_machines_still_pair_their_targets_by_name() -> None:
    here = build(entries("local", "lxc-101"), SPEC)
    there = build(entries("pve", "pve-lxc-101"), SPEC)
    assert "machine" not in here["targets"]["local"]
    assert not same(here, there)
    assert len(changes(here, there)) == 6
