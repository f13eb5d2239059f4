"""A real LXC container: Debian's lxc runs a busybox container under a private lxcpath
in tmp (never the machine's default one), this machine's /usr/bin and libraries bind-mounted
read-only so python3 runs inside. ``lxc://NAME`` runs against it with a fake host tree as
``--gpuhost-root``: the tree's ``usr/bin/lxc-attach`` is a wrapper that runs the real one with
``-P LXCPATH`` (``testing.lxc.attach_wrapper``), so the container's ``kernel`` checks read the
fake tree, never this machine's kernel, and its ``namespace`` sysctl is the real container's
own (its network namespace: ``lxc.net.0.type = empty``). The container is stopped and destroyed
at the end; where it cannot start the tests are skipped saying why (.ci/run fails then)."""

from __future__ import annotations

import json
import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import (
    LxcUnavailable,
    attach_wrapper,
    read_inside,
    real_container,
)

SPEC = textwrap.dedent("""\
    version: 1
    sysctl:
      vm.swappiness: 10
      net.ipv4.tcp_rmem: "4096 87380 67108864"
    """)
TCP_RMEM = "/proc/sys/net/ipv4/tcp_rmem"


@pytest.fixture(scope="module")
def container() -> Iterator[tuple[Path, str]]:
    lxcpath = Path(tempfile.mkdtemp(prefix="gpuhost-lxc-"))
    try:
        with real_container(lxcpath) as name:
            yield lxcpath, name
    except LxcUnavailable as exc:
        pytest.skip(f"no real LXC container here: {exc}")
    finally:
        shutil.rmtree(lxcpath, ignore_errors=True)


def test_verify_fix_and_rollback_of_a_namespace_sysctl_in_a_real_container(
        pytester: pytest.Pytester, tmp_path: Path, container: tuple[Path, str]) -> None:
    lxcpath, name = container
    host = FakeHost(tmp_path / "host").sysctl("vm.swappiness", 60)
    attach_wrapper(host, lxcpath)
    before = read_inside(lxcpath, name, TCP_RMEM)
    assert before.split() != ["4096", "87380", "67108864"]
    spec = pytester.makefile(".yaml", spec=SPEC)
    args = (f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
            f"--gpuhost-target=lxc://{name}", "-p", "no:cacheprovider")

    pytester.runpytest(*args, "--gpuhost-report=verify.json")
    where = {c["id"]: (c["target"], c["outcome"]) for c in
             json.loads((pytester.path / "verify.json").read_text())["checks"]}
    assert where == {"sysctl[vm.swappiness]": ("local", "failed"),
                     "sysctl[net.ipv4.tcp_rmem]": (f"lxc-{name}", "failed")}

    fixed = pytester.runpytest(*args, "--fix", "--gpuhost-report=fix.json")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()[-2000:]
    assert read_inside(lxcpath, name, TCP_RMEM).split() == ["4096", "87380", "67108864"]
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "10"

    back = pytester.runpytest(f"--gpuhost-root={host.root}", f"--gpuhost-target=lxc://{name}",
                              "--gpuhost-rollback", "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()[-2000:]
    assert read_inside(lxcpath, name, TCP_RMEM) == before
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "60"


def test_inside_a_real_container_the_kernels_sysctls_are_not_its_own(
        container: tuple[Path, str]) -> None:
    """What the emulated container assumes, held against the real one: PID 1's environment
    says container=lxc, its cgroup reads ``0::/`` and a kernel sysctl cannot be written."""
    lxcpath, name = container
    assert b"container=lxc" in read_inside(lxcpath, name, "/proc/1/environ").encode()
    assert read_inside(lxcpath, name, "/proc/1/cgroup").splitlines()[-1] == "0::/"
    from pytest_gpuhost.testing.lxc import _lxc

    refused = _lxc(["lxc-attach", "-P", str(lxcpath), "-n", name, "--", "python3", "-c",
                    "open('/proc/sys/vm/swappiness', 'w').write('10')"], 60.0)
    assert refused.returncode != 0
    assert "Read-only file system" in refused.stderr or "Permission denied" in refused.stderr
