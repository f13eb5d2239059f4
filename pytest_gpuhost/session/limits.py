"""What a process may hold open: a fleet's agent sessions against the soft limit on open files."""

from __future__ import annotations

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
