"""One machine is one target, however it is named, over the tests' sshd on 127.0.0.1: two
spellings of one ssh URL, a container's host written another way than the target that names
it, and (with the machine's own ids) two aliases of one machine."""

from __future__ import annotations

import json
import sys
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


def two_aliases(sshd: SshServer, directory: Path) -> Path:
    """The sshd's client configuration with two more names for it: ``gpu01`` and
    ``10.0.0.1`` (a machine listed by its name and by its address)."""
    config = directory / "ssh_config_aliases"
    text = sshd.client_config.read_text()
    config.write_text(text + text.replace(f"Host {sshd.alias}\n", "Host gpu01 10.0.0.1\n", 1))
    return config


def identified(host: FakeHost, machine_id: str = "0123456789abcdef0123456789abcdef") -> FakeHost:
    host.file("etc/machine-id", f"{machine_id}\n")
    host.file("proc/sys/kernel/random/boot_id", "6a1c3d4e-0000-4000-8000-000000000001\n")
    host.file("proc/sys/kernel/hostname", "gpu01\n")
    return host


@pytest.mark.parametrize("workers", [(), ("-n", "2")])
def test_one_machine_under_two_names_is_refused_before_either_fixes(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        workers: tuple[str, ...]) -> None:
    host = identified(FakeHost(tmp_path / "gpu01").sysctl("vm.swappiness", 30))
    config = two_aliases(sshd, tmp_path)
    pytester.makefile(".yaml", ten=SPEC, sixty="version: 1\nsysctl:\n  vm.swappiness: 60\n")
    (pytester.path / "fleet.txt").write_text(
        f"ssh://{sshd.user}@gpu01{host.root} ten.yaml\n"
        f"ssh://{sshd.user}@10.0.0.1{host.root}/ sixty.yaml\n")
    result = pytester.runpytest("--gpuhost-targets-file=fleet.txt", "--fix",
                                f"--gpuhost-ssh-config={config}", *workers,
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"*ssh://{sshd.user}@gpu01{host.root} (--gpuhost-targets-file=fleet.txt:1) and "
        f"ssh://{sshd.user}@10.0.0.1{host.root}/ (--gpuhost-targets-file=fleet.txt:2) are the "
        "same target "
        f"(one machine and root: the same machine-id, boot id and hostname, root {host.root}), "
        "under two names: give it once*"])
    assert (host.root / "proc/sys/vm/swappiness").read_text() == "30\n"
    assert not (host.root / "var/lib/pytest-gpuhost/journal").exists()


def test_two_roots_of_one_machine_are_two_targets(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """Copies of one tree (the same machine-id) at two roots are two places: both fixed."""
    one = identified(FakeHost(tmp_path / "one").sysctl("vm.swappiness", 30))
    two = identified(FakeHost(tmp_path / "two").sysctl("vm.swappiness", 30))
    config = two_aliases(sshd, tmp_path)
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", "--fix",
                                f"--gpuhost-target=ssh://gpu01{one.root}",
                                f"--gpuhost-target=ssh://10.0.0.1{two.root}",
                                f"--gpuhost-ssh-config={config}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK
    assert [(h.root / "proc/sys/vm/swappiness").read_text() for h in (one, two)] == ["10\n"] * 2


def test_a_container_pair_reached_two_ways_is_the_same_state(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """``lxc://101`` on the host's root, then ``ssh://HOST/ROOT?lxc=101`` from elsewhere: other
    names for every target, the same machines, so ``state diff`` says the same state."""
    host = identified(FakeHost(tmp_path / "pve").sysctls(
        {"vm.swappiness": 10, "net.ipv4.tcp_rmem": "4096 87380 268435456"}))
    container = lxc_container(host, "101")
    container.file("etc/machine-id", "fedcba9876543210fedcba9876543210\n")
    container.file("proc/sys/kernel/hostname", "ct101\n")
    pytester.makefile(".yaml", spec=CONTAINER_SPEC)
    here = pytester.runpytest("--gpuhost-spec=spec.yaml", f"--gpuhost-root={host.root}",
                              "--gpuhost-target=lxc://101", "--gpuhost-report=here.json",
                              "-p", "no:cacheprovider")
    there = pytester.runpytest("--gpuhost-spec=spec.yaml",
                               f"--gpuhost-target={sshd.url(host.root, query='?lxc=101')}",
                               f"--gpuhost-ssh-config={sshd.client_config}",
                               "--gpuhost-report=there.json", "-p", "no:cacheprovider")
    assert (here.ret, there.ret) == (pytest.ExitCode.OK, pytest.ExitCode.OK)
    names = [sorted(json.loads((pytester.path / f"{run}.json").read_text())["state"]["targets"])
             for run in ("here", "there")]
    assert names == [["local", "lxc-101"], [sshd.alias, f"{sshd.alias}-lxc-101"]]
    diff = pytester.run(sys.executable, "-m", "pytest_gpuhost.state", "diff", "here.json",
                        "there.json")
    assert diff.ret == 0, diff.stdout.str()
    diff.stdout.fnmatch_lines(["same host state, the same machines under other names*"])
