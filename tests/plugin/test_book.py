"""The controller's record book, without pytest or processes: fed records, failed reports and
worker logs of our own, as pytest-xdist's testing/test_dsession.py drives its scheduler with
mock nodes."""

from __future__ import annotations

from pathlib import Path

from pytest_gpuhost.plugin.book import RecordBook, no_record
from pytest_gpuhost.plugin.worker import SharedLedger
from pytest_gpuhost.plugin.workers import CONTROLLER, DoneLog, Progress
from pytest_gpuhost.reports import TargetInfo
from pytest_gpuhost.result import CheckResult, Outcome

SPEC = "spec.yaml"


def record(check_id: str, outcome: Outcome = Outcome.PASSED, message: str = "",
           target: str | None = None) -> CheckResult:
    kind, _, key = check_id.partition("[")
    return CheckResult(check_id, kind, key[:-1] or None, "10", "10", outcome, message,
                       target=target)


def book_of(*ids: str) -> RecordBook:
    book = RecordBook()
    book.expect(f"{SPEC}::{check_id}" for check_id in ids)
    return book


def outcomes(records: list[CheckResult]) -> list[tuple[str, str]]:
    return [(r.id, r.outcome.value) for r in records]


def test_records_come_in_collection_order_whatever_order_they_were_reported_in() -> None:
    book = book_of("sysctl[a]", "sysctl[b]", "dmesg")
    book.add(f"{SPEC}::dmesg", 2, record("dmesg"))
    book.add(f"{SPEC}::sysctl[b]", 1, record("sysctl[b]", Outcome.FAILED))
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"))
    assert outcomes(book.records()) == [("sysctl[a]", "passed"), ("sysctl[b]", "failed"),
                                        ("dmesg", "passed")]
    assert book.records() == book.ordered()


def test_a_collected_check_that_never_reported_is_an_error_in_its_place() -> None:
    book = book_of("sysctl[a]", "sysctl[b]", "dmesg")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"))
    book.add(f"{SPEC}::dmesg", 2, record("dmesg"))
    records = book.records()
    assert outcomes(records) == [("sysctl[a]", "passed"), ("sysctl[b]", "error"),
                                 ("dmesg", "passed")]
    missing = records[1]
    assert (missing.kind, missing.key, missing.location) == ("sysctl", "b", SPEC)
    assert missing.message == "no result: the check never reported"


def test_a_run_that_stopped_says_so_in_every_check_it_did_not_reach() -> None:
    book = book_of("sysctl[a]", "sysctl[b]")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"))
    [_, stopped] = book.records(stopped="another run holds the run lock")
    assert stopped.message == ("not run: the run stopped before it (another run holds the run "
                               "lock)")
    [_, interrupted] = book.records(stopped="interrupted")
    assert interrupted.message == "not run: the run was interrupted before it"


def test_a_crash_while_a_check_ran_makes_it_an_error_even_when_a_rerun_passed() -> None:
    """xdist reports the crash on the check and may run it again on another worker: the
    rerun's pass does not hide that a worker died on it."""
    book = book_of("sysctl[a]", "crash")
    book.incident(f"{SPEC}::crash", "error while it ran: worker 'gw0' crashed while running")
    book.add(f"{SPEC}::crash", 1, record("crash", message="rerun"))
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"))
    [passed, crashed] = book.records()
    assert passed.outcome is Outcome.PASSED
    assert crashed.outcome is Outcome.ERROR
    assert crashed.message == ("error while it ran: worker 'gw0' crashed while running; run "
                               "again, the check passed: rerun")


def test_a_failed_check_keeps_its_own_outcome_beside_an_incident() -> None:
    book = book_of("sysctl[a]")
    book.incident(f"{SPEC}::sysctl[a]", "error at teardown: boom")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]", Outcome.FAILED, "60 != 10"))
    [failed] = book.records()
    assert (failed.outcome, failed.message) == (Outcome.FAILED, "60 != 10")


def test_incidents_of_checks_not_collected_are_not_kept() -> None:
    book = book_of("sysctl[a]")
    book.incident("test_user.py::test_bench", "error at setup: gate closed")
    assert book.incidents == {}


def test_a_check_without_a_report_tells_the_first_incidents_and_counts_the_rest() -> None:
    book = book_of("crash")
    for number in range(4):
        book.incident(f"{SPEC}::crash", f"worker gw{number} crashed")
    [lost] = book.records()
    assert lost.message == ("no result: the check never reported (worker gw0 crashed; worker "
                            "gw1 crashed (and 2 more))")


def test_the_workers_logs_say_why_a_check_never_reported() -> None:
    """Crashed-worker accounting: started on a worker that went down, started on one that
    never sent its report, or never started after xdist stopped replacing crashed workers."""
    book = book_of("sysctl[a]", "sysctl[b]", "sysctl[c]", "crash")
    book.incident(f"{SPEC}::crash", "worker 'gw0' crashed while running")
    progress = Progress(started={0: "gw0", 1: "gw1", 3: "gw0"},
                        down={"gw0": "worker gw0 crashed: exit 3"})
    records = {r.id: r.message for r in book.records(progress=progress)}
    assert records["sysctl[a]"] == ("no result: the check never reported (its xdist worker "
                                    "went down while it ran: worker gw0 crashed: exit 3)")
    assert records["sysctl[b]"] == ("no result: the check never reported (it started on xdist "
                                    "worker gw1)")
    assert records["sysctl[c]"] == (
        "not run: no xdist worker started it after worker gw0 crashed: exit 3 (xdist gives out "
        "no more tests once --max-worker-restart workers have crashed): see spec.yaml::crash, "
        "then run again")
    assert records["crash"].endswith("(worker 'gw0' crashed while running)")
    healthy = {r.id: r.message for r in book.records(progress=Progress())}
    assert set(healthy.values()) == {"no result: the check never reported",
                                     "no result: the check never reported (worker 'gw0' "
                                     "crashed while running)"}


def test_a_stopped_run_does_not_blame_the_workers() -> None:
    book = book_of("sysctl[a]")
    progress = Progress(started={0: "gw0"}, down={"gw0": "worker gw0 crashed"})
    [stopped] = book.records(stopped="-x", progress=progress)
    assert stopped.message == "not run: the run stopped before it (-x)"


def test_a_target_is_what_its_workers_saw_with_their_costs_added() -> None:
    own = {"pve": TargetInfo("pve", "ssh://pve"), "nas": TargetInfo("nas", "ssh://nas")}
    book = book_of("sysctl[a]@pve")
    first = TargetInfo("pve", "ssh://pve", hostname="pve1", round_trips=3, connections=1)
    later = TargetInfo("pve", "ssh://pve", hostname="pve1", round_trips=2, connections=1,
                       journal="/j.jsonl")
    book.add(f"{SPEC}::sysctl[a]@pve", 0, record("sysctl[a]", target="pve"), first, "gw0")
    book.add(f"{SPEC}::sysctl[b]@pve", 1, record("sysctl[b]", target="pve"), later, "gw1")
    pve, nas = book.targets(own, add_own=False)
    assert (pve.hostname, pve.round_trips, pve.connections, pve.journal) == \
        ("pve1", 5, 2, "/j.jsonl")
    assert nas == own["nas"]  # no report reached it: as this process knows it
    controller = TargetInfo("pve", "ssh://pve", round_trips=1, connections=1)
    [pve, _] = book.targets({**own, "pve": controller}, add_own=True)
    assert (pve.round_trips, pve.connections) == (6, 3)  # the controller collected it too


def test_an_id_without_a_record_keeps_its_target_and_key() -> None:
    on_target = no_record("spec.yaml::sysctl[vm.swappiness]@pve", "lost")
    assert (on_target.id, on_target.key, on_target.target) == \
        ("sysctl[vm.swappiness]", "vm.swappiness", "pve")
    at_in_key = no_record("spec.yaml::module[a@b]", "lost")
    assert (at_in_key.id, at_in_key.key, at_in_key.target) == ("module[a@b]", "a@b", None)
    persisted = no_record("spec.yaml::persist[etc/sysctl.d/90-gpuhost-spec.conf]", "lost")
    assert (persisted.kind, persisted.key) == ("persist", "etc/sysctl.d/90-gpuhost-spec.conf")


def test_clearing_lets_the_records_go() -> None:
    book = book_of("sysctl[a]")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"))
    book.clear()
    assert book.records() == []


def test_a_check_that_reported_twice_keeps_its_worse_record() -> None:
    """Under ``--dist each`` every worker runs every check: one that failed on any worker is
    failed in the reports, however the others fared, and a fix one worker made is not hidden
    by another's pass after it."""
    book = book_of("sysctl[a]", "sysctl[b]", "sysctl[c]")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]", Outcome.FAILED), worker="gw0")
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"), worker="gw1")
    book.add(f"{SPEC}::sysctl[b]", 1, record("sysctl[b]", Outcome.FIXED), worker="gw0")
    book.add(f"{SPEC}::sysctl[b]", 1, record("sysctl[b]"), worker="gw1")
    book.add(f"{SPEC}::sysctl[c]", 2, record("sysctl[c]"), worker="gw0")
    book.add(f"{SPEC}::sysctl[c]", 2, record("sysctl[c]", Outcome.ERROR, "boom"), worker="gw1")
    assert outcomes(book.records()) == [("sysctl[a]", "failed"), ("sysctl[b]", "fixed"),
                                        ("sysctl[c]", "error")]
    # the same worker again: a rerun (pytest-rerunfailures), whose later record counts
    book.add(f"{SPEC}::sysctl[a]", 0, record("sysctl[a]"), worker="gw0")
    assert outcomes(book.records())[0] == ("sysctl[a]", "passed")


def test_a_fix_cut_short_on_a_worker_reaches_the_controller_through_its_log(
        tmp_path: Path) -> None:
    """pytest reports no test an interrupt cuts short: the worker's log carries its record,
    word for word, to the controller, which reads it beside the other workers' lines."""
    cut = record("module[nvidia]", Outcome.ERROR, "the run was interrupted (SIGTERM received) "
                 "during run modprobe -- nvidia (absent -> loaded); what it did is unknown",
                 target="gpu1")
    ledger = SharedLedger(DoneLog(tmp_path, "gw1"), records=False)
    ledger.started(3)
    ledger.cut_short(f"{SPEC}::module[nvidia]@gpu1", 3, cut)
    ledger.finished(4, "passed", None)
    ledger.close()
    progress = DoneLog(tmp_path, CONTROLLER).read()
    [(nodeid, (index, shared))] = progress.cut_short.items()
    assert (nodeid, index) == (f"{SPEC}::module[nvidia]@gpu1", 3)
    assert CheckResult.from_dict(shared) == cut
    assert progress.done == {4: "passed"}  # the check cut short never finished
