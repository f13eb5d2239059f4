"""A --fix run interrupted while its command runs (SIGTERM from ``timeout``,
systemd, Slurm or CI; SIGHUP from a closed terminal; Ctrl-C) kills that command's process group,
journals the change ``unknown`` and leaves the journal open; a rollback judges nothing while a
command a run started may still be making its change (it waits for the target's lock, which the
command holds until it ends)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gpuhost.fix.journal import read_journal
from pytest_gpuhost.testing.fakehost import FakeHost

from ..blocking import LIMIT_S, SIGNALS, Blocked, gone, journal_of, start_fix, until
from ..conftest import counts


@pytest.fixture
def blocked(fake: FakeHost) -> Iterator[Blocked]:
    made = Blocked(fake)
    yield made
    made.cleanup()


def start_local_fix(pytester: pytest.Pytester, root: Path) -> subprocess.Popen[bytes]:
    return start_fix(pytester, f"--gpuhost-root={root}", "--gpuhost-report=out.json")


@pytest.mark.parametrize("signum", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_during_a_fix_kills_its_command_and_leaves_the_change_unknown(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked,
        signum: signal.Signals) -> None:
    run = start_local_fix(pytester, fake.root)
    modprobe = blocked.started()
    run.send_signal(signum)
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe's group ending")
    blocked.release()  # a modprobe still running would load the module now: none does
    assert not blocked.loaded()
    contents = read_journal(journal_of(fake.root))
    [entry] = contents.entries
    assert entry.state == "unknown"
    why = "KeyboardInterrupt" if signum == signal.SIGINT else f"{signum.name} received"
    assert entry.error is not None and entry.error.startswith(
        f"the run was interrupted ({why}) during run modprobe -- nvidia (absent -> loaded); "
        "what it did is unknown")
    assert not contents.rolled_back
    assert f"(undo: --gpuhost-rollback={journal_of(fake.root)} --gpuhost-root={fake.root})" \
        in said
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("module[nvidia]", "error")
    assert "interrupted" in check["message"]


def test_a_rollback_judges_nothing_while_a_killed_run_s_command_still_runs(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked) -> None:
    """SIGKILL (the OOM killer, systemd's last word) unwinds nothing: the run's modprobe goes
    on. It holds the run lock it inherited, so a rollback waits for it instead of judging the
    change "never made" and closing the journal before the module loads."""
    run = start_local_fix(pytester, fake.root)
    modprobe = blocked.started()
    run.kill()
    run.communicate(timeout=LIMIT_S)
    assert not gone(modprobe)  # still loading, its run gone
    early = pytester.runpytest_subprocess(f"--gpuhost-root={fake.root}", "--gpuhost-rollback",
                                          "--gpuhost-lock-timeout=0.5", "-p", "no:cacheprovider")
    assert early.ret == pytest.ExitCode.INTERRUPTED
    assert "--gpuhost-rollback: another pytest-gpuhost run holds the run lock" in \
        early.stderr.str()
    assert "keeps it until that command ends" in early.stderr.str()
    contents = read_journal(journal_of(fake.root))
    assert not contents.rolled_back and [e.state for e in contents.entries] == ["pending"]
    blocked.release()
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe ending")
    assert blocked.loaded()  # the change landed after its run was gone
    rollback = pytester.runpytest(f"--gpuhost-root={fake.root}", "--gpuhost-rollback",
                                  "-p", "no:cacheprovider")
    assert rollback.ret == pytest.ExitCode.OK
    assert counts(rollback) == {"fixed": 1}
    assert not blocked.loaded()
    assert read_journal(journal_of(fake.root)).rolled_back


@pytest.mark.parametrize("signum", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_to_the_xdist_controller_alone_stops_the_worker_s_command(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked,
        signum: signal.Signals) -> None:
    """``kill PID``, ``docker stop`` with pytest as PID 1: the signal reaches the controller
    and no worker. The worker running the fix gets it too, at once: its command's group is
    killed and the change journaled ``unknown`` for that signal (not xdist's SIGINT seconds
    later, while the worker went on with its checks)."""
    run = start_fix(pytester, f"--gpuhost-root={fake.root}", "--gpuhost-report=out.json",
                    "-n", "2")
    modprobe = blocked.started()
    run.send_signal(signum)  # the controller's pid, not its process group
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    until(lambda: gone(modprobe) and gone(blocked.child()), "the modprobe's group ending")
    blocked.release()
    assert not blocked.loaded()
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "unknown"
    why = "KeyboardInterrupt" if signum == signal.SIGINT else f"{signum.name} received"
    assert entry.error is not None and entry.error.startswith(
        f"the run was interrupted ({why}) during run modprobe -- nvidia"), entry.error
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("module[nvidia]", "error")
    assert check["message"] == entry.error  # the journal's words, never "not run"


SIGNALLED_WITH_A_REPORT_QUEUED = """
import os, signal, time
import pytest

CHECK = "spec.yaml::sysctl[vm.swappiness]"
LIMIT_S = {limit!r}


def pytest_runtest_logreport(report):
    # On the controller, at CHECK's setup report: once its worker's later reports (the fix's
    # record among them) wait in the controller's queue, the controller alone gets SIGTERM.
    if "PYTEST_XDIST_WORKER" in os.environ or report.nodeid != CHECK or report.when != "setup":
        return
    dsession = report.node.config.pluginmanager.getplugin("dsession")
    deadline = time.monotonic() + LIMIT_S
    while dsession.queue.qsize() < 2:
        if time.monotonic() > deadline:
            raise AssertionError("the worker's reports of " + CHECK + " never came")
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(LIMIT_S)  # the handler raises here
"""


def test_a_fix_whose_report_waits_in_the_controller_s_queue_is_in_the_reports(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """The controller signalled while a worker's report of a fix it made waits unread: the
    report is read before the run ends, so the JSON report says ``fixed`` where the journal
    says the change was made (it said the check never ran)."""
    fake.sysctl("vm.swappiness", 60)
    pytester.makeconftest(SIGNALLED_WITH_A_REPORT_QUEUED.format(limit=LIMIT_S))
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", "--fix", f"--gpuhost-root={fake.root}", "-n", "2",
        "--gpuhost-report=out.json", "-p", "no:cacheprovider", timeout=LIMIT_S * 2)
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "applied", entry
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("sysctl[vm.swappiness]", "fixed"), check


def test_the_summary_after_a_signal_says_what_the_journal_and_report_say(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked) -> None:
    """SIGTERM while the fix's command runs: the change is ``unknown`` in the journal and an
    ``error`` in the report, so the terminal never counts it applied."""
    run = start_local_fix(pytester, fake.root)
    blocked.started()
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "unknown"
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert check["outcome"] == "error"
    assert check["message"] == entry.error  # what the journal says, never "not run"
    assert "--fix: 0 of 1 fix applied, 1 cut short by the interrupt (journaled unknown)" \
        in said.splitlines()


@pytest.mark.parametrize("group", [False, True], ids=["controller", "process-group"])
def test_the_summary_after_a_signal_to_an_xdist_run_says_what_the_journal_says(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked, group: bool) -> None:
    """The twin of the serial run's under ``-n 2``: the worker's fix cut short reaches the
    controller with the journal's words (an ``error``, journaled ``unknown``), never as a check
    that did not run, in the JSON report and on the terminal; whether the signal reached the
    controller alone (``kill PID``: it hands the signal on) or every process of the run
    (systemd's SIGTERM to the unit)."""
    run = start_fix(pytester, f"--gpuhost-root={fake.root}", "--gpuhost-report=out.json",
                    "-n", "2")
    blocked.started()
    if group:
        os.killpg(run.pid, signal.SIGTERM)  # its own session: the run's processes alone
    else:
        run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "unknown"
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("module[nvidia]", "error")
    assert check["message"] == entry.error  # what the journal says, never "not run"
    assert "--fix: 0 of 1 fix applied, 1 cut short by the interrupt (journaled unknown)" \
        in said.splitlines(), said
    assert f"(undo: --gpuhost-rollback={journal_of(fake.root)} --gpuhost-root={fake.root})" \
        in said



UNWINDING_UNTIL_THE_TEARDOWN = """
import os, time
from pathlib import Path

from pytest_gpuhost.plugin import worker_signals, workers
from xdist import workermanage

TEARDOWN = Path(__file__).parent / "teardown"
LIMIT_S = {limit!r}

if "PYTEST_XDIST_WORKER" in os.environ:
    written = workers.DoneLog.cut

    def cut(self, *args, **kwargs):
        # The worker's unwind, held until the controller ends its workers (xdist's teardown).
        deadline = time.monotonic() + LIMIT_S
        while not TEARDOWN.exists():
            if time.monotonic() > deadline:
                raise AssertionError("the controller never ended its workers")
            time.sleep(0.01)
        return written(self, *args, **kwargs)

    workers.DoneLog.cut = cut
else:
    worker_signals.DRAIN_S = 0.0  # the controller's wait for its workers passes at once
    teardown_nodes = workermanage.NodeManager.teardown_nodes

    def tearing_down(self):
        TEARDOWN.touch()
        return teardown_nodes(self)

    workermanage.NodeManager.teardown_nodes = tearing_down
"""


def test_a_worker_that_unwinds_after_the_controller_s_drain_still_reports_its_cut_fix(
        pytester: pytest.Pytester, fake: FakeHost, blocked: Blocked) -> None:
    """A loaded machine: the worker writes the record of the fix the signal cut short only
    after the controller stopped waiting for its reports (``DRAIN_S`` passed at once here),
    as late as xdist's teardown of its workers, which waits for them. The controller reads
    the workers' logs once they are gone, so the report still has the journal's words, never
    "not run"."""
    pytester.makeconftest(UNWINDING_UNTIL_THE_TEARDOWN.format(limit=LIMIT_S))
    run = start_fix(pytester, f"--gpuhost-root={fake.root}", "--gpuhost-report=out.json",
                    "-n", "2")
    blocked.started()
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=LIMIT_S)
    said = out.decode() + err.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, said
    [entry] = read_journal(journal_of(fake.root)).entries
    assert entry.state == "unknown"
    [check] = json.loads((pytester.path / "out.json").read_text())["checks"]
    assert (check["id"], check["outcome"]) == ("module[nvidia]", "error"), said
    assert check["message"] == entry.error  # what the journal says, never "not run"
    assert "--fix: 0 of 1 fix applied, 1 cut short by the interrupt (journaled unknown)" \
        in said.splitlines(), said
