"""What a batch asks of a host, what it answers, and how both cross a wire.

A request is a frozen value (the phase cache keys its replies by it). How each request type
crosses the wire is one row of ``WIRE_FORMS``: its name there (the agent's ``op``), its checked
fields, the request again from them, and its reply's value from and onto the wire (a
``Stat``'s ``FileInfo``, a ``Glob``'s matches with their errors). A remote host sends
``request.wire()`` and decodes with ``reply_from_wire``; the xdist controller hands what it read
to its workers with ``request.wire()``/``reply_to_wire`` and they take it back with
``request_from_wire``/``reply_from_wire``. A new request type is a class and one row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeGuard, TypeVar

import msgspec

from .agent import COMMAND_DIRS, DEFAULT_LIMIT, KMSG_LIMIT
from .errors import MISSING_ERRNOS, HostError, UnsafePath, raised


def checked_relative(path: str) -> str:
    """``path``, normalized (``proc//sys/./vm/`` -> ``proc/sys/vm``), once it is known to name
    something under the root: refuses ``..``, absolute paths, NUL and empty paths (``..`` in a
    link target is resolved inside the root)."""
    if not isinstance(path, str):
        raise UnsafePath(f"path {path!r} is not a string")
    if "\0" in path:
        raise UnsafePath(f"path {path!r} contains NUL")
    if path.startswith("/"):
        raise UnsafePath(f"path {path!r} is absolute; host paths are relative to the root")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts or not parts:
        raise UnsafePath(f"path {path!r} would leave the host root")
    return "/".join(parts)


def checked_program(name: str) -> str:
    """What a command line may start with: a bare name (found as ``which`` finds it), or a path
    inside the root (``opt/nccl-tests/build/all_reduce_perf``: relative, no ``..``; resolved
    inside the root by the agent, its links too)."""
    if isinstance(name, str) and "/" in name and "\0" not in name:
        return checked_relative(name)
    return checked_command(name)


def checked_command(name: str) -> str:
    """A command's bare name: a path (``../../bin/sh``) could run something outside the root."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name:
        raise UnsafePath(f"command {name!r} must be a bare name, found under the root's "
                         f"{', '.join(COMMAND_DIRS)}")
    return name


class FileInfo(msgspec.Struct, frozen=True):
    type: str
    """``file``, ``directory``, ``character device``, ``FIFO``, ..."""
    size: int
    mode: int
    rdev: tuple[int, int] = (0, 0)


class _Wired:
    """A request's ``wire()``: its row of ``WIRE_FORMS``."""

    __slots__ = ()

    def wire(self) -> dict[str, object]:
        form = WIRE_FORMS[type(self)]
        return {"op": form.op, **form.fields(self)}


class Read(_Wired, msgspec.Struct, frozen=True):
    """A regular file's bytes (bounded by ``limit``)."""

    path: str
    limit: int = DEFAULT_LIMIT


class Stat(_Wired, msgspec.Struct, frozen=True):
    """What is at a path (links followed inside the root), or a missing-file error."""

    path: str


class ListDir(_Wired, msgspec.Struct, frozen=True):
    path: str


class Glob(_Wired, msgspec.Struct, frozen=True):
    """Every path matching ``pattern`` (fnmatch wildcards within a component), with its bytes
    when ``read``: one request for ``sys/bus/pci/devices/*/vendor``, whatever the count."""

    pattern: str
    read: bool = True
    links: bool = False
    """Each match's symbolic link target as stored (None where it is no link), not its bytes."""


class Kmsg(_Wired, msgspec.Struct, frozen=True):
    """The kernel log's records (the device, or a plain file in a fake tree)."""

    path: str = "dev/kmsg"
    limit: int = KMSG_LIMIT


class Link(_Wired, msgspec.Struct, frozen=True):
    """The target of a symbolic link as stored (``../../../devices/pci0000:00/...``), or None
    when the path is not a link; never followed (resolve it with ``linux.pcitopo``)."""

    path: str


class Which(_Wired, msgspec.Struct, frozen=True):
    """Where a command is under the root's sbin/bin directories (and PATH at ``/``), or None."""

    name: str


class GpuQuery(_Wired, msgspec.Struct, frozen=True):
    """What the machine's NVIDIA driver says of its GPUs, through its own NVML library (or
    nvidia-smi): the agent's ``Gpus.facts``, in one answer (``gpu.agentnvml`` reads it)."""


Request = Read | Stat | ListDir | Glob | Kmsg | Link | Which | GpuQuery
Match = tuple[str, "bytes | str | HostError | None"]
"""A glob's match: its path and its bytes, its link target (``links``), an error or None."""


def unreadable(item: object) -> TypeGuard[HostError]:
    """Whether a glob's match could not be read for a reason other than being gone (removed
    between the glob and its read): a value its reader must not take for absent."""
    return isinstance(item, HostError) and item.errno not in MISSING_ERRNOS


class Reply(msgspec.Struct, frozen=True):
    """One request's answer: its value, or the error the host gave."""

    value: object = None
    error: HostError | None = None

    def get(self) -> object:
        if self.error is not None:
            raise raised(self.error)
        return self.value

    def data(self) -> bytes:
        value = self.get()
        assert isinstance(value, bytes)
        return value

    def text(self) -> str:
        return self.data().decode("utf-8", errors="replace")

    def names(self) -> list[str]:
        value = self.get()
        assert isinstance(value, list)
        return [str(name) for name in value]

    def lines(self) -> list[str]:
        return self.names()

    def info(self) -> FileInfo:
        value = self.get()
        assert isinstance(value, FileInfo)
        return value

    def matches(self) -> list[Match]:
        value = self.get()
        assert isinstance(value, list)
        return value

    @property
    def missing(self) -> bool:
        return self.error is not None and self.error.errno in MISSING_ERRNOS


# -- the wire ------------------------------------------------------------------------------------

R = TypeVar("R")


def _same(value: object) -> object:
    return value


def _error(answer: Mapping[str, object]) -> HostError:
    code = answer.get("errno")
    return HostError(str(answer["error"]), code if isinstance(code, int) else None)


def _error_wired(error: HostError) -> dict[str, object]:
    return {"error": str(error), "errno": error.errno}


def _info(value: object) -> object:
    if not isinstance(value, Mapping):
        return value
    rdev = value.get("rdev") or (0, 0)
    assert isinstance(rdev, (list, tuple))
    return FileInfo(str(value["type"]), int(str(value["size"])), int(str(value["mode"])),
                    (int(rdev[0]), int(rdev[1])))


def _info_wired(value: object) -> object:
    assert isinstance(value, FileInfo)
    return {"type": value.type, "size": value.size, "mode": value.mode, "rdev": list(value.rdev)}


def _match_item(item: object) -> bytes | str | HostError | None:
    if isinstance(item, Mapping) and "error" in item:
        return _error(item)
    assert item is None or isinstance(item, (bytes, str))
    return item


def _matches(value: object) -> object:
    if not isinstance(value, list):
        return value
    return [(str(path), _match_item(item)) for path, item in value]


def _matches_wired(value: object) -> object:
    assert isinstance(value, list)
    return [[path, _error_wired(item) if isinstance(item, HostError) else item]
            for path, item in value]


class WireForm(msgspec.Struct, Generic[R], frozen=True):
    """How one request type crosses the wire."""

    op: str
    """Its name there: the agent's operation."""
    fields: Callable[[R], dict[str, object]]
    """Its fields, checked: a path that would leave the root is refused before it is sent."""
    request: Callable[[Mapping[str, object]], R]
    """The request again from those fields."""
    value: Callable[[object], object] = _same
    """Its reply's value from the wire."""
    wired: Callable[[object], object] = _same
    """Its reply's value onto the wire (bytes stay bytes: ``agent.encode`` makes JSON of it)."""


WIRE_FORMS: dict[type, WireForm[Any]] = {
    Read: WireForm[Read](
        "read", lambda r: {"path": checked_relative(r.path), "limit": r.limit},
        lambda w: Read(str(w["path"]), int(str(w["limit"])))),
    Stat: WireForm[Stat](
        "stat", lambda r: {"path": checked_relative(r.path)},
        lambda w: Stat(str(w["path"])), _info, _info_wired),
    ListDir: WireForm[ListDir](
        "list", lambda r: {"path": checked_relative(r.path)},
        lambda w: ListDir(str(w["path"]))),
    Glob: WireForm[Glob](
        "glob", lambda r: {"pattern": checked_relative(r.pattern), "read": r.read,
                           "links": r.links},
        lambda w: Glob(str(w["pattern"]), w["read"] is True, w["links"] is True),
        _matches, _matches_wired),
    Kmsg: WireForm[Kmsg](
        "kmsg", lambda r: {"path": checked_relative(r.path), "limit": r.limit},
        lambda w: Kmsg(str(w["path"]), int(str(w["limit"])))),
    Link: WireForm[Link](
        "readlink", lambda r: {"path": checked_relative(r.path)},
        lambda w: Link(str(w["path"]))),
    Which: WireForm[Which](
        "which", lambda r: {"name": checked_command(r.name)},
        lambda w: Which(str(w["name"]))),
    GpuQuery: WireForm[GpuQuery]("nvml", lambda r: {}, lambda w: GpuQuery()),
}
"""Each request type's wire form, by type."""

_BY_OP = {form.op: form for form in WIRE_FORMS.values()}


def request_from_wire(wire: Mapping[str, object]) -> Request:
    """The inverse of ``Request.wire()``."""
    form = _BY_OP.get(str(wire.get("op")))
    if form is None:
        raise ValueError(f"not a host request: {dict(wire)!r}")
    request: Request = form.request(wire)
    return request


def reply_from_wire(request: Request, answer: Mapping[str, object]) -> Reply:
    """A reply from the agent's ``{"value": ...}`` / ``{"error": ..., "errno": ...}``."""
    if "error" in answer:
        return Reply(error=_error(answer))
    return Reply(WIRE_FORMS[type(request)].value(answer.get("value")))


def reply_to_wire(request: Request, reply: Reply) -> dict[str, object]:
    """The inverse of ``reply_from_wire``: the agent's own form of ``request``'s answer."""
    if reply.error is not None:
        return _error_wired(reply.error)
    return {"value": WIRE_FORMS[type(request)].wired(reply.value)}
