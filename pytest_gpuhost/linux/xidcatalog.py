"""NVIDIA's Xid catalog, bundled: per Xid code, its name, a class and the action it asks for.

Source: NVIDIA's public Xid table, "Analyzing Xid Errors with the Xid Catalog"
(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html), sheet "Catalog", as
published in October 2025 (codes 1 to 172; ``VERSION``). The name of each code is the table's
description; the action is its "Resolution Bucket (Immediate Action)" (RESTART_APP,
RESET_GPU, RESTART_BM, IGNORE, CHECK_MECHANICALS, a WORKFLOW_*), and ``escalate`` says its
"Investigatory Action" is CONTACT_SUPPORT: service the card if it repeats. The class is ours,
read from both columns: ``application`` (the program is wrong: CHECK_APP/CUDA, the Xid 13 and
31 workflows, and what NVIDIA's device plugin skips: 13, 31, 43, 45, 68, 109), ``driver``
(INVESTIGATE_SW, GSP, firmware), ``hardware`` (memory, the bus, power, a halted
micro-controller), ``interconnect`` (NVLink, C2C, NVSwitch). Codes the table lists as unused
are left out, as is any code it does not list: those are ``unknown``/``service``, never
dropped. Codes 162 to 172 have no resolution in the table: their action here is ours.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

SOURCE = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
VERSION = "2025-10 (codes 1-172)"

APPLICATION, DRIVER, HARDWARE, INTERCONNECT, UNKNOWN = (
    "application", "driver", "hardware", "interconnect", "unknown")
CLASSES = (APPLICATION, DRIVER, HARDWARE, INTERCONNECT, UNKNOWN)

NONE, RESTART_APP, RESET_GPU, REBOOT, CHECK_CABLE, SERVICE = (
    "none", "restart_app", "reset_gpu", "reboot", "check_cable", "service")
ACTIONS = (NONE, RESTART_APP, RESET_GPU, REBOOT, CHECK_CABLE, SERVICE)
"""From the least to the most severe: a node that needs a reboot needs no GPU reset first, and
a cable to check or a card to service needs hands on the machine."""
WORDS = {NONE: "nothing to do", RESTART_APP: "restart the application",
         RESET_GPU: "reset the GPU", REBOOT: "reboot", CHECK_CABLE: "check the cable and seating",
         SERVICE: "service the card"}


class Entry(NamedTuple):
    name: str
    cls: str
    action: str
    escalate: bool = False
    """NVIDIA's investigatory action is CONTACT_SUPPORT: service the card if it repeats."""

    def advice(self) -> str:
        """``reboot, then service if it repeats``."""
        words = WORDS[self.action]
        return f"{words}, then service if it repeats" if self.escalate and \
            self.action not in (SERVICE, NONE) else words


_RANK = {action: rank for rank, action in enumerate(ACTIONS)}


def severity(action: str) -> int:
    """The action's rank in ``ACTIONS``: higher is more severe."""
    return _RANK[action]


_A, _D, _H, _I = APPLICATION, DRIVER, HARDWARE, INTERCONNECT

CATALOG: dict[int, Entry] = {
    8: Entry("GPU stopped processing", _A, RESTART_APP, True),
    11: Entry("Invalid or corrupted push buffer stream", _A, RESTART_APP),
    13: Entry("Graphics Engine Exception", _A, RESTART_APP),
    14: Entry("Fake error (test)", _D, NONE),
    25: Entry("Invalid or illegal push buffer stream", _A, RESTART_APP),
    31: Entry("GPU memory page fault", _A, RESTART_APP),
    32: Entry("Invalid or corrupted push buffer stream", _A, RESTART_APP),
    37: Entry("Driver firmware error", _D, NONE),
    38: Entry("Driver firmware error", _D, NONE, True),
    39: Entry("Copy Engine Exception", _A, RESTART_APP, True),
    40: Entry("Copy Engine Exception", _A, RESTART_APP, True),
    41: Entry("Copy Engine Exception", _A, RESTART_APP, True),
    43: Entry("GPU stopped processing", _A, NONE),
    44: Entry("Graphics Engine fault during context switch", _A, NONE),
    45: Entry("Preemptive cleanup, due to previous errors", _A, NONE),
    46: Entry("GPU stopped processing", _H, RESET_GPU, True),
    48: Entry("Double Bit ECC Error", _H, RESET_GPU, True),
    54: Entry("Auxiliary power is not connected to the GPU board", _H, CHECK_CABLE, True),
    60: Entry("Video processor exception", _A, RESTART_APP),
    62: Entry("Internal micro-controller halt", _H, RESET_GPU, True),
    63: Entry("GPU memory remapping event", _H, NONE),
    64: Entry("GPU memory remapping failure", _H, RESET_GPU, True),
    66: Entry("Illegal access by driver", _D, NONE),
    67: Entry("Illegal access by driver", _D, NONE, True),
    68: Entry("NVDEC0 Exception", _A, RESTART_APP, True),
    69: Entry("Graphics Engine class error", _A, RESTART_APP),
    **{code: Entry(f"CE{n}: Unknown Error", _A, RESTART_APP, True)
       for code, n in ((70, 3), (71, 4), (72, 5), (75, 6), (76, 7), (77, 8), (85, 9))},
    74: Entry("NVLINK Error", _I, RESET_GPU, True),
    78: Entry("vGPU Start Error", _D, SERVICE),
    79: Entry("GPU has fallen off the bus", _H, REBOOT, True),
    80: Entry("Corrupted data sent to GPU", _A, RESTART_APP),
    82: Entry("NVJPG0 Error", _A, RESTART_APP, True),
    83: Entry("NVDEC1 Error", _A, RESTART_APP, True),
    84: Entry("NVDEC2 Error", _A, RESTART_APP, True),
    86: Entry("OFA Exception", _A, RESTART_APP, True),
    88: Entry("NVDEC3 Error", _A, RESTART_APP, True),
    89: Entry("NVDEC4 Error", _A, RESTART_APP, True),
    92: Entry("High single-bit ECC error rate", _H, NONE, True),
    93: Entry("Non-fatal violation of provisioned InfoROM wear limit", _H, NONE, True),
    94: Entry("Contained memory error", _H, RESTART_APP),
    95: Entry("Uncontained memory error", _H, RESET_GPU),
    **{code: Entry(f"NVDEC{code - 91} Error", _A, RESTART_APP, True) for code in (96, 97, 98)},
    **{code: Entry(f"NVJPG{code - 98} Error", _A, RESTART_APP, True) for code in range(99, 106)},
    106: Entry("SMBPBI Test Message", _D, NONE),
    107: Entry("SMBPBI Test Message Silent", _D, NONE),
    108: Entry("NVLink remote translation error", _I, NONE),
    109: Entry("Context Switch Timeout Error", _A, RESET_GPU, True),
    110: Entry("Security Fault Error", _D, RESET_GPU),
    119: Entry("GSP RPC Timeout", _D, RESET_GPU),
    120: Entry("GSP Error", _D, RESET_GPU),
    121: Entry("C2C Error", _I, NONE, True),
    **{code: Entry(f"CE{code - 116}: Unknown Error", _A, RESTART_APP, True)
       for code in range(126, 136)},
    136: Entry("Link Training Failed", _I, RESET_GPU),
    137: Entry("NVLink Privilege Error", _I, NONE),
    139: Entry("OFA1 Error", _A, RESTART_APP, True),
    140: Entry("ECC Unrecovered Error", _H, RESET_GPU, True),
    141: Entry("CUDA Fast Path Error", _D, NONE, True),
    142: Entry("NVENC3 Error", _A, SERVICE),
    143: Entry("GPU Initialization Error", _H, RESET_GPU, True),
    **{code: Entry(f"NVLINK: {unit} Error", _I, RESET_GPU, True)
       for code, unit in ((144, "SAW"), (145, "RLW"), (146, "TLW"), (147, "TREX"),
                          (148, "NVLPW_CTRL"), (149, "NETIR"), (150, "MSE"))},
    151: Entry("Key rotation Error", _D, REBOOT, True),
    152: Entry("DLA SMMU Error", _D, NONE, True),
    153: Entry("DLA timeout Error", _D, NONE, True),
    154: Entry("GPU Recovery Action Changed", _D, SERVICE),
    155: Entry("NVLINK: SW Defined Error", _I, RESET_GPU),
    156: Entry("Resource Retirement Event", _H, RESET_GPU),
    157: Entry("Resource Retirement Failure", _H, NONE, True),
    158: Entry("GPU Fatal Timeout", _H, RESET_GPU, True),
    159: Entry("CHI Non-Data Error", _D, SERVICE),
    160: Entry("Channel Retirement Event", _D, NONE),
    161: Entry("Channel Retirement Failure", _D, NONE),
    162: Entry("Power Smoothing HW Circuitry capability reengaged", _H, NONE),
    163: Entry("Power Smoothing HW Circuitry capability disengaged", _H, SERVICE),
    164: Entry("Power Smoothing HW Circuitry low lifetime reached", _H, NONE),
    165: Entry("Power Smoothing HW Circuitry lifetime exhausted", _H, SERVICE),
    166: Entry("NVLink encrypted traffic before the link was configured", _I, SERVICE),
    167: Entry("PCIe fatal timeout", _H, REBOOT, True),
    168: Entry("Reduced GPU memory capacity", _H, SERVICE),
    169: Entry("Internal micro-controller halt (SEC2)", _H, RESET_GPU, True),
    170: Entry("NVLink interrupt in confidential computing mode", _I, SERVICE),
    171: Entry("Uncorrectable DRAM error", _H, RESET_GPU, True),
    172: Entry("Uncorrectable SRAM error", _H, RESET_GPU, True),
}
"""Xid code -> entry (the table's unused codes left out: they are unknown)."""

FALLEN_OFF = Entry("GPU has fallen off the bus", _H, REBOOT, True)
"""``NVRM: The NVIDIA GPU ... has fallen off the bus`` without an Xid: as Xid 79."""
INIT_FAILED = Entry("RmInitAdapter failed", _H, REBOOT, True)
"""``NVRM: ... RmInitAdapter failed!``: the driver could not bring the GPU up (as Xid 143, whose
GPU reset cannot run on a GPU the driver never initialised: reboot)."""
SXID_FATAL = Entry("NVSwitch fatal error", _I, RESET_GPU, True)
"""A fatal SXid: the NVSwitch and the GPUs on it must be reset (Fabric Manager's guide)."""
SXID_NON_FATAL = Entry("NVSwitch non-fatal error", _I, NONE)
"""A non-fatal SXid: corrected by the switch, counted; a warning."""


def unknown(what: str) -> Entry:
    return Entry(what, UNKNOWN, SERVICE)


def xid_entry(code: int, text: str = "") -> Entry:
    """The entry of Xid ``code``; Xid 154 says in ``text`` which recovery it now asks for."""
    entry = CATALOG.get(code)
    if entry is None:
        return _unknown_xid(code)
    if code == 154:
        after = text.rpartition(" to ")[2].lower()
        for word, action in (("reboot", REBOOT), ("reset", RESET_GPU), ("none", NONE)):
            if word in after:
                return entry._replace(action=action)
    return entry


@functools.lru_cache(maxsize=256)  # one entry for a flood of one unknown code
def _unknown_xid(code: int) -> Entry:
    return unknown(f"Xid {code}, not in NVIDIA's catalog of {VERSION}")


def sxid_entry(code: int, text: str) -> Entry:
    """An NVSwitch SXid, by the severity its record states (``Fatal,`` or ``Non-fatal,``)."""
    head = text.lstrip().lower()
    if head.startswith("non-fatal"):
        return SXID_NON_FATAL
    if head.startswith("fatal"):
        return SXID_FATAL
    return unknown(f"SXid {code}, of no stated severity")
