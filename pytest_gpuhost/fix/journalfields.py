"""The fields of a journal's records, each checked as it is read (``journal.read_journal``): a
field of the wrong type or a bad encoding is a JournalError naming ``file:line``, never a
guess at what the change was."""

from __future__ import annotations

import base64
from typing import Any

from ..host import HostIdentity


class JournalError(Exception):
    """A journal that cannot be rolled back as it is; the message names ``file:line``."""


def text_field(record: dict[str, Any], name: str, where: str, *, optional: bool = False) -> Any:
    value = record.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str):
        shown = "nothing" if name not in record else f"{type(value).__name__} {value!r}"[:60]
        raise JournalError(f"{where}: a change record without a usable {name!r}: expected a "
                           f"string, got {shown}")
    return value


def identity_field(record: dict[str, Any], where: str) -> HostIdentity | None:
    data = record.get("identity")
    if data is None:
        return None
    fields = ("root", "hostname", "machine_id", "boot_id")
    if not isinstance(data, dict) or not isinstance(data.get("root"), str) or any(
            not isinstance(data.get(name), str | None) for name in fields):
        raise JournalError(f"{where}: the journal header's identity must be a mapping of "
                           f"{', '.join(fields)} to strings, got {str(data)[:80]}")
    return HostIdentity(data["root"], data.get("hostname"), data.get("machine_id"),
                        data.get("boot_id"))


def read_back_field(record: dict[str, Any], where: str) -> bytes | None:
    encoded = record.get("read_back_base64")
    if encoded is None:
        return None
    try:
        return base64.b64decode(str(encoded), validate=True)
    except ValueError:
        raise JournalError(f"{where}: 'read_back_base64' is not base64") from None


def run_fields(header: dict[str, Any]) -> tuple[str | None, tuple[str, ...]]:
    """The header's run id and the containers whose host the journal's target was (a journal
    older than them: None and none; a rollback then pairs a container with its host's newest)."""
    run, containers = header.get("run"), header.get("containers")
    return (run if isinstance(run, str) else None,
            tuple(str(each) for each in containers) if isinstance(containers, list) else ())
