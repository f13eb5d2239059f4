"""A host root with every operation on it: the file operations, globs, the kernel log, the run's
own files and locks, commands; and what machine and root it is."""

from __future__ import annotations

import os
import time

from .commands import Commands
from .globs import Globs
from .kmsg import KernelLog
from .locks import Locks

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from collections.abc import Callable

    from .gpus import Gpus


class Root(Globs, KernelLog, Locks, Commands):
    """A host root: resolves relative paths inside it and carries out every operation there."""

    def __init__(self, path: str, *, prefer_openat2: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(path, prefer_openat2=prefer_openat2, clock=clock)
        self.gpus: Gpus | None = None
        """The GPUs through NVML, at their first use (``gpus_of``)."""

    def identity(self) -> dict[str, object]:
        info: dict[str, object] = {"root": os.path.realpath(self.path)}
        if self.real:
            info["hostname"] = os.uname().nodename
            for key, path in (("machine_id", "/etc/machine-id"),
                              ("boot_id", "/proc/sys/kernel/random/boot_id")):
                try:
                    with open(path, encoding="utf-8", errors="replace") as file:
                        info[key] = file.readline().strip() or None
                except OSError:
                    info[key] = None
        return info


def gpus_of(root: Root) -> Gpus:
    """The root's ``Gpus``, made at its first use (the library stays loaded; ctypes and the
    module are imported then, not at a run's start-up)."""
    if root.gpus is None:
        from .gpus import Gpus


        root.gpus = Gpus(root)
    return root.gpus

