"""The bundled example host: the 8x RTX PRO 6000 Blackwell PCIe box before tuning
(``examples/hosts/blackwell8-untuned/``), and ``python -m pytest_gpuhost.fakehost DIR`` that
writes it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..gpu.nvml import FakeGpu, FakeNvml
from .faketools import PEERMEM_FAILURE
from .pcispace import ACS_KERNEL_DEFAULT

if TYPE_CHECKING:  # imported when the box is built
    from .hosttree import FakeHost

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
    from .hosttree import FakeHost

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

PROXMOX_CONTAINER = "101"
"""The LXC container of the Proxmox-like example host (``examples/hosts/pve-lxc``)."""


def proxmox_lxc(root: Path) -> FakeHost:
    """The untuned blackwell8 box as a Proxmox host with LXC container 101 (where a benchmark
    runs): the container's tree under ``var/lib/lxc/101/rootfs`` as LXC shows it (its own
    ``net.*`` sysctls, the host's kernel ones, 64-byte config spaces, the host's kmsg) and a fake
    ``usr/bin/lxc-attach`` that enters it (``testing.lxc``), so ``lxc://101`` with this tree as
    ``--gpuhost-root`` splits a spec between the host and the container on any machine."""
    from .lxc import lxc_container

    host = blackwell8_untuned(root)
    lxc_container(host, PROXMOX_CONTAINER, link=False)  # git keeps no hard links
    return host


def main(argv: list[str]) -> int:
    """``python -m pytest_gpuhost.fakehost [--proxmox] DIR``: write the bundled example host
    (with ``--proxmox``, the Proxmox-like one with its LXC container) to DIR; ``--help`` says
    so and writes nothing."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m pytest_gpuhost.fakehost",
        description="Write the bundled example host, a fake tree of an untuned 8-GPU server, "
                    "to DIR, a new or empty directory (a fresh copy of examples/hosts/).")
    parser.add_argument("--proxmox", action="store_true",
                        help=f"the Proxmox-like example instead: the same host with LXC "
                             f"container {PROXMOX_CONTAINER}'s tree and a fake lxc-attach "
                             "(examples/hosts/pve-lxc)")
    parser.add_argument("directory", metavar="DIR", help="where to write it")
    args = parser.parse_args(argv)
    proxmox = bool(args.proxmox)
    target = Path(args.directory)
    if target.exists() and any(target.iterdir()):
        print(f"{target} is not empty; choose a new directory", flush=True)
        return 1
    if proxmox:
        proxmox_lxc(target)
        print(f"wrote the Proxmox-like example host (container {PROXMOX_CONTAINER}) to "
              f"{os.fspath(target)}")
        return 0
    blackwell8_untuned(target)
    print(f"wrote the untuned blackwell8 example host to {os.fspath(target)}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
