"""Link registers, what a link carries, and the route between two devices as nvidia-smi topo -m
classes it: pure functions on bytes and paths."""

from __future__ import annotations

import pytest

from pytest_gpuhost.linux.pciconfig import ConfigError, parse_hexdump
from pytest_gpuhost.linux.pcilink import Link, link_gbps, port_registers
from pytest_gpuhost.linux.pcipath import Placement, hops, placement, route
from pytest_gpuhost.linux.pcitopo import TopologyError
from pytest_gpuhost.testing.fakehost import config_space

from ..conftest import FIXTURES


@pytest.mark.parametrize(("speed", "width", "mps", "gbps"), [
    (32.0, 16, 256, 57.61),   # Gen5 x16: 32 x 16 / 8 x 128/130 x 256/280 (the documented one)
    (16.0, 16, 256, 28.81),   # Gen4 x16
    (8.0, 16, 256, 14.40),    # Gen3 x16
    (32.0, 8, 256, 28.81),    # Gen5 x8: half of x16
    (32.0, 16, 128, 53.07),   # MPS 128: 128/152 of the line
    (2.5, 1, 128, 0.21),      # Gen1 x1, 8b/10b
    (64.0, 16, 256, 111.06),  # Gen6 x16, flit mode: 236/256 of a flit, 16-byte headers
])
def test_what_a_link_carries(speed: float, width: int, mps: int, gbps: float) -> None:
    assert round(link_gbps(speed, width, mps), 2) == gbps


def test_link_registers_of_a_gpu_dump() -> None:
    """The dump's Link Capabilities at 0x84 read 32 GT/s x16, and so does its Link Status at
    0x8a (bytes 05 01)."""
    dump = parse_hexdump((FIXTURES / "lspci_vvv_xxxx_rtx_pro_6000.txt").read_text())
    gpu = port_registers(dump["41:00.0"])
    assert (gpu.kind, gpu.capable, gpu.current) == ("legacy endpoint", Link(32.0, 16),
                                                   Link(32.0, 16))
    assert (gpu.max_payload, gpu.max_read_request, gpu.upstream_facing) == (256, 512, True)
    assert port_registers(dump["c1:00.0"]).max_read_request == 4096


def test_link_registers_of_a_port_trained_down_and_capped() -> None:
    config = config_space(vendor=0x1022, device=0x14AB, class_code=0x060400, exp_cap=0x58,
                          bridge=True, port_type=6, aspm=2, trained=("16.0", 8),
                          target_speed="8.0")
    port = port_registers(config)
    assert port.kind == "switch downstream port" and not port.upstream_facing
    assert (port.capable, port.current, port.target_speed) == (Link(32.0, 16), Link(16.0, 8),
                                                               8.0)
    assert port.aspm == 2 and Link(16.0, 8).describe() == "Gen4 x8"


def test_link_registers_need_more_than_the_64_byte_header() -> None:
    config = config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000)
    with pytest.raises(ConfigError, match="need root"):
        port_registers(config[:64])
    with pytest.raises(ConfigError, match="does not answer"):
        port_registers(b"\xff" * 4096)


def place(device: str, host: str, *bridges: str) -> Placement:
    """``bridges`` root port first, as a sysfs path reads."""
    return Placement(device, host, tuple(reversed(bridges)))


def test_placement_from_a_sysfs_link() -> None:
    where = placement("sys/bus/pci/devices/0000:43:00.0",
                      "../../../devices/pci0000:40/0000:40:01.1/0000:41:00.0/0000:42:08.0/"
                      "0000:43:00.0")
    assert where == Placement("0000:43:00.0", "pci0000:40",
                              ("0000:42:08.0", "0000:41:00.0", "0000:40:01.1"))
    with pytest.raises(TopologyError):
        placement("sys/bus/pci/devices/0000:43:00.0", "../../../module/nvidia")


def test_routes_are_classed_as_nvidia_smi_classes_them() -> None:
    switch = ("0000:40:01.1", "0000:41:00.0")  # root port, switch upstream port
    a = place("0000:43:00.0", "pci0000:40", *switch, "0000:42:08.0")
    b = place("0000:44:00.0", "pci0000:40", *switch, "0000:42:10.0")
    under = route(a, b, (0, 0))
    assert (under.level, under.turn) == ("PIX", "0000:41:00.0")
    assert (under.source_side, under.target_side) == (("0000:42:08.0",), ("0000:42:10.0",))
    # a second switch below a downstream port of the first: two switches, no host bridge
    deep = place("0000:47:00.0", "pci0000:40", *switch, "0000:42:18.0", "0000:45:00.0",
                 "0000:46:00.0")
    assert route(a, deep, (0, 0)).level == "PXB"
    assert route(deep, a, (0, 0)).source_side == ("0000:46:00.0", "0000:45:00.0",
                                                  "0000:42:18.0")
    other_port = place("0000:51:00.0", "pci0000:40", "0000:40:03.1")
    assert route(a, other_port, (0, 0)).level == "PHB"
    other_bridge = place("0000:61:00.0", "pci0000:60", "0000:60:01.1")
    assert route(a, other_bridge, (0, 0)).level == "NODE"
    far = route(a, other_bridge, (0, 1))
    assert (far.level, far.turn, far.host_bridges) == ("SYS", None, ("pci0000:40", "pci0000:60"))
    assert route(a, other_bridge, (-1, -1)).level == "NODE"  # no NUMA: one node


def test_hops_go_up_to_the_turn_or_the_root_port() -> None:
    assert hops("gpu", ("dsp",), "usp") == [("gpu", "dsp"), ("dsp", "usp")]
    assert hops("gpu", ("dsp", "usp", "rp"), None) == [("gpu", "dsp"), ("dsp", "usp"),
                                                     ("usp", "rp")]
    assert hops("gpu", (), None) == []
