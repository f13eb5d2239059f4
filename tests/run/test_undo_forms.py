"""Every run that changed anything says where each journal is, as a path of the machine that
holds it (a container's by its host's path too), and one undo in the form the run was given:
``--gpuhost-target=lxc://101`` with its ``--gpuhost-root``, under ``-n 2`` too, an absolute root
kept absolute; each undo then runs as printed and restores what the run changed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container, rootfs_of

RUN = ("-p", "no:cacheprovider")
JOURNALS = "var/lib/pytest-gpuhost/journal"
HOST_SIDE = "version: 1\nsysctl:\n  vm.swappiness: 10\n"
EARLIER = "20000101T000000Z"
"""A journal name's time stamp before any run of the tests."""
CONTAINER_SIDE = "version: 1\nsysctl:\n  net.ipv4.tcp_rmem: \"4096 87380 268435456\"\n"


def pair(root: Path) -> tuple[FakeHost, FakeHost]:
    host = FakeHost(root).sysctls({"vm.swappiness": 60,
                                   "net.ipv4.tcp_rmem": "4096 131072 6291456"})
    return host, lxc_container(host, "101")


def undo(result: pytest.RunResult) -> list[str]:
    """The options of the run's one ``undo:`` line, without its closing words."""
    [line] = [line for line in result.stdout.lines if line.startswith("undo: ")]
    return shlex.split(re.sub(r" \([^()]*\)$", "", line.removeprefix("undo: ")))


@pytest.mark.parametrize("spread", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_containers_run_that_changed_its_host_alone_names_the_hosts_journal(
        pytester: pytest.Pytester, spread: tuple[str, ...]) -> None:
    """The seed's command: ``lxc://101`` of a host tree, every change on the host. The root
    lies under the directory pytest runs in and is given absolute: it stays absolute."""
    if spread:
        pytest.importorskip("xdist")
    host, container = pair(pytester.path / "pve")
    spec = pytester.makefile(".yaml", spec=HOST_SIDE)
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                               "--gpuhost-target=lxc://101", "--fix", *spread, *RUN)
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    [journal] = (host.root / JOURNALS).glob("*.jsonl")
    assert not (container.root / JOURNALS).exists()
    fixed.stdout.fnmatch_lines([f"journal of local: {journal}",
                                f"undo: --gpuhost-rollback --gpuhost-root={host.root} "
                                "--gpuhost-target=lxc://101 (*)"])
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "10"
    back = pytester.runpytest(*undo(fixed), *RUN)  # a rollback runs serially
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    back.stdout.fnmatch_lines([f"rollback: {journal} is closed"])


def test_a_containers_journal_is_shown_by_its_hosts_path_too(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Only the container changed: its journal by its own path and by its host's (a file
    that opens there), and an undo that names it and leaves the host alone."""
    host, container = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=CONTAINER_SIDE)
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                               "--gpuhost-target=lxc://101", "--fix", *RUN)
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    [journal] = (container.root / JOURNALS).glob("*.jsonl")
    on_host = host.root / rootfs_of("101") / JOURNALS / journal.name
    assert on_host.is_file()
    fixed.stdout.fnmatch_lines([
        f"journal of lxc-101: /{JOURNALS}/{journal.name} (on local: {on_host})",
        f"undo: --gpuhost-rollback={journal.name} --gpuhost-root={host.root} "
        "--gpuhost-target=lxc://101 (its host had nothing to change)"])
    assert "pytest-gpuhost-rollback-" not in fixed.stdout.str()
    back = pytester.runpytest(*undo(fixed), *RUN)
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"
    assert "pytest-gpuhost-rollback-" not in back.stdout.str()  # never a temporary copy
    again = pytester.runpytest("--gpuhost-rollback", f"--gpuhost-root={host.root}",
                               "--gpuhost-target=lxc://101", *RUN)
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines([f"ERROR: no journal to roll back under /{JOURNALS} of lxc-101 "
                                "(every one there is rolled back already)*"])
    assert "lxc://101/var" not in again.stderr.str()  # a path there, never the URL glued on


def test_the_undo_of_a_later_run_that_changed_the_host_alone_is_that_runs(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The container changed in a first run, its host alone in a second: the second run's
    undo restores the host's change (the pair's newest run) and leaves the container's."""
    host, container = pair(tmp_path / "pve")
    root = f"--gpuhost-root={host.root}"
    first = pytester.makefile(".yaml", first=CONTAINER_SIDE)
    second = pytester.makefile(".yaml", second=HOST_SIDE)
    for spec in (first, second):
        fixed = pytester.runpytest(f"--gpuhost-spec={spec}", root,
                                   "--gpuhost-target=lxc://101", "--fix", *RUN)
        assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
        for journal in (container.root / JOURNALS).glob("*.jsonl"):  # a run a day before
            journal.rename(journal.with_name(EARLIER + journal.name[16:]))
    back = pytester.runpytest(*undo(fixed), *RUN)
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "87380"


def test_a_local_trees_absolute_root_stays_absolute(pytester: pytest.Pytester) -> None:
    fake = FakeHost(pytester.path / "tree").sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec=HOST_SIDE)
    fixed = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                               "--fix", *RUN)
    fixed.stdout.fnmatch_lines([f"journal: * (undo: --gpuhost-rollback=* "
                                f"--gpuhost-root={fake.root})"])


def test_a_pair_whose_host_journal_was_named_later_is_still_one_run(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """Both sides changed in one run, the container's journal named long before its host's (a
    slow ssh host, a long run): the undo restores both, as the run's id pairs them."""
    host, container = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=HOST_SIDE + "  net.ipv4.tcp_rmem: \"4096 87380 "
                             "268435456\"\n")
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                               "--gpuhost-target=lxc://101", "--fix", *RUN)
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    [journal] = (container.root / JOURNALS).glob("*.jsonl")
    journal.rename(journal.with_name(EARLIER + journal.name[16:]))
    back = pytester.runpytest(*undo(fixed), *RUN)
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"


def test_a_second_rollback_exits_4_as_the_documented_statuses_say(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    from ..conftest import REPO

    fake.sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec=HOST_SIDE)
    root = f"--gpuhost-root={fake.root}"
    pytester.runpytest("--gpuhost-spec=spec.yaml", root, "--fix", *RUN)
    assert pytester.runpytest("--gpuhost-rollback", root, *RUN).ret == pytest.ExitCode.OK
    again = pytester.runpytest("--gpuhost-rollback", root, *RUN)
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["ERROR: no journal to roll back under */var/lib/pytest-gpuhost/"
                                "journal (every one there is rolled back already)*"])
    none = pytester.runpytest("--gpuhost-rollback=nope.jsonl", root, *RUN)
    assert none.ret == pytest.ExitCode.USAGE_ERROR
    none.stderr.fnmatch_lines(["ERROR: --gpuhost-rollback=nope.jsonl: no such journal *"])
    reference = (REPO / "docs" / "reference.md").read_text()
    statuses = " ".join(reference.split("Exit status: ", 1)[1].split("\n\n", 1)[0].split())
    assert "`4` for" in statuses
    assert "`no journal to roll back under ROOT/var/lib/pytest-gpuhost/journal (every one " \
           "there is rolled back already)`, which a second `--gpuhost-rollback` says" in statuses
    assert "`--gpuhost-rollback=FILE: no such journal`" in statuses


def test_a_rollback_leaves_the_inis_spec_out_and_refuses_one_on_the_command_line(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The benchmark example's directory: its ini names the spec for every run there."""
    fake.sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec=HOST_SIDE)
    pytester.makeini("[pytest]\ngpuhost_spec = spec.yaml\n")
    root = f"--gpuhost-root={fake.root}"
    assert pytester.runpytest(root, "--fix", *RUN).ret == pytest.ExitCode.OK
    back = pytester.runpytest("--gpuhost-rollback", root, *RUN)
    assert back.ret == pytest.ExitCode.OK, back.stdout.str() + back.stderr.str()
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"
    back.stdout.fnmatch_lines(["gpuhost_spec in *.ini left out: --gpuhost-rollback restores a "
                               "journal, not a spec"])
    refused = pytester.runpytest("--gpuhost-rollback", "--gpuhost-spec=spec.yaml", root, *RUN)
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --gpuhost-rollback restores a journal (the originals "
                                  "it recorded), not a spec: drop --gpuhost-spec=spec.yaml from "
                                  "the command line *"])
