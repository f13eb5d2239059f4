"""One machine is one target, however it is named, over the tests' sshd on 127.0.0.1: two
spellings of one ssh URL, a container's host written another way than the target that names
it, and (with the machine's own ids) two aliases of one machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH

pytestmark = NEEDS_OPENSSH

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n"
CONTAINER_SPEC = ("version: 1\nsysctl:\n  vm.swappiness: 10\n"
                  "  net.ipv4.tcp_rmem: \"4096 87380 268435456\"\n")


def test_an_ssh_root_with_a_trailing_slash_is_the_same_target(
        pytester: pytest.Pytester, sshd: SshServer, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--fix",
                                f"--gpuhost-target={sshd.url(fake.root)}",
                                f"--gpuhost-target={sshd.url(fake.root)}/./?name=again",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*are the same target (the same machine and root): give it "
                                 "once*"])
    assert (fake.root / "proc/sys/vm/swappiness").read_text().strip() == "60"


def test_a_containers_host_spelt_another_way_is_the_target_that_names_it(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 10,
                                               "net.ipv4.tcp_rmem": "4096 87380 268435456"})
    lxc_container(host, "101")
    spec = pytester.makefile(".yaml", spec=CONTAINER_SPEC)
    container = sshd.url(f"{host.root}/./", query="?lxc=101")
    result = pytester.runpytest(f"--gpuhost-spec={spec}",
                                f"--gpuhost-target={sshd.url(host.root)}?name=pve",
                                f"--gpuhost-target={container}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    report = json.loads((pytester.path / "r.json").read_text())
    assert sorted(t["name"] for t in report["targets"]) == [f"{sshd.alias}-lxc-101", "pve"]
    assert sorted((c["id"], c["target"]) for c in report["checks"]) == [  # the kernel's once
        ("sysctl[net.ipv4.tcp_rmem]", f"{sshd.alias}-lxc-101"),
        ("sysctl[net.ipv4.tcp_rmem]", "pve"), ("sysctl[vm.swappiness]", "pve")]


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_a_containers_spec_that_sets_its_hosts_sysctl_another_way_is_refused(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        workers: tuple[str, ...]) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 30,
                                               "net.ipv4.tcp_rmem": "4096 87380 268435456"})
    lxc_container(host, "101")
    pytester.makefile(".yaml", ten=SPEC, sixty="version: 1\nsysctl:\n  vm.swappiness: 60\n")
    result = pytester.runpytest("--gpuhost-spec=ten.yaml", "--fix", "--fix-persist",
                                f"--gpuhost-target={sshd.url(host.root)}?name=pve",
                                f"--gpuhost-target={sshd.url(host.root)}?lxc=101&spec=sixty.yaml",
                                f"--gpuhost-ssh-config={sshd.client_config}", *workers,
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*sysctl[[]vm.swappiness] on pve ({sshd.url(host.root)}*) "
                                 "has two owners: ten.yaml:3 expects 10, sixty.yaml:3 expects "
                                 "60*"])
    assert (host.root / "proc/sys/vm/swappiness").read_text() == "30\n"
    assert not (host.root / "etc/sysctl.d").exists()
