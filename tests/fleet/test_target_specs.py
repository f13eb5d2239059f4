"""A spec per target: an inventory's ``gpuhost_spec`` (host or group vars; a bundled
name or a file relative to the inventory), a targets file's second column and ``?spec=``;
``--gpuhost-spec`` stays the default; the reports and the fleet page say which spec each ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

TRAINING = "version: 1\nname: training\nsysctl:\n  vm.swappiness: 10\n"
INFERENCE = "version: 1\nname: inference\nsysctl:\n  vm.max_map_count: 262144\n"
RUN = ("--gpuhost-report=r.json", "-p", "no:cacheprovider")


def ran(report: Path) -> tuple[list[tuple[str, str, str]], dict[str, list[str]]]:
    data = json.loads(report.read_text())
    return (sorted((c["target"], c["id"], c["outcome"]) for c in data["checks"]),
            {t["name"]: t["specs"] for t in data["targets"]})


def test_a_targets_files_second_column_and_spec_parameter_beat_the_default(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60, "vm.max_map_count": 262144})
    lxc_container(host, "101")
    lxc_container(host, "102")
    pytester.makefile(".yaml", training=TRAINING, inference=INFERENCE)
    pytester.makefile(".txt", targets="lxc://101 inference.yaml  # the second column\n"
                                      "lxc://102\n")
    pytester.runpytest("--gpuhost-spec=training.yaml", f"--gpuhost-root={host.root}",
                       "--gpuhost-targets-file=targets.txt", *RUN)
    checks, specs = ran(pytester.path / "r.json")
    assert checks == [("local", "sysctl[vm.max_map_count]", "passed"),
                      ("local", "sysctl[vm.swappiness]", "failed")]
    assert specs["local"] == ["training", "inference"]
    pytester.runpytest(f"--gpuhost-root={host.root}",
                       "--gpuhost-target=lxc://101?spec=inference.yaml", *RUN)
    assert ran(pytester.path / "r.json")[0] == [("local", "sysctl[vm.max_map_count]", "passed")]


def test_a_spec_given_twice_for_one_target_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", training=TRAINING)
    pytester.makefile(".txt", targets="lxc://101?spec=training.yaml training.yaml\n")
    result = pytester.runpytest("--gpuhost-targets-file=targets.txt", "-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*targets.txt:1: the spec is given twice*give it once*"])
