"""The fake host trees' import path: ``FakeHost`` (``hosttree``), its config spaces
(``pcispace``), its fake tools (``faketools``) and the bundled example host built on it
(``example``), every name importable from here as when they were one module; and
``python -m pytest_gpuhost.testing.fakehost DIR``, which writes the example host.
"""

from __future__ import annotations

from .example import (
    ACS_FACTOR,
    BLACKWELL8_GPUS,
    BLACKWELL8_RELEASE,
    UNTUNED_SYSCTLS,
    blackwell8_untuned,
    main,
    root_port,
)
from .faketools import (
    MODPROBE,
    NVBANDWIDTH,
    PEERMEM_FAILURE,
    SETPCI,
    nvbandwidth_text,
)
from .hosttree import (
    FakeHost,
)
from .pcispace import (
    ACS_CAPABLE,
    ACS_KERNEL_DEFAULT,
    AER_BODY,
    AER_COUNTERS,
    DEVCTL_FLAGS,
    acs_body,
    aer_text,
    bridge_caps,
    config_space,
    to_hexdump,
)

__all__ = [
    "ACS_CAPABLE",
    "ACS_FACTOR",
    "ACS_KERNEL_DEFAULT",
    "AER_BODY",
    "AER_COUNTERS",
    "BLACKWELL8_GPUS",
    "BLACKWELL8_RELEASE",
    "DEVCTL_FLAGS",
    "MODPROBE",
    "NVBANDWIDTH",
    "PEERMEM_FAILURE",
    "SETPCI",
    "UNTUNED_SYSCTLS",
    "FakeHost",
    "acs_body",
    "aer_text",
    "blackwell8_untuned",
    "bridge_caps",
    "config_space",
    "main",
    "nvbandwidth_text",
    "root_port",
    "to_hexdump",
]

if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
