"""The agent's serving loop on a target: its hello, then each batch on stdin answered on stdout
until stdin closes; SIGTERM and SIGHUP end it as its input closing does."""

from __future__ import annotations

import os
import signal
import sys

from .channel import Channel
from .operations import batch
from .root import Root
from .wire import decode, encode

PROTOCOL = 1
AGENT_DIGEST = ""
"""The SHA-256 of the joined source this agent was sent as (``host/upload.py`` fills it in
when it joins the modules; empty where the modules run in-process): its hello says it."""


class Ended(BaseException):
    """SIGTERM or SIGHUP to the agent: raised where it is, as SIGINT raises KeyboardInterrupt,
    so a running command's group is killed before the agent exits (and lets its locks go)."""


def _ended(signum: int, frame: object) -> None:
    raise Ended(signal.Signals(signum).name)


def serve(root_path: str) -> int:
    """Answer batches on stdin/stdout until stdin closes. The first message says who and
    where this is. SIGTERM and SIGHUP end the agent as its input closing does: a command it
    runs is killed (its whole group) first."""
    channel = Channel(sys.stdin.fileno(), sys.stdout.buffer)
    try:
        root = Root(root_path)
    except OSError as exc:
        channel.send({"hello": None, "error": f"the host root {root_path} cannot be opened: "
                                              f"{exc.strerror}", "errno": exc.errno})
        return 1
    root.watch = channel
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _ended)
    try:
        channel.send({"hello": {"protocol": PROTOCOL, "python": list(sys.version_info[:3]),
                                "euid": os.geteuid(), "identity": root.identity(),
                                "agent": AGENT_DIGEST}})
        return _answer(root, channel)
    except (Ended, KeyboardInterrupt, OSError, ValueError):  # told to end, the connection
        # gone, or a stream that is not this protocol
        return 1


def _answer(root: Root, channel: Channel) -> int:
    while True:
        message = channel.receive()
        if message is None:
            return 0
        if isinstance(message, dict) and "cancel" in message:
            continue  # for a command that had ended before the cancel came
        requests = decode(message)
        if not isinstance(requests, list):
            channel.send({"error": "not a batch of requests"})
            continue
        channel.send(encode(batch(root, requests)))


USAGE = """usage: python -m pytest_gpuhost.host.agent.serving [ROOT]

pytest-gpuhost's agent: answers batches of requests (JSON) on stdin, carried out inside ROOT
(default /), until stdin closes. A run starts it on each target over ssh or lxc-attach; it is
not run by hand.
"""


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):  # a root is a path: never either word
        sys.stdout.write(USAGE)
        sys.exit(0)
    sys.exit(serve(sys.argv[1] if len(sys.argv) > 1 else "/"))
