"""Claims of the docs a newcomer tried, each held by running what it describes: the tables are
whole, the node-health ids, the ini error's words, a report under a directory that does not
exist, the Slurm reason helper's exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_docs import DOCS, README

pytest_plugins = ["pytester"]

REPO = README.parent
EXAMPLES_WITH_README = ("ci", "k8s", "slurm", "benchmark")


def markdown_tables(text: str) -> list[list[str]]:
    """Each run of lines that begin with ``|`` (outside code blocks)."""
    tables: list[list[str]] = []
    current: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("|"):
            current.append(line)
            continue
        if current:
            tables.append(current)
            current = []
    return [*tables, current] if current else tables


@pytest.mark.parametrize("document", [README, *DOCS,
                                      *(REPO / "examples").glob("*/README.md")],
                         ids=lambda path: str(path.relative_to(REPO)))
def test_no_table_is_split(document: Path) -> None:
    """A table is a header, its ``| --- |`` line and rows, each one line: a blank line or a
    row broken across lines leaves a piece that Markdown shows as text."""
    for table in markdown_tables(document.read_text()):
        assert len(table) >= 2 and re.fullmatch(r"\|( *:?-+:? *\|)+", table[1]), table[0]
        assert all(line.rstrip().endswith("|") for line in table), table[0]


def test_node_health_ids_keep_their_domains_unless_they_would_not_fit() -> None:
    from pytest_gpuhost.reports.nodehealth import short_id

    check = "p2p[0000:01:00.0->0000:81:00.0]"
    text = " ".join((REPO / "docs" / "schedulers.md").read_text().split())
    assert f"Ids keep their PCI domains (`{check}`)" in text
    assert short_id(check, 80) == check
    shortened = "p2p[01:00.0->81:00.0]"
    assert f"(`{shortened}`:" in text and short_id(check, len(shortened)) == shortened


def test_the_ini_error_example_is_the_real_message(pytester: pytest.Pytester) -> None:
    text = " ".join((REPO / "docs" / "reference.md").read_text().split())
    [(option, ini)] = re.findall(r"\(`(--gpuhost-root=/x: [^`]+)`, or for the ini value, naming "
                                 r"the ini file by its path: `(gpuhost_root in [^`]+)`\)", text)
    by_option = pytester.runpytest("--gpuhost-root=/x", "--gpuhost-spec=blackwell8")
    assert by_option.ret == 4
    assert f"ERROR: {option}" in by_option.errlines
    pytester.makefile(".ini", tox="[pytest]\ngpuhost_root = /x\ngpuhost_spec = blackwell8\n")
    by_ini = pytester.runpytest()
    assert by_ini.ret == 4
    documented = ini.replace("/srv/bench/tox.ini", str(pytester.path / "tox.ini"))
    pytest.LineMatcher(by_ini.errlines).fnmatch_lines([
        "ERROR: " + documented.replace("...", "*").replace("[", "[[]")])


def test_a_report_under_a_directory_that_does_not_exist_makes_it(
        pytester: pytest.Pytester, fake: object) -> None:
    """fix-safety.md: the directories are made when the report is written, and a path under a
    file is refused before anything is read (exit 4)."""
    from pytest_gpuhost.testing.fakehost import FakeHost

    assert isinstance(fake, FakeHost)
    fake.sysctl("vm.swappiness", 10)
    text = " ".join((REPO / "docs" / "fix-safety.md").read_text().split())
    assert "`--gpuhost-report=out/node07/r.json` makes `out/node07/`" in text
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    made = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                              "--gpuhost-report=out/node07/r.json", "-p", "no:cacheprovider")
    assert made.ret == 0
    assert json.loads((pytester.path / "out/node07/r.json").read_text())["checks"]
    (pytester.path / "file").write_text("")
    refused = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={fake.root}",
                                 "--gpuhost-report=file/r.json", "-p", "no:cacheprovider")
    assert refused.ret == 4
    refused.stderr.fnmatch_lines(["*--gpuhost-report=file/r.json: *file is not a directory*"])


@pytest.mark.parametrize(("report", "status"), [
    ({"checks": [{"id": "sysctl[vm.swappiness]", "outcome": "passed"}]}, 0),
    ({"checks": [{"id": "sysctl[vm.swappiness]", "outcome": "failed"}]}, 1),
    (None, 2),
], ids=["healthy", "a check failed", "no report"])
def test_the_slurm_reason_helper_exits_as_schedulers_md_says(
        tmp_path: Path, report: dict[str, object] | None, status: int) -> None:
    text = " ".join((REPO / "docs" / "schedulers.md").read_text().split())
    assert ("exits 0 when the node is healthy, 1 when a check failed, and 2 when the checks "
            "could not run") in text
    path = tmp_path / "r.json"
    if report is not None:
        path.write_text(json.dumps({**report, "version": 1}))
    ran = subprocess.run([sys.executable, "-m", "pytest_gpuhost.reports.slurm", str(path),
                          f"--pytest-exit={status}"], capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == status, ran.stdout + ran.stderr
    assert ran.stdout.startswith("gpuhost: ")
    usage = subprocess.run([sys.executable, "-m", "pytest_gpuhost.reports.slurm"],
                           capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and usage.stdout == "" and "usage:" in usage.stderr


@pytest.mark.parametrize("example", EXAMPLES_WITH_README)
def test_each_example_has_a_readme_naming_each_of_its_files(example: str) -> None:
    """What each file is, and how to try it here."""
    folder = REPO / "examples" / example
    readme = folder / "README.md"
    assert readme.is_file()
    text = readme.read_text()
    files = {p.relative_to(folder).as_posix() for p in folder.rglob("*")
             if p.is_file() and p.name != "README.md" and "__pycache__" not in p.parts
             and not p.name.startswith(".")}
    assert {name for name in files if f"`{name}`" not in text} == set()
    assert "```" in text  # a command to try it
