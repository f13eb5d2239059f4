"""A spec parsed before, loaded from pytest's cache directory instead of parsed again.

Parsing a 300-entry spec and importing PyYAML to do it is a tenth of a run's start-up; a spec
file that has not changed since a run parsed it (a CI gate, node-problem-detector's every
interval, each xdist worker of a run) needs neither. The validated model is kept, pickled, in
pytest's cache: ``.pytest_cache/d/gpuhost-spec/`` by default. pytest's ``cache_dir`` ini
moves it, ``--cache-clear`` empties it, and ``-p no:cacheprovider`` turns it off.

An entry is named after a SHA-256 of everything a parse depends on: the spec's bytes, its
path and the name messages give it, the check kinds (section and class) and the conditions'
names, the Python and msgspec versions, and the size and modification time of every Python
file of the packages whose code parses the spec (this package's and each kind plugin's: another
version of either is other files). An edit of any of them is another key, and a parse. A spec
with an error is never kept: each run reports it anew.

A root tool must not take what decides its writes from a file another user can write. An
entry is read, or written, only in a directory this process's user owns, that is no symlink
and that only that user can write (made so when pytest made it group-writable); the entry is
opened without following a symlink and must be a regular file that the same user owns and only
that user can write. Anything else, or an entry that does not load back as the spec of its key
(cut short, from another version), is passed over: the spec is parsed, as without a cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import SectionParser, Spec, parse_spec
from .specfile import read_spec, shown_name

try:
    import _pickle as pickle  # the C pickler alone: pickle.py adds 2.5 ms of import
except ImportError:  # pragma: no cover - another Python than CPython
    import pickle  # type: ignore[no-redef]  # the same loads and dumps

DIRECTORY = "gpuhost-spec"
"""The name of the directory in pytest's cache (``config.cache.mkdir``)."""
FORMAT = 1
"""The layout of an entry, ``(FORMAT, key, spec)``: another layout is another key."""
MAX_ENTRY_BYTES = 64 * 1024 * 1024
PROTOCOL = 5
"""Python 3.8's, and every later one's (``_pickle`` has no HIGHEST_PROTOCOL)."""
KEEP = 32
"""Entries kept: writing one more removes the oldest (each edit of a spec is a new key)."""

_code_signatures: dict[str, bytes] = {}
"""A package's files' sizes and times, once a process (xdist's workers are processes)."""


def load_spec_cached(
    directory: Path | None,
    path: Path,
    parsers: Mapping[str, SectionParser],
    conditions: Iterable[str],
    *,
    display: Callable[[Path], str] = str,
) -> Spec:
    """``load_spec``'s spec, from ``directory`` where it holds it (None: no cache), else
    parsed and kept there; a spec with an error raises SpecError as ``load_spec`` does."""
    shown = shown_name(path, display)
    data = read_spec(path, shown)
    names = tuple(conditions)
    trusted = directory is not None and _trusted_directory(directory)
    key = _key(data, path, shown, parsers, names) if trusted else None
    if directory is None or key is None:
        return parse_spec(data, path, shown, parsers, names)
    entry = directory / f"{key}.pickle"
    cached = _read(entry, key)
    if cached is not None:
        return cached
    spec = parse_spec(data, path, shown, parsers, names)
    _write(directory, entry, key, spec)
    return spec


def _key(data: bytes, path: Path, shown: str, parsers: Mapping[str, SectionParser],
         conditions: tuple[str, ...]) -> str | None:
    """The entry's name; None where a kind's code cannot be found to key on (not cached)."""
    import msgspec

    digest = hashlib.sha256()
    for part in (str(FORMAT), sys.version, msgspec.__version__, str(path), shown,
                 "\0".join(sorted(conditions))):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0\0")
    packages = {__name__.split(".", 1)[0]}
    for section, parser in parsers.items():
        kind = type(parser)
        digest.update(f"{section}\0{kind.__module__}\0{kind.__qualname__}\0\0".encode())
        packages.add(kind.__module__.split(".", 1)[0])
    for package in sorted(packages):
        signature = _code_signature(package)
        if signature is None:
            return None
        digest.update(signature)
    digest.update(data)
    return digest.hexdigest()


def _code_signature(package: str) -> bytes | None:
    """The relative path, size and modification time of every Python file of the top-level
    module ``package`` (its directory's, for a package), or None where it has no file."""
    if package in _code_signatures:
        return _code_signatures[package]
    module = sys.modules.get(package)
    file = getattr(module, "__file__", None)
    if not file:
        return None
    origin = Path(file)
    files: list[str] = []
    if origin.name == "__init__.py":
        pending = [origin.parent]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for each in entries:
                    if each.name.endswith(".py"):
                        info = each.stat()  # a linked file: its target's
                        files.append(f"{each.path}\0{info.st_size}\0{info.st_mtime_ns}")
                    elif each.name != "__pycache__" and each.is_dir(follow_symlinks=False):
                        pending.append(Path(each.path))
    else:
        info = origin.stat()
        files.append(f"{origin}\0{info.st_size}\0{info.st_mtime_ns}")
    signature = "\0\0".join(sorted(files)).encode("utf-8", "surrogateescape") + b"\0\0\0"
    _code_signatures[package] = signature
    return signature


def _owned_and_private(info: os.stat_result) -> bool:
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _trusted_directory(directory: Path) -> bool:
    """Whether ``directory`` is one this user's own, that no other user can write: a real
    directory this user owns, made private where pytest made it group- or world-writable."""
    try:
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            return False
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.chmod(directory, 0o700, follow_symlinks=False)
            info = os.lstat(directory)
        return stat.S_ISDIR(info.st_mode) and _owned_and_private(info)
    except OSError:
        return False


def _read(entry: Path, key: str) -> Spec | None:
    """The spec kept at ``entry`` for ``key``, or None (no entry, or not one to trust)."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not _owned_and_private(info) or \
                info.st_size > MAX_ENTRY_BYTES:
            return None
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_ENTRY_BYTES:
            chunk = os.read(fd, MAX_ENTRY_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        loaded = pickle.loads(b"".join(chunks))
    except Exception:  # cut short, another version's classes, unreadable: parsed anew
        return None
    finally:
        os.close(fd)
    if not isinstance(loaded, tuple) or len(loaded) != 3 or loaded[0] != FORMAT or \
            loaded[1] != key or not isinstance(loaded[2], Spec):
        return None
    spec: Spec = loaded[2]
    return spec


def _write(directory: Path, entry: Path, key: str, spec: Spec) -> None:
    """Keep ``spec`` at ``entry``, written whole then renamed into place; where it cannot be
    (a kind's model that does not pickle, a full disk), nothing is kept."""
    temporary = directory / f".{key}.{os.getpid()}.tmp"
    try:
        data = pickle.dumps((FORMAT, key, spec), protocol=PROTOCOL)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temporary, entry)
    except Exception:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return
    _prune(directory)


def _prune(directory: Path) -> None:
    """Remove the oldest entries past KEEP."""
    try:
        entries = [(each.stat(follow_symlinks=False).st_mtime_ns, each.path)
                   for each in os.scandir(directory)
                   if each.name.endswith(".pickle") and each.is_file(follow_symlinks=False)]
        for _, oldest in sorted(entries)[:-KEEP]:
            os.unlink(oldest)
    except OSError:
        pass
