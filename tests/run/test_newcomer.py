"""What a newcomer met on a first run, each as it was met and as it is now:
a journal shown as a path on its target with an undo that works as printed, no undo after a run
that changed nothing, a bundled spec named as a file, an unreachable target said once, a sysctl
typo, counts in words that agree, and a rollback that counts every change of its journal."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import REPO
from ..e2e.test_ssh import fake_lxc_attach


def undo_options(result: pytest.RunResult, prefix: str) -> list[str]:
    """The options of the ``(undo: ...)`` of the summary line that starts with ``prefix``."""
    [line] = [line for line in result.stdout.lines if line.startswith(prefix)]
    return shlex.split(line.split("(undo: ", 1)[1].removesuffix(")"))


def test_a_containers_journal_is_a_path_in_it_and_its_undo_runs_as_printed(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = fake_lxc_attach(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    container = FakeHost(tmp_path / "ct101").sysctl("net.core.somaxconn", 128)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  net.core.somaxconn: 4096\n")
    url = f"lxc://101{container.root}"
    fixed = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-target={url}", "--fix",
                               "-p", "no:cacheprovider")
    assert fixed.ret == pytest.ExitCode.OK
    [journal] = (container.root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl")
    fixed.stdout.fnmatch_lines([f"journal of lxc-101: {journal}",
                                f"undo: --gpuhost-rollback={journal.name} --gpuhost-target={url} "
                                "(its host had nothing to change)"])
    assert f"{url}/var/lib" not in fixed.stdout.str()  # never the URL glued to the path

    [undo] = [line for line in fixed.stdout.lines if line.startswith("undo: ")]
    back = pytester.runpytest(*shlex.split(undo.removeprefix("undo: ").rsplit(" (", 1)[0]),
                              "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK
    assert (container.root / "proc/sys/net/core/somaxconn").read_text() == "128\n"
    back.stdout.fnmatch_lines(["--gpuhost-rollback: 1 of 1 change restored",
                               f"rollback: {journal} is closed"])


def test_a_local_trees_undo_names_its_root(pytester: pytest.Pytester, fake: FakeHost) -> None:
    """Without --gpuhost-root the rollback of a fake tree's journal is refused (it is not
    this machine's): the undo the summary prints carries it."""
    fake.sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    fixed = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                               "--fix", "-p", "no:cacheprovider")
    undo = undo_options(fixed, "journal: ")
    assert undo[1:] == [f"--gpuhost-root={fake.root}"]
    back = pytester.runpytest(*undo, "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_no_undo_after_a_run_whose_every_change_the_host_refused(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The journal holds the refused modprobe (so the next --fix does not retry it), and
    nothing to undo: the summary names it without an undo that would find nothing."""
    fake.modprobe(available=["nvidia_peermem"], failures={"nvidia_peermem": {
        "stderr": "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument"}})
    pytester.makefile(".yaml", spec="version: 1\nmodules:\n  nvidia_peermem: loaded\n")
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                                "--fix", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["--fix: 0 of 1 fix applied",
                                 "journal: *.jsonl (nothing to undo: the host refused every "
                                 "change)"])
    assert "(undo: " not in result.stdout.str()
    assert list((fake.root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl"))


def test_a_bundled_spec_named_as_a_file_names_the_bundled_one(
        pytester: pytest.Pytester) -> None:
    for args in (["--gpuhost-spec=blackwell8.yaml"], ["blackwell8.yaml"]):
        result = pytester.runpytest(*args, "-p", "no:cacheprovider")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([
            "ERROR: *blackwell8.yaml: no such file here (*); the bundled spec of that name runs "
            "as --gpuhost-spec=blackwell8 (a bundled spec is named without .yaml)"])
    pytester.makefile(".yaml", blackwell8="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    here = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", "--gpuhost-root=/nonexistent",
                              "-p", "no:cacheprovider")  # a file of that name: that file
    assert "bundled spec of that name" not in here.stderr.str()


def test_an_unreachable_target_is_said_once(pytester: pytest.Pytester, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """39 checks of a target ssh cannot reach: one error block and one summary line, the
    lines docs/remote.md quotes."""
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host pve port 22: No route to "
                               "host' >&2\nexit 255\n")
    (tools / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" + "".join(
        f"  kernel.k{n}: 0\n" for n in range(39)))
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", "--gpuhost-target=ssh://root@pve",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    documented = re.findall(r"`((?:\.\.\. and 38 more|not reached: pve)[^`]*)`",
                            " ".join((REPO / "docs" / "remote.md").read_text().split()))
    assert len(documented) == 2
    text = result.stdout.str()
    assert text.count(documented[1]) == 1
    assert text.count("gpuhost check sysctl[") == 1  # one block of the 39 identical ones
    assert text.count("_ ERROR gpuhost check sysctl[kernel.k0]@pve _") == 1
    result.stdout.fnmatch_lines([documented[0].replace("...", "*")])
    assert len([line for line in result.stdout.lines if line.startswith("ERROR ")]) == 39


def test_a_sysctl_typo_gets_a_did_you_mean_from_the_same_batch(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The names beside a missing sysctl come in the observation's batch: a run with a typo
    asks the host as many times as one without."""
    from .test_batched_reads import Counting

    fake.sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 20, "net.core.rmem_max": 212992})
    calls = []
    for name, entries in (("right", "  vm.swappiness: 10\n"),
                          ("typos", "  vm.swappiness: 10\n  vm.swapiness: 10\n"
                                    "  net.core.rmem_maxx: {min: 1}\n"
                                    "  vm.no_such_thing_at_all: 1\n")):
        pytester.makefile(".yaml", **{name: f"version: 1\nsysctl:\n{entries}"})
        counting = Counting()
        result = pytester.runpytest(f"--gpuhost-spec={name}.yaml", f"--gpuhost-root={fake.root}",
                                    "-p", "no:cacheprovider", plugins=[counting])
        calls.append(counting.calls)
    assert calls[0] == calls[1]
    result.stdout.fnmatch_lines([
        "proc/sys/net/core/rmem_maxx does not exist: this kernel has no such sysctl (or its "
        "module is not loaded); did you mean net.core.rmem_max?",
        "proc/sys/vm/no_such_thing_at_all does not exist: this kernel has no such sysctl (or "
        "its module is not loaded)",
        "proc/sys/vm/swapiness does not exist: * did you mean vm.swappiness?"])


def test_counts_agree_with_their_nouns(pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    root = f"--gpuhost-root={fake.root}"
    planned = pytester.runpytest("--gpuhost-spec=spec.yaml", root, "--fix", "--gpuhost-dry-run",
                                 "-p", "no:cacheprovider")
    planned.stdout.fnmatch_lines(["--gpuhost-dry-run: 1 fix planned (1 change); nothing was "
                                  "written"])
    fixed = pytester.runpytest("--gpuhost-spec=spec.yaml", root, "--fix", "-p",
                               "no:cacheprovider")
    fixed.stdout.fnmatch_lines(["--fix: 1 of 1 fix applied"])
    ok = pytester.runpytest_subprocess("--gpuhost-spec=spec.yaml", root, "--gpuhost-npd")
    assert ok.outlines == ["gpuhost: 1 check ok"]


def test_a_rollback_counts_the_change_it_left_alone(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    """Two changes, one changed by hand since: '1 of 2 changes restored, 1 not', never '1 of 1'
    (docs/fix-safety.md#undo: a value changed since is left as it is)."""
    fake.sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 20})
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                    "  vm.dirty_ratio: 5\n")
    root = f"--gpuhost-root={fake.root}"
    pytester.runpytest("--gpuhost-spec=spec.yaml", root, "--fix", "-p", "no:cacheprovider")
    (fake.root / "proc/sys/vm/swappiness").write_text("30\n")
    back = pytester.runpytest("--gpuhost-rollback", root, "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.TESTS_FAILED
    documented = " ".join((REPO / "docs" / "fix-safety.md").read_text().split())
    assert "(`--gpuhost-rollback: 1 of 2 changes restored, 1 not (below)`" in documented
    back.stdout.fnmatch_lines(["--gpuhost-rollback: 1 of 2 changes restored, 1 not (below)",
                               "  NOT FIXED  rollback[[]sysctl[[]vm.swappiness]*changed since the "
                               "fix (now '30', the fix left '10'): left as it is",
                               "rollback: * is still open *"])
    assert (fake.root / "proc/sys/vm/dirty_ratio").read_text() == "20\n"


def test_the_gates_closed_message_names_each_check_with_its_target(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With targets a check's id alone does not say which machine closed the gate: the message
    names it as its test does (``@lxc-101``)."""
    tools = fake_lxc_attach(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    container = FakeHost(tmp_path / "ct101").sysctl("net.core.somaxconn", 128)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  net.core.somaxconn: 4096\n")
    pytester.makepyfile(test_bench="def test_bench():\n    pass\n")
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=spec.yaml",
                                f"--gpuhost-target=lxc://101{container.root}", "--gpuhost-gate",
                                "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["*gpuhost gate closed: 1 of 1 host check failed: "
                                 "sysctl[[]net.core.somaxconn]@lxc-101 (failed)*"])
