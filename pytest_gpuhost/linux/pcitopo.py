"""Where a PCI device sits: the bridges between it and its root port, from its sysfs link.

``sys/bus/pci/devices/ADDR`` is a relative symbolic link into the device tree, e.g.
``../../../devices/pci0000:00/0000:00:01.1/0000:01:00.0``; through a PCIe switch it reads
``.../0000:40:01.1/0000:41:00.0/0000:42:08.0/0000:43:00.0`` (root port, switch upstream port,
switch downstream port, the device). The directories above the device whose names are PCI
addresses are its bridges; the topmost is the root port. Pure: the caller reads the link.
"""

from __future__ import annotations

import posixpath

from .pciaddr import normalize_address

PCI_DEVICES = "sys/bus/pci/devices"


class TopologyError(ValueError):
    """A link that does not lead into the device tree under the root."""


def resolve_link(link: str, target: str) -> str:
    """The root-relative path a link at root-relative ``link`` points to, resolved as
    ``openat2(RESOLVE_IN_ROOT)`` would: an absolute target starts at the root and ``..`` stops
    there."""
    base = [] if target.startswith("/") else link.split("/")[:-1]
    parts: list[str] = []
    for part in [*base, *target.split("/")]:
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    if not parts:
        raise TopologyError(f"{link} -> {target} points at the root itself")
    return posixpath.join(*parts)


def _address(name: str) -> str | None:
    try:
        return normalize_address(name)
    except ValueError:
        return None


def bridge_path(link: str, target: str) -> tuple[str, ...]:
    """The bridges above the device at ``link`` (``sys/bus/pci/devices/ADDR``), nearest first,
    the root port last; () for a device on a root bus (an integrated endpoint)."""
    resolved = resolve_link(link, target)
    parts = resolved.split("/")
    if parts[:2] != ["sys", "devices"]:
        raise TopologyError(f"{link} -> {target} leads to {resolved}, not into sys/devices")
    device = _address(parts[-1])
    if device is None or device != _address(link.rsplit("/", 1)[-1]):
        raise TopologyError(f"{link} -> {target} does not end at the device's own directory")
    bridges = [address for address in map(_address, parts[2:-1]) if address is not None]
    return tuple(reversed(bridges))
