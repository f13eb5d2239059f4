"""NVIDIA's GPU events in kernel log records: Xid, SXid, a GPU off the bus, and what resets a GPU.

The forms the driver writes (a record's text, after the kmsg header):

- ``NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, Timeout after 6s ...``;
  the address also without its domain (``PCI:9b:00``), without ``PCI:`` (``0000:01:00``), as a
  GPU's UUID (``GPU-509665ad-...``); ``pid='<unknown>'``, ``name=<unknown>``, or neither;
- ``nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up``;
- ``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``(PCI ID: 10de:26b5) installed in this system has``
  / ``fallen off the bus ...``: one record whose lines the kernel escapes, or several records;
  ``NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0x65:1457)``: events without an Xid;
- ``NVRM: loading NVIDIA UNIX ... Kernel Module``: the driver loaded, every GPU brought up anew
  (its probe's own records come just before it, in one run of the driver's records that no
  other record, Xid or unload interrupts); an NVRM
  record naming a GPU and ``GPU reset``: that GPU was reset;
- ``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...``: which UUID a GPU has.

GPUs are named in the sysfs form (``0000:9b:00.0``), or by UUID where the log names no address.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

_ADDRESS = r"(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_WHERE = rf"\((?:PCI:)?(?P<where>{_ADDRESS}|GPU-[0-9a-fA-F-]+)\)"
_HEAD = rf"\b(?P<kind>S?Xid) {_WHERE}: (?P<code>\d+)\b"
_XID = re.compile(rf"{_HEAD},? ?"
                  r"(?:pid=(?:'?<unknown>'?|(?P<pid>\d+))(?:, |,?$))?"
                  r"(?:name=(?P<name>[^,]*)(?:, |,?$))?(?P<rest>.*)", re.DOTALL)
_XID_HEAD = re.compile(_HEAD)
"""``_XID`` but its optional rest (pid, name, what the driver says): where one matches the other
does, with the same kind, GPU and code."""
xid_head = _XID_HEAD.search
"""``xid_head(text)``: the kind, GPU and code of the Xid or SXid in ``text`` (``head_of``),
without the rest of its event: what a walk of the log judges it by (the pattern's own search:
a flood calls it once a record)."""
_ANY_ADDRESS = re.compile(
    rf"(?<![0-9a-fA-F:])(?:PCI:)?(?P<address>{_ADDRESS})(?![0-9a-fA-F]|:[0-9a-fA-F])")
_THE_GPU = re.compile(rf"NVRM: The NVIDIA GPU (?P<address>{_ADDRESS})")
_LOAD = re.compile(r"NVRM: loading NVIDIA UNIX\b.*Kernel Module")
_RESET = re.compile(r"\bGPU (?:reset|has been reset)\b", re.IGNORECASE)
_NOT_DONE = re.compile(r"requir|need|fail|pending|Xid", re.IGNORECASE)
_UNLOADING = re.compile(r"\bUnload(?:ing|ed)\b|\bUnregistered\b")
_UUID = re.compile(rf"NVRM: GPU at PCI:(?P<address>{_ADDRESS}): (?P<uuid>GPU-[0-9a-fA-F-]+)")

FALLEN_OFF, INIT_FAILED = "fallen off the bus", "RmInitAdapter failed"
DRIVERS = ("NVRM", "nvidia")
"""How the records of NVIDIA's kernel modules begin (``NVRM:``, ``nvidia:``, ``nvidia-nvlink:``,
``nvidia 0000:01:00.0: ...``): only these can be GPU events or resets, and a driver load's own
records run together before its ``loading`` line."""


class XidEvent(NamedTuple):
    """One event: ``kind`` is ``Xid``, ``SXid`` or ``NVRM`` (an event without an Xid, whose
    ``code`` is None and whose ``text`` says which)."""

    kind: str
    code: int | None
    gpu: str | None
    pid: int | None
    name: str | None
    """The process the driver names (``name=nvidia-smi``)."""
    text: str
    """The record's whole text."""
    detail: str
    """What the driver says of it: the text after the code, pid and name (for an event
    without an Xid, which: ``fallen off the bus``, ``RmInitAdapter failed``)."""


class Marker(NamedTuple):
    """A record after which a GPU's earlier events are of a GPU that is gone: ``gpu`` None for
    a driver load (every GPU)."""

    gpu: str | None
    what: str


@functools.lru_cache(maxsize=1024)  # a flood of one GPU's Xid names it 50,000 times
def gpu_address(text: str) -> str:
    """``0000:9b:00``, ``9b:00``, ``00000000:9b:00.0`` -> ``0000:9b:00.0``; a UUID as it is."""
    if text.startswith("GPU-"):
        return text.lower()
    head, _, function = text.partition(".")
    parts = head.split(":")
    domain = int(parts[0], 16) if len(parts) == 3 else 0
    bus, device = parts[-2], parts[-1]
    return f"{domain:04x}:{bus.lower()}:{device.lower()}.{function or '0'}"


def code_span(text: str) -> tuple[int, int] | None:
    """Where the code of the Xid or SXid in ``text`` is (a capture's pattern keeps it)."""
    match = _XID.search(text)
    return match.span("code") if match else None


def head_of(match: re.Match[str]) -> tuple[str, int, str]:
    """(kind, code, GPU) of an ``xid_head``."""
    kind, where, code = match.group("kind", "where", "code")
    return kind, int(code), gpu_address(where)


def xid_detail(text: str, head: re.Match[str]) -> str:
    """``XidEvent.detail`` of the Xid or SXid whose ``xid_head`` is ``head``."""
    match = _XID.match(text, head.start())
    return match.group("rest").strip() if match else ""


def parse_event(text: str) -> XidEvent | None:
    """The Xid, SXid or event without an Xid in one record's text, or None."""
    match = _XID.search(text)
    if match is not None:
        kind, where, code, pid, name, rest = match.group("kind", "where", "code", "pid", "name",
                                                         "rest")
        name = name.strip() if name else None
        return XidEvent(kind, int(code), gpu_address(where), int(pid) if pid else None,
                        None if not name or name == "<unknown>" else name, text, rest.strip())
    return event_without_xid(text)


def event_without_xid(text: str) -> XidEvent | None:
    """A GPU off the bus or one the driver could not bring up, said without an Xid, in a
    record's text that has no Xid (``xid_head`` found none), or None."""
    if "NVRM" not in text:
        return None
    for what in (FALLEN_OFF, INIT_FAILED):
        if what in " ".join(text.split()):
            return XidEvent("NVRM", None, _first_address(text), None, None, text, what)
    return None


def _first_address(text: str) -> str | None:
    found = _ANY_ADDRESS.search(text)
    return gpu_address(found.group("address")) if found else None


def marker(text: str) -> Marker | None:
    """A driver load, or a reset of one GPU (an NVRM record that names it and says ``GPU
    reset``, not that one is required, pending or failed)."""
    if _LOAD.search(text):
        return Marker(None, "the driver loaded")
    if "NVRM" in text and _RESET.search(text) and not _NOT_DONE.search(text):
        gpu = _first_address(text)
        if gpu is not None:
            return Marker(gpu, "the GPU was reset")
    return None


def the_gpu(text: str) -> str | None:
    """The GPU of ``NVRM: The NVIDIA GPU 0000:b3:00.0``, the first record of an event that the
    next ones describe (``... fallen off the bus``) when the kernel splits it."""
    found = _THE_GPU.search(text)
    return gpu_address(found.group("address")) if found else None


def uuid_of(text: str) -> tuple[str, str] | None:
    """(UUID, address) from ``NVRM: GPU at PCI:0000:9b:00: GPU-509665ad-...``."""
    found = _UUID.search(text)
    return (found.group("uuid").lower(), gpu_address(found.group("address"))) if found else None


def unloading(text: str) -> bool:
    """A record of the driver going away (``nvidia-uvm: Unloaded the UVM driver``,
    ``nvidia-nvlink: Unregistered Nvlink Core``): the next load's run starts after it."""
    return _UNLOADING.search(text) is not None
