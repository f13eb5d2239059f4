"""A run whose spec comes from its targets (``?spec=``, a targets file's second column, an
inventory's ``gpuhost_spec``) and whose target source holds another mistake says that mistake,
not "needs a spec": the spec is there, in the source the mistake is in."""

from __future__ import annotations

import pytest

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"


def _target(pytester: pytest.Pytester) -> list[str]:
    return ["--gpuhost-target=ssh://127.0.0.1/?spec=own.yaml&nmae=x"]


def _targets_file(pytester: pytest.Pytester) -> list[str]:
    (pytester.path / "targets.txt").write_text("ssh://127.0.0.1:99999 own.yaml\n")
    return ["--gpuhost-targets-file=targets.txt"]


def _inventory(pytester: pytest.Pytester) -> list[str]:
    (pytester.path / "hosts.ini").write_text(
        "node01 ansible_host=127.0.0.1 ansible_port=abc gpuhost_spec=own.yaml\n")
    return ["--gpuhost-inventory=hosts.ini"]


def _ini(pytester: pytest.Pytester) -> list[str]:
    pytester.makeini("[pytest]\ngpuhost_targets = ssh://127.0.0.1/?spec=own.yaml&nmae=x\n")
    return []


MISTAKES = {
    "?spec= with an unknown parameter": (_target, "unknown parameter(s) nmae"),
    "a targets file's line with its spec and a bad port": (
        _targets_file, "targets.txt:1: 'ssh://127.0.0.1:99999': the port must be a number"),
    "an inventory host with gpuhost_spec and a bad port": (
        _inventory, "host node01: ansible_port must be a port number"),
    "gpuhost_targets in the ini file": (_ini, "unknown parameter(s) nmae"),
}


@pytest.mark.usefixtures("ansible_home")
@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_target_only_spec_run_says_the_real_mistake(pytester: pytest.Pytester,
                                                       mistake: str) -> None:
    pytester.makefile(".yaml", own=SPEC)
    given, said = MISTAKES[mistake]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *given(pytester))
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, err
    assert said in err, err
    assert "needs a spec" not in err, err


def test_a_bad_target_in_a_run_with_no_spec_anywhere_still_says_it_needs_one(
        pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--gpuhost-target=ssh://127.0.0.1:99999")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpuhost-target needs a spec: pass --gpuhost-spec=*"])
