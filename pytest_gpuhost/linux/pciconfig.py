"""PCI configuration space: find the PCI Express capability and decode Device Control.

Pure functions over the bytes of sysfs ``config``. The capability list starts at the pointer in
0x34 (when Status bit 4 says there is one); the PCI Express capability has id 0x10 and its offset
differs by card (0x60, 0x78, ...). Device Control is the 16-bit word at cap+8: Max_Payload_Size in
bits 7:5 and Max_Read_Request_Size in bits 14:12, each ``128 << n`` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

STATUS = 0x06
STATUS_CAP_LIST = 0x10
CAP_POINTER = 0x34
CAP_ID_EXP = 0x10
DEVCTL = 0x08
MRRS_SHIFT, MRRS_MASK = 12, 0x7000
MPS_SHIFT, MPS_MASK = 5, 0x00E0
BCR_FLR = 0x8000
"""Device Control bit 15: Initiate Function Level Reset on an endpoint. A fix never sets it."""

SIZES = (128, 256, 512, 1024, 2048, 4096)
_MAX_CAPS = 48  # (256 - 64) / 4: a longer chain is a loop


class ConfigError(ValueError):
    """Config space that cannot be decoded; the message says why and what to do."""


def find_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of capability ``cap_id`` in the standard list, or None when it is absent."""
    if len(config) < 0x40:
        raise ConfigError(f"config space is {len(config)} bytes; the header alone is 64")
    if not config[STATUS] & STATUS_CAP_LIST:
        return None
    offset = config[CAP_POINTER] & 0xFC
    seen: set[int] = set()
    while offset:
        if offset in seen or len(seen) >= _MAX_CAPS:
            raise ConfigError(f"capability list loops at 0x{offset:02x}")
        if offset + 2 > len(config):
            raise ConfigError(
                f"config space is {len(config)} bytes but the capability list goes to "
                f"0x{offset:02x}: reads past 64 bytes of sysfs config need root")
        seen.add(offset)
        if config[offset] == cap_id:
            return offset
        offset = config[offset + 1] & 0xFC
    return None


@dataclass(frozen=True)
class DeviceControl:
    """Device Control of the PCI Express capability at ``cap``; ``offset`` is cap+8."""

    cap: int
    value: int

    @property
    def offset(self) -> int:
        return self.cap + DEVCTL

    @property
    def max_read_request(self) -> int:
        return 128 << ((self.value & MRRS_MASK) >> MRRS_SHIFT)

    @property
    def max_payload(self) -> int:
        return 128 << ((self.value & MPS_MASK) >> MPS_SHIFT)

    @property
    def raw(self) -> bytes:
        return self.value.to_bytes(2, "little")

    def with_max_read_request(self, size: int) -> DeviceControl:
        """Read-modify-write of bits 14:12 alone; bit 15 (function-level reset) stays clear."""
        if size not in SIZES:
            raise ValueError(f"MaxReadReq {size} is not one of {SIZES}")
        code = SIZES.index(size)
        value = (self.value & ~MRRS_MASK & ~BCR_FLR & 0xFFFF) | (code << MRRS_SHIFT)
        return DeviceControl(self.cap, value)


def device_control(config: bytes) -> DeviceControl:
    cap = find_capability(config, CAP_ID_EXP)
    if cap is None:
        raise ConfigError("no PCI Express capability in the capability list")
    end = cap + DEVCTL + 2
    if len(config) < end:
        raise ConfigError(f"config space is {len(config)} bytes, Device Control is at "
                          f"0x{cap + DEVCTL:02x}: reads past 64 bytes of sysfs config need root")
    return DeviceControl(cap, int.from_bytes(config[cap + DEVCTL:end], "little"))


LNKCTL = 0x10
ASPM_MASK = 0x0003
ASPM_STATES = {0: "disabled", 1: "L0s", 2: "L1", 3: "L0s L1"}
"""Link Control (cap+0x10) bits 1:0, ASPM Control: which link power states are enabled."""


def aspm_control(config: bytes) -> tuple[int, int]:
    """(offset of Link Control, its ASPM Control bits 1:0)."""
    cap = find_capability(config, CAP_ID_EXP)
    if cap is None:
        raise ConfigError("no PCI Express capability in the capability list")
    end = cap + LNKCTL + 2
    if len(config) < end:
        raise ConfigError(f"config space is {len(config)} bytes, Link Control is at "
                          f"0x{cap + LNKCTL:02x}: reads past 64 bytes of sysfs config need root")
    return cap + LNKCTL, int.from_bytes(config[cap + LNKCTL:end], "little") & ASPM_MASK


def parse_hexdump(text: str) -> dict[str, bytes]:
    """Config spaces from ``lspci -xxx`` / ``-xxxx`` output, keyed by the device's address line.

    Lines ``00: de 10 ...`` after a device heading (``02:00.0 3D controller: ...``) are its bytes;
    other lines (``-vvv`` decoding, comments) are ignored.
    """
    spaces: dict[str, bytearray] = {}
    current: str | None = None
    for line in text.splitlines():
        head, sep, _ = line.partition(" ")
        heading = sep and not line[:1].isspace() and not head.endswith(":")
        if heading and ":" in head and "." in head:
            current = head
            spaces.setdefault(current, bytearray())
            continue
        offset, colon, hexbytes = line.partition(":")
        if current is None or not colon or line[:1].isspace():
            continue
        try:
            start = int(offset, 16)
            values = bytes(int(b, 16) for b in hexbytes.split())
        except ValueError:
            continue
        data = spaces[current]
        if start != len(data) or len(values) != 16:
            continue
        data.extend(values)
    return {address: bytes(data) for address, data in spaces.items() if data}
