"""What a process may hold and do at once: a fleet's agent sessions against the soft limit on
open files, and work on a few targets at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")

FILES_PER_SESSION = 3
"""An agent session held open costs this process three file descriptors (the ssh client's
stdin, stdout and stderr pipes)."""
FILES_SPARE = 256
"""What pytest, xdist, the reports and a fix's journal may hold open besides."""


def room_for_sessions(sessions: int) -> None:
    """Raise this process's soft limit on open files toward its hard limit where ``sessions``
    held at once would not fit (a common soft limit of 1024 holds some 250 targets), never
    lowering it: a large fleet runs instead of its last targets failing to start ssh."""
    if not sessions:  # a run of this machine alone: nothing to make room for
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = sessions * FILES_PER_SESSION + FILES_SPARE
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def each_at_once(work: Callable[[T], None], items: Sequence[T], at_once: int,
                 name: str) -> None:
    """``work`` on every item, ``at_once`` threads at a time (named ``name``), returning once
    all are done; an exception of ``work`` is raised here."""
    from concurrent.futures import ThreadPoolExecutor  # remote targets only

    with ThreadPoolExecutor(min(at_once, len(items)), thread_name_prefix=name) as pool:
        for _ in pool.map(work, items):
            pass
