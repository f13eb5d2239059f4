"""What JSON cannot carry, carried: bytes as ``{"b64": ...}`` and errors as ``{"error": ...,
"errno": ...}``, both ways."""

from __future__ import annotations

import base64

from .errors import OpError


def encode(value: object) -> object:
    """JSON for a reply: bytes as ``{"b64": ...}``, errors as ``{"error": ..., "errno": ...}``."""
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, OpError):
        return {"error": str(value), "errno": value.errno}
    if isinstance(value, dict):
        return {key: encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    return value


def decode(value: object) -> object:
    """The inverse of ``encode`` for requests (``{"b64": ...}`` -> bytes)."""
    if isinstance(value, dict):
        if set(value) == {"b64"}:
            return base64.b64decode(str(value["b64"]))
        return {key: decode(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode(item) for item in value]
    return value
