"""Build fake host trees: the files a real Linux GPU server shows under /proc, /sys and /dev.

Used by the tests, the bundled example host and the benchmarks. A tree built here is what
``--gpuhost-root`` reads: sysctls as files, PCI devices with a binary ``config`` space, cpuidle
states per CPU, proc/modules, a dev/kmsg file and a ``modprobe`` that edits the tree the way the
kernel would (or fails the way a real one does).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..checks.sysctl import sysctl_path
from ..gpu.measure import RECORDED_DIR
from ..gpu.nvml import RECORDED_NVML, FakeGpu, FakeNvml
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


FAKE_TOOL_START = r"""#!/bin/sh
''':'
# sh runs these lines and Python reads them as a string. The fake tool runs under the system's
# python3 when there is one, else under the first python3 on PATH: `#!/usr/bin/env python3`
# always takes the first on PATH, and a pyenv shim there costs ~100 ms a start (the system's
# python3 ~15 ms). -I -S: the standard library is all it needs.
for python in /usr/bin/python3 /usr/local/bin/python3; do
    [ -x "$python" ] && exec "$python" -I -S "$0" "$@"
done
exec python3 -I -S "$0" "$@"
'''
"""
"""How a fake tool's script starts: it must work on a fresh Debian CI machine (/usr/bin/python3)
and on a machine whose only python3 is a pyenv or conda one, and start fast on both."""

MODPROBE = FAKE_TOOL_START + r'''
"""A fake modprobe for a pytest-gpuhost fake host tree (written by pytest_gpuhost.fakehost).

It edits the tree it lives in (ROOT/usr/sbin/modprobe) the way the kernel would: proc/modules,
sys/module/NAME and dev/kmsg. Modules listed in FAILURES fail as they do on a real host.
"""
import json, os, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads(__CONFIG__)

def kmsg(lines):
    path = ROOT / "dev/kmsg"
    if not path.exists():
        return
    seq = 0
    for line in path.read_text().splitlines():
        head = line.split(";", 1)[0].split(",")
        if len(head) >= 4 and head[1].isdigit():
            seq = max(seq, int(head[1]))
    usec = int(time.monotonic() * 1e6)
    with open(path, "a") as out:
        for prio, text in lines:
            seq += 1
            out.write(f"{prio},{seq},{usec},-;{text}\n")

def loaded(name):
    for line in (ROOT / "proc/modules").read_text().splitlines():
        if line.split(" ", 1)[0] == name:
            return True
    return False

def main(argv):
    options, names = [], []
    for index, arg in enumerate(argv):
        if arg == "--":  # the end of the options: every later argument is a name
            names += argv[index + 1:]
            break
        (options if arg.startswith("-") else names).append(arg)
    remove = "-r" in options
    names = [a.replace("-", "_") for a in names]
    if len(names) != 1:
        print("modprobe: ERROR: fake modprobe takes one module name", file=sys.stderr)
        return 1
    name = names[0]
    release = (ROOT / "proc/sys/kernel/osrelease").read_text().strip()
    if name not in CONFIG["available"]:
        print(f"modprobe: FATAL: Module {name} not found in directory /lib/modules/{release}",
              file=sys.stderr)
        return 1
    if remove:
        if not loaded(name):
            return 0
        lines = (ROOT / "proc/modules").read_text().splitlines(keepends=True)
        (ROOT / "proc/modules").write_text("".join(l for l in lines if l.split(" ", 1)[0] != name))
        for child in sorted((ROOT / "sys/module" / name).rglob("*"), reverse=True):
            child.unlink() if child.is_file() else child.rmdir()
        (ROOT / "sys/module" / name).rmdir()
        return 0
    if loaded(name):
        return 0
    failure = CONFIG["failures"].get(name)
    if failure:
        kmsg([(4, text) for text in failure["kmsg"]])
        print(failure["stderr"], file=sys.stderr)
        return 1
    with open(ROOT / "proc/modules", "a") as out:
        out.write(f"{name} 16384 0 - Live 0x0000000000000000\n")
    (ROOT / "sys/module" / name).mkdir(parents=True, exist_ok=True)
    (ROOT / "sys/module" / name / "initstate").write_text("live\n")
    values = dict(CONFIG["parameters"].get(name, {}))
    for conf in sorted((ROOT / "etc/modprobe.d").glob("*.conf")):
        for line in conf.read_text().splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) > 2 and fields[0] == "options" and fields[1] == name:
                values.update(option.partition("=")[::2] for option in fields[2:])
    for parameter, value in values.items():
        path = ROOT / "sys/module" / name / "parameters" / parameter
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    if CONFIG["messages"].get(name):
        kmsg([(6, CONFIG["messages"][name])])
    return 0

sys.exit(main(sys.argv[1:]))
'''

NVBANDWIDTH = FAKE_TOOL_START + r'''
"""A fake nvbandwidth for a pytest-gpuhost fake host tree (written by pytest_gpuhost.fakehost).

It replays bandwidths recorded on the real box for each MaxReadReq setting: it reads every GPU's
Device Control from the tree's config space, so a --fix that raises MaxReadReq shows in the next
measurement, as it does on the hardware. While ACS redirect (ReqRedir, CmpltRedir or EgressCtrl)
is on at a bridge on either GPU's path, the copy is sent up to the root complex and reads at
acs_factor of that. Prints what ``nvbandwidth -j`` prints.
"""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = json.loads(__CONFIG__)

def max_read_request(address):
    config = (ROOT / "sys/bus/pci/devices" / address / "config").read_bytes()
    offset = config[0x34] & 0xFC
    while offset:
        if config[offset] == 0x10:
            devctl = int.from_bytes(config[offset + 8:offset + 10], "little")
            return 128 << ((devctl >> 12) & 7)
        offset = config[offset + 1] & 0xFC
    raise SystemExit(f"{address}: no PCI Express capability")

def table(address):
    mrrs = max_read_request(address)
    known = sorted(int(size) for size in CONFIG["p2p"])
    return CONFIG["p2p"][str(min(known, key=lambda size: abs(size - mrrs)))]

def redirected(address):
    for bridge in CONFIG["paths"].get(address, []):
        config = (ROOT / "sys/bus/pci/devices" / bridge / "config").read_bytes()
        offset = 0x100
        while 0x100 <= offset < len(config) - 8:
            header = int.from_bytes(config[offset:offset + 4], "little")
            if header & 0xFFFF == 0x000D:
                if int.from_bytes(config[offset + 6:offset + 8], "little") & 0x2C:
                    return True
                break
            offset = (header >> 20) & 0xFFC
    return False

def rate(source, target):
    value = table(target)[f"{source}->{target}"]
    if redirected(source) or redirected(target):
        value *= CONFIG["acs_factor"]
    return round(value, 2)

def matrix(test):
    gpus = CONFIG["gpus"]
    if test == "device_to_device_memcpy_read_ce":  # row s reads from column t: data t -> s
        return [[None if s == t else rate(t, s) for t in gpus] for s in gpus]
    return [[CONFIG[test][gpu] for gpu in gpus]]

def main(argv):
    tests = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-t" and i + 1 < len(argv)]
    cases = []
    for test in tests or CONFIG["tests"]:
        if test not in CONFIG["tests"]:
            cases.append({"name": test, "status": "Not Found"})
            continue
        rows = matrix(test)
        cells = [["N/A" if v is None else f"{v:.4f}" for v in row] for row in rows]
        values = [v for row in rows for v in row if v is not None]
        cases.append({"name": test, "status": "Passed", "bandwidth_matrix": cells,
                      "bandwidth_description": CONFIG["tests"][test],
                      "sum": round(sum(values), 4), "average": round(sum(values) / len(values), 4)})
    print(json.dumps({"nvbandwidth": {"git_version": "v0.8", "Driver Version": CONFIG["driver"],
                                      "CUDA Runtime Version": 13000, "testcases": cases}},
                     indent=1))
    return 0

sys.exit(main(sys.argv[1:]))
'''

PEERMEM_FAILURE = {
    "stderr": "modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument",
    "kmsg": [
        "nvidia_peermem: disagrees about version of symbol ib_register_peer_memory_client",
        "nvidia_peermem: Unknown symbol ib_register_peer_memory_client (err -22)",
    ],
}


class FakeHost:
    """A host tree under ``root``, built a piece at a time."""

    def __init__(self, root: Path, *, release: str = "6.8.0-49-generic") -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.file("proc/sys/kernel/osrelease", release + "\n")
        self.file("proc/modules", "")
        self._kmsg_seq = 0
        self._pci_dirs: dict[str, str] = {}

    def file(self, path: str, content: str | bytes, mode: int | None = None) -> Path:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        if mode is not None:
            target.chmod(mode)
        return target

    def sysctl(self, key: str, value: str | int) -> FakeHost:
        self.file(sysctl_path(key), f"{value}\n")
        return self

    def sysctls(self, values: Mapping[str, str | int]) -> FakeHost:
        for key, value in values.items():
            self.sysctl(key, value)
        return self

    def pci_device(self, address: str, *, vendor: int, device: int, class_code: int,
                   numa_node: int = 0, config: bytes | None = None,
                   link_width: int = 16, max_link_speed: str = "32.0 GT/s PCIe",
                   parent: str | None = None, aer: bool = True,
                   max_link_width: int | None = None) -> FakeHost:
        """A PCI function laid out as sysfs lays it out: its directory in the device tree
        (``sys/devices/pci0000:00/[bridges/]ADDR``, below ``parent``, a bridge added before)
        and ``sys/bus/pci/devices/ADDR`` a relative link to it; with ``aer``, its AER counters."""
        if parent is None:
            domain, bus, _ = address.split(":")
            directory = f"sys/devices/pci{domain}:{bus}/{address}"
        else:
            directory = f"{self._pci_dirs[parent]}/{address}"
        self._pci_dirs[address] = directory
        link = self.root / f"sys/bus/pci/devices/{address}"
        link.parent.mkdir(parents=True, exist_ok=True)
        (self.root / directory).mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(self.root / directory, link.parent))
        base = directory
        self.file(f"{base}/vendor", f"0x{vendor:04x}\n")
        self.file(f"{base}/device", f"0x{device:04x}\n")
        self.file(f"{base}/class", f"0x{class_code:06x}\n")
        self.file(f"{base}/numa_node", f"{numa_node}\n")
        self.file(f"{base}/current_link_width", f"{link_width}\n")
        self.file(f"{base}/max_link_width", f"{max_link_width or link_width}\n")
        self.file(f"{base}/max_link_speed", f"{max_link_speed}\n")
        self.file(f"{base}/current_link_speed", "2.5 GT/s PCIe\n")  # an idle GPU
        if aer:
            for name in AER_COUNTERS:
                self.file(f"{base}/{name}", aer_text(name))
        if config is None:
            config = config_space(vendor=vendor, device=device, class_code=class_code)
        self.file(f"{base}/config", config)
        return self

    def pci_dir(self, address: str) -> str:
        """The device's own directory in the device tree (where its sysfs link points)."""
        return self._pci_dirs[address]

    def bridge(self, address: str, *, parent: str | None = None, port_type: int = 4,
               acs: int | None = ACS_KERNEL_DEFAULT, acs_offset: int = 0x148,
               vendor: int = 0x1022, device: int = 0x14AB, numa_node: int = 0,
               aspm: int = 0, link_speed: str = "32.0", link_width: int = 16,
               trained: tuple[str, int] | None = None, target_speed: str | None = None,
               max_payload: int = 256) -> FakeHost:
        """A PCIe port: a root port (``port_type`` 4), a switch's upstream (5) or downstream (6)
        port, with ACS Control ``acs`` at ``acs_offset`` (None: no ACS capability), its link
        capable of ``link_speed`` x ``link_width`` and trained as ``trained`` says (default:
        to that), ``target_speed`` in Link Control 2 and ``aspm`` in Link Control."""
        config = config_space(vendor=vendor, device=device, class_code=0x060400, exp_cap=0x58,
                              bridge=True, port_type=port_type, aspm=aspm,
                              ext_caps=bridge_caps(acs, acs_offset), link_speed=link_speed,
                              link_width=link_width, trained=trained,
                              target_speed=target_speed, max_payload=max_payload)
        return self.pci_device(address, vendor=vendor, device=device, class_code=0x060400,
                               numa_node=numa_node, config=config, parent=parent)

    def gpu(self, address: str, *, numa_node: int = 0, max_read_request: int = 512,
            max_payload: int = 256, exp_cap: int = 0x78, link_width: int = 16,
            max_link_speed: str = "32.0", device: int = 0x2BB5, audio: bool = True,
            parent: str | None = None, aspm: int = 0, aer: bool = True,
            trained: tuple[str, int] | None = None) -> FakeHost:
        """An NVIDIA GPU function and, like a workstation card, its HD audio function ``.1``;
        its link trained to ``trained`` (speed, width) where that is given (a card at x8 of
        x16), else to what it can do."""
        config = config_space(vendor=0x10DE, device=device, class_code=0x030000,
                              exp_cap=exp_cap, max_read_request=max_read_request,
                              max_payload=max_payload, link_speed=max_link_speed,
                              link_width=link_width, aspm=aspm, trained=trained)
        width = trained[1] if trained else link_width
        self.pci_device(address, vendor=0x10DE, device=device, class_code=0x030000,
                        numa_node=numa_node, config=config, link_width=width,
                        max_link_width=link_width,
                        max_link_speed=f"{max_link_speed} GT/s PCIe", parent=parent, aer=aer)
        if audio:
            self.pci_device(address[:-1] + "1", vendor=0x10DE, device=0x22E8,
                            class_code=0x040300, numa_node=numa_node, parent=parent, aer=aer)
        return self

    def aer_counts(self, address: str, name: str, counts: Mapping[str, int]) -> FakeHost:
        """Set a device's AER counters (``aer_dev_correctable``, ...) as the kernel would."""
        self.file(f"{self._pci_dirs[address]}/{name}", aer_text(name, counts))
        return self

    def iommu_groups(self, types: Mapping[str, str]) -> FakeHost:
        """One IOMMU group per device, numbered in address order, of the given ``type``
        (``identity``, ``DMA``, ``DMA-FQ``): ``sys/kernel/iommu_groups/N/{type,devices/ADDR}``
        and each device's ``iommu_group`` link, as the kernel makes them."""
        for number, (address, kind) in enumerate(sorted(types.items())):
            group = f"sys/kernel/iommu_groups/{number}"
            self.file(f"{group}/type", f"{kind}\n")
            device = self.root / self._pci_dirs[address]
            members = self.root / group / "devices"
            members.mkdir(parents=True, exist_ok=True)
            (members / address).symlink_to(os.path.relpath(device, members))
            (device / "iommu_group").symlink_to(os.path.relpath(self.root / group, device))
        return self

    def cmdline(self, text: str) -> FakeHost:
        self.file("proc/cmdline", text.rstrip("\n") + "\n")
        return self

    def grub(self, *, linux: str = "", linux_default: str = "quiet splash",
             dropins: Mapping[str, str] | None = None) -> FakeHost:
        """etc/default/grub as Debian ships it, and drop-ins in etc/default/grub.d."""
        self.file("etc/default/grub", "# If you change this file, run 'update-grub'.\n"
                                      "GRUB_DEFAULT=0\nGRUB_TIMEOUT=5\n"
                                      "GRUB_DISTRIBUTOR=`lsb_release -i -s 2> /dev/null`\n"
                                      f'GRUB_CMDLINE_LINUX_DEFAULT="{linux_default}"\n'
                                      f'GRUB_CMDLINE_LINUX="{linux}"\n')
        for name, text in (dropins or {}).items():
            self.file(f"etc/default/grub.d/{name}", text)
        return self

    def cpufreq(self, driver: str, *, policies: int, governor: str = "schedutil",
                epp: str | None = None, boost: str | None = "global", boost_on: bool = True,
                cpus_per_policy: int = 1) -> FakeHost:
        """A cpufreq tree: ``policyN`` per group of CPUs with the driver's files. ``boost``:
        ``global`` (cpufreq/boost: acpi-cpufreq, amd-pstate before 6.11), ``policy``
        (policyN/boost, 6.11 on), ``intel`` (intel_pstate/no_turbo) or None (a VM)."""
        base = "sys/devices/system/cpu/cpufreq"
        governors = ("performance powersave" if driver in ("amd-pstate-epp", "intel_pstate")
                     else "conservative ondemand userspace powersave performance schedutil")
        for index in range(policies):
            first = index * cpus_per_policy
            policy = f"{base}/policy{first}"
            cpus = " ".join(str(c) for c in range(first, first + cpus_per_policy))
            self.file(f"{policy}/scaling_driver", f"{driver}\n")
            self.file(f"{policy}/scaling_governor", f"{governor}\n")
            self.file(f"{policy}/scaling_available_governors", f"{governors}\n")
            self.file(f"{policy}/related_cpus", f"{cpus}\n")
            self.file(f"{policy}/affected_cpus", f"{cpus}\n")
            if epp is not None:
                self.file(f"{policy}/energy_performance_preference", f"{epp}\n")
                self.file(f"{policy}/energy_performance_available_preferences",
                          "default performance balance_performance balance_power power\n")
            if boost == "policy":
                self.file(f"{policy}/boost", f"{int(boost_on)}\n")
        if boost == "global":
            self.file(f"{base}/boost", f"{int(boost_on)}\n")
        elif boost == "intel":
            self.file("sys/devices/system/cpu/intel_pstate/no_turbo", f"{int(not boost_on)}\n")
            self.file("sys/devices/system/cpu/intel_pstate/status", "active\n")
        return self

    def transparent_hugepage(self, selected: str = "always") -> FakeHost:
        words = ("always", "madvise", "never")
        text = " ".join(f"[{w}]" if w == selected else w for w in words)
        self.file("sys/kernel/mm/transparent_hugepage/enabled", text + "\n")
        return self

    def module_parameters(self, name: str, values: Mapping[str, str]) -> FakeHost:
        for parameter, value in values.items():
            self.file(f"sys/module/{name}/parameters/{parameter}", f"{value}\n")
        return self

    def idle_counters(self, state: str, *, usage: int, time_us: int,
                      cpus: Iterable[int] | None = None) -> FakeHost:
        """Set the ``usage`` and ``time`` counters of the cpuidle state named ``state``."""
        cpu = "sys/devices/system/cpu"
        for directory in sorted((self.root / cpu).glob("cpu[0-9]*/cpuidle/state*")):
            number = int(directory.parent.parent.name[3:])
            if (directory / "name").read_text().strip() != state:
                continue
            if cpus is None or number in set(cpus):
                (directory / "usage").write_text(f"{usage}\n")
                (directory / "time").write_text(f"{time_us}\n")
        return self

    def cpus(self, count: int, *, states: Iterable[str] = ("POLL", "C1", "C2"),
             driver: str = "acpi_idle", disabled: Iterable[str] = (),
             nodes: int = 1) -> FakeHost:
        names, off = list(states), set(disabled)
        cpu = "sys/devices/system/cpu"
        self.file(f"{cpu}/online", f"0-{count - 1}\n" if count > 1 else "0\n")
        self.file(f"{cpu}/possible", f"0-{count - 1}\n" if count > 1 else "0\n")
        self.file(f"{cpu}/cpuidle/current_driver", f"{driver}\n")
        for n in range(count):
            for index, name in enumerate(names):
                base = f"{cpu}/cpu{n}/cpuidle/state{index}"
                self.file(f"{base}/name", f"{name}\n")
                self.file(f"{base}/disable", "1\n" if name in off else "0\n")
                self.file(f"{base}/latency", f"{[0, 1, 400, 800][min(index, 3)]}\n")
                self.file(f"{base}/usage", "0\n")
                self.file(f"{base}/time", "0\n")
        per_node = max(1, count // nodes)
        for node in range(nodes):
            first, last = node * per_node, min(count, (node + 1) * per_node) - 1
            self.file(f"sys/devices/system/node/node{node}/cpulist", f"{first}-{last}\n")
        return self

    def module(self, name: str, *, state: str = "loaded", used_by: str = "-") -> FakeHost:
        """``loaded`` (proc/modules + sys/module/NAME/initstate) or ``builtin``."""
        if state == "loaded":
            with (self.root / "proc/modules").open("a") as out:
                out.write(f"{name} 16384 0 {used_by} Live 0x0000000000000000\n")
            self.file(f"sys/module/{name}/initstate", "live\n")
        elif state == "builtin":
            self.file(f"sys/module/{name}/parameters/.keep", "")
        else:
            raise ValueError(f"module state {state!r}: expected loaded or builtin")
        return self

    def kmsg(self, records: Iterable[tuple[int, str]], *, continuation: str | None = None
             ) -> FakeHost:
        """Append ``(prio, text)`` records to dev/kmsg, numbered and timed like the kernel's."""
        path = self.root / "dev/kmsg"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            for prio, text in records:
                self._kmsg_seq += 1
                usec = 1_000_000 + self._kmsg_seq * 1_237
                out.write(f"{prio},{self._kmsg_seq},{usec},-;{text}\n")
                if continuation:
                    out.write(f" {continuation}\n")
        return self

    def infiniband(self, device: str = "mlx5_0") -> FakeHost:
        self.file(f"sys/class/infiniband/{device}/node_type", "1: CA\n")
        return self

    def nvml(self, fake: FakeNvml) -> FakeHost:
        """Record what NVML says about this tree's GPUs (read by the NVML checks on a fake root)."""
        for name, text in fake.files().items():
            self.file(f"{RECORDED_NVML}/{name}", text)
        return self

    def nvbandwidth(self, *, gpus: Sequence[str], p2p: Mapping[int, Mapping[str, float]],
                    h2d: Mapping[str, float], d2h: Mapping[str, float],
                    driver: str = "580.95.05", paths: Mapping[str, Sequence[str]] | None = None,
                    acs_factor: float = 1.0) -> FakeHost:
        """Install ROOT/usr/bin/nvbandwidth replaying ``p2p[max_read_request]["a->b"]`` GB/s
        (data from a to b, read by b's copy engine) by the reading GPU b's current MaxReadReq,
        printed as nvbandwidth's read test prints it (row b, column a); fixed host copy rates.
        ``paths``: each GPU's bridges; while one of a pair's has ACS redirect on, the pair reads
        at ``acs_factor`` of its rate."""
        config = {"gpus": list(gpus), "driver": driver,
                  "paths": {gpu: list(bridges) for gpu, bridges in (paths or {}).items()},
                  "acs_factor": acs_factor,
                  "p2p": {str(size): dict(rates) for size, rates in p2p.items()},
                  "host_to_device_memcpy_ce": dict(h2d), "device_to_host_memcpy_ce": dict(d2h),
                  "tests": {"host_to_device_memcpy_ce": "memcpy CE CPU(row) -> GPU(column) "
                                                        "bandwidth (GB/s)",
                            "device_to_host_memcpy_ce": "memcpy CE CPU(row) <- GPU(column) "
                                                        "bandwidth (GB/s)",
                            "device_to_device_memcpy_read_ce": "memcpy CE GPU(row) -> "
                                                               "GPU(column) bandwidth (GB/s)"}}
        script = NVBANDWIDTH.replace("__CONFIG__", repr(json.dumps(config, sort_keys=True)))
        path = self.file("usr/bin/nvbandwidth", script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return self

    def recorded_bandwidth(self, name: str, text: str) -> FakeHost:
        """A saved bandwidth tool output where ``p2p: {probe: auto}`` finds it on a fake root."""
        self.file(f"{RECORDED_DIR}/{name}", text)
        return self

    def modprobe(self, *, available: Iterable[str],
                 failures: Mapping[str, Mapping[str, object]] | None = None,
                 messages: Mapping[str, str] | None = None,
                 parameters: Mapping[str, Mapping[str, str]] | None = None) -> FakeHost:
        """Install ROOT/usr/sbin/modprobe that loads ``available`` modules into this tree, each
        with its default ``parameters`` overridden by the tree's etc/modprobe.d options."""
        config = {"available": sorted(available), "failures": dict(failures or {}),
                  "messages": dict(messages or {}),
                  "parameters": {k: dict(v) for k, v in (parameters or {}).items()}}
        script = MODPROBE.replace("__CONFIG__", repr(json.dumps(config, sort_keys=True)))
        path = self.file("usr/sbin/modprobe", script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return self


    def setpci(self, directory: str = "usr/bin") -> FakeHost:
        """Install ROOT/DIRECTORY/setpci, pciutils' where Debian and Proxmox keep it
        (``usr/sbin`` on RHEL): --fix-persist names it in its udev rule. It changes nothing:
        pytest-gpuhost never runs it, udev would at boot."""
        path = self.file(f"{directory}/setpci", SETPCI)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return self


SETPCI = """#!/bin/sh
# A fake host tree's pciutils (written by pytest_gpuhost.fakehost). pytest-gpuhost never runs
# it: --fix --fix-persist names it in the udev rule that sets each GPU's MaxReadReq when its
# driver binds (udev runs it at boot, by this path), and so looks for it here.
echo "setpci: a fake host tree's stand-in; nothing is changed" >&2
exit 0
"""


UNTUNED_SYSCTLS: dict[str, str | int] = {
    "kernel.numa_balancing": 1,
    "kernel.nmi_watchdog": 1,
    "kernel.sched_autogroup_enabled": 1,
    "kernel.perf_event_paranoid": 4,
    "vm.swappiness": 60,
    "vm.dirty_ratio": 20,
    "vm.dirty_background_ratio": 10,
    "net.core.rmem_max": 212992,
    "net.core.wmem_max": 212992,
    "net.ipv4.tcp_rmem": "4096\t131072\t6291456",
    "net.ipv4.tcp_wmem": "4096\t16384\t4194304",
}

BLACKWELL8_GPUS = (  # (address, NUMA node): four GPUs behind each socket
    ("0000:01:00.0", 0), ("0000:21:00.0", 0), ("0000:41:00.0", 0), ("0000:61:00.0", 0),
    ("0000:81:00.0", 1), ("0000:a1:00.0", 1), ("0000:c1:00.0", 1), ("0000:e1:00.0", 1),
)


def nvbandwidth_text(tests: Mapping[str, tuple[str, Sequence[Sequence[float | None]]]], *,
                     devices: Sequence[str], version: str = "v0.8",
                     driver: str = "580.95.05") -> str:
    """Text as nvbandwidth prints it: a header, the devices, then per test ``Running NAME.``, the
    matrix (``N/A`` where nothing was measured) and ``SUM NAME``."""
    lines = [f"nvbandwidth Version: {version}", f"Built from Git version: {version}", "",
             "CUDA Runtime Version: 13000", "CUDA Driver Version: 13000",
             f"Driver Version: {driver}", ""]
    lines += [f"Device {i}: {name}" for i, name in enumerate(devices)] + [""]
    for name, (description, rows) in tests.items():
        columns = len(rows[0])
        lines += [f"Running {name}.", description,
                  " " * 2 + "".join(f"{c:>10}" for c in range(columns))]
        for index, row in enumerate(rows):
            cells = "".join(f"{'N/A' if v is None else f'{v:.2f}':>10}" for v in row)
            lines.append(f"{index:>2}{cells}")
        total = sum(v for row in rows for v in row if v is not None)
        lines += ["", f"SUM {name} {total:.2f}", ""]
    return "\n".join(lines)


def _p2p_rate(source: int, target: int, max_read_request: int) -> float:
    """GB/s for data from GPU ``source`` to GPU ``target`` (the target reads it), as recorded
    on the box, by the reading GPU's MaxReadReq: with MaxReadReq
    512, same-socket reads land just above the 45 GB/s floor and cross-socket reads, with the
    longer round trip through the socket link, well below 32; with 4096 both clear them."""
    same = BLACKWELL8_GPUS[source][1] == BLACKWELL8_GPUS[target][1]
    jitter = ((source * 7 + target * 3) % 9) * 0.09
    if max_read_request >= 4096:
        return round((52.41 if same else 41.07) + jitter, 2)
    return round((46.21 if same else 27.35) + jitter, 2)


BLACKWELL8_RELEASE = "6.5.0-44-generic"
"""The box's kernel: older than the 6.8 the spec asks for."""
ACS_FACTOR = 0.62
"""What ACS redirect costs a P2P read on the box: up through the root complex and back."""


def root_port(gpu: str) -> str:
    """The root port above a blackwell8 GPU: ``0000:81:00.0`` sits below ``0000:80:01.1``."""
    return f"{gpu[:5]}{int(gpu[5:7], 16) - 1:02x}:01.1"


def blackwell8_untuned(root: Path, *, cpus: int = 64) -> FakeHost:
    """The 8x RTX PRO 6000 Blackwell PCIe box before tuning (the bundled example host): every
    GPU behind its own root port, each with the ACS redirect Linux sets with the IOMMU on;
    acpi-cpufreq where amd-pstate-epp is wanted; an old kernel; THP always."""
    host = FakeHost(root, release=BLACKWELL8_RELEASE)
    host.sysctls(UNTUNED_SYSCTLS)
    for address, node in BLACKWELL8_GPUS:
        host.bridge(root_port(address), acs=ACS_KERNEL_DEFAULT, numa_node=node,
                    acs_offset=0x148 if node == 0 else 0x2A0)
        host.gpu(address, numa_node=node, max_read_request=512, max_payload=256,
                 parent=root_port(address))
    host.bridge("0000:80:03.1", acs=ACS_KERNEL_DEFAULT, numa_node=1)  # the NIC's: no GPU's
    host.pci_device("0000:91:00.0", vendor=0x15B3, device=0x1021, class_code=0x020700,
                    numa_node=1, parent="0000:80:03.1")  # ConnectX-7 in InfiniBand mode
    host.iommu_groups({address: "DMA-FQ" for address, _ in BLACKWELL8_GPUS})
    host.cpus(cpus, states=("POLL", "C1", "C2"), driver="acpi_idle", nodes=2)
    host.cpufreq("acpi-cpufreq", policies=cpus, governor="schedutil", boost="global")
    host.transparent_hugepage("always")
    host.cmdline(f"BOOT_IMAGE=/vmlinuz-{BLACKWELL8_RELEASE} root=/dev/nvme0n1p2 ro quiet splash")
    host.grub(linux_default="quiet splash")
    for name, used_by in (("nvidia", "nvidia_modeset,"), ("nvidia_modeset", "-"),
                          ("ib_core", "mlx5_ib,"), ("mlx5_ib", "-"), ("mlx5_core", "mlx5_ib,")):
        host.module(name, used_by=used_by)
    host.infiniband("mlx5_0")
    host.file("proc/driver/nvidia/version",
              "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build"
              "  (dvs-builder@U22-I3-AF03-09-1)  Tue Sep 23 09:50:15 UTC 2025\n"
              "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
    host.kmsg([
        (6, f"Linux version {BLACKWELL8_RELEASE} (buildd@lcy02-amd64-103) #44-Ubuntu SMP"),
        (6, f"Command line: BOOT_IMAGE=/vmlinuz-{BLACKWELL8_RELEASE} root=/dev/nvme0n1p2 ro "
            "quiet splash"),
        (6, "pci 0000:01:00.0: [10de:2bb5] type 00 class 0x030000 PCIe Legacy Endpoint"),
    ], continuation="SUBSYSTEM=pci")
    host.kmsg([
        (6, "nvidia: loading out-of-tree module taints kernel."),
        (5, "nvidia-nvlink: Nvlink Core is being initialized, major device number 510"),
        (6, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05"),
        (6, "mlx5_core 0000:91:00.0: firmware version: 28.39.1002"),
        (4, "vxlan: non-ECT from 10.233.64.17 with TOS=0x2"),
        (4, "vxlan: non-ECT from 10.233.64.23 with TOS=0x2"),
    ])
    host.modprobe(
        available=("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem",
                   "nouveau", "ib_core", "mlx5_ib", "mlx5_core"),
        failures={"nvidia_peermem": PEERMEM_FAILURE},
        messages={"nvidia_uvm": "nvidia-uvm: Loaded the UVM driver, major device number 508."},
        parameters={"nvidia_uvm": {"uvm_disable_hmm": "N"}},
    )
    host.setpci()
    host.nvml(FakeNvml(driver="580.95.05",
                       devices={address: FakeGpu(persistence_mode=False, max_link_generation=5,
                                                 power_limit=300_000)
                                for address, _ in BLACKWELL8_GPUS},
                       topologies={f"{a}->{b}": "NODE" if na == nb else "SYS"
                                   for a, na in BLACKWELL8_GPUS for b, nb in BLACKWELL8_GPUS
                                   if a < b}))
    addresses = [address for address, _ in BLACKWELL8_GPUS]
    host.nvbandwidth(
        gpus=addresses,
        p2p={size: {f"{a}->{b}": _p2p_rate(s, t, size) for s, a in enumerate(addresses)
                    for t, b in enumerate(addresses) if s != t} for size in (512, 4096)},
        h2d={a: round(53.9 + (i % 3) * 0.21, 2) for i, a in enumerate(addresses)},
        d2h={a: round(55.2 + (i % 4) * 0.17, 2) for i, a in enumerate(addresses)},
        paths={a: [root_port(a)] for a in addresses},
        acs_factor=ACS_FACTOR,
    )
    return host

def main(argv: list[str]) -> int:
    """``python -m pytest_gpuhost.fakehost DIR``: write the bundled example host to DIR."""
    if len(argv) != 1:
        print("usage: python -m pytest_gpuhost.fakehost DIR", flush=True)
        return 2
    target = Path(argv[0])
    if target.exists() and any(target.iterdir()):
        print(f"{target} is not empty; choose a new directory", flush=True)
        return 1
    blackwell8_untuned(target)
    print(f"wrote the untuned blackwell8 example host to {os.fspath(target)}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
