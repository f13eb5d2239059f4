"""Allure's ``host`` label names the machine a check judged: a remote target's checks are
labelled with that machine as it names itself, not with the machine pytest ran on (which
allure-pytest gives every test), over the tests' real sshd on 127.0.0.1."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH
from ..reports.test_reports import allure_results

pytestmark = NEEDS_OPENSSH
pytest_plugins = ["pytester"]


def named_host(root: Path, hostname: str) -> Path:
    FakeHost(root).sysctl("vm.swappiness", 10)
    (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
    (root / "proc/sys/kernel/hostname").write_text(f"{hostname}\n")
    return root


def test_each_checks_host_label_and_parameter_name_the_machine_it_judged(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    here = named_host(tmp_path / "here", "gpu-here")
    there = named_host(tmp_path / "there", "gpu-node07")
    spec = pytester.path / "spec.yaml"
    spec.write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={here}",
                                "--gpuhost-target=local",
                                f"--gpuhost-target={sshd.url(there, query='?name=node07')}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--alluredir=allure", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-2000:]
    results = allure_results(pytester.path / "allure")
    hosts = {name: ([label["value"] for label in r["labels"] if label["name"] == "host"],
                    [p["value"] for p in r["parameters"] if p["name"] == "host"])
             for name, r in results.items()}
    assert hosts == {"sysctl[vm.swappiness]@local": (["gpu-here"], ["'gpu-here'"]),
                     "sysctl[vm.swappiness]@node07": (["gpu-node07"], ["'gpu-node07'"])}
    assert socket.gethostname() not in {"gpu-here", "gpu-node07"}
