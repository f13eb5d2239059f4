"""What a target says of itself for the reports (``HostFacts``): its hostname, kernel, NVIDIA
driver and GPUs, read in the first batch of collection (``HOST_FACTS``), as the host itself
reports them."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ..checks import Fact
from ..gpu.nvml import RECORDED_READS
from ..host import GpuQuery, Read, Reply, Request


class HostFacts(msgspec.Struct, frozen=True):
    """What reports say about the machine: as the host itself reports it."""

    hostname: str | None
    kernel: str | None
    driver: str | None
    """The NVIDIA kernel module's version (sysfs), else the version line of proc/driver."""
    gpus: tuple[str, ...]
    gpu_models: tuple[str, ...]


def _first_line(reply: Reply) -> str | None:
    if reply.error is not None:
        return None
    text = reply.text().strip()
    return text.splitlines()[0] if text else None


def _driver_line(line: str | None) -> str | None:
    """``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release ...`` ->
    ``580.95.05``; a bare version stays as it is."""
    if line is None:
        return None
    words = [w for w in line.replace("  ", " ").split() if w[:1].isdigit() and "." in w]
    return words[0] if words else line


HOST_FACTS_READS: tuple[Request, ...] = (
    Read("proc/sys/kernel/hostname"), Read("proc/sys/kernel/osrelease"),
    Read("sys/module/nvidia/version"), Read("proc/driver/nvidia/version"),
    *RECORDED_READS,  # a fake root's NVML: opening it then costs no round trip
    GpuQuery(),  # nor does the target's own (``gpu.agentnvml``)
)


def _parse_host_facts(replies: Sequence[Reply]) -> tuple[str | None, ...]:
    hostname, kernel, module, proc = (_first_line(r) for r in replies[:4])
    return hostname, kernel, module or _driver_line(proc)


HOST_FACTS = Fact("host facts", HOST_FACTS_READS, _parse_host_facts)
