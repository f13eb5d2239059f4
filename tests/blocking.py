"""A fake ``modprobe`` that blocks until the test releases it: the
interrupt tests signal a run while its fix's command is running, and see what was left.

Every wait here is bounded by an event (a file appearing, a process ending) and a generous
limit after which the test fails saying what did not happen; nothing asserts on time."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_gpuhost.fix.journal import JOURNAL_DIR
from pytest_gpuhost.testing.fakehost import FakeHost

BLOCKING_MODPROBE = """#!/bin/sh
# Says it started (its pid, and a child left in its process group), then waits until the test
# releases it and only then loads the module: a modprobe still in the kernel's module init.
for name; do :; done
case " $* " in
  *" -r "*) grep -v "^$name " "$GPUHOST_ROOT/proc/modules" > "$GPUHOST_ROOT/m.tmp"
            cat "$GPUHOST_ROOT/m.tmp" > "$GPUHOST_ROOT/proc/modules"; exit 0;;
esac
(while [ ! -e "$GPUHOST_ROOT/release" ]; do sleep 0.01; done) &
echo $! > "$GPUHOST_ROOT/child.pid"
echo $$ > "$GPUHOST_ROOT/modprobe.tmp"
mv "$GPUHOST_ROOT/modprobe.tmp" "$GPUHOST_ROOT/modprobe.pid"
while [ ! -e "$GPUHOST_ROOT/release" ]; do sleep 0.01; done
echo "$name 16384 0 - Live 0x0000000000000000" >> "$GPUHOST_ROOT/proc/modules"
"""
SPEC = "version: 1\nmodules:\n  nvidia: loaded\n"
"""One check whose fix runs ``modprobe -- nvidia``."""
LIMIT_S = 120.0
"""How long an event may take before the test fails: far past any machine's load."""
SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT]
"""What stops a run: systemd or a scheduler, a closed terminal, Ctrl-C."""


def start_fix(pytester: pytest.Pytester, *args: str) -> subprocess.Popen[bytes]:
    """``pytest spec.yaml --fix ARGS`` in its own session (a signal reaches it alone)."""
    pytester.makefile(".yaml", spec=SPEC)
    argv = [sys.executable, "-m", "pytest", "spec.yaml", "--fix", "-p", "no:cacheprovider", *args]
    process: subprocess.Popen[bytes] = pytester.popen(argv, stdin=subprocess.DEVNULL,
                                                      start_new_session=True)
    return process


def journal_of(root: Path) -> Path:
    """The one journal a run left under ``root``."""
    [journal] = (root / JOURNAL_DIR).iterdir()
    return journal


def until(happened: Callable[[], bool], what: str, limit: float = LIMIT_S) -> None:
    """Return once ``happened()``; fail naming ``what`` if it has not after ``limit`` s."""
    deadline = time.monotonic() + limit
    while not happened():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {limit:g} s")
        time.sleep(0.01)


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for a reaper counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


class Blocked:
    """The blocking modprobe installed in a fake tree, and what it leaves there."""

    def __init__(self, fake: FakeHost) -> None:
        self.root = fake.root
        fake.file("usr/sbin/modprobe", BLOCKING_MODPROBE, mode=0o755)

    def started(self) -> int:
        """The modprobe's pid, once it runs (waited for)."""
        pid_file = self.root / "modprobe.pid"
        until(pid_file.exists, "the fix's modprobe starting")
        return int(pid_file.read_text())

    def child(self) -> int:
        return int((self.root / "child.pid").read_text())

    def release(self) -> None:
        (self.root / "release").touch()

    def loaded(self) -> bool:
        return any(line.split(" ", 1)[0] == "nvidia"
                   for line in (self.root / "proc/modules").read_text().splitlines())

    def cleanup(self) -> None:
        """Whatever a failed test left running ends here."""
        self.release()
        for name in ("modprobe.pid", "child.pid"):
            path = self.root / name
            if path.exists():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(path.read_text()), signal.SIGKILL)
