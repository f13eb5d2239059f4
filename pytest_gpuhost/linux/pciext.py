"""PCI Express extended capabilities (config space 0x100..0xFFF) and ACS Control.

Pure functions over the bytes of sysfs ``config``. Each extended capability starts with a 32-bit
header: the capability id in bits 15:0, its version in 19:16 and the offset of the next one in
31:20 (dword aligned; 0 ends the list). The list starts at 0x100; a header of 0 there means the
device has none. A header of 0xFFFFFFFF there is not "none": Linux sizes a function whose 0x100
reads all ones at 256 bytes (``pci_cfg_space_size_ext``), so in a longer file it is a device
that stopped answering, and an error, as a vendor ID of 0xffff is. A list that loops or points
below 0x100 or past the end is an error, not an endless walk (Linux stops after
(4096 - 256) / 8 headers too).

Access Control Services (id 0x000D): ACS Capability at +0x04, ACS Control at +0x06, both 16 bits.
Control bits (PCIe Base Spec 7.7.8.3, Linux ``PCI_ACS_*``): SV 0x01, TB 0x02, P2P Request
Redirect 0x04, P2P Completion Redirect 0x08, Upstream Forwarding 0x10, P2P Egress Control 0x20,
Direct Translated P2P 0x40. The three that send peer traffic up to the root complex are RR, CR
and EC; a fix clears those alone.
"""

from __future__ import annotations

import msgspec

from .pciconfig import ConfigError, check_answers

EXT_START = 0x100
CONFIG_SIZE = 0x1000
EXT_ID_ACS = 0x000D
EXT_ID_AER = 0x0001
ACS_CAP, ACS_CTRL = 0x04, 0x06
ACS_BITS = {"SrcValid": 0x01, "TransBlk": 0x02, "ReqRedir": 0x04, "CmpltRedir": 0x08,
            "UpstreamFwd": 0x10, "EgressCtrl": 0x20, "DirectTrans": 0x40}
"""lspci's names of the ACS Control bits, in its order."""
ACS_REDIRECT = 0x04 | 0x08 | 0x20
"""P2P Request Redirect, P2P Completion Redirect, P2P Egress Control."""
_MAX_HEADERS = (CONFIG_SIZE - EXT_START) // 8


class ExtCapability(msgspec.Struct, frozen=True):
    offset: int
    cap_id: int
    version: int


def extended_capabilities(config: bytes) -> list[ExtCapability]:
    """Every extended capability in list order; [] when the device has none or ``config`` ends
    at 256 bytes (a conventional PCI device); a ConfigError for a device that reads all ones."""
    if len(config) <= EXT_START:
        return []
    check_answers(config)
    found: list[ExtCapability] = []
    offset = EXT_START
    seen: set[int] = set()
    while True:
        if offset + 4 > len(config):
            raise ConfigError(f"extended capability at 0x{offset:03x} is past the end of the "
                              f"{len(config)}-byte config space")
        header = int.from_bytes(config[offset:offset + 4], "little")
        if offset == EXT_START and header == 0:
            return []
        if offset == EXT_START and header == 0xFFFFFFFF:
            raise ConfigError(f"the extended capability header at 0x100 reads 0xffffffff in a "
                              f"{len(config)}-byte config space (Linux gives a function whose "
                              "0x100 reads all ones 256 bytes): the device does not answer "
                              "config reads (gone, or in reset); check dmesg and lspci -vvv")
        if offset in seen or len(seen) >= _MAX_HEADERS:
            raise ConfigError(f"extended capability list loops at 0x{offset:03x}")
        seen.add(offset)
        found.append(ExtCapability(offset, header & 0xFFFF, (header >> 16) & 0xF))
        following = (header >> 20) & 0xFFC
        if following == 0:
            return found
        if following < EXT_START:
            raise ConfigError(f"extended capability at 0x{offset:03x} points to 0x{following:03x}"
                              ", below 0x100")
        offset = following


def find_extended(config: bytes, cap_id: int) -> int | None:
    return next((c.offset for c in extended_capabilities(config) if c.cap_id == cap_id), None)


def acs_names(bits: int) -> str:
    """``ReqRedir+ CmpltRedir+ EgressCtrl-`` for the redirect bits, as lspci shows them."""
    return " ".join(f"{name}{'+' if bits & mask else '-'}" for name, mask in ACS_BITS.items()
                    if mask & ACS_REDIRECT)


class AcsControl(msgspec.Struct, frozen=True):
    """ACS Control of the ACS capability at ``cap``; ``offset`` is cap+6."""

    cap: int
    capability: int
    value: int

    @property
    def offset(self) -> int:
        return self.cap + ACS_CTRL

    @property
    def redirect(self) -> int:
        """The RR/CR/EC bits that are set."""
        return self.value & ACS_REDIRECT

    @property
    def raw(self) -> bytes:
        return self.value.to_bytes(2, "little")

    def without_redirect(self) -> AcsControl:
        """A read-modify-write that clears RR, CR and EC and keeps every other bit."""
        return AcsControl(self.cap, self.capability, self.value & ~ACS_REDIRECT & 0xFFFF)

    def describe(self) -> str:
        return f"ACSCtl 0x{self.value:04x}: {acs_names(self.value)}"


def acs_control(config: bytes) -> AcsControl | None:
    """The ACS Control register, or None when the device has no ACS capability."""
    if len(config) < EXT_START:
        raise ConfigError(f"config space is {len(config)} bytes: the extended capabilities "
                          "(from 0x100) need root to read (sysfs shows 64 bytes otherwise)")
    cap = find_extended(config, EXT_ID_ACS)
    if cap is None:
        return None
    if cap + ACS_CTRL + 2 > len(config):
        raise ConfigError(f"ACS capability at 0x{cap:03x} is cut off by the end of config space")
    capability = int.from_bytes(config[cap + ACS_CAP:cap + ACS_CAP + 2], "little")
    value = int.from_bytes(config[cap + ACS_CTRL:cap + ACS_CTRL + 2], "little")
    return AcsControl(cap, capability, value)
