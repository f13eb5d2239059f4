"""Every output is its own file and none of them is an input of the run: a report over the spec,
the targets file, the inventory, a journal or a file of the host tree, or two reports at one
file, is a usage error (exit 4) before anything is read or changed. Files are compared by
identity: ``out``, ``./out``, a link to it and a hard link are one file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ..conftest import snapshot

pytest_plugins = ["pytester"]

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A host tree on which the spec's one check passes."""
    root = tmp_path / "host"
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/sys/vm/swappiness").write_text("10\n")
    return root


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    path = pytester.path / "spec.yaml"
    path.write_text(SPEC)
    return path


def refused(result: pytest.RunResult, *lines: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    result.stderr.fnmatch_lines(list(lines))
    assert "Traceback" not in result.stderr.str()


@pytest.mark.parametrize("output", ["--gpuhost-report=spec.yaml", "--gpuhost-prom=./spec.yaml",
                                    "--gpuhost-nfd=link.yaml", "--junitxml=sub/../spec.yaml",
                                    "--gpuhost-fleet-html=hard.yaml"])
def test_an_output_that_is_the_spec_is_refused_and_the_spec_kept(
        pytester: pytest.Pytester, spec: Path, root: Path, output: str) -> None:
    (pytester.path / "link.yaml").symlink_to(spec)
    os.link(spec, pytester.path / "hard.yaml")
    (pytester.path / "sub").mkdir()
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}", "--fix",
                                output)
    refused(result, f"*{output}: *.yaml is the spec spec.yaml, which this run reads; the "
                    "report would replace it: name another file*")
    assert spec.read_text() == SPEC


def test_an_output_that_is_the_targets_file_is_refused(
        pytester: pytest.Pytester, spec: Path, root: Path) -> None:
    targets = pytester.path / "targets.txt"
    targets.write_text("local\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                "--gpuhost-targets-file=targets.txt",
                                "--gpuhost-prom=targets.txt")
    refused(result, "*--gpuhost-prom=targets.txt: *targets.txt is "
                    "--gpuhost-targets-file=targets.txt, which this run reads*")
    assert targets.read_text() == "local\n"


def test_an_output_in_an_inventory_directory_is_refused(
        pytester: pytest.Pytester, spec: Path, root: Path) -> None:
    inventory = pytester.path / "inventory"
    inventory.mkdir()
    (inventory / "hosts.ini").write_text("node01 ansible_host=127.0.0.1\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                "--gpuhost-inventory=inventory",
                                "--gpuhost-report=inventory/gpuhost.json")
    refused(result, "*--gpuhost-report=inventory/gpuhost.json: *gpuhost.json is under "
                    "--gpuhost-inventory=inventory; the report would write into it*")
    assert sorted(p.name for p in inventory.iterdir()) == ["hosts.ini"]


def test_an_output_that_is_the_journal_is_refused(
        pytester: pytest.Pytester, spec: Path, root: Path) -> None:
    (root / "proc/sys/vm/swappiness").write_text("60\n")
    before = snapshot(root)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}", "--fix",
                                "--gpuhost-journal=changes.jsonl",
                                "--gpuhost-report=./changes.jsonl")
    refused(result, "*--gpuhost-report=./changes.jsonl: *changes.jsonl is "
                    "--gpuhost-journal=changes.jsonl, which this run reads*")
    assert snapshot(root) == before  # nothing fixed
    assert not (pytester.path / "changes.jsonl").exists()


def test_an_output_that_is_the_journal_a_rollback_reads_is_refused(
        pytester: pytest.Pytester, root: Path) -> None:
    journal = pytester.path / "changes.jsonl"
    journal.write_text("{}\n")
    result = pytester.runpytest(f"--gpuhost-root={root}", "--gpuhost-rollback=changes.jsonl",
                                "--gpuhost-report=changes.jsonl")
    refused(result, "*--gpuhost-report=changes.jsonl: *is --gpuhost-rollback=changes.jsonl, "
                    "which this run reads*")
    assert journal.read_text() == "{}\n"


def test_an_output_under_the_host_root_is_refused(
        pytester: pytest.Pytester, spec: Path, root: Path) -> None:
    before = snapshot(root)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                f"--gpuhost-nfd={root}/proc/sys/vm/swappiness")
    refused(result, "*--gpuhost-nfd=*swappiness: *swappiness is under the host root *host; the "
                    "report would write into it: name a file outside it*")
    assert snapshot(root) == before


@pytest.mark.parametrize(("first", "second"), [
    ("--gpuhost-report=out", "--gpuhost-prom=./out"),
    ("--gpuhost-report=out", "--gpuhost-nfd=link"),
    ("--gpuhost-report=out", "--gpuhost-fleet-html=hard"),
    ("--gpuhost-report=out.xml", "--junitxml=out.xml"),
    ("--gpuhost-report=allure/categories.json", "--alluredir=allure"),
])
def test_two_outputs_at_one_file_are_refused(pytester: pytest.Pytester, spec: Path, root: Path,
                                             first: str, second: str) -> None:
    (pytester.path / "out").write_text("old")
    (pytester.path / "link").symlink_to("out")
    os.link(pytester.path / "out", pytester.path / "hard")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}", first,
                                second)
    refused(result, "* name one file (*): the last report written would replace the other; "
                    "give each its own file*")
    assert (pytester.path / "out").read_text() == "old"


def test_outputs_may_share_a_character_device(pytester: pytest.Pytester, spec: Path,
                                              root: Path) -> None:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                "--gpuhost-report=/dev/null", "--gpuhost-prom=/dev/null")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
