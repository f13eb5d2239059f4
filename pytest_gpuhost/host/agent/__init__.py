"""The host agent: every operation pytest-gpuhost makes on a machine, contained in its host root.

These modules are the whole of what touches a machine. ``LocalHost`` calls them in-process; a
remote host sends them joined into one source (``host/upload.py``) over its one connection and
runs it there with ``python3`` (``serving.serve``), so a remote target gets exactly the same
containment and limits as a local one. Hence: the standard library only, Python 3.8 syntax,
nothing written to the target but what an operation asks for (no temporary files, no caches),
and between these modules only ``from .module import name`` (the join drops those lines, so
each name must be defined once among them).

Each module is one idea: what a failure says (``errors``), paths resolved inside the root
(``containment``), the file operations (``files``), globs (``globs``), the kernel log (``kmsg``),
the run's own files (``ownfiles``) and locks (``locks``), commands (``commands``), all of them on
one ``Root`` (``root``); the GPUs over ctypes (``gpus``) or nvidia-smi (``smi``); the requests
and their batch (``operations``), bytes and errors in JSON (``wire``), the connection
(``channel``) and the serving loop (``serving``).

Limits. A read takes a regular file only (/proc and /sys attributes are regular files): a FIFO, a
device or a directory in its place is an error naming it, never a read that blocks or never ends;
sizes are bounded (``DEFAULT_LIMIT``). Only ``kmsg`` reads a character device, and only the
kernel log (1:11), non-blocking and bounded. Commands resolve under the root's sbin/bin
directories, run without a shell in their own session, and a timeout kills their process group.

Errors are ``OpError(message, errno)``; a batch answers each request with its value or its error.
This ``__init__`` gathers the names the package's other modules use (it is not sent); the GPUs'
modules load at the first ``gpus_of``, and the connection and its serving loop only on a target.
The requests' table and batch (``operations``) and the wire forms (``wire``) are what a remote
target's connection needs; a local run calls ``Root`` in-process and never uses them, so they
are loaded at their first use (``agent.batch``, ``agent.encode``), not at every run's start-up.
"""

from __future__ import annotations

from .commands import COMMAND_DIRS as COMMAND_DIRS
from .commands import COMMAND_TIMEOUT_S as COMMAND_TIMEOUT_S
from .commands import EXIT_POLL_S as EXIT_POLL_S
from .commands import OUTPUT_LIMIT as OUTPUT_LIMIT
from .commands import REAP_S as REAP_S
from .containment import MAX_LINKS as MAX_LINKS
from .containment import check_relative as check_relative
from .errors import OpError as OpError
from .errors import file_type as file_type
from .files import DEFAULT_LIMIT as DEFAULT_LIMIT
from .kmsg import KMSG_DEVICE as KMSG_DEVICE
from .kmsg import KMSG_LIMIT as KMSG_LIMIT
from .locks import LOCK_MARK as LOCK_MARK
from .locks import LOCK_POLL_S as LOCK_POLL_S
from .root import Root as Root
from .root import gpus_of as gpus_of

TYPE_CHECKING = False
if TYPE_CHECKING:  # the names below, for the type checker; at run time ``__getattr__``
    from .operations import OPERATIONS as OPERATIONS
    from .operations import batch as batch
    from .operations import execute as execute
    from .wire import decode as decode
    from .wire import encode as encode

_LATER = {"OPERATIONS": "operations", "batch": "operations", "execute": "operations",
          "decode": "wire", "encode": "wire"}
"""The names loaded at their first use, and the module of each."""


def __getattr__(name: str) -> object:
    """``OPERATIONS``, ``batch``, ``execute`` (``operations``), ``encode`` and ``decode``
    (``wire``), each imported when first asked for."""
    module = _LATER.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value: object = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
