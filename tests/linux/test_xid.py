"""NVIDIA's GPU events in kernel log records: every form parsed, each classified by the catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.checks.dmesg_xid import entry_of
from pytest_gpuhost.linux import xidcatalog
from pytest_gpuhost.linux.kmsg import parse_records
from pytest_gpuhost.linux.xid import gpu_address, marker, parse_event, the_gpu, uuid_of

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg_gpu_events.txt"
UUID = "gpu-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"


def test_every_form_parses_into_code_gpu_pid_name_and_is_classified() -> None:
    records, malformed = parse_records(FIXTURE.read_text().splitlines())
    assert malformed == 0
    seen = {}
    for record in records:
        event = parse_event(record.text)
        if event is not None:
            entry = entry_of(event)
            seen[record.seq] = (event.kind, event.code, event.gpu, event.pid, event.name,
                                entry.cls, entry.action)
    assert seen == {
        104: ("Xid", 119, "0000:c3:00.0", 31337, "python3", "driver", "reset_gpu"),
        105: ("Xid", 79, "0000:41:00.0", None, None, "hardware", "reboot"),  # no pid, no name
        106: ("Xid", 63, "0000:62:00.0", 2211, None, "hardware", "none"),  # a pid, no name
        107: ("Xid", 31, "0000:82:00.0", None, None, "application", "restart_app"),  # no PCI:
        108: ("Xid", 13, "0000:a1:00.0", None, None, "application", "restart_app"),  # no domain
        109: ("Xid", 48, UUID, 4410, "trainer", "hardware", "reset_gpu"),  # (GPU-...)
        110: ("SXid", 20034, "0000:c6:00.0", None, None, "interconnect", "reset_gpu"),
        111: ("SXid", 19084, "0000:c5:00.0", None, None, "interconnect", "none"),
        112: ("SXid", 10002, "0000:c7:00.0", None, None, "unknown", "service"),
        113: ("NVRM", None, "0000:b3:00.0", None, None, "hardware", "reboot"),  # escaped lines
        116: ("NVRM", None, None, None, None, "hardware", "reboot"),  # its GPU: record 114's
        117: ("NVRM", None, "0000:d1:00.0", None, None, "hardware", "reboot"),
        118: ("Xid", 999, "0000:e1:00.0", 77, "mystery", "unknown", "service"),
    }
    by_seq = {record.seq: record for record in records}
    assert parse_event(by_seq[104].text).detail.startswith("Timeout after 6s")  # type: ignore[union-attr]  # parsed above
    assert the_gpu(by_seq[114].text) == "0000:b4:00.0"
    assert uuid_of(by_seq[102].text) == (UUID, "0000:c3:00.0")
    assert marker(by_seq[101].text) is not None and marker(by_seq[101].text).gpu is None  # type: ignore[union-attr]  # checked first
    assert marker(by_seq[119].text) is None  # "likely needs to be reset" is no reset


@pytest.mark.parametrize("text", [
    "NVRM: GPU 0000:41:00.0: GPU reset done",
    "NVRM: GPU at PCI:0000:41:00: GPU has been reset",
])
def test_a_gpu_reset_names_its_gpu(text: str) -> None:
    found = marker(text)
    assert found is not None and found.gpu == "0000:41:00.0"


@pytest.mark.parametrize("text", [
    "NVRM: Xid (PCI:0000:41:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
    "(GPU Reset Required)",
    "NVRM: GPU 0000:41:00.0: GPU reset required",
    "NVRM: GPU 0000:41:00.0: GPU reset failed",
    "pcieport 0000:40:01.1: GPU reset",  # not the driver's
])
def test_what_is_no_reset(text: str) -> None:
    assert marker(text) is None


def test_unknown_codes_are_unknown_service_never_dropped() -> None:
    for code in (1, 91, 173, 4000):  # unused in NVIDIA's table, or past it
        entry = xidcatalog.xid_entry(code)
        assert (entry.cls, entry.action) == ("unknown", "service")
        assert str(code) in entry.name


def test_xid_154_takes_the_action_its_record_names() -> None:
    text = "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    assert xidcatalog.xid_entry(154, text).action == "reboot"
    assert xidcatalog.xid_entry(154, text.replace("Node Reboot", "GPU Reset")).action == \
        "reset_gpu"
    assert xidcatalog.xid_entry(154, "something else").action == "service"


def test_the_catalog_is_whole_and_ordered() -> None:
    for code, entry in xidcatalog.CATALOG.items():
        assert 1 <= code <= 172 and entry.cls in xidcatalog.CLASSES[:-1], code
        assert entry.action in xidcatalog.ACTIONS, code
    assert xidcatalog.CATALOG[79].advice() == "reboot, then service if it repeats"
    assert xidcatalog.CATALOG[13].advice() == "restart the application"
    assert [xidcatalog.severity(a) for a in xidcatalog.ACTIONS] == list(range(6))
    assert xidcatalog.SOURCE.startswith("https://docs.nvidia.com/deploy/xid-errors/")


@pytest.mark.parametrize(("given", "address"), [
    ("0000:9b:00", "0000:9b:00.0"), ("9B:00", "0000:9b:00.0"),
    ("00000000:9b:00.1", "0000:9b:00.1"), ("0001:c6:00.0", "0001:c6:00.0"),
])
def test_gpu_addresses_in_the_sysfs_form(given: str, address: str) -> None:
    assert gpu_address(given) == address
