"""A spec per target over the tests' sshd: an Ansible inventory's two groups, each
with its ``gpuhost_spec`` (group vars, a file relative to the inventory), run two specs in one
run; the report and the fleet page say which spec each target ran. Two hosts of one group are
the same sshd with a fake root each; the third is this run's ``local`` (a fake root too)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.fleet import targets_of_report
from pytest_gpuhost.fleet.page import _facts
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH
from ..fleet.test_target_specs import INFERENCE, RUN, TRAINING, ran

pytestmark = NEEDS_OPENSSH


@pytest.fixture(scope="module", autouse=True)
def _ansible_home(ansible_home: None) -> None:
    """Ansible keeps its files in the tests' own directories."""


def test_an_inventorys_two_groups_run_two_specs_in_one_run(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    trees = {name: FakeHost(tmp_path / name).sysctls({"vm.swappiness": 10,
                                                       "vm.max_map_count": 65530})
             for name in ("train1", "train2", "infer1")}
    ssh = f"ansible_connection: ssh, ansible_host: {sshd.alias}, ansible_user: {sshd.user}"
    pytester.makefile(".yaml", **{"specs/training": TRAINING})
    pytester.makefile(".yaml", **{"specs/inference": INFERENCE})
    pytester.makefile(".yml", inventory=textwrap.dedent(f"""\
        all:
          vars:
            ansible_connection: local
          children:
            training:
              vars:
                gpuhost_spec: specs/training.yaml
              hosts:
                train1: {{{ssh}, gpuhost_root: {trees['train1'].root}}}
                train2: {{{ssh}, gpuhost_root: {trees['train2'].root}}}
            inference:
              vars:
                gpuhost_spec: specs/inference.yaml
              hosts:
                infer1: {{gpuhost_root: {trees['infer1'].root}}}
        """))
    result = pytester.runpytest("--gpuhost-inventory=inventory.yml",
                                f"--gpuhost-ssh-config={sshd.client_config}", *RUN)
    checks, specs = ran(pytester.path / "r.json")
    assert checks == [("infer1", "sysctl[vm.max_map_count]", "failed"),
                      ("train1", "sysctl[vm.swappiness]", "passed"),
                      ("train2", "sysctl[vm.swappiness]", "passed")]
    assert specs == {"train1": ["training"], "train2": ["training"],
                     "infer1": ["inference"]}
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    [row] = [r for r in targets_of_report(json.loads((pytester.path / "r.json").read_text()),
                                          "r.json") if r.name == "infer1"]
    assert "spec inference" in _facts(row)
