"""PCI addresses in the sysfs form ``0000:81:00.0``, whatever form a tool printed them in."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"([0-9a-f]{4,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])\Z")


def normalize_address(address: str) -> str:
    """The sysfs form ``0000:81:00.0`` of an address (NVML prints ``00000000:81:00.0``)."""
    match = _ADDRESS.fullmatch(address.strip().lower())
    if not match:
        raise ValueError(f"not a PCI address: {address!r}")
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus}:{device}.{function}"


def address_order(address: str) -> tuple[int, ...]:
    domain, bus, rest = address.split(":")
    device, function = rest.split(".")
    return (int(domain, 16), int(bus, 16), int(device, 16), int(function, 16))
