"""A fake host's LXC container, as Proxmox's ``pct enter`` shows it from inside: the container's
tree under the host's (``ROOT/var/lib/lxc/CTID/rootfs``, where LXC keeps it) and the host's
``lxc-attach`` that enters it (``faketools.LXC_ATTACH``), so ``lxc://CTID`` (with the host as
``--gpuhost-root``) and ``ssh://HOST/ROOT?lxc=CTID`` reach it without a real container.

What a container sees of its host, as LXC's defaults give it:

- the kernel's sysctls are the host's (hard links to the host tree's files where the file system
  allows: one kernel, one value), but for the ``net.*`` ones of its own network namespace,
  which start as the host's values and are its own from then on (copies); the ``net.*`` ones the
  kernel keeps global (``net.core.rmem_max``) are the host's too;
- PCI devices whose config space reads 64 bytes (reads past the header need root in the initial
  user namespace), in the host's sysfs layout;
- the host's kernel log (a hard link to its dev/kmsg) and NVIDIA driver version;
- PID 1's environment ``container=lxc`` and its cgroup ``0::/`` (a cgroup namespace hides the
  ``lxc.payload`` path), as a real LXC container shows them.

A real container's /proc/sys is read-only except ``net.*``; the agent runs as root in the tests,
so the tree cannot refuse a write: the tests prove instead that nothing of the kernel's is
written there (the container's tree is compared before and after).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from pathlib import Path

from ..checks.sysctl import sysctl_scope
from ..gpu.nvml import RECORDED_NVML
from .fakehost import FakeHost
from .faketools import LXC_ATTACH, nvbandwidth_config, nvbandwidth_script

LXC_DIR = "var/lib/lxc"
CONFIG_SEEN = 64
"""What a container reads of a PCI device's config space: the header alone."""


def rootfs_of(ctid: str) -> str:
    """Where the host's tree keeps container CTID's tree."""
    return f"{LXC_DIR}/{ctid}/rootfs"


def _link_or_copy(source: Path, target: Path, *, link: bool) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        target.unlink()
    if link:
        try:
            os.link(source, target)
            return
        except OSError as exc:  # another file system, or no hard links here
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
    shutil.copyfile(source, target)


def _sysctl_key(relative: Path) -> str:
    return ".".join(relative.parts)


def existing_host(root: Path) -> FakeHost:
    """A host tree already built (an example host's copy) to add a container to: unlike
    ``FakeHost(root)``, nothing of it is written over."""
    host = FakeHost.__new__(FakeHost)
    host.root = root
    return host


def lxc_container(host: FakeHost, ctid: str = "101", *, link: bool = True) -> FakeHost:
    """Container ``ctid`` of ``host``, its tree made from the host's as the module says, and
    the host's ``usr/bin/lxc-attach`` that enters it. ``link``: share the kernel's files with
    the host through hard links (an example committed to git cannot keep them: copies)."""
    attach = host.file("usr/bin/lxc-attach", LXC_ATTACH)
    attach.chmod(attach.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    container = FakeHost(host.root / rootfs_of(ctid), release=(
        host.root / "proc/sys/kernel/osrelease").read_text().strip())
    sysctls = host.root / "proc/sys"
    for source in sorted(p for p in sysctls.rglob("*") if p.is_file()):
        relative = source.relative_to(sysctls)
        own = sysctl_scope(_sysctl_key(relative)) != "kernel"
        _link_or_copy(source, container.root / "proc/sys" / relative, link=link and not own)
    _pci_devices(host, container)
    for path in ("dev/kmsg", "proc/driver/nvidia/version", "proc/modules", "proc/cmdline"):
        if (host.root / path).is_file():
            _link_or_copy(host.root / path, container.root / path, link=link)
    recorded = host.root / RECORDED_NVML
    for source in sorted(p for p in recorded.rglob("*") if p.is_file()):
        container.file(str(Path(RECORDED_NVML) / source.relative_to(recorded)),
                       source.read_bytes())
    tool = host.root / "usr/bin/nvbandwidth"
    if tool.is_file():  # the benchmark's tool in the container measures the host's GPUs
        config = {**nvbandwidth_config(tool.read_text()),
                  "hardware": "/".join([".."] * len(Path(rootfs_of(ctid)).parts))}
        made = container.file("usr/bin/nvbandwidth", nvbandwidth_script(config))
        made.chmod(made.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    container.file("proc/1/environ", b"container=lxc\0PATH=/usr/sbin:/usr/bin:/sbin:/bin\0")
    container.file("proc/1/cgroup", "0::/\n")
    return container


def _pci_devices(host: FakeHost, container: FakeHost) -> None:
    """The host's PCI devices as a container sees them: the same sysfs layout (links kept,
    relative as the kernel's are), each config space cut to its 64-byte header."""
    devices = host.root / "sys/devices"
    for source in sorted(devices.glob("pci*/**/*")):
        if not source.is_file() or source.is_symlink():
            continue
        target = container.root / source.relative_to(host.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        data = source.read_bytes()
        target.write_bytes(data[:CONFIG_SEEN] if source.name == "config" else data)
    listed = host.root / "sys/bus/pci/devices"
    for link in sorted(listed.iterdir()) if listed.is_dir() else ():
        target = container.root / link.relative_to(host.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(os.readlink(link))
