"""Under -n 2, over a real OpenSSH server on 127.0.0.1: a fleet's run never stalls. Every
collected check is handed out to a worker (or becomes an error record), whatever order the
workers' collections come in."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..blocking import LIMIT_S
from ..conftest import NEEDS_OPENSSH

pytestmark = NEEDS_OPENSSH

COLLECTED_LAST = textwrap.dedent("""\
    import os, time
    from pathlib import Path

    FLAG = Path(__file__).with_name("one-target-collected")
    REMOTE = {{"a", "b", "c"}}


    def remote(ids):
        return {{i.rsplit("@", 1)[-1] for i in ids}} & REMOTE


    def pytest_xdist_node_collection_finished(node, ids):
        # the controller: the collection of the worker with one target is in
        if len(remote(ids)) == 1:
            FLAG.touch()


    def pytest_collection_modifyitems(items):
        # the worker given two targets sends its collection after the other's is in
        if "PYTEST_XDIST_WORKER" in os.environ and len(remote(i.nodeid for i in items)) == 2:
            deadline = time.monotonic() + {limit!r}
            while not FLAG.exists():
                if time.monotonic() > deadline:
                    raise AssertionError("the other worker's collection never came in")
                time.sleep(0.01)
    """)


@pytest.mark.parametrize("local", [False, True], ids=["remote", "local-and-remote"])
def test_a_fleet_whose_targets_have_one_check_each_runs_every_check(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, local: bool) -> None:
    """Three targets of one check each from a targets file (and this machine's), at -n 2: the
    worker given two of them collects last. It was given one target, kept its one check back
    for more (as every xdist worker keeps its last test), and was given nothing more: the run
    printed the other worker's result and waited until killed."""
    roots = {name: FakeHost(tmp_path / name).sysctl("vm.swappiness", 10).root
             for name in ("a", "b", "c")}
    (pytester.path / "fleet.txt").write_text("".join(
        f"{sshd.url(root, query=f'?name={name}')}\n" for name, root in roots.items()))
    (pytester.path / "spec.yaml").write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.makeconftest(COLLECTED_LAST.format(limit=LIMIT_S / 2))
    here_root = FakeHost(tmp_path / "here").sysctl("vm.swappiness", 10).root
    here = ["--gpuhost-target=local", f"--gpuhost-root={here_root}"] if local else []
    result = pytester.runpytest_subprocess(
        "--gpuhost-spec=spec.yaml", "--gpuhost-targets-file=fleet.txt", *here, "-n", "2",
        f"--gpuhost-ssh-config={sshd.client_config}", "--gpuhost-report=r.json",
        "-p", "no:cacheprovider", timeout=LIMIT_S)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert (pytester.path / "one-target-collected").exists()  # the order was the stalling one
    report = json.loads((pytester.path / "r.json").read_text())
    targets = ["a", "b", "c", *(["local"] if local else [])]
    assert sorted((c["target"], c["outcome"]) for c in report["checks"]) == [
        (name, "passed") for name in targets]
