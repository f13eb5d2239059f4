"""``gpus.driver_match``: the NVML library in use (a container's) is the kernel module's version.

A user-space check: the library is a file of the root the check runs in, while the module is the
running kernel's (proc/driver/nvidia/version). Without NVML in this process (a container target
over lxc-attach or ssh), the version is the one in the name of the root's
``libnvidia-ml.so.VERSION``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from ..gpu.nvml import NvmlSource, NvmlUnavailable
from ..host import Glob, Host, Read, Request
from . import Evidence, NoFix, NotApplicable, Observation

NVIDIA_VERSION = "proc/driver/nvidia/version"
_MODULE = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


def module_version(text: str) -> tuple[str, str]:
    """(open or proprietary, version) from proc/driver/nvidia/version's NVRM line."""
    line = next((row for row in text.splitlines() if row.startswith("NVRM version")),
                text.strip())
    flavour = "open" if "Open Kernel Module" in line else "proprietary"
    match = _MODULE.search(line)
    return flavour, match.group(1) if match else "unknown"


class DriverMatchProbe(NoFix, msgspec.Struct, frozen=True):
    """The NVML library in use (a container's) must be the kernel module's version: a
    container image with another driver's user space fails at nvmlInit or later."""

    nvml: NvmlSource

    def reads(self) -> Sequence[Request]:
        return (Read(NVIDIA_VERSION), *self.nvml.reads(),
                *(Glob(pattern, read=False) for pattern in NVML_LIBRARIES))

    def observe(self, host: Host) -> Observation:
        if not host.exists(NVIDIA_VERSION):
            return Observation(None, problem=f"{NVIDIA_VERSION} does not exist: the NVIDIA "
                                             "kernel module is not loaded")
        _, module = module_version(host.read_text(NVIDIA_VERSION))
        evidence = [Evidence(NVIDIA_VERSION, f"kernel module {module}")]
        try:
            library = self.nvml.get().library_version()
        except NvmlUnavailable as exc:
            if "mismatch" in str(exc).lower():
                return Observation(f"library does not match kernel module {module}: {exc}",
                                   tuple(evidence))
            # no NVML in this process for the target (a container over lxc-attach or ssh): the
            # library the target's programs load names its version in its file name
            installed = installed_libraries(host)
            if not installed:
                raise NotApplicable(f"NVML unavailable ({exc}) and no libnvidia-ml.so.VERSION "
                                    f"under {', '.join(NVML_LIBRARIES)}") from None
            versions = sorted(set(installed.values()))
            evidence += [Evidence(path, f"NVML library {version}")
                         for path, version in sorted(installed.items())]
            if versions == [module]:
                return Observation("match", tuple(evidence))
            return Observation(f"library {', '.join(versions)}, kernel module {module}",
                               tuple(evidence))
        evidence.append(Evidence("NVML nvmlSystemGetNVMLVersion", library))
        driver = library.split(".", 1)[1] if library.count(".") >= 2 and \
            library.split(".", 1)[0].isdigit() and len(library.split(".", 1)[0]) <= 2 else library
        if driver == module:
            return Observation("match", tuple(evidence))
        return Observation(f"library {driver}, kernel module {module}", tuple(evidence))


NVML_LIBRARIES = ("usr/lib/x86_64-linux-gnu/libnvidia-ml.so.*",
                  "usr/lib/aarch64-linux-gnu/libnvidia-ml.so.*", "usr/lib64/libnvidia-ml.so.*",
                  "usr/lib/libnvidia-ml.so.*")
"""Where distributions and the NVIDIA container toolkit put the NVML library: the real file is
``libnvidia-ml.so.<driver version>`` (``.so.1`` is a link to it)."""
_LIBRARY_VERSION = re.compile(r"libnvidia-ml\.so\.(\d+\.\d+(?:\.\d+)?)\Z")


def installed_libraries(host: Host) -> dict[str, str]:
    """path -> driver version of every NVML library file on the host."""
    found = {}
    for pattern in NVML_LIBRARIES:
        for path, _ in host.glob(pattern, read=False):
            match = _LIBRARY_VERSION.search(path)
            if match:
                found[path] = match.group(1)
    return found
