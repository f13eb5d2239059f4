"""A fleet's held agent sessions and the soft limit on open files (``session/limits.py``):
raised toward the hard limit where the sessions would not fit, never lowered, never past the
hard limit. The limits are a fake ``resource`` module's: this process's own are untouched."""

from __future__ import annotations

import types

import pytest

from pytest_gpuhost.session.limits import FILES_PER_SESSION, FILES_SPARE, room_for_sessions


def fake_resource(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int) -> list[tuple[int, int]]:
    """``resource`` with these limits; returns the limits set, in order."""
    import sys

    limits = [soft, hard]
    set_to: list[tuple[int, int]] = []

    def setrlimit(kind: int, pair: tuple[int, int]) -> None:
        set_to.append(pair)
        limits[:] = pair

    module = types.SimpleNamespace(RLIMIT_NOFILE=7, RLIM_INFINITY=-1,
                                   getrlimit=lambda kind: tuple(limits), setrlimit=setrlimit)
    monkeypatch.setitem(sys.modules, "resource", module)
    return set_to


def test_the_soft_limit_is_raised_to_what_the_sessions_need() -> None:
    with pytest.MonkeyPatch.context() as patch:
        set_to = fake_resource(patch, 1024, 65536)
        room_for_sessions(500)
    assert set_to == [(500 * FILES_PER_SESSION + FILES_SPARE, 65536)]


@pytest.mark.parametrize(("soft", "hard", "sessions", "expected"), [
    (1024, 65536, 100, []),                # they fit: untouched
    (4096, 65536, 500, []),                # never lowered
    (1024, 1200, 500, [(1200, 1200)]),     # no further than the hard limit
    (1024, -1, 500, [(1756, -1)]),         # an unlimited hard limit: what they need
    (-1, -1, 5000, []),                    # unlimited already
    (2048, 2048, 5000, []),                # at the hard limit already
])
def test_the_soft_limit_is_never_lowered_nor_raised_past_the_hard_one(
        soft: int, hard: int, sessions: int, expected: list[tuple[int, int]]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        set_to = fake_resource(patch, soft, hard)
        room_for_sessions(sessions)
    assert set_to == expected
