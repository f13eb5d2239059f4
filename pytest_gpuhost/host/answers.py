"""What a target's agent may say, checked before anything reads it.

A message is a length line, then that many bytes of JSON (``take_message``). The first is the
agent's hello; each later one answers a batch, one reply per request, each reply
``{"value": ...}`` of the shape its operation gives or ``{"error": TEXT, "errno": N}``
(``batch_problem``). A target that says anything else (a shell's banner, a corrupted stream,
another program's JSON, lists where strings belong, a 200,000-deep array) is not running the
agent: the caller makes it lost ("not the agent's answer"), and every other target runs on.
"""

from __future__ import annotations

import errno
import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence

from . import HostError

MAX_MESSAGE = 256 * 2**20
"""The largest answer taken from the target: more than any batch of bounded reads (a kernel
log's 64 MiB of records the largest), so a length beyond it is a stream gone wrong."""
HEADER_LIMIT = 32
"""A length line is a number of at most this many bytes."""


def garbled(data: bytes, why: str = "") -> HostError:
    """What the target sent instead of the agent's answer: a shell's startup file that
    prints, a wrapper's banner, a corrupted stream."""
    return HostError(f"the target sent something that is not the agent's answer: "
                     f"{data[:200]!r}{why}", errno.EPROTO)


def take_message(buffer: bytearray) -> tuple[bool, object]:
    """``(True, message)`` once a whole message is at the head of ``buffer`` (taken off it),
    ``(False, None)`` while it is still arriving; HostError EPROTO for what is no message."""
    newline = buffer.find(b"\n")
    if newline < 0:
        if len(buffer) > HEADER_LIMIT:
            raise garbled(bytes(buffer))
        return False, None
    header = bytes(buffer[:newline])
    size = int(header) if header.strip().isdigit() else -1
    if size < 0:
        raise garbled(header)
    if size > MAX_MESSAGE:
        raise garbled(header, f" (an answer of {size} bytes, more than the {MAX_MESSAGE} any "
                              "answer of the agent's has)")
    end = newline + 1 + size
    if len(buffer) < end:
        return False, None
    payload = bytes(buffer[newline + 1:end])
    del buffer[:end]
    try:
        return True, json.loads(payload)
    except (ValueError, RecursionError):  # not JSON (UnicodeDecodeError is one), or too deep
        raise garbled(payload) from None


def _whole(value: object) -> bool:
    return type(value) is int


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _text_or_none(value: object) -> bool:
    return value is None or isinstance(value, str)


def _error(value: object) -> bool:
    """``{"error": TEXT, "errno": N or null}``."""
    return isinstance(value, dict) and isinstance(value.get("error"), str) and (
        value.get("errno") is None or _whole(value.get("errno")))


def _stat(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    rdev = value.get("rdev", [0, 0])
    return isinstance(value.get("type"), str) and _whole(value.get("size")) and \
        _whole(value.get("mode")) and isinstance(rdev, list) and len(rdev) == 2 and \
        all(_whole(number) for number in rdev)


def _glob(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(match, list) and len(match) == 2 and isinstance(match[0], str) and (
            match[1] is None or isinstance(match[1], (bytes, str)) or _error(match[1]))
        for match in value)


def _ran(value: object) -> bool:
    return isinstance(value, dict) and _whole(value.get("returncode")) and \
        isinstance(value.get("stdout"), str) and isinstance(value.get("stderr"), str)


def _identity(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(key, str) and _text_or_none(item)
                                           for key, item in value.items())


def _nothing(value: object) -> bool:
    return value is None


def _anything(value: object) -> bool:
    return True


VALUES: dict[str, Callable[[object], bool]] = {
    "read": lambda value: isinstance(value, bytes), "stat": _stat, "list": _texts,
    "glob": _glob, "kmsg": _texts, "readlink": _text_or_none, "which": _text_or_none,
    "run": _ran, "identity": _identity, "lock": _whole, "write": _nothing,
    "replace": _nothing, "remove": _nothing, "create": _nothing, "append": _nothing,
    "unlock": _nothing, "nvml": lambda value: isinstance(value, dict), "nvml_set": _nothing,
    "nvml_sample": lambda value: isinstance(value, dict),
}
"""The shape of each operation's value, as the agent gives it (bytes already decoded)."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def _outside(pattern: object, matches: list[list[object]]) -> str | None:
    """The first glob match whose path is not one ``pattern`` names (a component for each of
    its components, each matching it), as the agent's glob gives only those: the kinds read
    a device or a CPU from a match's components by their place."""
    parts = str(pattern).split("/")
    for path, _ in matches:
        names = str(path).split("/")
        if len(names) != len(parts) or not all(
                name not in ("", ".", "..") and fnmatch.fnmatchcase(name, part)
                for name, part in zip(names, parts, strict=True)):
            return f"a glob match {_shown(path)} outside its pattern {_shown(pattern)}"
    return None


def reply_problem(request: Mapping[str, object], reply: object) -> str | None:
    """What is wrong with one reply to ``request``; None when it is the agent's."""
    op = str(request.get("op"))
    if not isinstance(reply, dict):
        return f"{_shown(reply)} where the reply to a {op} request belongs"
    if "error" in reply:
        return None if _error(reply) else f"an error without its text and errno: {_shown(reply)}"
    if "value" not in reply:
        return f"a reply to a {op} request without a value or an error: {_shown(reply)}"
    check = VALUES.get(op, _anything)
    if not check(reply["value"]):
        return f"a {op} value of the wrong shape: {_shown(reply['value'])}"
    return _outside(request.get("pattern"), reply["value"]) if op == "glob" else None


def batch_problem(requests: Sequence[Mapping[str, object]], replies: object) -> str | None:
    """What is wrong with the answer to a batch; None when it is the agent's."""
    if not isinstance(replies, list) or len(replies) != len(requests):
        count = len(replies) if isinstance(replies, list) else None
        return (f"{_shown(replies)} where {len(requests)} replies belong"
                + (f" ({count} came)" if count is not None else ""))
    for request, reply in zip(requests, replies, strict=True):
        problem = reply_problem(request, reply)
        if problem is not None:
            return problem
    return None


def hello_problem(message: object) -> str | None:
    """What is wrong with the agent's first message; None when it is a hello (or the agent's
    own refusal: ``{"hello": null, "error": ...}``)."""
    if not isinstance(message, dict):
        return f"{_shown(message)} where the agent's hello belongs"
    hello = message.get("hello")
    if hello is None and isinstance(message.get("error"), str):
        return None
    if not isinstance(hello, dict) or not _whole(hello.get("euid")) or \
            not _identity(hello.get("identity")):
        return f"a hello of the wrong shape: {_shown(message)}"
    return None
