"""The agent's end of its connection: a length line, then that many bytes of JSON, each way; and
what has arrived while a command runs (the connection closed, a cancel)."""

from __future__ import annotations

import json
import os

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from typing import Any


class Channel:
    """The agent's end of its connection: a length line, then that many bytes of JSON, each
    way. Input is read through a buffer of its own, so that while a command runs the agent
    still sees the connection close or a ``{"cancel": ...}`` arrive (``stop``)."""

    HEADER_LIMIT = 32

    def __init__(self, source: int, out: Any) -> None:
        self.source = source
        self.out = out
        self.buffer = bytearray()
        self.closed = False

    def fileno(self) -> int:
        return self.source

    def send(self, message: object) -> None:
        data = json.dumps(message, separators=(",", ":")).encode()
        self.out.write(b"%d\n" % len(data) + data)
        self.out.flush()

    def _fill(self) -> None:
        chunk = os.read(self.source, 1 << 20)
        if chunk:
            self.buffer += chunk
        else:
            self.closed = True

    def _head(self, *, take: bool) -> tuple[bool, object]:
        """(True, the message) when a whole one is at the head of the buffer (taken off it
        with ``take``); ValueError for a stream that is not this protocol."""
        newline = self.buffer.find(b"\n")
        if newline < 0:
            if len(self.buffer) > self.HEADER_LIMIT:
                raise ValueError("not a length line")
            return False, None
        size = int(self.buffer[:newline])
        end = newline + 1 + size
        if size < 0 or len(self.buffer) < end:
            return False, None
        message = json.loads(bytes(self.buffer[newline + 1:end]))
        if take:
            del self.buffer[:end]
        return True, message

    def receive(self) -> object | None:
        """The next message; None once the connection has closed."""
        while True:
            whole, message = self._head(take=True)
            if whole:
                return message
            if self.closed:
                return None
            self._fill()

    def stop(self) -> str | None:
        """Why a running command must end, from what has arrived (called when input is
        ready): the connection closed (the controller or its ssh is gone), or the controller
        asked to cancel; None: go on (a message that is not a cancel waits its turn)."""
        if not self.closed:
            self._fill()
        if self.closed:
            return "the connection to the controller closed"
        whole, message = self._head(take=False)
        if whole and isinstance(message, dict) and "cancel" in message:
            self._head(take=True)
            return f"the controller cancelled it: {message['cancel']}"
        return None
