"""A spec parsed before, loaded from pytest's cache directory instead of parsed again.

Parsing a 300-entry spec, and importing PyYAML to do it, is about 20 ms of a run's start-up; a
spec file that has not changed since a run parsed it (a CI gate, node-problem-detector's every
interval, each xdist worker of a run) needs neither. The validated model is kept, pickled, in
pytest's cache: ``.pytest_cache/d/gpuhost-spec/`` by default. pytest's ``cache_dir`` ini
moves it, ``--cache-clear`` empties it, and ``-p no:cacheprovider`` turns it off.

What is kept: the specs of runs whose check kinds are all this package's. A kind of another
plugin may parse by code or state no key here can cover (a conftest's helpers, an option), so
a run with one parses its spec every time. An entry is named after a SHA-256 of everything a
parse depends on: the spec's bytes, its path and the name messages give it, the kinds
(section and class) and the conditions' names, the Python and msgspec versions, PyYAML's file,
and the size and modification time of every Python file of this package (another version of it
is other files, an edit of one in an editable install too). A spec with an error is never kept:
each run reports it anew.

A root tool must not take what decides its writes from a file another user can write, nor write
where another user points it. The directory is opened once, a component at a time from ``/``
without following a link (a path through one is not used), and used only if every directory
above it is root's or this user's and no other user can write it (or it is sticky, as
``/tmp``), and if it is this user's own (made private where pytest made it group-writable);
every read, write, rename and removal after that is relative to that open directory. An entry
must be a regular file of this user's with one link that no other user can write, opened
without following a link, and must begin with its own key before anything of it is unpickled.
Anything else, or an entry that does not load back as the spec of its key (cut short, from
another version), is passed over: the spec is parsed, as without a cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from . import SectionParser, Spec, parse_spec
from .specfile import read_bounded, read_spec, shown_name

try:
    import _pickle as pickle  # the C pickler alone: pickle.py adds 2.5 ms of import
except ImportError:  # pragma: no cover - another Python than CPython
    import pickle  # type: ignore[no-redef]  # the same loads and dumps

DIRECTORY = "gpuhost-spec"
"""The name of the directory in pytest's cache (``config.cache.mkdir``)."""
FORMAT = 2
"""The layout of an entry, ``MAGIC key \\n`` then the pickled spec: another is another key."""
MAGIC = b"pytest-gpuhost spec "
PROTOCOL = 5
"""Python 3.8's, and every later one's (``_pickle`` has no HIGHEST_PROTOCOL)."""
MAX_ENTRY_BYTES = 64 * 1024 * 1024
KEEP = 32
"""Entries kept: writing one more removes the least recently used (each edit is a new key)."""
STALE_TEMPORARY_NS = 600 * 10**9
"""A temporary file this old is a killed run's: removed when an entry is written."""
PACKAGE = __name__.split(".", 1)[0]


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
    parse = functools.partial(parse_spec, data, path, shown, parsers, names)
    own = all(type(parser).__module__.startswith(f"{PACKAGE}.") for parser in parsers.values())
    folder = _open_private_directory(directory) if directory is not None and own else None
    if folder is None:  # no cache, a plugin's kind, or not a directory to trust
        return parse()
    try:
        key = _key(data, path, shown, parsers, names)
        if key is None:
            return parse()
        cached = _read(folder, key)
        if cached is not None:
            return cached
        spec = parse()
        _write(folder, key, spec)
        return spec
    finally:
        os.close(folder)


def _key(data: bytes, path: Path, shown: str, parsers: Mapping[str, SectionParser],
         conditions: tuple[str, ...]) -> str | None:
    """The entry's name; None where the code it depends on cannot be read (not cached)."""
    import msgspec

    digest = hashlib.sha256()
    for part in (str(FORMAT), sys.version, msgspec.__version__, str(path), shown,
                 "\0".join(sorted(conditions))):
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0\0")
    for section, parser in parsers.items():
        kind = type(parser)
        digest.update(f"{section}\0{kind.__module__}\0{kind.__qualname__}\0\0".encode())
    try:
        digest.update(_code_signature())
        digest.update(_yaml_signature())
    except (OSError, ValueError, ImportError):  # a package removed under the run, a zip
        return None
    digest.update(data)
    return digest.hexdigest()


@functools.cache
def _code_signature() -> bytes:
    """The path, size and modification time of every Python file of this package, once a
    process (xdist's workers are processes)."""
    root = Path(__file__).resolve().parent.parent
    files: list[str] = []
    pending = [root]
    while pending:
        with os.scandir(pending.pop()) as entries:
            for each in entries:
                if each.name.endswith(".py"):
                    try:
                        info = each.stat()  # a linked file: its target's
                    except FileNotFoundError:  # a dangling link (an editor's lock file)
                        continue
                    files.append(f"{each.path}\0{info.st_size}\0{info.st_mtime_ns}")
                elif each.name != "__pycache__" and each.is_dir(follow_symlinks=False):
                    pending.append(Path(each.path))
    return "\0\0".join(sorted(files)).encode("utf-8", "surrogateescape") + b"\0\0\0"


def _yaml_signature() -> bytes:
    """PyYAML's own file, size and time (an upgrade is another key), found without importing
    it where a run has not."""
    module = sys.modules.get("yaml")
    origin = getattr(module, "__file__", None)
    for entry in sys.path if origin is None else ():  # where the import would look first
        candidate = os.path.join(entry or ".", "yaml", "__init__.py")
        if os.path.isfile(candidate):
            origin = candidate
            break
    if origin is None:  # a finder of its own: ask the import system (0.6 ms)
        import importlib.util

        found = importlib.util.find_spec("yaml")
        origin = found.origin if found is not None else None
    if origin is None:
        return b"no yaml\0"
    info = os.stat(origin)
    return f"{origin}\0{info.st_size}\0{info.st_mtime_ns}\0".encode("utf-8", "surrogateescape")


def _safe_above(info: os.stat_result) -> bool:
    """Whether a directory above the cache's lets no other user replace what is in it."""
    return info.st_uid in (0, os.geteuid()) and (
        not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or bool(info.st_mode & stat.S_ISVTX))


def _open_private_directory(directory: Path) -> int | None:
    """``directory``, open, where no other user can write it or anything above it (see the
    module's docstring), made private where pytest made it group- or world-writable; None
    where it is not one to trust."""
    # As given, every link refused: a link in a directory another user can write could name
    # any private directory of this user's (pytest's own path holds none: it is the working
    # directory's, which the kernel gives without links).
    parts = [part for part in os.path.abspath(directory).split(os.sep) if part]
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open("/", flags)
    except OSError:
        return None
    try:
        for part in parts:
            if not _safe_above(os.fstat(fd)):
                raise PermissionError(part)
            child = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = child
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PermissionError(directory)
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.fchmod(fd, 0o700)
        return fd
    except OSError:
        os.close(fd)
        return None


def _header(key: str) -> bytes:
    return MAGIC + key.encode("ascii") + b"\n"


def _read(folder: int, key: str) -> Spec | None:
    """The spec kept for ``key`` in the open directory ``folder``, or None (no entry, or not
    one to trust)."""
    try:
        fd = os.open(f"{key}.pickle", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or \
                info.st_nlink != 1 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or \
                info.st_size > MAX_ENTRY_BYTES:
            return None
        data = read_bounded(fd, MAX_ENTRY_BYTES)
        header = _header(key)
        if not data.startswith(header):  # another key's, or not an entry: never unpickled
            return None
        loaded = pickle.loads(memoryview(data)[len(header):])
        if not isinstance(loaded, Spec):
            return None
        with contextlib.suppress(OSError):
            os.utime(fd)  # used now: the last to be pruned
        return loaded
    except Exception:  # cut short, another version's classes, unreadable: parsed anew
        return None
    finally:
        os.close(fd)


def _write(folder: int, key: str, spec: Spec) -> None:
    """Keep ``spec`` for ``key`` in the open directory ``folder``, written whole under a name
    of its own then renamed into place; where it cannot be (a model that does not pickle, a
    full disk), nothing is kept."""
    temporary = f".{key}.{os.urandom(8).hex()}.tmp"
    created = False
    try:
        data = _header(key) + pickle.dumps(spec, protocol=PROTOCOL)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                     os.O_CLOEXEC, 0o600, dir_fd=folder)
        created = True
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(temporary, f"{key}.pickle", src_dir_fd=folder, dst_dir_fd=folder)
    except Exception:
        if created:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=folder)
        return
    _prune(folder)


def _prune(folder: int) -> None:
    """Remove the least recently used entries past KEEP, and killed runs' temporary files."""
    import time

    now = time.time_ns()
    try:
        entries: list[tuple[int, str]] = []
        with os.scandir(folder) as listing:
            for each in listing:
                if not each.is_file(follow_symlinks=False):
                    continue
                modified = each.stat(follow_symlinks=False).st_mtime_ns
                if each.name.endswith(".pickle"):
                    entries.append((modified, each.name))
                elif each.name.endswith(".tmp") and now - modified > STALE_TEMPORARY_NS:
                    os.unlink(each.name, dir_fd=folder)
        for _, oldest in sorted(entries)[:-KEEP]:
            os.unlink(oldest, dir_fd=folder)
    except OSError:
        pass
