"""The documentation's code runs: the complete kind of docs/adding-a-kind.md, verify and fix."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from .conftest import REPO


def python_block(document: Path) -> str:
    [code] = re.findall(r"```python\n(.*?)```", document.read_text(), re.S)
    return code


def test_the_documented_kind_checks_fixes_and_rolls_back(pytester: pytest.Pytester,
                                                         fake: FakeHost) -> None:
    pytester.makeconftest(python_block(REPO / "docs" / "adding-a-kind.md"))
    fake.file("sys/class/net/eth0/mtu", "1500\n")
    fake.file("sys/class/net/ib0/mtu", "4092\n")
    pytester.makefile(".yaml", spec="version: 1\nmtu:\n  ib0: 4092\n  eth0: {min: 9000}\n")
    verify = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-v")
    verify.stdout.fnmatch_lines(["*spec.yaml::mtu[[]eth0] FAILED*",
                                 "*spec.yaml::mtu[[]ib0] PASSED*"])
    fixed = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                               "--gpuhost-report=r.json")
    assert fixed.ret == pytest.ExitCode.OK
    records = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert records["mtu[eth0]"]["outcome"] == "fixed"
    assert (fake.root / "sys/class/net/eth0/mtu").read_text() == "9000\n"
    back = pytester.runpytest("--gpuhost-rollback", f"--gpuhost-root={fake.root}")
    assert back.ret == pytest.ExitCode.OK
    assert (fake.root / "sys/class/net/eth0/mtu").read_text() == "1500\n"


def test_a_bad_section_of_the_documented_kind_is_exit_4(pytester: pytest.Pytester,
                                                        fake: FakeHost) -> None:
    pytester.makeconftest(python_block(REPO / "docs" / "adding-a-kind.md"))
    pytester.makefile(".yaml", spec="version: 1\nmtu:\n  eth0: lots\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*spec.yaml:3: mtu eth0*"])
