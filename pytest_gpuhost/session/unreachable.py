"""The Host of a target that cannot be reached: it answers every read with an error naming the
target and the connection's own words, so each of its checks is an error with that reason and
the other targets run."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..host import BatchReads, HostError, HostIdentity, Reply, Request, TargetLost, raised


class UnreachableHost(BatchReads):
    """What a target that cannot be reached answers: every read an error naming it and the
    connection's own words, so its checks are errors with that reason and the others run."""

    def __init__(self, url: str, reason: HostError) -> None:
        self.url = url
        self.reason = reason
        self._lost = TargetLost(str(reason), reason.errno)

    def describe(self) -> str:
        return self.url

    def local_machine(self) -> bool:
        return False

    def privileged(self) -> bool:
        return False

    def identity(self) -> HostIdentity:
        raise raised(self.reason)

    def invalidate(self) -> None:
        """Nothing to forget."""

    def local_path(self, path: str) -> Path | None:
        return None

    def batch(self, requests: Sequence[Request]) -> list[Reply]:
        return [Reply(error=self._lost) for _ in requests]

    def _refuse(self, *args: object, **kwargs: object) -> Any:
        raise raised(self.reason)

    def unlock(self, handle: int) -> None:
        """A lost connection released its locks with it."""

    write_text = write_bytes = replace_file = remove = which = run = _refuse
    create_file = append_file = lock = _refuse
