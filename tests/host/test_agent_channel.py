"""The agent's channel on its own (``host/agent/channel.py``, no root, no serving loop): each
message a length line and that many bytes of JSON; while a command runs, a cancel is taken off
the input and anything else waits its turn."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Iterator

import pytest

from pytest_gpuhost.host.agent.channel import Channel


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read, write = os.pipe()
    yield read, write
    for fd in (read, write):
        with contextlib.suppress(OSError):  # a test closed it already
            os.close(fd)


def test_a_message_is_a_length_line_and_its_json() -> None:
    out = io.BytesIO()
    Channel(-1, out).send({"value": [1, "x"]})
    assert out.getvalue() == b'17\n{"value":[1,"x"]}'


def test_messages_come_whole_however_the_bytes_arrive(pipe: tuple[int, int]) -> None:
    read, write = pipe
    channel = Channel(read, io.BytesIO())
    os.write(write, b'2\n[]15\n[{"op":"re')
    assert channel.receive() == []
    os.write(write, b'ad"}]')
    os.close(write)
    assert channel.receive() == [{"op": "read"}]
    assert channel.receive() is None  # the connection closed


def test_a_message_that_comes_while_a_command_runs_waits_its_turn(
        pipe: tuple[int, int]) -> None:
    read, write = pipe
    channel = Channel(read, io.BytesIO())
    os.write(write, b"2\n[]")
    assert channel.stop() is None  # a batch while a command runs: not taken
    os.close(write)
    assert channel.receive() == []
    assert channel.receive() is None


def test_a_cancel_or_the_connection_closing_stops_a_command(pipe: tuple[int, int]) -> None:
    read, write = pipe
    channel = Channel(read, io.BytesIO())
    os.write(write, b'15\n{"cancel":"^C"}')
    assert channel.stop() == "the controller cancelled it: ^C"
    os.close(write)
    assert channel.stop() == "the connection to the controller closed"
    assert channel.receive() is None  # the cancel was taken off the input


def test_a_stream_that_is_not_the_protocol_is_refused(pipe: tuple[int, int]) -> None:
    read, write = pipe
    os.write(write, b"Welcome to pve1, have a nice day\n")
    with pytest.raises(ValueError):
        Channel(read, io.BytesIO()).receive()
