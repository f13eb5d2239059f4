"""Namespaces as the kernel draws them: a container's IPC and UTS sysctls (``kernel.shmmax``,
``fs.mqueue.*``, ``kernel.hostname``) are its own, as its network namespace's ``net.*`` ones
are: read, fixed and persisted inside it, never on its host (``lxc://101`` of a fake host
tree, whose ``lxc-attach`` enters the container's tree)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.checks.sysctl import sysctl_path
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

RUN = ("-p", "no:cacheprovider")
NAMESPACED = [
    # (namespace, key, the host's value = what the spec wants, the container's own)
    ("ipc", "kernel.shmmax", "68719476736", "33554432"),
    ("ipc", "kernel.sem", "250 32000 100 128", "32000 1024000000 500 32000"),
    ("ipc", "fs.mqueue.msg_max", "1024", "10"),
    ("uts", "kernel.hostname", "pve", "inference"),
]


def own_value(container: FakeHost, key: str, value: str) -> Path:
    """The container's own value of a namespaced sysctl: its own file (whatever the fake
    tree shared with the host before), as its own namespace holds it."""
    path = container.root / sysctl_path(key)
    path.unlink(missing_ok=True)
    return container.file(sysctl_path(key), f"{value}\n")


@pytest.mark.parametrize(("namespace", "key", "wanted", "own"), NAMESPACED,
                         ids=[f"{ns}-{key}" for ns, key, _, _ in NAMESPACED])
def test_a_namespaced_sysctl_is_read_and_fixed_in_the_container_never_on_its_host(
        pytester: pytest.Pytester, tmp_path: Path, namespace: str, key: str, wanted: str,
        own: str) -> None:
    host = FakeHost(tmp_path / "pve").sysctl(key, wanted)
    container = lxc_container(host, "101")
    inside = own_value(container, key, own)
    spec = pytester.makefile(".yaml", spec=f"version: 1\nsysctl:\n  {key}: \"{wanted}\"\n")
    args = (f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
            "--gpuhost-target=lxc://101", *RUN)
    checked = pytester.runpytest(*args, "--gpuhost-report=r.json")
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert (record["target"], record["outcome"], record["scope"]) == (
        "lxc-101", "failed", "namespace"), checked.stdout.str()
    assert record["observed"].split() == own.split()
    fixed = pytester.runpytest(*args, "--fix", "--fix-persist", "--gpuhost-report=f.json")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    assert inside.read_text().split() == wanted.split()
    assert (host.root / sysctl_path(key)).read_text().split() == wanted.split()
    persisted = (container.root / "etc/sysctl.d/90-gpuhost-spec.conf").read_text()
    assert f"{key} = {wanted}" in persisted
    assert not (host.root / "etc/sysctl.d/90-gpuhost-spec.conf").exists()


def test_the_kernels_own_sysctls_beside_them_stay_on_the_host(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``kernel.osrelease`` and ``fs.file-max`` are the kernel's whatever namespace reads them:
    still checked on the host, beside a container's ``kernel.shmmax``."""
    host = FakeHost(tmp_path / "pve").sysctls({"kernel.shmmax": 1, "fs.file-max": 100})
    container = lxc_container(host, "101")
    own_value(container, "kernel.shmmax", "2")
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  kernel.shmmax: 2\n"
                                           "  fs.file-max: 100\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--gpuhost-report=r.json", *RUN)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert sorted((c["id"], c["target"]) for c in json.loads(
        (pytester.path / "r.json").read_text())["checks"]) == [
        ("sysctl[fs.file-max]", "local"), ("sysctl[kernel.shmmax]", "lxc-101")]
