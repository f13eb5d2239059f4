"""PCI config spaces for fake host trees: the bytes a device's sysfs ``config`` holds (its
capabilities, MaxReadReq, link speed and width, ACS and AER), and ``lspci -xxxx``'s hexdump of
them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..linux.pciconfig import CAP_ID_EXP, CAP_POINTER, DEVCTL, SIZES, STATUS, STATUS_CAP_LIST
from ..linux.pciext import EXT_ID_ACS, EXT_ID_AER

DEVCTL_FLAGS = 0x0917
"""CorrErr+ NonFatalErr+ FatalErr+ RlxdOrd+ ExtTag+ NoSnoop+, as on a typical NVIDIA endpoint."""

_SPEED_CODES = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def config_space(
    *,
    vendor: int,
    device: int,
    class_code: int,
    exp_cap: int | None = 0x78,
    max_read_request: int = 512,
    max_payload: int = 256,
    link_speed: str = "32.0",
    link_width: int = 16,
    size: int = 4096,
    bridge: bool = False,
    port_type: int = 1,
    aspm: int = 0,
    ext_caps: Sequence[tuple[int, int, bytes]] = (),
    trained: tuple[str, int] | None = None,
    target_speed: str | None = None,
) -> bytes:
    """A config space with PM and MSI capabilities and, at ``exp_cap``, PCI Express: type 0
    (an endpoint; ``port_type`` 1, legacy endpoint) or, with ``bridge``, type 1 (port_type 4 a
    root port, 5 a switch upstream port, 6 a downstream port). ``link_speed`` and
    ``link_width`` are Link Capabilities; the link trained to them (Link Status) unless
    ``trained`` says (speed, width) otherwise. ``target_speed``: Link Control 2's Target Link
    Speed (a slot set to "Gen3" in the firmware). ``aspm`` is Link Control's ASPM bits 1:0.
    ``ext_caps`` are (offset, id, body) extended capabilities chained from 0x100 in the order
    given (see ``acs_body``)."""
    data = bytearray(size)
    data[0:2] = vendor.to_bytes(2, "little")
    data[2:4] = device.to_bytes(2, "little")
    data[4:6] = (0x0406).to_bytes(2, "little")  # Mem+ BusMaster+ DisINTx+
    data[STATUS] = STATUS_CAP_LIST
    data[8] = 0xA1  # revision
    data[9:12] = class_code.to_bytes(3, "little")
    data[0x2C:0x30] = (vendor | 0x1234 << 16).to_bytes(4, "little")
    pm, msi = (0x40, 0x48) if exp_cap is not None and exp_cap < 0x70 else (0x60, 0x68)
    data[CAP_POINTER] = pm
    data[pm:pm + 4] = bytes([0x01, msi, 0x03, 0x00])  # power management, version 3
    data[msi:msi + 2] = bytes([0x05, exp_cap or 0x00])  # MSI
    data[msi + 2] = 0x80  # 64bit+
    if exp_cap is not None:
        data[exp_cap:exp_cap + 2] = bytes([CAP_ID_EXP, 0x00])
        data[exp_cap + 2:exp_cap + 4] = (0x0002 | port_type << 4).to_bytes(2, "little")  # v2
        data[exp_cap + 4:exp_cap + 8] = (0x00008FC1).to_bytes(4, "little")  # DevCap: MPS 256
        devctl = DEVCTL_FLAGS | SIZES.index(max_read_request) << 12 | SIZES.index(max_payload) << 5
        data[exp_cap + DEVCTL:exp_cap + DEVCTL + 2] = devctl.to_bytes(2, "little")
        speed = _SPEED_CODES[link_speed]
        lnkcap = speed | link_width << 4 | 0x3 << 10
        data[exp_cap + 0x0C:exp_cap + 0x10] = lnkcap.to_bytes(4, "little")
        data[exp_cap + 0x10:exp_cap + 0x12] = (0x0040 | aspm).to_bytes(2, "little")  # CommClk+
        now_speed, now_width = (_SPEED_CODES[trained[0]], trained[1]) if trained else \
            (speed, link_width)
        data[exp_cap + 0x12:exp_cap + 0x14] = (now_speed | now_width << 4).to_bytes(2, "little")
        if target_speed is not None:
            data[exp_cap + 0x30:exp_cap + 0x32] = _SPEED_CODES[target_speed].to_bytes(2, "little")
    if bridge:
        data[0x0E] = 0x01  # header type 1: a PCI-to-PCI bridge
    for index, (offset, cap_id, body) in enumerate(ext_caps):
        following = ext_caps[index + 1][0] if index + 1 < len(ext_caps) else 0
        header = cap_id | 1 << 16 | following << 20
        data[offset:offset + 4] = header.to_bytes(4, "little")
        data[offset + 4:offset + 4 + len(body)] = body
    return bytes(data)


ACS_CAPABLE = 0x005F
"""ACSCap: SrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans+."""
ACS_KERNEL_DEFAULT = 0x001D
"""What Linux enables on a port with the IOMMU on: SrcValid+ ReqRedir+ CmpltRedir+ UpstreamFwd+."""


def acs_body(control: int, capability: int = ACS_CAPABLE) -> bytes:
    """The ACS capability after its header: ACS Capability (+4), ACS Control (+6)."""
    return capability.to_bytes(2, "little") + control.to_bytes(2, "little")


AER_BODY = bytes(0x44)
"""An Advanced Error Reporting capability with nothing logged."""


def bridge_caps(acs: int | None, acs_offset: int = 0x148) -> tuple[tuple[int, int, bytes], ...]:
    """A port's extended capabilities as real ones list them: AER at 0x100, then ACS at
    ``acs_offset`` (None: a bridge without ACS), then a vendor-specific one at 0x400."""
    caps: list[tuple[int, int, bytes]] = [(0x100, EXT_ID_AER, AER_BODY)]
    if acs is not None:
        caps.append((acs_offset, EXT_ID_ACS, acs_body(acs)))
    caps.append((0x400, 0x000B, bytes(8)))
    return tuple(caps)


AER_COUNTERS = {
    "aer_dev_correctable": ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout",
                            "NonFatalErr", "CorrIntErr", "HeaderOF", "TOTAL_ERR_COR"),
    "aer_dev_nonfatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                         "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                         "TOTAL_ERR_NONFATAL"),
    "aer_dev_fatal": ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt",
                      "UnxCmplt", "RxOF", "MalfTLP", "ECRC", "UnsupReq", "ACSViol",
                      "TOTAL_ERR_FATAL"),
}
"""The AER counter files of a PCIe device's sysfs directory, as the kernel prints them."""


def aer_text(name: str, counts: Mapping[str, int] | None = None) -> str:
    counts = dict(counts or {})
    names = AER_COUNTERS[name]
    total = sum(counts.get(n, 0) for n in names[:-1])
    return "".join(f"{n} {total if n == names[-1] else counts.get(n, 0)}\n" for n in names)


def to_hexdump(address: str, heading: str, config: bytes) -> str:
    """``lspci -xxxx`` text: a heading line, then 16 bytes a line."""
    lines = [f"{address} {heading}"]
    for offset in range(0, len(config), 16):
        chunk = " ".join(f"{b:02x}" for b in config[offset:offset + 16])
        lines.append(f"{offset:02x}: {chunk}" if offset < 0x100 else f"{offset:03x}: {chunk}")
    return "\n".join(lines) + "\n"
