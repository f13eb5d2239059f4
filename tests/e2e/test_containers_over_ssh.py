"""A container pair over ssh: from inside a container, one command checks (and fixes) each setting
where it lives, over the tests' real sshd on 127.0.0.1: the emulated Proxmox host ``pve`` is a
copy of the example host tree, its container 101 a tree under it as LXC shows one (``/proc/sys``
of the host's kernel but its own ``net.*``, 64-byte config spaces, the host's kmsg; see
``testing.lxc``). ``--gpuhost-host`` sends the container's ``kernel`` checks to the host."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from pytest_gpuhost.checks.memory import THP, THP_MODES
from pytest_gpuhost.gpu.nvmlrecorded import FakeGpu
from pytest_gpuhost.linux.sysfs import bracketed
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.fakenvml import compiler, nvml_library, nvml_state
from pytest_gpuhost.testing.lxc import existing_host, lxc_container, rootfs_of
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import BLACKWELL8, NEEDS_OPENSSH

pytestmark = NEEDS_OPENSSH

BENCH = "def test_bench_a():\n    pass\n\ndef test_bench_b():\n    pass\n"


def runtime_spec(path: Path) -> Path:
    """blackwell8 less what only a boot fixes (as tests/plugin/test_gate.py's runtime_only),
    plus a sysctl of the container's own network namespace."""
    data = yaml.safe_load(BLACKWELL8.read_text())
    for section in ("kernel", "iommu"):
        del data[section]
    del data["cpufreq"]["driver"]
    del data["modules"]["nvidia_uvm"]["parameters"]
    data["sysctl"]["net.ipv4.tcp_rmem"] = "4096 87380 268435456"
    path.write_text(yaml.safe_dump(data))
    return path


def tree(root: Path) -> dict[str, bytes]:
    """Every file's bytes but the run's own state (journals, locks)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and "pytest-gpuhost" not in p.parts}


def test_one_command_from_the_container_gates_fixes_and_rolls_back_both_sides(
        pytester: pytest.Pytester, sshd: SshServer, example_host: Path) -> None:
    shutil.rmtree(example_host / "sys/class/infiniband")  # peermem is then not applicable
    host = existing_host(example_host)
    container = lxc_container(host, "101", link=False)
    (container.root / "proc/sys/net/ipv4").mkdir(parents=True, exist_ok=True)
    (container.root / "proc/sys/net/ipv4/tcp_rmem").write_text("4096\t131072\t6291456\n")
    before_host, before_container = tree(host.root), tree(container.root)
    spec = runtime_spec(pytester.path / "blackwell8.yaml")
    pytester.makepyfile(test_bench=BENCH)
    command = ("test_bench.py", f"--gpuhost-spec={spec}", f"--gpuhost-root={container.root}",
               f"--gpuhost-host={sshd.url(host.root)}",
               f"--gpuhost-ssh-config={sshd.client_config}", "--gpuhost-gate",
               "-p", "no:cacheprovider")

    closed = pytester.runpytest(*command, "--gpuhost-report=closed.json",
                                "--junitxml=closed.xml")
    assert closed.ret == pytest.ExitCode.TESTS_FAILED
    closed.stdout.fnmatch_lines([f"*gpuhost gate closed: * host checks failed: *@{sshd.alias} "
                                 "(failed)*"])
    placed = once_each(pytester.path / "closed.json")
    cases = [case.get("name") for case in
             ElementTree.parse(pytester.path / "closed.xml").iter("testcase")]
    assert len(cases) == len(set(cases)) == len(placed) + 2  # and the two benchmarks
    for check, target in placed.items():  # each with its target, once
        assert sum(f"{check}@{target}" in str(name) for name in cases) == 1, check
    assert placed["sysctl[vm.swappiness]"] == sshd.alias
    assert placed["sysctl[net.core.rmem_max]"] == sshd.alias  # global: the host's
    assert placed["sysctl[net.ipv4.tcp_rmem]"] == "local"
    assert {target for check, target in placed.items() if check.startswith("pcie")} == {
        sshd.alias}  # the container reads 64-byte config spaces: checked on the host

    opened = pytester.runpytest(*command, "--fix", "--gpuhost-report=fixed.json")
    assert opened.ret == pytest.ExitCode.OK, opened.stdout.str()[-3000:]
    opened.stdout.fnmatch_lines_random([
        f"journal of {sshd.alias}: /*/var/lib/pytest-gpuhost/journal/*.jsonl",
        "journal of local: */var/lib/pytest-gpuhost/journal/*.jsonl",
        f"undo: --gpuhost-rollback --gpuhost-root={container.root} "
        f"--gpuhost-host={sshd.url(host.root)} --gpuhost-ssh-config=* (*)"])
    assert not [line for line in opened.outlines  # a path on its target, never its URL glued on
                if line.startswith("journal of") and "ssh://" in line]
    fixed = once_each(pytester.path / "fixed.json")
    assert fixed == placed
    assert tree(host.root) != before_host and tree(container.root) != before_container
    assert not (container.root / "etc/default/grub.d").exists()
    assert not (container.root / "etc/modprobe.d").exists()
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "87380"

    [undo] = [line for line in opened.outlines if line.startswith("undo: ")]
    back = pytester.runpytest(*shlex.split(undo.removeprefix("undo: ").rsplit(" (", 1)[0]),
                              "-p", "no:cacheprovider")  # the undo as printed (the host as given)
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()[-3000:]
    back.stdout.fnmatch_lines_random(["rollback: * is closed", "rollback: * is closed"])
    assert tree(container.root) == before_container
    assert diff(tree(host.root), before_host) == []
    journals = [p for p in host.root.rglob("*.jsonl") if "pytest-gpuhost" in p.parts]
    assert any(rootfs_of("101") in str(p) for p in journals)
    assert any(rootfs_of("101") not in str(p) for p in journals)


def once_each(report: Path) -> dict[str, str]:
    """Each check's target, every check exactly once in the report, each with its target."""
    checks = json.loads(report.read_text())["checks"]
    ids = [c["id"] for c in checks]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert all(c["target"] for c in checks)
    return {c["id"]: c["target"] for c in checks}


def diff(after: dict[str, bytes], before: dict[str, bytes]) -> list[str]:
    """The files that differ (the container's tree excluded: compared on its own; the kernel
    log too: the fake modprobe logs there as the kernel does, and a log is no setting). THP is
    compared by its selected mode: a rollback writes back the word the kernel takes
    (``always``), which a kernel shows as ``[always] madvise never`` and a fake tree as
    written."""
    def same(key: str) -> bool:
        if key == THP and key in after and key in before:
            return bracketed(after[key].decode(), THP_MODES) == \
                bracketed(before[key].decode(), THP_MODES)
        return after.get(key) == before.get(key)

    return sorted(k for k in set(after) | set(before) if not same(k)
                  and not k.startswith("var/lib/lxc/") and k != "dev/kmsg")


@pytest.mark.skipif(compiler() is None, reason="no C compiler (cc) on this machine to build the "
                    "fake libnvidia-ml.so.1 with")
def test_nvml_facts_and_fixes_of_an_ssh_target_come_from_its_own_library(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """The agent on the target loads the target's libnvidia-ml.so.1 (under its root) with
    ctypes: its GPUs are read and fixed there, not skipped as before."""
    host = FakeHost(tmp_path / "pve")
    gpus = {"0000:01:00.0": FakeGpu(power_limit=450_000)}
    host.gpu("0000:01:00.0")
    state = nvml_library(host, gpus)
    spec = pytester.makefile(".yaml", spec="version: 1\ngpus:\n  persistence_mode: enabled\n"
                                           "  power_limit: {min: 600}\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(host.root)}",
                                f"--gpuhost-ssh-config={sshd.client_config}", "--fix",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    outcomes = {c["id"]: c["outcome"] for c in
                json.loads((pytester.path / "r.json").read_text())["checks"]}
    assert outcomes["gpus.persistence_mode[0000:01:00.0]"] == "fixed", result.stdout.str()
    assert outcomes["gpus.power_limit[0000:01:00.0]"] == "fixed"
    assert nvml_state(state)["0000:01:00.0"]["persistence_mode"] == 1
    assert nvml_state(state)["0000:01:00.0"]["power_limit"] == 600_000


def test_an_lxc_target_whose_pid1_cgroup_says_init_scope_is_a_container(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """``ssh://HOST?lxc=CTID`` is a container by construction: ``when: container`` holds on it
    though nothing inside says so (PID 1's cgroup ``0::/init.scope``, no ``container=``)."""
    host = FakeHost(tmp_path / "pve").sysctl("net.ipv4.tcp_rmem", "4096 87380 268435456")
    container = lxc_container(host, "101")
    container.file("proc/1/environ", b"PATH=/usr/bin:/bin\0")
    container.file("proc/1/cgroup", "0::/init.scope\n")
    spec = pytester.makefile(".yaml", spec='version: 1\nsysctl:\n  net.ipv4.tcp_rmem: '
                                           '{value: "4096 87380 268435456", when: container}\n')
    pytester.runpytest(f"--gpuhost-spec={spec}",
                       f"--gpuhost-target={sshd.url(host.root, query='?lxc=101')}",
                       f"--gpuhost-ssh-config={sshd.client_config}",
                       "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert (record["target"], record["outcome"]) == (f"{sshd.alias}-lxc-101", "passed")


def test_the_host_named_by_gpuhost_host_holds_where_local_is_only_a_containers_host(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """``--gpuhost-host=ssh://pve`` with ``--gpuhost-target=lxc://101`` only: ``local`` enters the
    run as the container's host, and is still the declared container of pve. The kernel's
    setting is fixed on pve, over ssh, never in local's tree nor in 101's; the container's own
    ``net.*`` one in 101; its ``when: container``, asked of 101, holds."""
    pve = FakeHost(tmp_path / "pve").sysctl("vm.swappiness", 60)
    local = FakeHost(tmp_path / "local").sysctls({"vm.swappiness": 60,
                                                  "net.ipv4.tcp_rmem": "4096 131072 6291456"})
    container = lxc_container(local, "101", link=False)
    before_local = tree(local.root)
    spec = pytester.makefile(".yaml", spec='version: 1\nsysctl:\n'
                                           '  vm.swappiness: {value: 10, when: container}\n'
                                           '  net.ipv4.tcp_rmem: "4096 87380 268435456"\n')
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={local.root}",
                                f"--gpuhost-host={sshd.url(pve.root)}",
                                f"--gpuhost-ssh-config={sshd.client_config}",
                                "--gpuhost-target=lxc://101", "--fix",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-3000:]
    assert once_each(pytester.path / "r.json") == {"sysctl[vm.swappiness]": sshd.alias,
                                                   "sysctl[net.ipv4.tcp_rmem]": "lxc-101"}
    assert (pve.root / "proc/sys/vm/swappiness").read_text().strip() == "10"
    assert (container.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    changed = [k for k in diff(tree(local.root), before_local)]
    assert changed == [], changed  # the container's tree (var/lib/lxc) is compared apart
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "87380"
    # one undo for the three (the container, its host local, local's host pve), as given
    result.stdout.fnmatch_lines([
        f"undo: --gpuhost-rollback --gpuhost-root={local.root} --gpuhost-target=lxc://101 "
        f"--gpuhost-host={sshd.url(pve.root)} --gpuhost-ssh-config=* (*)"])
    [undo] = [line for line in result.outlines if line.startswith("undo: ")]
    back = pytester.runpytest(*shlex.split(undo.removeprefix("undo: ").rsplit(" (", 1)[0]),
                              "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()[-3000:]
    assert (pve.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"


@pytest.mark.parametrize("side", ["container", "host"])
def test_an_ssh_containers_journal_and_undo_as_the_run_was_given(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, side: str) -> None:
    """``ssh://HOST/ROOT?lxc=101``: a container's journal by its path inside and by its host's
    (``ROOT/var/lib/lxc/101/rootfs/...``, a file there), the host's by its path on the host;
    the undo names the target as given and restores what the run changed."""
    host = FakeHost(tmp_path / "pve").sysctls({"vm.swappiness": 60,
                                               "net.ipv4.tcp_rmem": "4096 131072 6291456"})
    container = lxc_container(host, "101")
    entry = "net.ipv4.tcp_rmem: \"4096 87380 268435456\"" if side == "container" else \
        "vm.swappiness: 10"
    spec = pytester.makefile(".yaml", spec=f"version: 1\nsysctl:\n  {entry}\n")
    url = sshd.url(host.root, query="?lxc=101")
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-target={url}",
                               f"--gpuhost-ssh-config={sshd.client_config}", "--fix",
                               "-p", "no:cacheprovider")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()[-3000:]
    journals = "var/lib/pytest-gpuhost/journal"
    if side == "container":
        [journal] = (container.root / journals).glob("*.jsonl")
        on_host = host.root / rootfs_of("101") / journals / journal.name
        assert on_host.is_file()
        fixed.stdout.fnmatch_lines([
            f"journal of {sshd.alias}-lxc-101: /{journals}/{journal.name} (on {sshd.alias}: "
            f"{on_host})",
            f"undo: --gpuhost-rollback={journal.name} --gpuhost-target={url} "
            "--gpuhost-ssh-config=* (its host had nothing to change)"])
    else:
        [journal] = (host.root / journals).glob("*.jsonl")
        fixed.stdout.fnmatch_lines([f"journal of {sshd.alias}: {journal}",
                                    f"undo: --gpuhost-rollback --gpuhost-target={url} "
                                    "--gpuhost-ssh-config=* (*)"])
    [undo] = [line for line in fixed.outlines if line.startswith("undo: ")]
    back = pytester.runpytest(*shlex.split(undo.removeprefix("undo: ").rsplit(" (", 1)[0]),
                              "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()[-3000:]
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"
    assert "pytest-gpuhost-rollback-" not in back.stdout.str()  # never the temporary copy


def test_local_under_gpuhost_host_is_a_container_for_when(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """``--gpuhost-host`` declares ``local`` a container: ``when: container`` holds there though
    nothing in its tree says so (a cgroup namespace, no ``container=``)."""
    pve = FakeHost(tmp_path / "pve")
    local = FakeHost(tmp_path / "local").sysctl("net.ipv4.tcp_rmem", "4096 87380 268435456")
    local.file("proc/1/cgroup", "0::/\n")
    spec = pytester.makefile(".yaml", spec='version: 1\nsysctl:\n  net.ipv4.tcp_rmem: '
                                           '{value: "4096 87380 268435456", when: container}\n')
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={local.root}",
                       f"--gpuhost-host={sshd.url(pve.root)}",
                       f"--gpuhost-ssh-config={sshd.client_config}",
                       "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert (record["target"], record["outcome"]) == ("local", "passed"), record["message"]
