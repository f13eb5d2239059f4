"""The dmesg check's GPU events: an application's Xid warns, a hardware one fails naming its
action, an unknown one fails as service, and a GPU reset or driver load sets the events before
it aside."""

from __future__ import annotations

import pytest

from pytest_gpuhost.result import Outcome
from pytest_gpuhost.specmodel import SpecError
from pytest_gpuhost.testing.fakehost import FakeHost

from ..runner import run_spec

SPEC = "version: 1\ndmesg: {}\n"
APP = "NVRM: Xid (PCI:0000:a1:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
FALLEN = "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off " \
    "the bus."
GSP = "NVRM: Xid (PCI:0000:9b:00): 119, pid=2024, name=nvidia-smi, Timeout after 6s of waiting"
LOAD = ("nvidia-nvlink: Nvlink Core is being initialized, major device number 509",
        "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build")


def test_an_application_xid_leaves_the_check_passed_with_a_warning(fake: FakeHost) -> None:
    fake.kmsg([(4, APP), (4, APP), (6, "NVRM: Xid (PCI:0000:62:00): 63, pid=1, Row Remapper")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert (result.outcome, result.observed) == (Outcome.PASSED, "0")
    [warning] = result.warnings
    assert warning == ("GPU event(s) that leave the node open: 0000:a1:00.0: Xid 13 (Graphics "
                       "Engine Exception) x2: restart the application; 0000:62:00.0: Xid 63 (GPU "
                       "memory remapping event): nothing to do")
    events = result.details["xid"]
    assert [(e["code"], e["gpu"], e["pid"], e["name"], e["class"], e["action"], e["verdict"])
            for e in events] == [
        (13, "0000:a1:00.0", 4242, "python3", "application", "restart_app", "warn"),
        (13, "0000:a1:00.0", 4242, "python3", "application", "restart_app", "warn"),
        (63, "0000:62:00.0", 1, None, "hardware", "none", "warn")]  # action none: a warning
    assert "xid_worst" not in result.details


def test_a_hardware_xid_fails_naming_each_action_most_severe_first(fake: FakeHost) -> None:
    fake.kmsg([(6, GSP), (4, APP), (3, FALLEN), (6, GSP),
               (4, "NVRM: Xid (PCI:0000:e1:00): 999, pid=7, name=x, what is this")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert (result.outcome, result.observed) == (Outcome.FAILED, "4")  # info level, too
    assert result.message == (  # what to do first: pytest's short summary cuts the line
        "0000:e1:00.0: Xid 999 (Xid 999, not in NVIDIA's catalog of 2025-10 (codes 1-172)): "
        "service the card; 0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then "
        "service if it repeats; 0000:9b:00.0: Xid 119 (GSP RPC Timeout) x2: reset the GPU; "
        "4 kernel log record(s) at emerg, alert, crit, err, warn since boot")
    assert result.details["xid_worst"] == {
        "action": "service", "advice": "service the card", "code": 999, "kind": "Xid",
        "gpu": "0000:e1:00.0", "class": "unknown", "short": "service (Xid 999 0000:e1:00.0)",
        "rank": 5}
    counts = {(c["gpu"], c["code"]): (c["class"], c["action"], c["verdict"], c["count"])
              for c in result.details["xid_counts"]}
    assert counts == {("0000:e1:00.0", 999): ("unknown", "service", "fail", 1),
                      ("0000:41:00.0", 79): ("hardware", "reboot", "fail", 1),
                      ("0000:9b:00.0", 119): ("driver", "reset_gpu", "fail", 2),
                      ("0000:a1:00.0", 13): ("application", "restart_app", "warn", 1)}
    assert result.details["offending"] == []  # the GPU events are in details.xid


def test_a_driver_reload_sets_the_events_before_it_aside(fake: FakeHost) -> None:
    fake.kmsg([(3, FALLEN), (4, GSP), (6, "nvidia-uvm: Unloaded the UVM driver."),
               (6, "nvidia-nvlink: Unregistered Nvlink Core, major device number 509"),
               *((6, text) for text in LOAD)])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert (result.outcome, result.observed) == (Outcome.PASSED, "0")
    assert result.details["xid_set_aside"] == [
        {"gpu": "0000:41:00.0", "count": 1, "why": "before the driver loaded (seq 6)"},
        {"gpu": "0000:9b:00.0", "count": 1, "why": "before the driver loaded (seq 6)"}]
    assert "2 set aside" in result.evidence[0]["raw"]
    assert result.evidence[1]["raw"].startswith("1 GPU event(s) of 0000:41:00.0 set aside: "
                                                "before the driver loaded")
    fake.kmsg([(3, FALLEN)])  # again, after the load: judged
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert "0000:41:00.0: Xid 79" in result.message


def test_a_gpu_that_fell_off_while_the_driver_loaded_is_not_set_aside(fake: FakeHost) -> None:
    """The probe's records come before the load's own line: they belong to that load."""
    fake.kmsg([(6, "systemd[1]: Started Load Kernel Modules."), (6, LOAD[0]),
               (3, r"NVRM: The NVIDIA GPU 0000:b3:00.0\x0aNVRM: (PCI ID: 10de:2bb5) installed "
                   r"in this system has\x0aNVRM: fallen off the bus and is not responding."),
               (3, "NVRM: The NVIDIA probe routine failed for 1 device(s)."), (4, LOAD[1])])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert "0000:b3:00.0: GPU has fallen off the bus: reboot, then service if it repeats" in \
        result.message
    assert "xid_set_aside" not in result.details


def test_a_gpu_reset_sets_aside_that_gpu_alone(fake: FakeHost) -> None:
    other = FALLEN.replace("0000:41:00", "0000:42:00")
    fake.kmsg([(3, FALLEN), (3, other), (6, "NVRM: GPU 0000:41:00.0: GPU reset done")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert [e["gpu"] for e in result.details["xid"]] == ["0000:42:00.0"]
    assert result.details["xid_set_aside"] == [
        {"gpu": "0000:41:00.0", "count": 1, "why": "before the GPU was reset (seq 3)"}]


def test_a_uuid_event_is_named_by_its_address_where_the_log_says_it(fake: FakeHost) -> None:
    fake.kmsg([(6, "NVRM: GPU at PCI:0000:c3:00: GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"),
               (4, "NVRM: Xid (GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9): 48, pid=1, DBE")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.details["xid"][0]["gpu"] == "0000:c3:00.0"


def test_the_xid_rule_moves_classes_and_allow_still_allows(fake: FakeHost) -> None:
    fake.kmsg([(4, APP), (3, FALLEN)])
    spec = ("version: 1\ndmesg:\n  xid: {fail: [hardware, application]}\n"
            "  allow: ['GPU has fallen off the bus']\n")
    result = run_spec(spec, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED  # the application's Xid fails now
    assert result.message == ("0000:a1:00.0: Xid 13 (Graphics Engine Exception): restart the "
                              "application; 1 kernel log record(s) at emerg, alert, crit, err, "
                              "warn since boot, 1 allowed pattern")
    assert "1 allowed as noise" in result.evidence[0]["raw"]  # Xid 79, by the allow pattern
    spec = "version: 1\ndmesg:\n  levels: [err]\n  xid: {fail: [hardware], warn: []}\n"
    result = run_spec(spec, fake.root)["dmesg"]
    assert result.observed == "1"  # Xid 13 (warn level) is left to the levels: not at err


def test_since_a_time_judges_what_was_logged_from_then_on(fake: FakeHost) -> None:
    fake.file("proc/stat", "cpu  1 2 3\nbtime 1796083200\nprocesses 7\n")  # 2026-12-01T00:00Z
    fake.kmsg([(3, FALLEN)])  # at 1.001237 s after boot
    late = "version: 1\ndmesg: {since: '2026-12-01T00:00:02Z'}\n"
    early = "version: 1\ndmesg: {since: '2026-12-01T00:00:01+00:00'}\n"
    assert run_spec(late, fake.root)["dmesg"].outcome is Outcome.PASSED
    result = run_spec(early, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert "since 2026-12-01T00:00:01+00:00" in result.message
    (fake.root / "proc/stat").write_text("cpu  1 2 3\n")
    result = run_spec(late, fake.root)["dmesg"]
    assert result.outcome is Outcome.ERROR or result.outcome is Outcome.FAILED
    assert "needs the boot's time, and proc/stat has no btime line" in result.message


@pytest.mark.parametrize(("section", "words"), [
    ("{xid: {fail: [hardwre]}}", "unknown Xid class 'hardwre'"),
    ("{xid: {fail: [hardware], warn: [hardware]}}", "'hardware' is in both xid.fail and xid.warn"),
    ("{xid: {pass: [application]}}", "pass"),
    ("{since: yesterday}", "or a time such as 2026-12-01T00:00:00Z; got 'yesterday'"),
])
def test_a_bad_xid_rule_or_time_is_refused_at_its_line(fake: FakeHost, section: str,
                                                         words: str) -> None:
    with pytest.raises(SpecError, match=words.replace("(", r"\(").replace("[", r"\[")):
        run_spec(f"version: 1\ndmesg: {section}\n", fake.root)


def test_an_xid_right_before_a_load_is_no_part_of_it(fake: FakeHost) -> None:
    """Only the driver's records of the load itself run together before its line: an Xid
    logged just before a reload (nothing between) is still set aside."""
    fake.kmsg([(6, "NVRM: GPU at PCI:0000:41:00: GPU-77aa0000-0000-0000-0000-000000000000"),
               (3, FALLEN), *((6, text) for text in LOAD)])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.PASSED
    assert result.details["xid_set_aside"][0]["gpu"] == "0000:41:00.0"


def test_an_nvswitch_fatal_sxid_fails_and_a_non_fatal_one_warns(fake: FakeHost) -> None:
    fake.kmsg([(4, "nvidia-nvswitch1: SXid (PCI:0000:c5:00.0): 19084, Non-fatal, Link 12 AN1 "
                   "Heartbeat Timeout Error (First)")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.PASSED
    assert result.warnings == ("GPU event(s) that leave the node open: 0000:c5:00.0: SXid 19084 "
                               "(NVSwitch non-fatal error): nothing to do",)
    fake.kmsg([(4, "nvidia-nvswitch2: SXid (PCI:0000:c6:00.0): 20034, Fatal, Link 30 LTSSM "
                   "Fault Up")])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert result.outcome is Outcome.FAILED
    assert result.message.startswith("0000:c6:00.0: SXid 20034 (NVSwitch fatal error): reset "
                                     "the GPU, then service if it repeats; 1 kernel log record")
    assert result.details["xid_worst"]["class"] == "interconnect"
