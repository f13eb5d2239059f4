"""A fake host tree, built a piece at a time (``FakeHost``): the files a real Linux GPU server
shows under /proc, /sys and /dev.

Used by the tests, the bundled example host and the benchmarks. A tree built here is what
``--gpuhost-root`` reads: sysctls as files, PCI devices with a binary ``config`` space
(``pcispace``), cpuidle states per CPU, proc/modules, a dev/kmsg file and fake tools as real
files (``faketools``: a ``modprobe`` that edits the tree the way the kernel would, or fails the
way a real one does). ``fakehost`` is its import path, with the bundled example host
(``example``) built on it.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..checks.sysctl import sysctl_path
from ..gpu.measure import RECORDED_DIR
from ..gpu.nvml import RECORDED_NVML, FakeNvml
from .faketools import (
    MODPROBE,
    SETPCI,
    nvbandwidth_script,
)
from .pcispace import (
    ACS_KERNEL_DEFAULT,
    AER_COUNTERS,
    aer_text,
    bridge_caps,
    config_space,
)


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
        path = self.file("usr/bin/nvbandwidth", nvbandwidth_script(config))
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
