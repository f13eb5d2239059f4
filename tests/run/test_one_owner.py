"""A setting has one owner in a run: two checks of one setting on one machine that expect
different values are an error before anything changes (exit 4), whichever specs they came from
(two --gpuhost-spec, a host's spec and its container's ?spec=); the same expectation twice
changes the machine once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

RUN = ("-p", "no:cacheprovider")
TEN = "version: 1\nsysctl:\n  vm.dirty_ratio: 5\n  vm.swappiness: 10\n"
SIXTY = "version: 1\nsysctl:\n  vm.swappiness: 60\n"


def tree(root: Path) -> dict[str, bytes]:
    """Every file's bytes but a lock's (an xdist controller takes the run lock as it starts)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.suffix != ".lock"}


@pytest.mark.parametrize("fix", [("--fix",), ("--fix", "--gpuhost-dry-run"),
                                 ("--fix", "-n", "2")])
def test_two_specs_that_set_one_sysctl_two_ways_are_refused_before_any_change(
        pytester: pytest.Pytester, fake: FakeHost, fix: tuple[str, ...]) -> None:
    fake.sysctls({"vm.swappiness": 30, "vm.dirty_ratio": 20})
    pytester.makefile(".yaml", ten=TEN, sixty=SIXTY)
    before = tree(fake.root)
    result = pytester.runpytest("ten.yaml", "sixty.yaml", f"--gpuhost-root={fake.root}", *fix,
                                *RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"*sysctl[[]vm.swappiness] on local ({fake.root}) has two owners: ten.yaml:4 expects "
        "10, sixty.yaml:3 expects 60*"])
    assert tree(fake.root) == before  # no change, no journal


def test_a_containers_spec_that_sets_its_hosts_sysctl_another_way_is_refused(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The container's ``vm.swappiness`` is its host's kernel's: placed there, where the host's
    own spec sets it too. --fix-persist would write both into the host's sysctl.d."""
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 30, "vm.dirty_ratio": 20})
    lxc_container(host, "101")
    pytester.makefile(".yaml", ten=TEN, sixty=SIXTY)
    before = tree(host.root)
    result = pytester.runpytest("--gpuhost-spec=ten.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=local",
                                "--gpuhost-target=lxc://101?spec=sixty.yaml", "--fix",
                                "--fix-persist", *RUN)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"*sysctl[[]vm.swappiness] on local ({host.root}) has two owners: ten.yaml:4 expects "
        "10, sixty.yaml:3 expects 60*"])
    assert tree(host.root) == before


def test_the_same_expectation_in_two_specs_changes_the_machine_once(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctls({"vm.swappiness": 30, "vm.dirty_ratio": 20})
    pytester.makefile(".yaml", ten=TEN, again="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest("ten.yaml", "again.yaml", f"--gpuhost-root={fake.root}",
                                "--fix", "--gpuhost-report=r.json", *RUN)
    assert result.ret == pytest.ExitCode.OK
    checks = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert sorted((c["location"].split(":")[0], c["id"], c["outcome"]) for c in checks) == [
        ("again.yaml", "sysctl[vm.swappiness]", "passed"),
        ("ten.yaml", "sysctl[vm.dirty_ratio]", "fixed"),
        ("ten.yaml", "sysctl[vm.swappiness]", "fixed")]
    [journal] = (fake.root / "var/lib/pytest-gpuhost/journal").iterdir()
    changes = [json.loads(line) for line in journal.read_text().splitlines()[1:]]
    assert sum("swappiness" in json.dumps(c) for c in changes) == 1


def test_a_run_that_changes_nothing_still_reports_both_owners(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """Without --fix nothing changes: each spec's check says how the machine stands to it."""
    fake.sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5})
    pytester.makefile(".yaml", ten=TEN, sixty=SIXTY)
    result = pytester.runpytest("ten.yaml", "sixty.yaml", f"--gpuhost-root={fake.root}", *RUN)
    result.assert_outcomes(passed=2, failed=1)
