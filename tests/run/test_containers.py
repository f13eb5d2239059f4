"""A container and its host checked as one machine, without ssh: ``lxc://101`` of a
fake host tree (``--gpuhost-root``) whose ``usr/bin/lxc-attach`` enters the container's tree
(``testing.lxc``). Its ``kernel`` checks run on the host (``@local``), the rest inside
(``@lxc-101``); a recognised container without its host says where to check."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container, rootfs_of

SPEC = textwrap.dedent("""\
    version: 1
    sysctl:
      vm.swappiness: 10
      net.core.rmem_max: 268435456
      net.ipv4.tcp_rmem: "4096 87380 268435456"
    """)
UNTUNED: dict[str, str | int] = {"vm.swappiness": 60, "net.core.rmem_max": 212992,
                               "net.ipv4.tcp_rmem": "4096 131072 6291456"}
RUN = ("-p", "no:cacheprovider")


def pair(root: Path) -> tuple[FakeHost, FakeHost]:
    host = FakeHost(root).sysctls(UNTUNED)
    return host, lxc_container(host, "101")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def checks(path: Path) -> list[tuple[str, str, str]]:
    report = json.loads(path.read_text())
    return sorted((c["id"], c["target"], c["outcome"]) for c in report["checks"])


def test_a_containers_kernel_checks_run_on_its_host_and_its_own_inside(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host, _ = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--gpuhost-report=r.json",
                                "-v", *RUN)
    result.stdout.fnmatch_lines_random([
        "*::sysctl[[]vm.swappiness]@local FAILED*",
        "*::sysctl[[]net.core.rmem_max]@local FAILED*",
        "*::sysctl[[]net.ipv4.tcp_rmem]@lxc-101 FAILED*"])
    assert checks(pytester.path / "r.json") == [
        ("sysctl[net.core.rmem_max]", "local", "failed"),
        ("sysctl[net.ipv4.tcp_rmem]", "lxc-101", "failed"),
        ("sysctl[vm.swappiness]", "local", "failed")]
    targets = {t["name"]: t for t in json.loads((pytester.path / "r.json").read_text())
               ["targets"]}
    assert targets["lxc-101"]["kernel_on"] == "local"
    assert targets["local"]["specs"] == ["spec"]


def test_the_host_named_too_runs_its_kernel_checks_once(pytester: pytest.Pytester,
                                                        tmp_path: Path) -> None:
    host, _ = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=SPEC)
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                       "--gpuhost-target=local", "--gpuhost-target=lxc://101",
                       "--gpuhost-report=r.json", *RUN)
    assert checks(pytester.path / "r.json") == [
        ("sysctl[net.core.rmem_max]", "local", "failed"),
        ("sysctl[net.ipv4.tcp_rmem]", "local", "failed"),
        ("sysctl[net.ipv4.tcp_rmem]", "lxc-101", "failed"),
        ("sysctl[vm.swappiness]", "local", "failed")]


def test_under_xdist_a_container_pair_runs_each_check_once_where_it_lives(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """With -n 2 the pair's checks are placed across both targets as in a serial run: each
    check runs once, on the machine where its setting lives, and --fix changes each side."""
    pytest.importorskip("xdist")
    host, container = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=SPEC)
    common = (f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
              "--gpuhost-target=lxc://101", *RUN)
    serial = pytester.runpytest(*common, "--gpuhost-report=serial.json")
    assert serial.ret == pytest.ExitCode.TESTS_FAILED, serial.stdout.str()
    spread = pytester.runpytest(*common, "-n", "2", "--gpuhost-report=spread.json")
    assert spread.ret == pytest.ExitCode.TESTS_FAILED, spread.stdout.str()
    assert checks(pytester.path / "spread.json") == checks(pytester.path / "serial.json")
    fixed = pytester.runpytest(*common, "-n", "2", "--fix", "--gpuhost-report=fixed.json")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    assert [outcome for _, _, outcome in checks(pytester.path / "fixed.json")] == ["fixed"] * 3
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "10"
    assert (container.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "87380"
    from pytest_gpuhost.fix.journal import read_journal

    runs = {read_journal(path).run for root in (host.root, container.root)
            for path in (root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl")}
    assert len(runs) == 1 and None not in runs  # the workers' journals name their run


def test_fix_changes_each_setting_where_it_lives_and_rollback_restores_both(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host, container = pair(tmp_path / "pve")
    before = tree(host.root)
    spec = pytester.makefile(".yaml", spec=SPEC)
    args = (f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
            "--gpuhost-target=lxc://101")
    gate = pytester.runpytest(*args, "--gpuhost-gate", *RUN)
    gate.stdout.fnmatch_lines(["*sysctl[[]vm.swappiness]@local*"])
    assert gate.ret != 0
    fixed = pytester.runpytest(*args, "--fix", "--gpuhost-gate", "--gpuhost-report=r.json",
                               *RUN)
    assert fixed.ret == 0, fixed.stdout.str()
    assert {outcome for _, _, outcome in checks(pytester.path / "r.json")} == {"fixed"}
    assert (host.root / "proc/sys/vm/swappiness").read_text().strip() == "10"
    own = container.root / "proc/sys/net/ipv4/tcp_rmem"
    assert own.read_text().split() == ["4096", "87380", "268435456"]
    assert (host.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"
    journals = sorted(str(p.relative_to(host.root)) for p in host.root.rglob("*.jsonl")
                      if "pytest-gpuhost" in str(p))
    assert any(j.startswith(rootfs_of("101")) for j in journals), journals
    assert any(not j.startswith("var/lib/lxc") for j in journals), journals
    back = pytester.runpytest(f"--gpuhost-root={host.root}", "--gpuhost-target=lxc://101",
                              "--gpuhost-rollback", *RUN)
    assert back.ret == 0, back.stdout.str()
    after = tree(host.root)
    changed = sorted(k for k in set(before) | set(after)
                     if before.get(k) != after.get(k) and "pytest-gpuhost" not in k)
    assert changed == []


def test_fix_persist_writes_no_host_file_into_a_container(pytester: pytest.Pytester,
                                                          tmp_path: Path) -> None:
    host, container = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101", "--fix", "--fix-persist",
                                "--gpuhost-report=r.json", *RUN)
    assert result.ret == 0, result.stdout.str()
    inside = sorted(str(p.relative_to(container.root)) for p in
                    (container.root / "etc").rglob("*") if p.is_file())
    assert inside == ["etc/sysctl.d/90-gpuhost-spec.conf"]
    assert "net.ipv4.tcp_rmem" in (container.root / inside[0]).read_text()
    assert "vm.swappiness" not in (container.root / inside[0]).read_text()
    written = (host.root / "etc/sysctl.d/90-gpuhost-spec.conf").read_text()
    assert "vm.swappiness = 10" in written and "net.ipv4.tcp_rmem" not in written
    assert "update-grub" not in result.stdout.str()


def test_a_recognised_container_without_its_host_says_where_to_check(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    _, container = pair(tmp_path / "pve")
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={container.root}",
                                "--gpuhost-report=r.json", "--fix", *RUN)
    outcomes = {c["id"]: (c["outcome"], c["message"]) for c in
                json.loads((pytester.path / "r.json").read_text())["checks"]}
    for key in ("vm.swappiness", "net.core.rmem_max"):
        outcome, message = outcomes[f"sysctl[{key}]"]
        assert outcome == "error"
        assert message.startswith("this is a container: check it where the kernel lives "
                                  "(--gpuhost-host=ssh://HOST); here (PID 1's environment "
                                  "holds container=lxc)")
    assert outcomes["sysctl[net.ipv4.tcp_rmem]"][0] == "fixed"
    assert (container.root / "proc/sys/vm/swappiness").read_text().strip() == "60"
    result.stdout.fnmatch_lines(["*this is a container: check it where the kernel lives*"])


def test_a_container_says_once_first_what_it_cannot_judge_and_offers_no_fix(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """25 failures of the container's own settings come before its host's kernel checks: the
    line that says which option judges those is written once, before every failure block
    (never folded away after 20), and no kernel check offers --fix, which changes none."""
    host = FakeHost(tmp_path / "pve").sysctls({**UNTUNED, **{f"net.ipv4.conf.c{n}.rp_filter": 1
                                                          for n in range(25)}})
    container = lxc_container(host, "101")
    spec = pytester.makefile(".yaml", spec=SPEC + "".join(
        f"  net.ipv4.conf.c{n}.rp_filter: 0\n" for n in range(25)))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={container.root}",
                                "--gpuhost-report=r.json", *RUN)
    lines = result.stdout.lines
    said = [n for n, line in enumerate(lines) if line.startswith("this is a container: 2 of "
                                                                 "its kernel checks")]
    blocks = [n for n, line in enumerate(lines) if line.startswith("____") and "gpuhost check"
              in line]
    assert len(said) == 1 and len(blocks) == 20, result.stdout.str()
    assert said[0] < blocks[0]
    assert "--gpuhost-host=ssh://[USER@]HOST" in lines[said[0]]
    messages = [c["message"] for c in json.loads((pytester.path / "r.json").read_text())
                ["checks"] if c["message"].startswith("this is a container")]
    assert len(messages) == 2
    assert not [m for m in messages if "run with --fix" in m or "--fix-persist" in m]
    assert "(fixable: run with --fix)" in result.stdout.str()  # the container's own still say it


@pytest.mark.parametrize(("cgroup", "held"), [("0::/init.scope\n", False),
                                              ("0::/lxc.payload.101/init.scope\n", True),
                                              ("0::/system.slice/docker-4f.scope\n", True),
                                              ("0::/kubepods.slice/kubepods-pod1.slice\n", True),
                                              ("0::/user.slice/libpod-9a.scope\n", True),
                                              ("0::/\n", False)])
def test_a_container_is_recognised_as_systemd_detect_virt_does(
        tmp_path: Path, cgroup: str, held: bool) -> None:
    from pytest_gpuhost.checks.conditions import container
    from pytest_gpuhost.host import LocalHost

    fake = FakeHost(tmp_path / "r")
    fake.file("proc/1/cgroup", cgroup)
    assert container(LocalHost(fake.root))[0] is held
    for marker, content in (("run/systemd/container", "lxc\n"), (".dockerenv", ""),
                            ("run/.containerenv", ""),
                            ("proc/1/environ", b"PATH=/bin\0container=podman\0")):
        other = FakeHost(tmp_path / marker.replace("/", "_"))
        other.file(marker, content)
        holds, reason = container(LocalHost(other.root))
        assert holds, marker
        assert marker.split("/")[-1].lstrip(".") in reason or "container=" in reason


def test_an_lxc_target_of_ssh_is_a_container_whatever_its_cgroup_says(tmp_path: Path) -> None:
    """``ssh://HOST?lxc=CTID`` whose PID 1 cgroup reads ``0::/init.scope`` is a container by
    construction: its host is ssh://HOST, where its kernel checks go."""
    from pytest_gpuhost.config.targetoptions import place_kernels
    from pytest_gpuhost.config.targets import parse_target

    [container, host] = place_kernels([parse_target("ssh://root@pve?lxc=101")])
    assert container.kernel_on == host.name == "pve"
    assert (host.url, host.container, host.implied) == (
        "ssh://root@pve/", None, "the host of ssh://root@pve?lxc=101")


WHY_SPEC = textwrap.dedent("""\
    version: 1
    sysctl:
      vm.swappiness: {value: 10, why: "keep the model's pages in memory"}
      vm.max_map_count: {min: 65530, why: "the default is enough"}
      net.ipv4.tcp_rmem: "4096 87380 268435456"
    """)


def test_capture_of_a_container_writes_one_spec_that_passes_on_the_same_pair(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host, _ = pair(tmp_path / "pve")
    host.sysctl("vm.max_map_count", 65530)
    spec = pytester.makefile(".yaml", spec=WHY_SPEC)
    pair_args = (f"--gpuhost-root={host.root}", "--gpuhost-target=lxc://101", *RUN)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *pair_args,
                                "--gpuhost-capture=golden.yaml")
    result.stdout.fnmatch_lines([
        "--gpuhost-capture: wrote golden.yaml (what lxc-101 and local held)",
        "--gpuhost-capture: warning: 2 check(s) failed on lxc-101 and local: the capture "
        "records the failing values*"])
    import yaml

    captured = yaml.safe_load((pytester.path / "golden.yaml").read_text())["sysctl"]
    assert captured["vm.swappiness"] == 60  # the failing value, without the why it argued
    assert captured["vm.max_map_count"] == {"min": 65530, "why": "the default is enough"}
    assert captured["net.ipv4.tcp_rmem"] == "4096 131072 6291456"
    again = pytester.runpytest("--gpuhost-spec=golden.yaml", *pair_args,
                               "--gpuhost-report=r.json")
    assert again.ret == pytest.ExitCode.OK, again.stdout.str()[-2000:]
    assert {(i, t) for i, t, _ in checks(pytester.path / "r.json")} == {
        ("sysctl[vm.swappiness]", "local"), ("sysctl[vm.max_map_count]", "local"),
        ("sysctl[net.ipv4.tcp_rmem]", "lxc-101")}


def test_in_a_container_a_boot_fix_is_never_promised(pytester: pytest.Pytester,
                                                      tmp_path: Path) -> None:
    """A kernel command line that lacks a word, with the GRUB drop-in holding it, is
    reboot_required on a machine; in a container without its host it is an error saying where
    to check (a reboot of the container boots no kernel), and --fix-persist writes no GRUB
    drop-in there."""
    _, container = pair(tmp_path / "pve")
    container.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet")
    spec = pytester.makefile(".yaml", spec="version: 1\nkernel:\n  cmdline: {has: [iommu=pt]}\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={container.root}",
                                "--fix", "--fix-persist", "--gpuhost-report=r.json", *RUN)
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert record["outcome"] == "error"
    assert record["message"].startswith("this is a container: check it where the kernel lives")
    assert not (container.root / "etc/default/grub.d").exists()
    assert "update-grub" not in result.stdout.str()


WHEN_SPEC = textwrap.dedent("""\
    version: 1
    sysctl:
      vm.swappiness: {value: 10, when: container}
      vm.max_map_count: {value: 65530, when: not container}
    """)


def test_a_condition_is_asked_of_the_container_the_entry_was_written_for(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """``when: container`` in a container's spec holds there, though its ``kernel`` check runs
    on the host (which is no container): it runs; ``when: not container`` is skipped, saying
    what the container showed."""
    host, _ = pair(tmp_path / "pve")
    host.sysctl("vm.max_map_count", 1)
    spec = pytester.makefile(".yaml", spec=WHEN_SPEC)
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                       "--gpuhost-target=lxc://101", "--gpuhost-report=r.json", *RUN)
    records = {c["id"]: c for c in json.loads((pytester.path / "r.json").read_text())["checks"]}
    swappiness, map_count = records["sysctl[vm.swappiness]"], records["sysctl[vm.max_map_count]"]
    assert (swappiness["target"], swappiness["outcome"]) == ("local", "failed")
    assert (map_count["target"], map_count["outcome"]) == ("local", "skipped")
    assert map_count["message"] == ("when: not container is false: lxc-101: lxc://101 is a "
                                    "container of local")


def test_a_check_of_a_host_and_its_container_runs_where_either_target_asks_for_it(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    """The host named too runs the shared ``kernel`` check once: the container's spec asks for
    it (``when: container`` holds there) though the host's own would skip it."""
    host, _ = pair(tmp_path / "pve")
    host.sysctl("vm.max_map_count", 1)
    spec = pytester.makefile(".yaml", spec=WHEN_SPEC)
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={host.root}",
                       "--gpuhost-target=local", "--gpuhost-target=lxc://101",
                       "--gpuhost-report=r.json", *RUN)
    assert checks(pytester.path / "r.json") == [
        ("sysctl[vm.max_map_count]", "local", "failed"),
        ("sysctl[vm.swappiness]", "local", "failed")]


def test_gpuhost_host_places_local_however_it_enters_the_run() -> None:
    """``local`` implied as ``lxc://101``'s host is still the container ``--gpuhost-host``
    declares: its kernel is pve's, and so, through it, 101's."""
    from pytest_gpuhost.config.targetoptions import place_kernels
    from pytest_gpuhost.config.targets import parse_target

    pve = parse_target("ssh://root@pve/")
    [container, local, host] = place_kernels([parse_target("lxc://101")], host=pve)
    assert (container.kernel_on, local.url, local.kernel_on) == ("local", "local", "pve")
    assert (host.url, host.implied) == ("ssh://root@pve/", "the host of local")


@pytest.mark.parametrize("inside", [True, False], ids=["both-changed", "host-alone-changed"])
def test_a_pairs_rollback_takes_its_own_runs_host_journal(pytester: pytest.Pytester,
                                                          tmp_path: Path, inside: bool) -> None:
    """Container 101 fixed, then container 102 of the same host with another spec: the undo
    the first run printed restores the first run's host change and leaves the second's (the
    host's newest journal is the second run's). The pair's journals share their run's id;
    where the container changed nothing, its host's journal names it among its containers."""
    from pytest_gpuhost.fix.journal import read_journal

    host = FakeHost(tmp_path / "pve").sysctls({**UNTUNED, "vm.dirty_ratio": 20})
    first, second = lxc_container(host, "101"), lxc_container(host, "102")
    spec = pytester.makefile(".yaml", spec=SPEC if inside else
                             "version: 1\nsysctl:\n  vm.swappiness: 10\n")
    other = pytester.makefile(".yaml", other="version: 1\nsysctl:\n  vm.dirty_ratio: 5\n"
                              "  net.ipv4.tcp_rmem: \"4096 87380 268435456\"\n")
    root = f"--gpuhost-root={host.root}"
    one = pytester.runpytest(f"--gpuhost-spec={spec}", root, "--gpuhost-target=lxc://101",
                             "--fix", *RUN)
    assert one.ret == 0, one.stdout.str()
    journal = "var/lib/pytest-gpuhost/journal"
    [host_journal] = [read_journal(p) for p in (host.root / journal).glob("*.jsonl")]
    assert host_journal.run is not None and host_journal.containers == ("lxc://101",)
    own = [read_journal(p) for p in (first.root / journal).glob("*.jsonl")]
    assert [j.run for j in own] == ([host_journal.run] if inside else [])
    if inside:
        one.stdout.fnmatch_lines([f"undo: --gpuhost-rollback --gpuhost-root={host.root} "
                                  "--gpuhost-target=lxc://101 (*)"])
    two = pytester.runpytest(f"--gpuhost-spec={other}", root, "--gpuhost-target=lxc://102",
                             "--fix", *RUN)
    assert two.ret == 0, two.stdout.str()
    sysctl = host.root / "proc/sys/vm"
    assert (sysctl / "swappiness").read_text().strip() == "10"
    assert (sysctl / "dirty_ratio").read_text().strip() == "5"
    back = pytester.runpytest(root, "--gpuhost-target=lxc://101", "--gpuhost-rollback", *RUN)
    assert back.ret == 0, back.stdout.str()
    assert (sysctl / "swappiness").read_text().strip() == "60"  # the first run's, undone
    assert (sysctl / "dirty_ratio").read_text().strip() == "5"  # the second run's, kept
    assert (first.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "131072"
    assert (second.root / "proc/sys/net/ipv4/tcp_rmem").read_text().split()[1] == "87380"
