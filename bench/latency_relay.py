"""An ssh ProxyCommand that adds latency: relays standard input and output to HOST:PORT, each
byte delivered DELAY seconds after it arrived, in each direction (a round trip gains 2 x DELAY).

    ProxyCommand python3 bench/latency_relay.py %h %p 0.025

A line with a delay, not a slow line: every chunk is held until its own due time, so chunks in
flight overlap as they would on a long cable, and the bandwidth is not limited. Stdlib only; no
root, no network namespace, no netem. Used by bench/ssh.py.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable

CHUNK = 1 << 16


def pipe(read: Callable[[], bytes], write: Callable[[bytes], None], end: Callable[[], None],
         delay: float) -> list[threading.Thread]:
    """Two threads: one reads and stamps each chunk with its due time, one delivers it then."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def receive() -> None:
        while True:
            try:
                data = read()
            except OSError:
                data = b""
            held.put((time.monotonic() + delay, data))
            if not data:
                return

    def deliver() -> None:
        while True:
            due, data = held.get()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                end()
                return
            try:
                write(data)
            except OSError:
                end()
                return

    return [threading.Thread(target=receive, daemon=True),
            threading.Thread(target=deliver, daemon=True)]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: latency_relay.py HOST PORT DELAY_SECONDS", file=sys.stderr)
        return 2
    host, port, delay = argv[0], int(argv[1]), float(argv[2])
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def to_stdout(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]

    def end_up() -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)

    up = pipe(lambda: os.read(0, CHUNK), sock.sendall, end_up, delay)
    down = pipe(lambda: sock.recv(CHUNK), to_stdout, lambda: os.close(1), delay)
    for thread in up + down:
        thread.start()
    down[1].join()  # the server's side ended and everything it sent was delivered
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
