"""The files of this machine that a user names: report files written atomically, never
replacing what is not a file; a saved output read as a regular file only.

A report path is checked when the run is configured (``check_output``), before anything is
changed, so a bad path is a usage error (exit 4), not a traceback after the fixes. At the end,
``write_output`` writes a regular file atomically (a reader never sees half a report), follows a
symlink to the file it names and replaces that (but not another user's link in a sticky,
world-writable directory, which the kernel's fs.protected_symlinks would not follow), and
writes a character device or a FIFO as it is (``--gpuhost-report=/dev/stdout``); it never
replaces a device, a FIFO or a link with a file. ``read_regular`` reads a file the spec names
(a saved tool output): opened without blocking (a FIFO would wait for a writer forever), a
regular file only, and no more than a limit.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))
"""What a path that is not a regular file is, in words (``file_kind``)."""


def file_kind(mode: int) -> str:
    """``a FIFO``, ``a directory``, ...: what a file of ``mode`` is where a regular one was
    wanted."""
    return next((name for test, name in FILE_KINDS if test(mode)), "not a regular file")


def read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file ``path``; an OSError for anything else (its
    ``strerror`` says what the path is: ``a FIFO, not a regular file``), never a read that
    waits for a writer or never ends."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"{file_kind(mode)}, not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as file:
            return file.read(limit)
    finally:
        os.close(fd)


class OutputError(Exception):
    """A report path that cannot be written; the message names it and says why."""


def utf8(text: str) -> bytes:
    """``text`` as a report file holds it, always valid UTF-8: a lone surrogate (a target's
    byte that is not UTF-8, which its JSON answer carried as ``\\udcff``) becomes U+FFFD, as
    such bytes do wherever they are read as text, instead of the whole file going unwritten."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").encode("utf-8")


def write_atomically(path: Path, text: str, *, mode: int = 0o644, replace: bool = True) -> None:
    """A temporary file beside ``path``, then rename: readable by others (a CI user, the Allure
    CLI, node_exporter) although the run may be root's; nothing is left behind on failure.

    ``replace=False``: the complete file is linked into place, which fails with FileExistsError
    when ``path`` exists by then (a file another process wrote meanwhile is never replaced)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(utf8(text))
        os.chmod(tmp, mode)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
            os.unlink(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


MAX_LINKS = 40
"""Links followed in one path at most (the kernel's own limit)."""


def _resolve(path: Path, source: str) -> Path:
    """``os.path.realpath``, refusing a link the kernel's ``fs.protected_symlinks`` would not
    follow for us: one in a sticky, world-writable directory (``/tmp``) owned neither by us nor
    by the directory's owner. The report is written to the link's target by rename, which the
    kernel's own check never sees, so the rule is applied here (as root, another user's link
    in /tmp must not make us replace /etc/passwd)."""
    parts = list(Path(os.getcwd(), path).parts[1:])  # not abspath: '..' after a link is the
    # link target's parent, as the kernel resolves it
    done = Path("/")
    links = 0
    while parts:
        current = done / parts.pop(0)
        try:
            info = os.lstat(current)
        except OSError:
            return Path(os.path.realpath(current.joinpath(*parts)))
        if not stat.S_ISLNK(info.st_mode):
            done = current
            continue
        links += 1
        if links > MAX_LINKS:
            raise OutputError(f"{source}: too many symbolic links in {path}")
        directory = os.stat(done)
        shared = directory.st_mode & stat.S_ISVTX and directory.st_mode & stat.S_IWOTH
        if shared and info.st_uid not in (os.geteuid(), directory.st_uid):
            raise OutputError(f"{source}: {current} is a symbolic link owned by uid "
                              f"{info.st_uid} in the shared directory {done}; it is not "
                              "followed (as the kernel's fs.protected_symlinks would not): "
                              "name the file itself")
        link = Path(os.readlink(current))
        parts = [*link.parts[1:], *parts] if link.is_absolute() else [*link.parts, *parts]
        if link.is_absolute():
            done = Path("/")
    return Path(os.path.realpath(done))


def check_output(path: Path, source: str) -> Path:
    """The path a report will be written to (a symlink's target), or OutputError naming
    ``source`` (``--gpuhost-report=x.json``) and what is wrong."""
    target = _resolve(path, source)
    try:
        info = os.stat(target)
    except (FileNotFoundError, NotADirectoryError):
        info = None
    except OSError as exc:
        raise OutputError(f"{source}: cannot look at {target}: {exc.strerror}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise OutputError(f"{source}: {target} is a directory; name a file in it")
        if stat.S_ISBLK(info.st_mode) or stat.S_ISSOCK(info.st_mode):
            kind = "block device" if stat.S_ISBLK(info.st_mode) else "socket"
            raise OutputError(f"{source}: {target} is a {kind}; a report goes to a file, a "
                              "character device or a FIFO")
        return target
    ancestor = target.parent
    while not os.path.lexists(ancestor):
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"{source}: {ancestor} is not a directory, so {target} cannot be "
                          "created under it")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputError(f"{source}: {ancestor} is not writable, so {target} cannot be "
                          "created")
    return target


def write_output(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write a report to the path ``check_output`` returned; raises OutputError."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror}") from None
    try:
        if info is None or stat.S_ISREG(info.st_mode):
            write_atomically(path, text, mode=mode)
            return
        if stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode):
            _write_in_place(path, utf8(text))
            return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    raise OutputError(f"cannot write {path}: it is not a file, a character device or a FIFO")


def _write_in_place(path: Path, data: bytes) -> None:
    """A device or FIFO as it is: no create, no truncate, no rename; a FIFO without a reader
    is an error, not a wait."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise OutputError(f"cannot write {path}: it is a FIFO with no reader") from None
        raise
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)
