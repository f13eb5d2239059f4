"""Globs inside a root: fnmatch wildcards within one component, each match read (or its link target
taken) in the same call."""

from __future__ import annotations

import fnmatch

from .containment import check_relative
from .errors import MISSING, OpError
from .files import DEFAULT_LIMIT, Files


class Globs(Files):
    """``glob`` on the root's files."""

    def glob(self, pattern: str, *, read: bool, limit: int = DEFAULT_LIMIT,
             links: bool = False) -> list[list[object]]:
        """``[path, content or error or None]`` for every path matching ``pattern`` (fnmatch
        wildcards within one component; names starting with '.' only where the pattern's
        component does), sorted; with ``read``, each match's bytes (or why not); with
        ``links``, each match's link target as stored (None for what is not a link). A
        directory the pattern must list that is missing has no matches; one that cannot be
        listed (EACCES, a link out of the root) fails the whole glob: its matches are
        unknown, and a glob that left them out would drop a CPU or a GPU unseen."""
        check_relative(pattern)
        paths = [""]
        for part in [p for p in pattern.split("/") if p not in ("", ".")]:
            paths = [path for base in paths for path in self._step(base, part)]
        matches = (self._match(path, read, limit, links) for path in sorted(paths))
        return [match for match in matches if match is not None]

    def _step(self, base: str, part: str) -> list[str]:
        """The paths under ``base`` that one component of a glob pattern names."""
        if not any(char in part for char in "*?["):
            return [f"{base}/{part}" if base else part]
        try:
            names = self._listdir(base or ".")
        except OpError as exc:
            if exc.errno in MISSING:
                return []
            raise
        hidden = part.startswith(".")
        return [f"{base}/{n}" if base else n for n in names
                if fnmatch.fnmatchcase(n, part) and (hidden or n[0] != ".")]

    def _match(self, path: str, read: bool, limit: int, links: bool) -> list[object] | None:
        """One glob match as ``glob`` returns it, or None for a path that is gone."""
        try:
            if links:
                target = self.readlink(path)
                return [path, target] if target is not None or self._lexists(path) else None
            if not read:
                self.stat(path)
                return [path, None]
            return [path, self.read(path, limit)]
        except OpError as exc:
            if links:
                return [path, exc]
            return None if not read or exc.errno in MISSING else [path, exc]
