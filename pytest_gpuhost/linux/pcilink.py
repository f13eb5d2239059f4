"""PCI Express links: what a port's config space says of its link, and what a link can carry.

Pure functions over the bytes of sysfs ``config``. In the PCI Express capability (id 0x10):
the Capabilities Register at +0x02 (version 3:0, Device/Port Type 7:4), Device Control at +0x08
(Max_Payload_Size 7:5, Max_Read_Request_Size 14:12), Link Capabilities at +0x0C (Max Link Speed
3:0, Max Link Width 9:4), Link Control at +0x10 (ASPM Control 1:0), Link Status at +0x12
(Current Link Speed 3:0, Negotiated Link Width 9:4) and, in a version 2 capability, Link
Control 2 at +0x30 (Target Link Speed 3:0). A speed field is a code: 1 is 2.5 GT/s, 2 is 5,
3 is 8, 4 is 16, 5 is 32, 6 is 64.

What a link carries, in GB/s (10^9 bytes a second) each way:
``rate x width / 8 x encoding x MPS / (MPS + 24)``. The encoding is 8b/10b at 2.5 and 5 GT/s,
128b/130b at 8 to 32 GT/s, and at 64 GT/s (flit mode) 236 bytes of TLPs in a 256-byte flit.
24 bytes go with each TLP besides its payload of at most MPS bytes: the framing (STP and END,
or the 4-byte STP token that holds the sequence number from 8 GT/s on) with the sequence
number, a 4-dword header (64-bit addresses: a GPU's BAR lies above 4 GiB) and the 4-byte LCRC;
in flit mode, the header alone (16 bytes). PCIe Gen5 x16 at MPS 256: 32 x 16 / 8 x 128/130 x
256/280 = 57.61 GB/s. Flow-control and acknowledgement packets, which share the link, are left
out: a copy reaches a little less.
"""

from __future__ import annotations

import msgspec

from .pciconfig import (
    CAP_ID_EXP,
    ConfigError,
    aspm_control,
    capability_end,
    device_control,
    find_capability,
    short_config,
)

SPEEDS = {1: 2.5, 2: 5.0, 3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}
"""Link speed codes (LnkCap, LnkSta, LnkCtl2) -> GT/s per lane."""
IDLE_SPEED = 2.5
"""An idle GPU drops its link to 2.5 GT/s: a Link Status read then says nothing of the speed
the link trains to under load."""

PORT_TYPES = {0: "endpoint", 1: "legacy endpoint", 4: "root port", 5: "switch upstream port",
              6: "switch downstream port", 7: "PCIe-to-PCI bridge", 8: "PCI-to-PCIe bridge",
              9: "integrated endpoint", 10: "event collector"}
UPSTREAM_FACING = (0, 1, 5, 7)
"""Device/Port Types whose link registers describe the link above them (an endpoint, a switch's
upstream port, a PCIe-to-PCI bridge); a root port's and a downstream port's describe the link
below them."""

TLP_OVERHEAD = 24
"""Bytes each TLP carries besides its payload (framing, sequence number, 4-dword header, LCRC)."""
FLIT_OVERHEAD = 16
"""At 64 GT/s (flit mode) framing, sequence number and CRC are the flit's: the header alone."""
_CAPS, _DEVCAP, _LNKCAP, _LNKSTA, _LNKCTL2 = 0x02, 0x04, 0x0C, 0x12, 0x30


def encoding(speed: float) -> float:
    """The share of the line rate that carries data (TLPs) at ``speed`` GT/s."""
    if speed <= 5.0:
        return 8 / 10
    if speed <= 32.0:
        return 128 / 130
    return 236 / 256


def link_gbps(speed: float, width: int, max_payload: int) -> float:
    """What a link of ``width`` lanes at ``speed`` GT/s carries each way, in GB/s, in TLPs of
    ``max_payload`` bytes (see the module's formula)."""
    overhead = FLIT_OVERHEAD if speed > 32.0 else TLP_OVERHEAD
    return speed * width / 8 * encoding(speed) * max_payload / (max_payload + overhead)


def generation(speed: float) -> int | None:
    """PCIe generation of a speed (8 GT/s is Gen3), None for one the table does not know."""
    for code, value in SPEEDS.items():
        if value == speed:
            return code
    return None


class Link(msgspec.Struct, frozen=True):
    """A link's speed (GT/s per lane; 0.0 for a code no generation has) and width (lanes)."""

    speed: float
    width: int

    def describe(self) -> str:
        gen = generation(self.speed)
        return (f"Gen{gen} x{self.width}" if gen is not None else
                f"{self.speed:g} GT/s x{self.width}")

    def gbps(self, max_payload: int) -> float:
        return link_gbps(self.speed, self.width, max_payload)

    def below(self, other: Link) -> bool:
        return self.speed < other.speed or self.width < other.width

    def narrowest(self, other: Link) -> Link:
        """What two ends can train to: the slower speed, the fewer lanes."""
        return Link(min(self.speed, other.speed), min(self.width, other.width))


def _link(word: int) -> Link:
    return Link(SPEEDS.get(word & 0xF, 0.0), (word >> 4) & 0x3F)


class PortRegisters(msgspec.Struct, frozen=True):
    """What config space says of one PCI Express function on a GPU's path."""

    port_type: int
    capable: Link
    """Link Capabilities: the fastest and widest this port can train to."""
    current: Link
    """Link Status: the link as it trained (both ends read the same)."""
    target_speed: float | None
    """Link Control 2's Target Link Speed (a downstream port caps its link with it; firmware
    sets it for "PCIe Gen3" in a slot's setup), None where there is none."""
    aspm: int
    """Link Control's ASPM Control bits 1:0 (1 L0s, 2 L1, 3 both)."""
    max_payload: int
    max_read_request: int

    @property
    def kind(self) -> str:
        return PORT_TYPES.get(self.port_type, f"port type {self.port_type}")

    @property
    def upstream_facing(self) -> bool:
        return self.port_type in UPSTREAM_FACING


def port_registers(config: bytes) -> PortRegisters:
    """The link registers of the PCI Express capability; ConfigError for config space that
    does not hold them (64 bytes without root, no PCI Express capability, a damaged list)."""
    control = device_control(config)  # the capability, its Device Control's sizes checked
    cap = find_capability(config, CAP_ID_EXP)
    assert cap is not None
    end = cap + _LNKSTA + 2
    capability_end(cap, _LNKSTA + 2, "the PCI Express capability's Link Status")
    if len(config) < end:
        raise ConfigError(f"Link Status at 0x{cap + _LNKSTA:02x}: "
                          f"{short_config(len(config), end - 1)}")

    def word(offset: int, size: int = 2) -> int:
        return int.from_bytes(config[cap + offset:cap + offset + size], "little")

    version, port_type = word(_CAPS) & 0xF, (word(_CAPS) >> 4) & 0xF
    target = None
    if version >= 2 and cap + _LNKCTL2 + 2 <= min(len(config), 0x100):
        target = SPEEDS.get(word(_LNKCTL2) & 0xF)
    _, aspm = aspm_control(config)
    return PortRegisters(port_type, _link(word(_LNKCAP, 4)), _link(word(_LNKSTA)), target,
                         aspm, control.max_payload, control.max_read_request)
