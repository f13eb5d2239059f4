"""Config-space decoding, on fixtures written in the format of ``lspci -vvv -xxxx`` dumps."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.checks import Observation
from pytest_gpuhost.checks.changes import Plan
from pytest_gpuhost.host import Host
from pytest_gpuhost.linux.pciconfig import (
    SIZES,
    ConfigError,
    DeviceControl,
    device_control,
    find_capability,
    parse_hexdump,
)
from pytest_gpuhost.result import Outcome
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import FIXTURES
from ..runner import run_spec


@pytest.fixture(scope="module")
def dumps() -> dict[str, bytes]:
    return parse_hexdump((FIXTURES / "lspci_vvv_xxxx_rtx_pro_6000.txt").read_text())


def test_hexdump_gives_every_function_its_4096_bytes(dumps: dict[str, bytes]) -> None:
    assert sorted(dumps) == ["41:00.0", "41:00.1", "c1:00.0"]
    assert {len(config) for config in dumps.values()} == {4096}
    assert dumps["41:00.0"][:4] == bytes.fromhex("de10b52b")  # vendor 10de, device 2bb5


def test_capability_walk_finds_express_at_its_card_specific_offset(
    dumps: dict[str, bytes],
) -> None:
    assert find_capability(dumps["41:00.0"], 0x10) == 0x78
    assert find_capability(dumps["c1:00.0"], 0x10) == 0x60
    assert find_capability(dumps["41:00.0"], 0x05) == 0x68  # MSI, on the way
    assert find_capability(dumps["41:00.0"], 0x11) is None  # no MSI-X


def test_device_control_matches_what_lspci_decoded(dumps: dict[str, bytes]) -> None:
    gpu = device_control(dumps["41:00.0"])
    assert (gpu.offset, gpu.value) == (0x80, 0x2937)
    assert (gpu.max_payload, gpu.max_read_request) == (256, 512)
    other = device_control(dumps["c1:00.0"])
    assert (other.offset, other.max_payload, other.max_read_request) == (0x68, 256, 4096)


def test_non_root_read_of_64_bytes_says_to_run_as_root() -> None:
    dump = parse_hexdump((FIXTURES / "lspci_x_nonroot_64_bytes.txt").read_text())
    config = dump["41:00.0"]
    assert len(config) == 64
    with pytest.raises(ConfigError, match="reads past 64 bytes of sysfs config need root"):
        device_control(config)


def test_a_function_without_a_capability_list() -> None:
    config = bytearray(256)
    config[0x34] = 0x40  # a pointer, but Status bit 4 says there is no list
    assert find_capability(bytes(config), 0x10) is None
    with pytest.raises(ConfigError, match="no PCI Express capability"):
        device_control(bytes(config))


def test_a_looping_capability_list_is_an_error() -> None:
    config = bytearray(256)
    config[0x06] = 0x10
    config[0x34] = 0x40
    config[0x40:0x42] = bytes([0x01, 0x48])
    config[0x48:0x4A] = bytes([0x05, 0x40])
    with pytest.raises(ConfigError, match="loops at 0x40"):
        find_capability(bytes(config), 0x10)


def test_shorter_than_the_header() -> None:
    with pytest.raises(ConfigError, match="the header alone is 64"):
        find_capability(b"\x00" * 32, 0x10)


@pytest.mark.parametrize(("size", "code"), [(128, 0), (512, 2), (4096, 5)])
def test_max_read_request_rewrite_touches_bits_14_to_12_only(size: int, code: int) -> None:
    before = DeviceControl(0x78, 0x2937)
    after = before.with_max_read_request(size)
    assert after.max_read_request == size
    assert after.value & 0x7000 == code << 12
    assert after.value & ~0x7000 == 0x0937  # payload, error reporting, ExtTag, NoSnoop kept


def test_a_word_with_function_level_reset_set_is_refused_not_rewritten() -> None:
    """Bit 15 reads 0 on an answering endpoint: a 1 there is neither written back (a reset)
    nor cleared (a bit that is not ours)."""
    with pytest.raises(ConfigError, match=r"DevCtl 0xa937 at 0x80 reads bit 15 set"):
        DeviceControl(0x78, 0xA937).with_max_read_request(4096)


@pytest.mark.parametrize("value", [0xFFFF, 0x7937, 0x6937, 0x29F7, 0x29D7])
def test_reserved_size_codes_are_refused_not_decoded(value: int) -> None:
    """0xffff (a device that fell off the bus) would read as MaxReadReq 16384 and pass any
    ``min``; no answering device holds the reserved codes 6 and 7 in either size field."""
    config = _with_pointer(0x78)
    config[0x78:0x7A] = bytes([0x10, 0x00])
    config[0x80:0x82] = value.to_bytes(2, "little")
    with pytest.raises(ConfigError, match=f"DevCtl 0x{value:04x} at 0x80 holds the reserved"):
        device_control(bytes(config))


def test_rewrite_refuses_sizes_that_are_not_encodable() -> None:
    with pytest.raises(ValueError, match="MaxReadReq 1000"):
        DeviceControl(0x78, 0x2937).with_max_read_request(1000)


# --- a damaged capability list is refused, never followed into the header or extended space ---


def _with_pointer(pointer: int, *, at: int = 0x34, size: int = 4096) -> bytearray:
    """A config space whose capability list (from ``at``) points at ``pointer``."""
    config = bytearray(size)
    config[0x06] = 0x10  # Status: capability list
    config[at] = pointer
    return config


def test_a_pointer_into_the_header_is_refused_naming_it() -> None:
    config = _with_pointer(0x08)
    config[0x08:0x0A] = bytes([0x10, 0x00])  # revision 0x10 reads like the PCIe capability id
    with pytest.raises(ConfigError, match=r"capability pointer at 0x34 is 0x08, inside the "
                                          r"64-byte header"):
        device_control(bytes(config))


def test_a_next_pointer_into_the_header_is_refused_naming_the_capability() -> None:
    config = _with_pointer(0x40)
    config[0x40:0x42] = bytes([0x01, 0x10])  # PM, next -> 0x10 (BAR0)
    with pytest.raises(ConfigError, match=r"next pointer of the capability at 0x40 is 0x10"):
        find_capability(bytes(config), 0x10)


@pytest.mark.parametrize("cap", [0xFC, 0xF8])
def test_device_control_must_lie_below_0x100(cap: int) -> None:
    config = _with_pointer(cap)
    config[cap:cap + 2] = bytes([0x10, 0x00])
    assert find_capability(bytes(config), 0x10) == cap  # the id and next pointer fit
    with pytest.raises(ConfigError, match=f"Device Control at 0x{cap:02x} would reach "
                                          f"0x{cap + 9:02x}, past the standard capabilities"):
        device_control(bytes(config))


def test_the_last_capability_whose_device_control_fits() -> None:
    config = _with_pointer(0xF4)
    config[0xF4:0xF6] = bytes([0x10, 0x00])
    config[0xFC:0xFE] = (0x5000).to_bytes(2, "little")
    assert device_control(bytes(config)).max_read_request == 4096


def test_reserved_pointer_bits_are_masked_as_the_kernel_and_libpci_do() -> None:
    config = _with_pointer(0x7B)  # bits 1:0 are reserved: the capability is at 0x78
    config[0x78:0x7A] = bytes([0x10, 0x00])
    assert find_capability(bytes(config), 0x10) == 0x78


def test_a_device_that_reads_all_ones_is_an_error() -> None:
    config = _with_pointer(0x40)
    config[0x40:0x42] = bytes([0xFF, 0xFF])
    with pytest.raises(ConfigError, match="capability at 0x40 reads 0xff"):
        find_capability(bytes(config), 0x10)


@pytest.mark.parametrize(("size", "words"), [
    (64, "reads past 64 bytes of sysfs config need root"),
    (256, "256 bytes means no extended config space (conventional PCI, or a VM"),
])
def test_a_short_config_space_says_what_its_length_means(size: int, words: str) -> None:
    from pytest_gpuhost.linux.pciconfig import short_config

    assert words in short_config(size, 0x104)


# --- the MaxReadReq write, byte for byte on the fake config file ---------------------------------

MRRS_SPEC = "version: 1\npcie:\n  max_read_request: {size}\n"


def _gpu_with_devctl(fake: FakeHost, value: int) -> Path:
    fake.gpu("0000:01:00.0")
    config = fake.root / "sys/bus/pci/devices/0000:01:00.0/config"
    data = bytearray(config.read_bytes())
    data[0x80:0x82] = value.to_bytes(2, "little")  # DevCtl of the capability at 0x78
    config.write_bytes(bytes(data))
    return config


@pytest.mark.parametrize("others", [0x0000, 0x0001, 0x0917, 0x0937, 0x0A5A, 0x05A5, 0x0FBF])
@pytest.mark.parametrize(("start", "size"), [(0, 4096), (2, 4096), (5, 128), (4, 1024)])
def test_the_fix_changes_devctl_bits_14_to_12_and_nothing_else(
        fake: FakeHost, others: int, start: int, size: int) -> None:
    """Whatever the other bits of DevCtl hold (error reporting, payload, ExtTag, phantom
    functions, AuxPwr, NoSnoop: 0x0fbf sets all of 11:0 that a valid payload code allows),
    the fix rewrites 14:12 alone, in DevCtl's two bytes, and not one other byte of the 4096."""
    config = _gpu_with_devctl(fake, others | start << 12)
    before = config.read_bytes()
    result = run_spec(MRRS_SPEC.format(size=size), fake.root, fix=True)[
        "pcie.max_read_request[0000:01:00.0]"]
    after = config.read_bytes()
    assert result.outcome is Outcome.FIXED, result.message
    assert {i for i in range(len(before)) if before[i] != after[i]} <= {0x80, 0x81}
    old, new = (int.from_bytes(data[0x80:0x82], "little") for data in (before, after))
    assert (old ^ new) & ~0x7000 == 0  # only bits 14:12 differ
    assert new == others | SIZES.index(size) << 12


@pytest.mark.parametrize("value", [0x8000 | 0x2937, 0x8000 | 0x0FBF, 0x8000])
def test_a_devctl_with_bit_15_set_is_not_written_at_all(fake: FakeHost, value: int) -> None:
    config = _gpu_with_devctl(fake, value)
    before = config.read_bytes()
    result = run_spec(MRRS_SPEC.format(size=4096), fake.root, fix=True)[
        "pcie.max_read_request[0000:01:00.0]"]
    assert config.read_bytes() == before
    assert result.outcome is Outcome.FAILED
    assert "not fixed: sys/bus/pci/devices/0000:01:00.0/config: DevCtl " \
        f"0x{value:04x} at 0x80 reads bit 15 set" in result.message


def test_a_devctl_that_reads_all_ones_is_an_error_and_not_written(fake: FakeHost) -> None:
    """The capability header still answers, DevCtl reads 0xffff: before, the fix wrote
    0x2fff (every enable bit of 11:0 set) and ``min: 4096`` passed on 16384."""
    config = _gpu_with_devctl(fake, 0xFFFF)
    before = config.read_bytes()
    for spec in (MRRS_SPEC.format(size=512), "version: 1\npcie:\n  max_read_request: "
                                             "{min: 4096}\n"):
        result = run_spec(spec, fake.root, fix=True)["pcie.max_read_request[0000:01:00.0]"]
        assert result.outcome is Outcome.ERROR
        assert "holds the reserved MaxReadReq code 7" in result.message
    assert config.read_bytes() == before


# --- a bridge or GPU that reads all ones is an error, never "no ACS" or a value ---------------

ACS_SPEC = "version: 1\npcie:\n  acs_redirect: 'off'\n"


def _gpu_behind(fake: FakeHost, bridge: str = "0000:40:01.1") -> Path:
    fake.bridge(bridge)
    fake.gpu("0000:41:00.0", parent=bridge)
    return fake.root / "sys/bus/pci/devices" / bridge / "config"


def test_a_bridge_that_reads_all_ones_is_an_error_not_a_pass(fake: FakeHost) -> None:
    """Its extended header at 0x100 reads 0xffffffff, which the walk took for "no extended
    capabilities": the bridge passed as "no ACS capability: it cannot redirect"."""
    config = _gpu_behind(fake)
    config.write_bytes(b"\xff" * 4096)
    [result] = run_spec(ACS_SPEC, fake.root, fix=True).values()
    assert result.outcome is Outcome.ERROR
    assert "the vendor ID reads 0xffff: the device does not answer config reads" in \
        result.message
    assert config.read_bytes() == b"\xff" * 4096


def test_an_extended_header_of_all_ones_in_4096_bytes_is_an_error(fake: FakeHost) -> None:
    config = _gpu_behind(fake)
    data = bytearray(config.read_bytes())
    data[0x100:0x104] = b"\xff" * 4
    config.write_bytes(bytes(data))
    [result] = run_spec(ACS_SPEC, fake.root, fix=True).values()
    assert result.outcome is Outcome.ERROR
    assert "header at 0x100 reads 0xffffffff in a 4096-byte config space" in result.message
    assert config.read_bytes() == bytes(data)


def test_a_gpu_that_reads_all_ones_is_an_error_that_says_so(fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0")
    config = fake.root / "sys/bus/pci/devices/0000:01:00.0/config"
    config.write_bytes(b"\xff" * 4096)
    [result] = run_spec(MRRS_SPEC.format(size=4096), fake.root, fix=True).values()
    assert result.outcome is Outcome.ERROR
    assert "vendor ID reads 0xffff" in result.message
    assert config.read_bytes() == b"\xff" * 4096


def test_extended_capabilities_none_and_256_bytes() -> None:
    from pytest_gpuhost.linux.pciext import extended_capabilities

    config = bytearray(4096)
    config[0:2] = b"\xde\x10"
    assert extended_capabilities(bytes(config)) == []  # 0 at 0x100: none
    assert extended_capabilities(b"\xff" * 256) == []  # no extended space to read


# --- link width and speed, as sysfs shows them -------------------------------------------------


@pytest.mark.parametrize("shown", ["63", "3", "64", "x16"])
def test_a_link_width_no_pcie_link_has_is_an_error_not_a_pass(fake: FakeHost, shown: str) -> None:
    """The kernel prints Link Status bits 9:4: a GPU that fell off the bus reads them as 63,
    which passed ``min: 16``."""
    fake.gpu("0000:01:00.0")
    (fake.root / fake.pci_dir("0000:01:00.0") / "current_link_width").write_text(f"{shown}\n")
    [result] = run_spec("version: 1\npcie:\n  link_width: {min: 16}\n", fake.root).values()
    assert result.outcome is Outcome.ERROR
    assert f"current_link_width reads {shown!r}, not a PCIe link width" in result.message


@pytest.mark.parametrize(("shown", "outcome"), [("16", Outcome.PASSED), ("8", Outcome.FAILED),
                                                ("0", Outcome.FAILED)])
def test_link_widths_of_an_answering_device(fake: FakeHost, shown: str,
                                            outcome: Outcome) -> None:
    fake.gpu("0000:01:00.0")
    (fake.root / fake.pci_dir("0000:01:00.0") / "current_link_width").write_text(f"{shown}\n")
    [result] = run_spec("version: 1\npcie:\n  link_width: {min: 16}\n", fake.root).values()
    assert result.outcome is outcome


# --- a register that changes between the plan and the write ---------------------------------------


def test_a_devctl_changed_between_the_plan_and_the_write_is_not_overwritten(
        fake: FakeHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver sets a DevCtl bit (Unsupported Request Reporting, bit 3) after the plan read
    the register: the write of the planned word would silently clear it again."""
    from pytest_gpuhost.checks.pcie import MaxReadRequestProbe

    config = _gpu_with_devctl(fake, 0x2937)
    planned = MaxReadRequestProbe.plan

    def plan_then_the_driver_writes(self: MaxReadRequestProbe, host: Host, value: str,
                                    observed: Observation) -> Plan:
        plan = planned(self, host, value, observed)
        data = bytearray(config.read_bytes())
        data[0x80] |= 0x08
        config.write_bytes(bytes(data))
        return plan

    monkeypatch.setattr(MaxReadRequestProbe, "plan", plan_then_the_driver_writes)
    result = run_spec(MRRS_SPEC.format(size=4096), fake.root, fix=True)[
        "pcie.max_read_request[0000:01:00.0]"]
    assert result.outcome is Outcome.FIX_FAILED
    assert "@0x80 holds 3f29 now, not the 3729 the fix was planned from" in result.message
    assert config.read_bytes()[0x80:0x82] == (0x293F).to_bytes(2, "little")  # the driver's


def test_a_value_that_reads_back_different_is_fix_failed_not_fixed(fake: FakeHost) -> None:
    """A device that keeps its MaxReadReq (firmware-locked, or a write the kernel drops)."""
    from pytest_gpuhost.host import LocalHost

    class Dropping(LocalHost):
        def write_bytes(self, path: str, data: bytes, offset: int = 0) -> None:
            return None

    _gpu_with_devctl(fake, 0x2937)
    [result] = run_spec(MRRS_SPEC.format(size=4096), fake.root, fix=True,
                        host=Dropping).values()
    assert result.outcome is Outcome.FIX_FAILED
    assert "read back '512'" in result.message and "ignored the write" in result.message


# --- what is written: ACS Control bits, and only the GPUs' and path bridges' config --------------


@pytest.mark.parametrize("control", [0x0004, 0x002C, 0x003D, 0x007F, 0xFFFF & ~0x0080, 0xF02C,
                                     0x0F5D])
def test_the_acs_fix_clears_rr_cr_ec_and_nothing_else(fake: FakeHost, control: int) -> None:
    """Whatever else ACS Control holds (SV, TB, UF, DT, the Enhanced bits 11:8, the reserved
    15:12), the fix clears 0x2c alone, in the register's two bytes of the whole config space,
    and rollback puts every byte back."""
    fake.bridge("0000:40:01.1", acs=control, acs_offset=0x2A0)
    fake.gpu("0000:41:00.0", parent="0000:40:01.1")
    config = fake.root / "sys/bus/pci/devices/0000:40:01.1/config"
    before = config.read_bytes()
    journal = fake.root.parent / "j.jsonl"
    [fixed] = run_spec(ACS_SPEC, fake.root, fix=True, journal=journal).values()
    assert fixed.outcome is Outcome.FIXED
    after = config.read_bytes()
    assert {i for i in range(4096) if before[i] != after[i]} <= {0x2A6, 0x2A7}
    assert int.from_bytes(after[0x2A6:0x2A8], "little") == control & ~0x2C
    [undo] = run_spec(None, fake.root, rollback=journal).values()
    assert undo.outcome is Outcome.FIXED
    assert config.read_bytes() == before


def test_only_the_nvidia_gpu_function_is_written_never_its_audio_or_another_vendor(
        fake: FakeHost) -> None:
    """MaxReadReq is fixed on vendor 0x10de, class 0x0300/0x0302 alone: the GPU's HD audio
    function (0x0403), an NVIDIA bridge (0x0604) and another vendor's 3D controller keep
    every byte, though each has a PCI Express capability with MaxReadReq 512."""
    fake.gpu("0000:01:00.0")  # and its audio function 0000:01:00.1
    fake.pci_device("0000:02:00.0", vendor=0x1002, device=0x74A1, class_code=0x030200)
    fake.pci_device("0000:03:00.0", vendor=0x10DE, device=0x22A3, class_code=0x068000)
    fake.pci_device("0000:04:00.0", vendor=0x10DE, device=0x1AF1, class_code=0x060400)
    devices = fake.root / "sys/bus/pci/devices"
    others = {a: (devices / a / "config").read_bytes()
              for a in ("0000:01:00.1", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0")}
    results = run_spec(MRRS_SPEC.format(size=4096), fake.root, fix=True)
    assert {k: r.outcome for k, r in results.items()} == {
        "pcie.max_read_request[0000:01:00.0]": Outcome.FIXED}
    assert {a: (devices / a / "config").read_bytes() for a in others} == others


@pytest.mark.parametrize("size", [256, 4096])
def test_link_control_must_lie_below_0x100_too(size: int) -> None:
    """A PCIe capability at 0xf4 puts Link Control at 0x104: read from extended space as
    ASPM bits (4096 bytes), or blamed on root (256 bytes, read as root)."""
    from pytest_gpuhost.linux.pciconfig import aspm_control

    config = _with_pointer(0xF4, size=size)
    config[0xF4:0xF6] = bytes([0x10, 0x00])
    if size > 0x104:
        config[0x104] = 0x03  # would read as L0s L1
    with pytest.raises(ConfigError, match="Link Control at 0xf4 would reach 0x105, past the "
                                          "standard capabilities"):
        aspm_control(bytes(config))

