"""A fake host's LXC container, as Proxmox's ``pct enter`` shows it from inside: the container's
tree under the host's (``ROOT/var/lib/lxc/CTID/rootfs``, where LXC keeps it) and the host's
``lxc-attach`` that enters it (``faketools.LXC_ATTACH``), so ``lxc://CTID`` (with the host as
``--gpuhost-root``) and ``ssh://HOST/ROOT?lxc=CTID`` reach it without a real container.

What a container sees of its host, as LXC's defaults give it:

- the kernel's sysctls are the host's (hard links to the host tree's files where the file system
  allows: one kernel, one value), but for those of its own namespaces (``net.*`` of its network
  namespace, ``kernel.shmmax`` and the IPC namespace's, ``kernel.hostname`` of its UTS one),
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

import contextlib
import errno
import os
import shlex
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from ..checks.sysctl import sysctl_scope
from ..gpu.nvml import RECORDED_NVML
from .faketools import LXC_ATTACH, nvbandwidth_config, nvbandwidth_script
from .hosttree import FakeHost

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


# -- a real LXC container (Debian's lxc and busybox-static) -------------------------------------

REAL_CONFIG = (
    "lxc.net.0.type = empty\n"  # a network namespace of its own, with no device in it
    "lxc.apparmor.profile = unconfined\n"
    "lxc.mount.entry = /usr/bin usr/bin none ro,bind,create=dir 0 0\n"
    "lxc.mount.entry = /usr/lib usr/lib none ro,bind,optional,create=dir 0 0\n"
    "lxc.mount.entry = /lib lib none ro,bind,optional,create=dir 0 0\n"
    "lxc.mount.entry = /lib64 lib64 none ro,bind,optional,create=dir 0 0\n")
"""What a busybox container needs to run this machine's python3 (its /usr/bin and libraries,
read-only), and no network or AppArmor profile of the machine's (``lxc.net.0`` and
``lxc.apparmor`` lines of the template are replaced)."""
ATTACH_WRAPPER = "#!/bin/sh\n# the real lxc-attach, on the tests' private lxcpath\n" \
                 "exec {attach} -P {lxcpath} \"$@\"\n"


class LxcUnavailable(RuntimeError):
    """A real container cannot be made or started here (the reason says why)."""


def _lxc(argv: list[str], timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def real_container(lxcpath: Path, name: str = "gpuhost101") -> Iterator[str]:
    """A real busybox LXC container under the private ``lxcpath`` (never the machine's default
    one), started, configured as ``REAL_CONFIG`` says; stopped and destroyed at the end.
    LxcUnavailable (with lxc-start's own words) where it cannot run."""
    tools = [tool for tool in ("lxc-create", "lxc-start", "lxc-attach", "lxc-stop",
                               "lxc-destroy", "busybox") if shutil.which(tool) is None]
    if tools:
        raise LxcUnavailable(f"not installed: {', '.join(tools)} (Debian: lxc, busybox-static)")
    lxcpath.mkdir(parents=True, exist_ok=True)
    made = _lxc(["lxc-create", "-P", str(lxcpath), "-n", name, "-t", "busybox"])
    if made.returncode != 0:
        raise LxcUnavailable(f"lxc-create -t busybox failed: {made.stderr.strip()[-400:]}")
    try:
        config = lxcpath / name / "config"
        kept = [line for line in config.read_text().splitlines()
                if not line.startswith(("lxc.net.0.", "lxc.apparmor.profile"))
                and not line.startswith("lxc.mount.entry = /lib")
                and not line.startswith("lxc.mount.entry = /usr/lib")]
        config.write_text("\n".join(kept) + "\n" + REAL_CONFIG)
        log = lxcpath / f"{name}.log"
        started = _lxc(["lxc-start", "-P", str(lxcpath), "-n", name, "-l", "INFO", "-o",
                        str(log)])
        if started.returncode != 0:
            said = log.read_text()[-600:] if log.exists() else started.stderr[-600:]
            raise LxcUnavailable(f"lxc-start failed: {said.strip()}")
        ready = _lxc(["lxc-attach", "-P", str(lxcpath), "-n", name, "--", "python3", "-c",
                      "pass"], timeout=60.0)
        if ready.returncode != 0:
            raise LxcUnavailable(f"python3 does not run in the container: "
                                 f"{ready.stderr.strip()[-400:]}")
        yield name
    finally:
        _lxc(["lxc-stop", "-P", str(lxcpath), "-n", name, "-k"], timeout=60.0)
        _lxc(["lxc-destroy", "-P", str(lxcpath), "-n", name], timeout=60.0)


def attach_wrapper(host: FakeHost, lxcpath: Path) -> Path:
    """The fake host's usr/bin/lxc-attach: the machine's real one on ``lxcpath``, so that
    ``lxc://NAME`` with the fake tree as --gpuhost-root enters the real container while its
    ``kernel`` checks read the fake tree, never this machine's kernel."""
    attach = shutil.which("lxc-attach") or "lxc-attach"
    path = host.file("usr/bin/lxc-attach", ATTACH_WRAPPER.format(
        attach=shlex.quote(attach), lxcpath=shlex.quote(str(lxcpath))))
    path.chmod(0o755)
    return path


def read_inside(lxcpath: Path, name: str, path: str) -> str:
    """A file of the running container, read from outside with lxc-attach."""
    done = _lxc(["lxc-attach", "-P", str(lxcpath), "-n", name, "--", "cat", path], 60.0)
    if done.returncode != 0:
        raise LxcUnavailable(f"lxc-attach cat {path}: {done.stderr.strip()[-300:]}")
    return done.stdout
