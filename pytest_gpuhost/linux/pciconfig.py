"""PCI configuration space: find the PCI Express capability and decode Device Control.

Pure functions over the bytes of sysfs ``config``. The capability list starts at the pointer in
0x34 (when Status bit 4 says there is one); the PCI Express capability has id 0x10 and its offset
differs by card (0x60, 0x78, ...). Device Control is the 16-bit word at cap+8: Max_Payload_Size in
bits 7:5 and Max_Read_Request_Size in bits 14:12, each ``128 << n`` bytes.

Standard capabilities live in 0x40..0xFF. The walk takes a pointer as the kernel
(``__pci_find_next_cap_ttl``) and libpci do: bits 1:0 are reserved and masked off, so an entry is
always dword aligned; but where the kernel quietly ends the list at a pointer below 0x40, this walk
refuses it, as it refuses a capability too close to 0x100 to hold what is read from it: such a
pointer would make a fix write the header (BAR0 at 0x10) or extended config space.
"""

from __future__ import annotations

import msgspec

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
STANDARD_START, STANDARD_END = 0x40, 0x100
"""Standard capabilities lie in [0x40, 0x100); the header is below, extended space above."""
_MAX_CAPS = 48  # (256 - 64) / 4: a longer chain is a loop


class ConfigError(ValueError):
    """Config space that cannot be decoded; the message says why and what to do."""


def short_config(length: int, needed: int) -> str:
    """Why ``length`` bytes of sysfs config do not reach offset ``needed``, in the words of what
    each length means: 64 is the header alone (not root, or a container), 256 a function without
    extended config space (conventional PCI, or a VM that does not expose it)."""
    seen = f"config space is {length} bytes but 0x{needed:02x} is needed"
    if length <= 0x40:
        return (f"{seen}: only the 64-byte header is readable: reads past 64 bytes of sysfs "
                "config need root (in the initial user namespace: a container reads 64 bytes)")
    if length == STANDARD_END:
        return (f"{seen}: 256 bytes means no extended config space (conventional PCI, or a VM "
                "that does not expose it)")
    return f"{seen}: the file is shorter than a PCI function's config space"


HEADER_TYPE = 0x0E
BRIDGE_HEADER = 1
"""Header type 1 (bits 6:0 of 0x0E): a PCI-to-PCI bridge, what every PCIe port is."""


def header_type(config: bytes) -> int:
    """The layout of the header: 0 an endpoint, 1 a PCI-to-PCI bridge, 2 a CardBus bridge
    (bit 7, a multi-function device, masked off)."""
    if len(config) <= HEADER_TYPE:
        raise ConfigError(f"config space is {len(config)} bytes; the header alone is 64")
    return config[HEADER_TYPE] & 0x7F


def check_answers(config: bytes) -> None:
    """Refuse config space read from a function that does not answer: a vendor ID of 0xffff is
    what a read returns from a device that fell off the bus or is in reset (no vendor has it),
    and every other byte read then is 0xff too, which a walk would take for values."""
    if config[:2] == b"\xff\xff":
        raise ConfigError("the vendor ID reads 0xffff: the device does not answer config reads "
                          "(gone from the bus, or in reset); nothing is read or written: check "
                          "dmesg and lspci -vvv")


def capability_end(offset: int, length: int, what: str) -> None:
    """Refuse a standard capability whose ``length`` bytes from ``offset`` leave 0x40..0xFF."""
    if offset + length > STANDARD_END:
        raise ConfigError(f"{what} at 0x{offset:02x} would reach 0x{offset + length - 1:02x}, "
                          "past the standard capabilities (0x40..0xff): a damaged capability "
                          "list; nothing is read or written there")


def find_capability(config: bytes, cap_id: int) -> int | None:
    """Offset of capability ``cap_id`` in the standard list, or None when it is absent.

    Each pointer must lie in 0x40..0xFF (bits 1:0 masked off, as the PCI spec, the kernel and
    libpci mask them); a pointer into the header, an entry too close to 0x100 to hold its id
    and next pointer, a loop, or an id of 0xFF or a vendor ID of 0xffff (the device reads all
    ones) is a ConfigError naming it."""
    if len(config) < 0x40:
        raise ConfigError(f"config space is {len(config)} bytes; the header alone is 64")
    check_answers(config)
    if not config[STATUS] & STATUS_CAP_LIST:
        return None
    where, offset = f"the capability pointer at 0x{CAP_POINTER:02x}", config[CAP_POINTER]
    seen: set[int] = set()
    while offset:
        if offset < STANDARD_START:
            raise ConfigError(f"{where} is 0x{offset:02x}, inside the 64-byte header: standard "
                              "capabilities lie in 0x40..0xff; a damaged capability list")
        offset &= 0xFC
        if offset in seen or len(seen) >= _MAX_CAPS:
            raise ConfigError(f"capability list loops at 0x{offset:02x}")
        if offset + 2 > len(config):
            raise ConfigError(short_config(len(config), offset + 1))
        seen.add(offset)
        if config[offset] == 0xFF:
            raise ConfigError(f"the capability at 0x{offset:02x} reads 0xff: the device does not "
                              "answer config reads (gone, or in reset)")
        if config[offset] == cap_id:
            return offset
        where, offset = f"the next pointer of the capability at 0x{offset:02x}", \
            config[offset + 1]
    return None


class DeviceControl(msgspec.Struct, frozen=True):
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
        """Read-modify-write of bits 14:12 alone: every other bit is written as it was read.

        Bit 15 is the one bit that cannot be written back as read: on an endpoint it is
        Initiate Function Level Reset, which always reads 0, so a 1 there means the word was
        not read from an answering endpoint; writing it back would reset the GPU and clearing
        it would change a bit that is not ours (Bridge Configuration Retry on a port). Such a
        word is refused (ConfigError), never rewritten."""
        if size not in SIZES:
            raise ValueError(f"MaxReadReq {size} is not one of {SIZES}")
        if self.value & BCR_FLR:
            raise ConfigError(f"DevCtl 0x{self.value:04x} at 0x{self.offset:02x} reads bit 15 "
                              "set, but an endpoint's Initiate Function Level Reset always "
                              "reads 0: the function does not answer as an endpoint (in reset, "
                              "or not a GPU); nothing is written: check it with lspci -vvv")
        code = SIZES.index(size)
        value = (self.value & ~MRRS_MASK & 0xFFFF) | (code << MRRS_SHIFT)
        return DeviceControl(self.cap, value)


def _check_encodings(devctl: DeviceControl) -> None:
    """Refuse a Device Control whose size fields hold the reserved codes 6 and 7: no device
    sets them, and a word read as all ones (0xffff: the device fell off the bus) holds them.
    Decoded, 7 would read as a MaxReadReq of 16384 that passes any ``min``, and rewritten,
    every other bit of the garbage word would be written back to the device."""
    for name, mask, shift in (("MaxReadReq", MRRS_MASK, MRRS_SHIFT),
                              ("MaxPayload", MPS_MASK, MPS_SHIFT)):
        code = (devctl.value & mask) >> shift
        if code >= len(SIZES):
            raise ConfigError(f"DevCtl 0x{devctl.value:04x} at 0x{devctl.offset:02x} holds the "
                              f"reserved {name} code {code}: the device does not answer config "
                              "reads (0xffff: gone, or in reset); nothing is read as a size or "
                              "written: check it with lspci -vvv and dmesg")


def device_control(config: bytes) -> DeviceControl:
    """Device Control of the PCI Express capability; the whole word lies below 0x100, and its
    size fields hold sizes (see ``_check_encodings``)."""
    cap = find_capability(config, CAP_ID_EXP)
    if cap is None:
        raise ConfigError("no PCI Express capability in the capability list")
    end = cap + DEVCTL + 2
    capability_end(cap, DEVCTL + 2, "the PCI Express capability's Device Control")
    if len(config) < end:
        raise ConfigError(f"Device Control at 0x{cap + DEVCTL:02x}: "
                          f"{short_config(len(config), end - 1)}")
    devctl = DeviceControl(cap, int.from_bytes(config[cap + DEVCTL:end], "little"))
    _check_encodings(devctl)
    return devctl


LNKCTL = 0x10
ASPM_MASK = 0x0003
ASPM_STATES = {0: "disabled", 1: "L0s", 2: "L1", 3: "L0s L1"}
"""Link Control (cap+0x10) bits 1:0, ASPM Control: which link power states are enabled."""


def aspm_control(config: bytes) -> tuple[int, int]:
    """(offset of Link Control, its ASPM Control bits 1:0); like Device Control, the word must
    lie below 0x100: a capability too close to it would read extended config space as ASPM."""
    cap = find_capability(config, CAP_ID_EXP)
    if cap is None:
        raise ConfigError("no PCI Express capability in the capability list")
    end = cap + LNKCTL + 2
    capability_end(cap, LNKCTL + 2, "the PCI Express capability's Link Control")
    if len(config) < end:
        raise ConfigError(f"Link Control at 0x{cap + LNKCTL:02x}: "
                          f"{short_config(len(config), end - 1)}")
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
