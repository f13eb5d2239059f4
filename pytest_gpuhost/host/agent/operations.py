"""Each request an agent answers: its fields checked, and the root's operation that carries it out;
a batch answered request by request, each with its value or its error."""

from __future__ import annotations

import errno

from .commands import COMMAND_TIMEOUT_S
from .errors import OpError
from .files import DEFAULT_LIMIT
from .kmsg import KMSG_LIMIT
from .root import Root, gpus_of

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from collections.abc import Callable
    from typing import Any


def _text(request: dict[str, Any], key: str) -> str:
    value = request.get(key)
    if not isinstance(value, str):
        raise OpError(f"a {request.get('op')} request needs {key!r} as a string, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return value


def _whole(request: dict[str, Any], key: str, default: int) -> int:
    value = request.get(key) or default
    if isinstance(value, bool) or not isinstance(value, int):
        raise OpError(f"a {request.get('op')} request needs {key!r} as an integer, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return value


def _seconds(request: dict[str, Any], key: str, default: float) -> float:
    value = request.get(key) or default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise OpError(f"a {request.get('op')} request needs {key!r} as a number, not "
                      f"{type(value).__name__}", errno.EINVAL)
    return float(value)


def _data(request: dict[str, Any]) -> bytes:
    value = request.get("data")
    if not isinstance(value, bytes):
        raise OpError(f"a {request.get('op')} request needs its data as bytes",
                      errno.EINVAL)
    return value


def _run(root: Root, request: dict[str, Any]) -> object:
    argv, env = request.get("argv"), request.get("env") or {}
    if not isinstance(argv, list) or not all(isinstance(arg, str) for arg in argv):
        raise OpError("a run request needs its argv as a list of strings", errno.EINVAL)
    if not isinstance(env, dict) or not all(isinstance(key, str) and isinstance(value, str)
                                            for key, value in env.items()):
        raise OpError("a run request needs its env as a mapping of strings", errno.EINVAL)
    return root.run(argv, env, _seconds(request, "timeout", COMMAND_TIMEOUT_S))


def _write(root: Root, request: dict[str, Any]) -> object:
    root.write(_text(request, "path"), _data(request), _whole(request, "offset", 0),
               truncate=bool(request.get("truncate")))
    return None


def _replace(root: Root, request: dict[str, Any]) -> object:
    root.replace(_text(request, "path"), _data(request), _whole(request, "mode", 0o644))
    return None


def _create(root: Root, request: dict[str, Any]) -> object:
    root.create(_text(request, "path"), _data(request), _whole(request, "mode", 0o600))
    return None


def _append(root: Root, request: dict[str, Any]) -> object:
    root.append(_text(request, "path"), _data(request), sync=request.get("sync", True) is not False)
    return None


def _remove(root: Root, request: dict[str, Any]) -> object:
    root.remove(_text(request, "path"))
    return None


def _unlock(root: Root, request: dict[str, Any]) -> object:
    root.unlock(_whole(request, "handle", -1))
    return None


OPERATIONS: dict[str, Callable[[Root, dict[str, Any]], object]] = {
    "read": lambda root, r: root.read(_text(r, "path"), _whole(r, "limit", DEFAULT_LIMIT)),
    "stat": lambda root, r: root.stat(_text(r, "path")),
    "list": lambda root, r: root.listdir(_text(r, "path")),
    "glob": lambda root, r: root.glob(_text(r, "pattern"), read=bool(r.get("read")),
                                      limit=_whole(r, "limit", DEFAULT_LIMIT),
                                      links=bool(r.get("links"))),
    "kmsg": lambda root, r: root.kmsg(_text(r, "path"), _whole(r, "limit", KMSG_LIMIT)),
    "readlink": lambda root, r: root.readlink(_text(r, "path")),
    "which": lambda root, r: root.which(_text(r, "name")),
    "identity": lambda root, r: root.identity(),
    "lock": lambda root, r: root.lock(_text(r, "path"), _seconds(r, "timeout", 0.0),
                                      str(r.get("holder") or "")),
    "run": _run, "write": _write, "replace": _replace, "create": _create, "append": _append,
    "remove": _remove, "unlock": _unlock,
    "nvml": lambda root, r: gpus_of(root).facts(),
    "nvml_sample": lambda root, r: gpus_of(root).sample(),
    "nvml_set": lambda root, r: gpus_of(root).set(_text(r, "address"), _text(r, "setting"),
                                                  _text(r, "value")),
}
"""Each operation a request may name, and what carries it out."""


def execute(root: Root, request: dict[str, Any]) -> object:
    """One request: ``{"op": ..., ...}`` -> its value; raises OpError (a request that is not
    one of the table's, or whose fields have the wrong types, included)."""
    if not isinstance(request, dict):
        raise OpError(f"a request must be a mapping, not {type(request).__name__}",
                      errno.EINVAL)
    op = request.get("op")
    operation = OPERATIONS.get(op) if isinstance(op, str) else None
    if operation is None:
        raise OpError(f"unknown operation {request.get('op')!r}", errno.EINVAL)
    return operation(root, request)


def batch(root: Root, requests: list[dict[str, Any]]) -> list[dict[str, object]]:
    """Each request's ``{"value": ...}`` or ``{"error": message, "errno": n}``, in order."""
    replies: list[dict[str, object]] = []
    for request in requests:
        try:
            replies.append({"value": execute(root, request)})
        except OpError as exc:
            replies.append({"error": str(exc), "errno": exc.errno})
        except OSError as exc:
            replies.append({"error": str(exc), "errno": exc.errno})
    return replies
