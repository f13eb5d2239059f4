"""xdist's controller sending tests to a worker that has just died (xdist's
own race, pytest-xdist issue 204) once ended the run in INTERNALERROR (``OSError: cannot send
(already closed?)``) instead of exit 1 with the lost check in every report.

The race is forced here, not waited for. With ``--maxschedchunk=1`` a worker holds two tests,
so each completion it sends makes the scheduler send it one more. The worker dies right after
the completion of CHECK has gone out; the controller is held at CHECK's teardown report until
that worker is gone and xdist's receiver thread has queued its death, and is then put back in
the state of the race, where the main thread handles the completion before the receiver thread
has marked the worker down (``node._down``): the scheduler sends to the dead worker, every time.
The worker then dies holding a test it never started: that test is the crash's error record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ..blocking import LIMIT_S

CHECK = "blackwell8.yaml::sysctl[vm.swappiness]"

RACE = f"""\
import os, time
from pathlib import Path
import pytest

CHECK = {CHECK!r}
PID = Path("dead-worker.pid")
LIMIT_S = {LIMIT_S!r}


def _gone(pid):
    try:
        return Path(f"/proc/{{pid}}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    # On a worker: die right after the completion of CHECK has gone to the controller.
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    interactor = next(p for p in session.config.pluginmanager.get_plugins()
                      if type(p).__name__ == "WorkerInteractor")
    index = [item.nodeid for item in session.items].index(CHECK)
    send = interactor.sendevent

    def sendevent(name, **kwargs):
        send(name, **kwargs)
        if name == "runtest_protocol_complete" and kwargs.get("item_index") == index:
            Path("dead-worker.tmp").write_text(str(os.getpid()))
            os.replace("dead-worker.tmp", PID)  # whole, for the controller reading it
            os._exit(3)  # a segfault in a driver call

    interactor.sendevent = sendevent


def pytest_runtest_logreport(report):
    # On the controller, at CHECK's teardown report: wait until its worker is gone and xdist's
    # receiver thread has seen its connection end, then put back the moment before that thread
    # marked it down: the completion handled next sends to a dead worker.
    if "PYTEST_XDIST_WORKER" in os.environ or report.nodeid != CHECK or \
            report.when != "teardown":
        return
    node = report.node
    deadline = time.monotonic() + LIMIT_S
    while not (PID.exists() and _gone(int(PID.read_text())) and node.shutting_down):
        if time.monotonic() > deadline:
            raise AssertionError("the worker did not die after " + CHECK)
        time.sleep(0.01)
    node._down = False  # its death is queued after the completion, as in the race
"""


def test_tests_sent_to_a_worker_that_just_died_cost_nothing(pytester: pytest.Pytester,
                                                             example_host: Path) -> None:
    pytester.makepyfile(race=RACE)
    result = pytester.runpytest_subprocess(
        "-p", "race", "--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}", "-n", "2",
        "--maxschedchunk=1", "-m", "not gpuhost_slow", "--gpuhost-report=out.json",
        "-p", "no:cacheprovider", "--max-worker-restart=4", timeout=LIMIT_S * 2)
    out = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in out, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert (pytester.path / "dead-worker.pid").exists()  # the race did happen
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert len(outcomes) == 190 and report["complete"] is True
    errors = {check["id"]: check["message"] for check in report["checks"]
              if check["outcome"] == "error"}
    crashed = [name for name, why in errors.items() if "crashed while running" in why]
    assert len(crashed) == 1, errors  # the test it held and never started
    assert outcomes["sysctl[vm.swappiness]"] != "error"  # its completion went out
    for name, why in errors.items():  # nothing else lost: every other error is a check
        # ranked after the crashed one, which it had to follow (dmesg, the kernel's log)
        assert name in crashed or "check(s) it must follow never finished" in why, why
