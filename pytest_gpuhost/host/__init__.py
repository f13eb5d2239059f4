"""The host layer: the only code that touches a machine.

A ``Host`` is a machine seen through a root (``/`` or a fake tree): it reads, writes, lists,
resolves links, finds and runs commands, and reads many paths in one call (``batch``), which is
what makes a remote host cost a constant number of round trips. Every path is relative to the
root and resolved inside it as ``openat2(RESOLVE_IN_ROOT)`` would (see ``agent``): an absolute
link target is relative to the root and ``..`` stops at it, so no read, write, listing or command
ever reaches outside. A write never creates a file; ``replace_file`` (for pytest-gpuhost's own
files) never replaces anything but a file.

``Host`` is what every host must answer. What only some hosts have is declared too, each as a
small protocol that a host has whole or not at all: ``Closable`` (something to end when the run
is done), ``Connection`` (a target reached over a connection: its cost, its time against
--gpuhost-target-timeout, why it was lost), ``Releasable`` (a connection let go without waiting
for its process) and ``PhaseCache`` (a phase's reads served from one batch). The run asks
``isinstance(host, Connection)``, never for an attribute by name.

Implementations: ``LocalHost`` (this machine, in-process) here, others by URL scheme through the
``pytest_gpuhost_make_host`` hook (``targets`` keeps the schemes). ``CachedHost`` wraps any of
them to serve a phase's reads from one batch. ``Host`` and the protocols are in ``interface``,
requests and their wire forms in ``requests``, errors in ``errors``, the injectable clock in
``clock``; every name is re-exported here.
"""

from __future__ import annotations

from .agent import COMMAND_DIRS as COMMAND_DIRS
from .agent import COMMAND_TIMEOUT_S as COMMAND_TIMEOUT_S
from .cache import CachedHost
from .clock import SYSTEM_CLOCK, Clock, SystemClock
from .errors import (
    MISSING_ERRNOS,
    CommandTimeout,
    HostError,
    TargetLost,
    TargetTimeout,
    UnsafePath,
    raised,
)
from .interface import (
    BatchReads,
    Closable,
    CommandResult,
    Connection,
    GpuControl,
    GpuSampling,
    Host,
    HostIdentity,
    PhaseCache,
    Releasable,
    current_step,
    doing,
)
from .local import LocalHost
from .requests import (
    WIRE_FORMS,
    FileInfo,
    Glob,
    GpuQuery,
    Kmsg,
    Link,
    ListDir,
    Match,
    Read,
    Reply,
    Request,
    Stat,
    Which,
    WireForm,
    checked_command,
    checked_program,
    checked_relative,
    reply_from_wire,
    reply_to_wire,
    request_from_wire,
    unreadable,
)

__all__ = [
    "COMMAND_DIRS",
    "COMMAND_TIMEOUT_S",
    "MISSING_ERRNOS",
    "SYSTEM_CLOCK",
    "WIRE_FORMS",
    "BatchReads",
    "CachedHost",
    "Clock",
    "Closable",
    "CommandResult",
    "CommandTimeout",
    "Connection",
    "FileInfo",
    "Glob",
    "GpuControl",
    "GpuQuery",
    "GpuSampling",
    "Host",
    "HostError",
    "HostIdentity",
    "Kmsg",
    "Link",
    "ListDir",
    "LocalHost",
    "Match",
    "PhaseCache",
    "Read",
    "Releasable",
    "Reply",
    "Request",
    "Stat",
    "SystemClock",
    "TargetLost",
    "TargetTimeout",
    "UnsafePath",
    "Which",
    "WireForm",
    "checked_command",
    "checked_program",
    "checked_relative",
    "current_step",
    "doing",
    "raised",
    "reply_from_wire",
    "reply_to_wire",
    "request_from_wire",
    "unreadable",
]
