"""Fleets over real remote targets: one run over several ssh targets (fake roots behind a real
OpenSSH server on 127.0.0.1, keys under tmp_path) writes the fleet page, the JSON report that
``python -m pytest_gpuhost.fleet`` merges into the same rows, and a capture of the golden target
that then holds the others to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH
from ..fleet.test_view import FLEET_SPEC, tuned_node

pytestmark = NEEDS_OPENSSH



def page_data(html: Path) -> dict[str, Any]:
    blob = html.read_text().split('<script type="application/json" id="fleet-data">', 1)[1]
    data: dict[str, Any] = json.loads(blob.split("</script>", 1)[0].replace("<\\/", "</"))
    return data


def test_a_run_over_several_targets_is_a_fleet_with_drift_and_a_golden_capture(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots = {"node01": tuned_node(tmp_path, "node01"), "node02": tuned_node(tmp_path, "node02"),
             "node03": tuned_node(tmp_path, "node03", gen4=True)}
    (pytester.path / "fleet.yaml").write_text(FLEET_SPEC)
    targets = [f"--gpuhost-target={sshd.url(root, query=f'?name={name}')}"
               for name, root in roots.items()]
    common = [*targets, f"--gpuhost-ssh-config={sshd.client_config}", "-p", "no:cacheprovider"]
    run = pytester.runpytest("--gpuhost-spec=fleet.yaml", *common,
                             "--gpuhost-target=ssh://root@127.0.0.1:1/?name=node04",
                             "--gpuhost-connect-timeout=3", "--gpuhost-fleet-html=fleet.html",
                             "--gpuhost-report=run.json", "--gpuhost-capture=golden.yaml",
                             "--gpuhost-capture-from=node01")
    assert run.ret == pytest.ExitCode.TESTS_FAILED  # node04 cannot be reached

    report = json.loads((pytester.path / "run.json").read_text())
    lost = [c for c in report["checks"] if c["target"] == "node04"]
    # GPU sections too: nothing was read, so no '0 GPUs' failure, only the reason
    assert {c["kind"] for c in lost} >= {"gpu_count", "pcie.max_link_speed", "sysctl"}
    assert {c["outcome"] for c in lost} == {"error"}
    assert all("cannot reach ssh://root@127.0.0.1:1/" in c["message"] for c in lost)

    data = page_data(pytester.path / "fleet.html")
    strings = data["strings"]
    rows = {row[0]: row for row in data["targets"]}
    assert list(rows) == ["node01", "node02", "node03", "node04"]
    assert "Connection refused" in strings[rows["node04"][1]]  # no result, and why
    assert all(rows[name][1] == -1 for name in ("node01", "node02", "node03"))
    # node03's GPU at 0000:81:00.0 trained at Gen4: within the spec, but the minority
    drifts = {strings[data["checks"][check][1]]: groups for check, groups in data["drift"]}
    [majority, minority] = drifts["pcie.max_link_speed[0000:81:00.0]"]
    assert [data["targets"][i][0] for i in majority[1]] == ["node01", "node02"]
    assert [data["targets"][i][0] for i in minority[1]] == ["node03"]
    assert strings[minority[0]].startswith("16.0 GT/s") and minority[2] == 1  # passes the spec
    merged = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet", "run.json",
                             "--html", "merged.html"], cwd=pytester.path, capture_output=True,
                            text=True, timeout=120)
    assert merged.returncode == 1, merged.stderr  # a target is unhealthy
    assert "pcie.max_link_speed[0000:81:00.0]" in merged.stdout
    assert "node03" in merged.stdout.split("drift", 1)[1]
    again = page_data(pytester.path / "merged.html")
    assert [row[0] for row in again["targets"]] == list(rows)

    golden = (pytester.path / "golden.yaml").read_text()
    assert "what target node01 held then, for the keys of fleet.yaml." in golden
    assert "# host: node01\n" in golden  # what the target calls itself, not the controller
    assert "--gpuhost-capture-from=node01" in golden
    hold = pytester.runpytest("--gpuhost-spec=golden.yaml", *common, "--gpuhost-report=hold.json")
    report = json.loads((pytester.path / "hold.json").read_text())
    failing = sorted((c["target"], c["id"]) for c in report["checks"] if c["outcome"] != "passed")
    assert failing == [("node03", "pcie.max_link_speed[0000:81:00.0]")], failing
    assert hold.ret == pytest.ExitCode.TESTS_FAILED


def test_capture_from_an_unknown_target_is_a_usage_error_before_anything_runs(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    (pytester.path / "fleet.yaml").write_text(FLEET_SPEC)
    root = tuned_node(tmp_path, "node01")
    result = pytester.runpytest("--gpuhost-spec=fleet.yaml",
                                f"--gpuhost-target={sshd.url(root, query='?name=a')}",
                                "--gpuhost-target=local", f"--gpuhost-root={root}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-capture=golden.yaml", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "name the golden one with --gpuhost-capture-from=TARGET" in result.stderr.str()
    assert "a, local" in result.stderr.str()
    named = pytester.runpytest("--gpuhost-spec=fleet.yaml",
                               f"--gpuhost-target={sshd.url(root, query='?name=a')}",
                               f"--gpuhost-ssh-config={sshd.client_config}",
                               "--gpuhost-capture=golden.yaml", "--gpuhost-capture-from=b",
                               "-p", "no:cacheprovider")
    assert named.ret == pytest.ExitCode.USAGE_ERROR
    assert "--gpuhost-capture-from=b: no such target; the targets are: a" in named.stderr.str()
    assert not (pytester.path / "golden.yaml").exists()


def test_fix_persist_over_two_targets_writes_each_its_own_files(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """--fix-persist applies per target: each target's files under its own root, from its own
    records, each record naming its target (before, only the first target got files, made
    from every target's records)."""
    from pytest_gpuhost.testing.fakehost import FakeHost

    roots = {name: FakeHost(tmp_path / name).sysctl("vm.swappiness", 60).root
             for name in ("a", "b")}
    (pytester.path / "spec.yaml").write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(
        "--gpuhost-spec=spec.yaml", "--fix", "--fix-persist", "--gpuhost-report=r.json",
        *[f"--gpuhost-target={sshd.url(root, query=f'?name={name}')}"
          for name, root in roots.items()],
        f"--gpuhost-ssh-config={sshd.client_config}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    for root in roots.values():
        assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"
        [conf] = (root / "etc/sysctl.d").glob("*gpuhost*")
        assert conf.read_text().endswith("vm.swappiness = 10\n")
        assert list((root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl"))
    report = json.loads((pytester.path / "r.json").read_text())
    persisted = sorted((c["target"], c["outcome"]) for c in report["checks"]
                       if c["kind"] == "persist")
    assert persisted == [("a", "fixed"), ("b", "fixed")]


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_a_fleet_fix_where_another_run_holds_one_target_goes_on_with_the_others(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        xdist: tuple[str, ...]) -> None:
    """A run lock held on one target of a fleet is that target's error, as a lost connection
    is: the other targets are fixed, nothing is written on the held one, and each of its
    checks says who holds the lock and what to do (before, the whole run stopped, exit 2,
    every later target's checks not run)."""
    from pytest_gpuhost.fix.locking import RootLock
    from pytest_gpuhost.testing.fakehost import FakeHost

    roots = {name: FakeHost(tmp_path / name).sysctl("vm.swappiness", 60)
             .sysctl("vm.dirty_ratio", 40).root for name in ("a", "b", "c")}
    (pytester.path / "spec.yaml").write_text(
        "version: 1\nsysctl:\n  vm.swappiness: 10\n  vm.dirty_ratio: 10\n")
    held = RootLock(roots["b"] / "var/lib/pytest-gpuhost/run.lock", "run")
    held.acquire(1)
    try:
        result = pytester.runpytest(
            "--gpuhost-spec=spec.yaml", "--fix", "--gpuhost-report=r.json",
            "--gpuhost-lock-timeout=0.3",
            *[f"--gpuhost-target={sshd.url(root, query=f'?name={name}')}"
              for name, root in roots.items()],
            f"--gpuhost-ssh-config={sshd.client_config}", "-p", "no:cacheprovider", *xdist)
    finally:
        held.release()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    for name in ("a", "c"):
        assert (roots[name] / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (roots["b"] / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert (roots["b"] / "proc/sys/vm/dirty_ratio").read_text() == "40\n"
    report = json.loads((pytester.path / "r.json").read_text())
    outcomes = {(c["target"], c["id"]): c["outcome"] for c in report["checks"]}
    assert outcomes == {
        ("a", "sysctl[vm.dirty_ratio]"): "fixed", ("a", "sysctl[vm.swappiness]"): "fixed",
        ("b", "sysctl[vm.dirty_ratio]"): "error", ("b", "sysctl[vm.swappiness]"): "error",
        ("c", "sysctl[vm.dirty_ratio]"): "fixed", ("c", "sysctl[vm.swappiness]"): "fixed"}
    for check in (c for c in report["checks"] if c["target"] == "b"):
        assert "another pytest-gpuhost run holds the run lock" in check["message"]
        assert "(waited 0.3 s)" in check["message"]
        assert "the other targets went on" in check["message"], check["message"]

