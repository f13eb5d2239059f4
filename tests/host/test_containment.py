"""Nothing outside the root: every read, write, listing and command resolves inside it.

Each case runs twice, with the kernel's openat2(RESOLVE_IN_ROOT) and with the portable walk a
kernel without openat2 gets. A canary outside the tree proves that nothing there was read as the
host's value, written or run.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.host import Glob, HostError, Kmsg, LocalHost, Read, Stat
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import counts, snapshot


@pytest.fixture(params=["openat2", "walk"])
def resolution(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def host(fake: FakeHost, resolution: str) -> LocalHost:
    return LocalHost(fake.root, prefer_openat2=resolution == "openat2")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory beside the tree with a canary file, as the real /proc/sys value would be."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "canary").write_text("60\n")
    (directory / "script").write_text("#!/bin/sh\ntouch \"$0.ran\"\n")
    (directory / "script").chmod(0o755)
    return directory


def _link(fake: FakeHost, path: str, target: str | Path) -> None:
    link = fake.root / path
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)


def test_an_absolute_link_resolves_under_the_root(fake: FakeHost, host: LocalHost,
                                                  outside: Path) -> None:
    _link(fake, "proc/sys/vm/swappiness", outside / "canary")
    with pytest.raises(HostError, match="No such file"):
        host.read_text("proc/sys/vm/swappiness")
    fake.file(str(outside / "canary").lstrip("/"), "10\n")  # the same path, inside the tree
    assert host.read_text("proc/sys/vm/swappiness") == "10\n"
    host.write_text("proc/sys/vm/swappiness", "0\n")
    assert (outside / "canary").read_text() == "60\n"


def test_dot_dot_in_a_link_stops_at_the_root(fake: FakeHost, host: LocalHost,
                                             outside: Path) -> None:
    depth = len(fake.root.parts) + 3
    _link(fake, "proc/sys/vm/swappiness", "../" * depth + str(outside / "canary").lstrip("/"))
    with pytest.raises(HostError, match="No such file"):
        host.write_text("proc/sys/vm/swappiness", "0\n")
    assert (outside / "canary").read_text() == "60\n"
    assert not host.exists("proc/sys/vm/swappiness")


def test_relative_sysfs_links_inside_the_root_work(fake: FakeHost, host: LocalHost) -> None:
    real = "sys/devices/pci0000:00/0000:00:01.1/0000:01:00.0"
    fake.file(f"{real}/vendor", "0x10de\n")
    _link(fake, "sys/bus/pci/devices/0000:01:00.0", "../../../devices/pci0000:00/0000:00:01.1/"
                                                     "0000:01:00.0")
    assert host.read_text("sys/bus/pci/devices/0000:01:00.0/vendor") == "0x10de\n"
    assert host.listdir("sys/bus/pci/devices/0000:01:00.0") == ["vendor"]
    [(path, data)] = host.glob("sys/bus/pci/devices/*/vendor")
    assert (path, data) == ("sys/bus/pci/devices/0000:01:00.0/vendor", b"0x10de\n")


def test_a_device_link_chain_that_ends_outside_is_not_followed_out(
        fake: FakeHost, host: LocalHost, outside: Path) -> None:
    (outside / "device").mkdir()
    (outside / "device" / "config").write_bytes(b"\x00" * 256)
    _link(fake, "sys/devices/hop", outside / "device")
    _link(fake, "sys/bus/pci/devices/0000:01:00.0", "../../../devices/hop")
    with pytest.raises(HostError):
        host.write_bytes("sys/bus/pci/devices/0000:01:00.0/config", b"\xff\xff", 0x10)
    assert (outside / "device" / "config").read_bytes() == b"\x00" * 256


def test_a_link_loop_is_an_error(fake: FakeHost, host: LocalHost) -> None:
    _link(fake, "a", "b")
    _link(fake, "b", "a")
    with pytest.raises(HostError, match=r"symbolic links|ELOOP"):
        host.read_text("a")
    assert not host.exists("a")


def test_a_link_to_the_root_itself_stays_in_it(fake: FakeHost, host: LocalHost) -> None:
    fake.file("etc/hostname", "node\n")
    _link(fake, "up", "/")
    _link(fake, "dots", "../..")
    assert host.read_text("up/etc/hostname") == "node\n"
    assert host.read_text("dots/etc/hostname") == "node\n"


def test_replace_file_through_a_linked_directory_stays_inside(
        fake: FakeHost, host: LocalHost, outside: Path) -> None:
    _link(fake, "etc", outside)
    with pytest.raises(HostError, match=r"symbolic link to .*does not exist under the root"):
        host.replace_file("etc/sysctl.d/90-gpuhost.conf", "vm.swappiness = 10\n")
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "script"]
    inside = fake.root / str(outside).lstrip("/")
    inside.mkdir(parents=True)  # the link's target, under the root: written there
    host.replace_file("etc/sysctl.d/90-gpuhost.conf", "vm.swappiness = 10\n")
    assert (inside / "sysctl.d" / "90-gpuhost.conf").read_text() == "vm.swappiness = 10\n"
    assert sorted(p.name for p in outside.iterdir()) == ["canary", "script"]


def test_replace_file_never_replaces_a_link_or_a_device(fake: FakeHost, host: LocalHost,
                                                       outside: Path) -> None:
    _link(fake, "etc/sysctl.d/90-gpuhost.conf", outside / "canary")
    with pytest.raises(HostError, match="symbolic link; pytest-gpuhost replaces only files"):
        host.replace_file("etc/sysctl.d/90-gpuhost.conf", "x\n")
    assert (fake.root / "etc/sysctl.d/90-gpuhost.conf").is_symlink()
    os.mkfifo(fake.root / "etc/fifo")
    with pytest.raises(HostError, match="FIFO"):
        host.replace_file("etc/fifo", "x\n")


def test_remove_never_removes_what_a_link_points_to(fake: FakeHost, host: LocalHost,
                                                     outside: Path) -> None:
    _link(fake, "etc/modprobe.d/gpuhost.conf", outside / "canary")
    with pytest.raises(HostError, match="symbolic link"):
        host.remove("etc/modprobe.d/gpuhost.conf")
    assert (outside / "canary").exists()


@pytest.mark.parametrize("target", ["outside-script", "/bin/sh", "/usr/bin/env"])
def test_commands_linked_out_of_the_root_are_not_found(fake: FakeHost, host: LocalHost,
                                                       outside: Path, target: str) -> None:
    _link(fake, "usr/sbin/modprobe", outside / "script" if target == "outside-script" else target)
    assert host.which("modprobe") is None
    with pytest.raises(HostError, match="modprobe not found"):
        host.run(["modprobe", "--", "nvidia"])
    assert not (outside / "script.ran").exists()


def test_a_command_linked_inside_the_root_runs(fake: FakeHost, host: LocalHost) -> None:
    fake.file("bin/kmod", "#!/bin/sh\necho \"kmod $*\"\n", mode=0o755)
    _link(fake, "usr/sbin/modprobe", "/bin/kmod")
    found = host.which("modprobe")
    assert found == str((fake.root / "bin/kmod").resolve())
    assert host.run(["modprobe", "nvidia"]).stdout == "kmod nvidia\n"


def test_a_fifo_in_place_of_a_sysctl_is_an_error_not_a_hang(fake: FakeHost,
                                                            host: LocalHost) -> None:
    (fake.root / "proc/sys/vm").mkdir(parents=True)
    os.mkfifo(fake.root / "proc/sys/vm/swappiness")
    with pytest.raises(HostError, match="it is a FIFO, not a file"):
        host.read_text("proc/sys/vm/swappiness")
    with pytest.raises(HostError):
        host.write_text("proc/sys/vm/swappiness", "10\n")
    [reply] = host.batch([Read("proc/sys/vm/swappiness")])
    assert reply.error is not None and "FIFO" in str(reply.error)


def test_a_fifo_in_place_of_a_journal_is_an_error_not_a_hang(fake: FakeHost,
                                                             host: LocalHost) -> None:
    """An append opens the state file without waiting for a reader: a FIFO where the journal
    should be (planted where another user can write, a shared xdist journal that "exists
    already") is refused as not pytest-gpuhost's own file, never waited on forever."""
    import threading

    (fake.root / "var/lib/pytest-gpuhost/journal").mkdir(parents=True)
    fifo = fake.root / "var/lib/pytest-gpuhost/journal/x.jsonl"
    os.mkfifo(fifo)
    raised: list[BaseException] = []

    def append() -> None:
        try:
            host.append_file("var/lib/pytest-gpuhost/journal/x.jsonl", b"{}\n")
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    worker = threading.Thread(target=append, daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # a reader lets the blocked open go on, so the thread ends
        with open(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK), "rb"):
            worker.join(5)
        pytest.fail("append_file waited for a reader of a FIFO")
    assert raised and isinstance(raised[0], HostError)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_journal_another_user_made_first_gets_no_line(fake: FakeHost, host: LocalHost) -> None:
    """The journal xdist workers share "exists already" when one of them made it; one that
    another user planted first (--gpuhost-journal=/tmp/...) is refused, its lines left out of
    any rollback."""
    from pytest_gpuhost.checks.changes import WriteText
    from pytest_gpuhost.fix.journal import Journal
    from pytest_gpuhost.fix.state import StateFile

    planted = fake.root / "tmp/j.jsonl"
    planted.parent.mkdir()
    planted.write_text('{"event": "header"}\n')
    os.chown(planted, 12345, 12345)
    journal = Journal(StateFile(host, "tmp/j.jsonl", "tmp/j.jsonl"), "spec", shared=True)
    with pytest.raises(HostError, match=r"belongs to uid 12345, not to this run's user"):
        journal.record("sysctl[vm.swappiness]", "sysctl", "vm.swappiness",
                       WriteText("proc/sys/vm/swappiness", "60\n", "10\n"))
    assert planted.read_text() == '{"event": "header"}\n'


def test_kmsg_as_a_fifo_or_a_directory_is_refused(fake: FakeHost, host: LocalHost) -> None:
    (fake.root / "dev").mkdir()
    os.mkfifo(fake.root / "dev/kmsg")
    with pytest.raises(HostError, match="FIFO, not the kernel log"):
        host.read_kmsg()


def test_kmsg_linked_to_dev_zero_resolves_inside_the_tree(fake: FakeHost,
                                                          host: LocalHost) -> None:
    _link(fake, "dev/kmsg", "/dev/zero")
    with pytest.raises(HostError, match="No such file"):
        host.read_kmsg()


def test_reads_are_bounded(fake: FakeHost, host: LocalHost) -> None:
    fake.file("proc/modules", "x" * 5000)
    [reply] = host.batch([Read("proc/modules", limit=4096)])
    assert reply.error is not None and "larger than 4096 bytes" in str(reply.error)
    fake.file("dev/kmsg", "6,1,0,-;hello\n" * 1000)
    [kmsg] = host.batch([Kmsg(limit=1024)])
    assert kmsg.error is not None and "larger than 1024 bytes" in str(kmsg.error)


def test_a_directory_in_place_of_a_file_is_an_error(fake: FakeHost, host: LocalHost) -> None:
    (fake.root / "proc/sys/vm/swappiness").mkdir(parents=True)
    with pytest.raises(HostError, match="directory, not a file"):
        host.read_text("proc/sys/vm/swappiness")


def test_a_batch_answers_each_request_on_its_own(fake: FakeHost, host: LocalHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    replies = host.batch([Read("proc/sys/vm/swappiness"), Read("proc/sys/vm/nope"),
                          Stat("proc/sys/vm"), Glob("proc/sys/*/swappiness")])
    assert replies[0].text() == "60\n"
    assert replies[1].missing
    assert replies[2].info().type == "directory"
    assert [path for path, _ in replies[3].matches()] == ["proc/sys/vm/swappiness"]


@pytest.mark.parametrize("path", ["../etc/passwd", "proc/../../x", "/etc/passwd", "a\0b"])
def test_requests_that_name_paths_outside_are_refused(host: LocalHost, path: str) -> None:
    with pytest.raises(HostError, match=r"leave the host root|absolute|NUL"):
        host.batch([Read(path)])


# -- whole runs ---------------------------------------------------------------------------------


def _linked_out_tree(fake: FakeHost, outside: Path) -> None:
    """A copied tree whose files are absolute links to the machine's own (proc -> /proc)."""
    fake.cpus(2, states=("POLL", "C1", "C2"))
    fake.gpu("0000:01:00.0")
    (outside / "disable").write_text("0\n")
    (outside / "config").write_bytes(b"\x00" * 4096)
    _link(fake, "proc/sys/vm/swappiness", outside / "canary")
    (fake.root / "sys/devices/system/cpu/cpu0/cpuidle/state2/disable").unlink()
    _link(fake, "sys/devices/system/cpu/cpu0/cpuidle/state2/disable", outside / "disable")
    config = fake.root / "sys/bus/pci/devices/0000:01:00.0/config"
    config.unlink()
    config.symlink_to(outside / "config")
    fake.file("bin/true", "")
    _link(fake, "usr/sbin/modprobe", outside / "script")


def test_a_fix_run_on_a_tree_linked_out_changes_nothing_outside(
        pytester: pytest.Pytester, fake: FakeHost, outside: Path) -> None:
    _linked_out_tree(fake, outside)
    spec = pytester.makefile(".yaml", spec=textwrap.dedent("""\
        version: 1
        sysctl:
          vm.swappiness: 10
        pcie:
          max_read_request: 4096
        cpuidle:
          disabled: [C2]
        modules:
          nvidia: loaded
        """))
    before = snapshot(outside)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={fake.root}", "--fix",
                                "-p", "no:cacheprovider")
    assert snapshot(outside) == before
    assert counts(result).get("fixed", 0) == 0
    output = result.stdout.str()
    assert "module[nvidia]" in output and "modprobe not found" in output
    assert result.ret == 1


# -- pytest-gpuhost's own files: locks and journals ----------------------------------------------

SWAPPINESS = "version: 1\nsysctl:\n  vm.swappiness: 10\n"


def _fix(pytester: pytest.Pytester, fake: FakeHost) -> pytest.RunResult:
    spec = pytester.makefile(".yaml", spec=SWAPPINESS)
    return pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={fake.root}", "--fix",
                              "--gpuhost-lock-timeout=0", "-p", "no:cacheprovider")


def test_a_lock_file_linked_out_is_never_opened_through_the_link(
        pytester: pytest.Pytester, fake: FakeHost, outside: Path) -> None:
    fake.sysctl("vm.swappiness", 60)
    _link(fake, "var/lib/pytest-gpuhost/run.lock", outside / "canary")
    result = _fix(pytester, fake)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*cannot take the run lock *run.lock*"])
    assert (outside / "canary").read_text() == "60\n"
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"  # nothing was fixed


def test_a_lock_file_hard_linked_to_another_file_is_left_alone(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    victim = fake.file("etc/shadow", "root:x:\n")
    (fake.root / "var/lib/pytest-gpuhost").mkdir(parents=True)
    os.link(victim, fake.root / "var/lib/pytest-gpuhost/run.lock")
    result = _fix(pytester, fake)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*file with 2 hard links, not pytest-gpuhost's own file*"])
    assert victim.read_text() == "root:x:\n"


def test_a_lock_file_that_holds_something_else_is_not_truncated(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    lock = fake.file("var/lib/pytest-gpuhost/run.lock", "important\n")
    result = _fix(pytester, fake)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    result.stdout.fnmatch_lines(["*holds something else than a pytest-gpuhost lock*"])
    assert lock.read_text() == "important\n"


def test_a_journal_directory_linked_out_stays_inside_the_root(
        pytester: pytest.Pytester, fake: FakeHost, outside: Path) -> None:
    fake.sysctl("vm.swappiness", 60)
    _link(fake, "var/lib/pytest-gpuhost/journal", outside)
    before = sorted(p.name for p in outside.iterdir())
    result = _fix(pytester, fake)
    assert sorted(p.name for p in outside.iterdir()) == before
    # the link's target does not exist under the root: the change is not made unjournaled
    result.stdout.fnmatch_lines(["*symbolic link to *, which does not exist under the root*"])
    assert (fake.root / "proc/sys/vm/swappiness").read_text() == "60\n"
