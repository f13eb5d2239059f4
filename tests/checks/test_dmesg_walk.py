"""The dmesg check's one pass over the kernel log: a record of no NVIDIA module is never parsed
for a GPU event, an Xid is judged by its head (kind, GPU, code) as the whole pattern would judge
it, each record is counted once, and a flood is named and counted as each of its events would
be."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.checks import dmesg_xid
from pytest_gpuhost.checks.dmesg_xid import KEPT, XidLog
from pytest_gpuhost.linux import xid
from pytest_gpuhost.linux.kmsg import Record
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.testing.fakehost import FakeHost

from ..runner import run_spec

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kmsg_gpu_events.txt"
SPEC = "version: 1\ndmesg: {}\n"
NOISE = "vxlan: non-ECT from 10.233.1.2 with TOS=0x2"
APP = "NVRM: Xid (PCI:0000:a1:00): 13, pid=4242, name=python3, Graphics SM Warp Exception"
FALLEN = "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off " \
    "the bus."
GSP = "NVRM: Xid (PCI:0000:9b:00): 119, pid={pid}, name=nvidia-smi, Timeout after 6s"


def test_a_record_of_no_nvidia_module_is_never_parsed_for_a_gpu_event(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Noise costs one prefix test: only the records of NVIDIA's modules reach the GPU
    events' parser, whatever else they say."""
    fed: list[str] = []
    feed = XidLog.feed

    def counted(self: XidLog, record: Record, index: int) -> dmesg_xid.Seen | None:
        fed.append(record.text)
        return feed(self, record, index)

    monkeypatch.setattr(XidLog, "feed", counted)
    driver = [FALLEN, "nvidia-nvlink: Nvlink Core is being initialized", "NVRM: GPU reset done"]
    fake.kmsg([*((4, NOISE) for _ in range(50)), (3, driver[0]), (6, driver[1]),
               (3, "kernel: NVRM: Xid (PCI:0000:41:00): 79, quoted by another module"),
               (6, driver[2]), (3, "AER: fatal")])
    result = run_spec("version: 1\ndmesg: {allow: ['vxlan']}\n", fake.root)["dmesg"]
    assert fed == driver
    assert (result.outcome, result.observed) == (Outcome.FAILED, "3")  # Xid 79, the quote, AER


HEADS = [
    *(line.partition(";")[2] for line in FIXTURE.read_text().splitlines()),
    "NVRM: Xid (PCI:0000:41:00): 79",
    "NVRM: Xid (PCI:0000:41:00): 79x, a code run into a word is no Xid",
    "NVRM: an Xid (zz): 1 first, then Xid (PCI:0000:41:00): 48, pid=7, the second",
    "nvidia-nvswitch0: ASXid (PCI:0000:c2:00.0): 20034, Fatal, a word around SXid",
    "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034 Fatal, no comma",
    "NVRM: Xid (GPU-509665AD-1234): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
    "(Node Reboot Required)",
]


@pytest.mark.parametrize("text", HEADS)
def test_an_xid_s_head_is_the_xid_the_whole_pattern_finds(text: str) -> None:
    event = xid.parse_event(text)
    head = xid.xid_head(text)
    if event is None or event.code is None:
        assert head is None
        return
    assert head is not None
    assert xid.head_of(head) == (event.kind, event.code, event.gpu)
    assert xid.xid_detail(text, head) == event.detail


def test_each_record_is_counted_once_at_its_level_and_allowed_once(fake: FakeHost) -> None:
    fake.kmsg([(4, NOISE), (4, NOISE), (6, NOISE),  # two allowed at the levels, one below
               (4, APP),  # an application's Xid: a warning
               (6, FALLEN),  # judged below the levels too: failing
               (3, APP.replace("python3", "allowed")),  # an Xid allowed by pattern
               (6, APP.replace("python3", "allowed")),  # and one below the levels
               (3, "NVRM: GPU 0000:41:00.0: something else"),  # the driver's, no event
               (4, "nvidia: module verification failed"),
               (7, "NVRM: debug chatter")])
    with (fake.root / "dev/kmsg").open("a") as log:
        log.write("not a record\n")
    spec = "version: 1\ndmesg: {allow: ['vxlan', 'name=allowed']}\n"
    result = run_spec(spec, fake.root)["dmesg"]
    assert (result.outcome, result.observed) == (Outcome.FAILED, "3")
    assert result.evidence[0]["raw"] == (
        "10 records since boot, 6 at the levels, 4 allowed as noise, 3 offending; 1 malformed "
        "line(s) skipped; GPU events: 1 failing, 1 warning(s), 0 set aside")


def test_a_flood_is_named_and_counted_as_each_of_its_events(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of events of two GPUs, interleaved: the message names each GPU and code once,
    most severe first, with how many; the counts are per GPU and code; the details keep the
    KEPT most severe, each parsed whole only there."""
    parsed: list[str] = []
    parse_event = xid.parse_event

    def counted(text: str) -> xid.XidEvent | None:
        parsed.append(text)
        return parse_event(text)

    monkeypatch.setattr(xid, "parse_event", counted)
    other = GSP.replace("9b:00", "9a:00")
    fake.kmsg([record for n in range(150) for record in (
        (3, GSP.format(pid=n)), (4, other.format(pid=n)), (4, APP))] + [(3, FALLEN)])
    result = run_spec(SPEC, fake.root)["dmesg"]
    assert (result.outcome, result.observed) == (Outcome.FAILED, "301")
    assert result.message == (
        "0000:41:00.0: Xid 79 (GPU has fallen off the bus): reboot, then service if it repeats; "
        "0000:9a:00.0: Xid 119 (GSP RPC Timeout) x150: reset the GPU; 0000:9b:00.0: Xid 119 "
        "(GSP RPC Timeout) x150: reset the GPU; 301 kernel log record(s) at emerg, alert, "
        "crit, err, warn since boot")
    assert [(c["gpu"], c["code"], c["verdict"], c["count"])
            for c in result.details["xid_counts"]] == [
        ("0000:41:00.0", 79, "fail", 1), ("0000:9a:00.0", 119, "fail", 150),
        ("0000:9b:00.0", 119, "fail", 150), ("0000:a1:00.0", 13, "warn", 150)]
    events = result.details["xid"]
    assert len(events) == KEPT and result.details["xid_cut"] == 451 - KEPT
    assert [(e["gpu"], e["seq"]) for e in events[:3]] == [
        ("0000:41:00.0", 451), ("0000:9a:00.0", 2), ("0000:9a:00.0", 5)]
    assert events[1]["pid"] == 0 and events[2]["pid"] == 1
    assert [e["gpu"] for e in events[150:152]] == ["0000:9a:00.0", "0000:9b:00.0"]
    assert len(parsed) == KEPT  # the events the details show, and none else
    assert result.evidence[1]["raw"].endswith(GSP.format(pid=0))  # the first by seq
