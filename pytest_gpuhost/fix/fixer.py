"""The fixer: the only code that carries out planned changes.

Each change is written to the journal before it is made, made under the root's lock, and, when
the host refuses it, explained in words an operator can act on: what was seen (the errno's name
and text) and what it means (read-only /proc/sys in a container, kernel lockdown, not root, an
immutable file). A command that times out, or a change whose remote target is lost before it
answers, leaves its change ``unknown``: journaled as neither applied nor failed, so a rollback
still offers to undo it.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import msgspec

from ..checks import NAMESPACE
from ..checks.changes import Change, Command, NvmlSetting, Plan, ReplaceFile, WriteBytes, WriteText
from ..checks.conditions import in_container
from ..checks.sysctl import sysctl_scope
from ..gpu.nvml import NvmlPermissionError, NvmlSource, NvmlUnavailable
from ..host import COMMAND_TIMEOUT_S, CommandTimeout, Host, HostError, Read, TargetLost
from ..result import INTERRUPTED_FIX
from .journal import Journal
from .locking import RootLock

LOCKDOWN = "sys/kernel/security/lockdown"


class FixError(Exception):
    """A change the host refused; the message carries the reason, the errno or the tool's
    stderr, and what to do."""

    def __init__(self, message: str, action: str | None = None, *, unknown: bool = False
                 ) -> None:
        super().__init__(message)
        self.action = action
        self.unknown = unknown
        """The host may or may not have made the change (a command that timed out)."""


class Applied(msgspec.Struct, frozen=True):
    """What a fix did, for the record: the action and anything the action printed."""

    action: str
    output: str = ""


def _lockdown_mode(host: Host) -> str | None:
    """The active kernel lockdown mode (``integrity``, ``confidentiality``) or None."""
    if not host.exists(LOCKDOWN):
        return None
    text = host.read_text(LOCKDOWN)
    start, end = text.find("["), text.find("]")
    mode = text[start + 1:end] if 0 <= start < end else "none"
    return None if mode == "none" else mode


def errno_text(exc: HostError) -> str:
    """``EPERM (Operation not permitted)``: the errno as the kernel named it."""
    if exc.errno is None:
        return "no errno"
    return f"{errno.errorcode.get(exc.errno, str(exc.errno))} ({os.strerror(exc.errno)})"


def explain(host: Host, change: Change, exc: HostError) -> str:
    """Why the host refused a change (the errno seen, by name), and what to do about it."""
    path = getattr(change, "path", "")
    seen = f"{exc} [{errno.errorcode.get(exc.errno, '?')}]" if exc.errno else str(exc)
    if exc.errno == errno.EROFS and path.startswith("proc/sys/"):
        key = path.removeprefix("proc/sys/")
        if sysctl_scope(key) == NAMESPACE:
            shown = key.replace("/", ".")
            return (f"read-only here: {shown} is this container's own (its IPC, UTS or network "
                    "namespace), not its host's: set it in the container's configuration "
                    f"(LXC: lxc.sysctl.{shown}; Docker: --sysctl; Kubernetes: "
                    f"securityContext.sysctls), or mount its /proc/sys writable ({seen})")
        if in_container(host):
            return (f"read-only in this container: fix it on the host "
                    f"(--gpuhost-target=ssh://HOST) ({seen}); the kernel's sysctls are the "
                    "host's, and only the namespaced ones (net.*, IPC, UTS) a container's")
        return (f"read-only: this sysctl is not namespaced in a container ({seen}); set it on "
                "the host itself, or as a namespaced sysctl in the pod or container spec")
    if exc.errno == errno.EROFS:
        return f"read-only file system: {seen}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        if not host.privileged():
            return f"permission denied: --fix needs root; run it with sudo ({seen})"
        mode = _lockdown_mode(host) if isinstance(change, WriteBytes) else None
        if mode is not None:
            return (f"kernel lockdown ({mode}) refuses PCI config-space writes from user space "
                    f"({seen}); set MaxReadReq in the firmware, or boot without lockdown")
        if exc.errno == errno.EPERM:
            return (f"refused with {errno_text(exc)} even as root ({exc}): an immutable or "
                    "append-only file (chattr +i or +a: see lsattr), a capability this process "
                    "lacks (a container without CAP_SYS_ADMIN or CAP_NET_ADMIN), or a security "
                    "policy (SELinux, AppArmor, seccomp)")
        return (f"refused with {errno_text(exc)} even as root ({exc}): the file is read-only for "
                "everyone (a read-only sysctl or sysfs attribute: mode bits bind root there), or "
                "a security module (SELinux, AppArmor) denies it")
    if exc.errno == errno.EINVAL and path.startswith("proc/sys/"):
        return f"the kernel rejected the value as invalid for this sysctl ({seen})"
    return seen


class Fixer:
    """Carries out changes for one process of a --fix run.

    ``run_lock`` is taken at the first change and held to the end of the run (two runs never
    interleave); ``apply_lock`` is taken around each fix (the xdist workers of one run, whose
    controller holds the run lock, never interleave either).
    """

    def __init__(self, host: Host, journal: Journal | None, *, run_lock: RootLock | None,
                 apply_lock: RootLock | None, lock_timeout: float,
                 nvml: NvmlSource | None = None,
                 command_timeout: float = COMMAND_TIMEOUT_S,
                 held: Sequence[RootLock] = ()) -> None:
        self.host = host
        self.held = tuple(held)
        """Locks taken before the run judged anything (a rollback's apply lock), released at
        ``close`` with the run lock."""
        self.command_timeout = command_timeout
        """How long a command (modprobe) may run before its process group is killed."""
        self.nvml = nvml
        self.journal = journal
        self.run_lock = run_lock
        self.apply_lock = apply_lock
        self.lock_timeout = lock_timeout
        self.interrupted: str | None = None
        """What the change an interrupt cut short is journaled as (``_interrupted``)."""

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the locks while a check re-observes, plans and applies (raises LockUnavailable)."""
        if self.run_lock is not None:
            self.run_lock.acquire(self.lock_timeout)
        if self.apply_lock is None:
            yield
            return
        self.apply_lock.acquire(self.lock_timeout)
        try:
            yield
        finally:
            self.apply_lock.release()

    def apply(self, check: str, kind: str, key: str | None, plan: Plan) -> Applied:
        """Journal every change (durably, in one write), then make each in order; stop at the
        first one refused, and journal those after it as not made. What each write left is
        read back once all are made (one batch: one round trip to a remote target), and the
        outcome lines go in one write after them."""
        entries: list[str | None] = [None] * len(plan.changes)
        if self.journal is not None and plan.changes:
            try:
                entries = list(self.journal.record_all(check, kind, key, plan.changes))
            except (OSError, HostError) as exc:
                reason = getattr(exc, "strerror", None) or exc
                raise FixError(f"cannot write the journal {self.journal.path}: {reason}; the "
                               "change was not made", action=plan.changes[0].describe()) from exc
        outputs = []
        made: list[tuple[str | None, Change]] = []
        for index, (change, entry) in enumerate(zip(plan.changes, entries, strict=True)):
            try:
                output = self._execute(change)
            except FixError as exc:
                self._journal_outcomes([
                    *self._made(made),
                    (entry, str(exc), exc.unknown, None),
                    *((later, f"not made: {change.describe()} before it was refused ({exc})",
                       False, None) for later in entries[index + 1:])])
                raise
            except BaseException as exc:  # an interrupt: Ctrl-C, SIGTERM or SIGHUP
                self._interrupted(made, entry, change, entries[index + 1:], exc)
                raise
            made.append((entry, change))
            if output:
                outputs.append(output)
        self._journal_outcomes(self._made(made))
        return Applied(plan.summary, "\n".join(outputs))

    def _interrupted(self, made: Sequence[tuple[str | None, Change]], entry: str | None,
                     change: Change, later: Sequence[str | None], exc: BaseException) -> None:
        """The run was interrupted while ``change`` was being made: its command's process group
        was killed (a remote one by its agent), but what it did first is unknown, so it is
        journaled ``unknown`` (and the journal left open); the changes made before it are
        ``applied`` without a read-back (a rollback then restores only over the value the
        fix wrote), those after it not made. Lines that cannot be written stay pending,
        which a rollback treats the same."""
        why = str(exc) or type(exc).__name__
        self.interrupted = (f"{INTERRUPTED_FIX}{why}) during {change.describe()}; what it did "
                            "is unknown: see what the host holds now, or undo it with "
                            "--gpuhost-rollback")
        self._journal_outcomes([
            *((done, None, False, None) for done, _ in made),
            (entry, self.interrupted, True, None),
            *((rest, f"not made: the run was interrupted ({why}) before it", False, None)
              for rest in later)])
        with contextlib.suppress(OSError, HostError):
            if self.journal is not None:
                self.journal.sync()

    def _made(self, made: Sequence[tuple[str | None, Change]]
              ) -> list[tuple[str | None, str | None, bool, bytes | None]]:
        """The outcome of each change made: applied, with what its write left (read back)."""
        if self.journal is None:
            return []
        backs = self._read_backs([change for _, change in made])
        return [(entry, None, False, back) for (entry, _), back in zip(made, backs, strict=True)]

    def _journal_outcomes(self, outcomes: Sequence[tuple[str | None, str | None, bool,
                                                         bytes | None]]) -> None:
        """``(entry, error, unknown, read_back)`` lines in one write. Lines that cannot be
        written leave their entries pending: rollback treats a pending change as possibly
        made, so nothing is lost."""
        if self.journal is None:
            return
        with contextlib.suppress(OSError, HostError):
            self.journal.outcomes([(entry, error, unknown, back)
                                   for entry, error, unknown, back in outcomes
                                   if entry is not None])

    def _read_backs(self, changes: Sequence[Change]) -> list[bytes | None]:
        """What each write left (a kernel may clamp or round it), for the journal: a rollback
        then knows that value as the fix's own. None where there is nothing to read. Read in
        one batch after the fix's writes; a fix that writes one file twice reads it once."""
        paths = list(dict.fromkeys(c.path for c in changes
                                   if isinstance(c, (WriteText, WriteBytes))))
        try:
            replies = dict(zip(paths, self.host.batch([Read(path) for path in paths]),
                               strict=True)) if paths else {}
        except HostError:  # a target lost after its writes: nothing read back, none lost
            replies = {}
        backs: list[bytes | None] = []
        for change in changes:
            reply = replies.get(change.path) if isinstance(change, (WriteText, WriteBytes)) \
                else None
            if reply is None or reply.error is not None:
                backs.append(None)
            elif isinstance(change, WriteBytes):
                size = len(bytes.fromhex(change.new))
                backs.append(reply.data()[change.offset:change.offset + size])
            else:
                backs.append(reply.data())
        return backs

    def _execute(self, change: Change) -> str:
        try:
            if isinstance(change, WriteText):
                # Bytes that are not UTF-8 travel as surrogate escapes (Host.write_text).
                self.host.write_text(change.path,
                                     change.new_bytes.decode("utf-8", "surrogateescape"))
            elif isinstance(change, WriteBytes):
                self._still_as_planned(change)
                self.host.write_bytes(change.path, bytes.fromhex(change.new), change.offset)
            elif isinstance(change, NvmlSetting):
                self._nvml(change)
            elif isinstance(change, ReplaceFile):
                if change.new is None:
                    self.host.remove(change.path)
                else:
                    self.host.replace_file(change.path, change.new_content or "")
            else:
                return self._run(change)
        except CommandTimeout as exc:
            raise FixError(f"the state is unknown: {exc}; journaled as unknown: see what the "
                           "host holds now, or undo it with --gpuhost-rollback",
                           action=change.describe(), unknown=True) from exc
        except TargetLost as exc:  # the change went out, its answer never came back
            raise FixError(f"the state is unknown: {exc}, while the change was being made; "
                           "journaled before it was made: see what the host holds now, or undo "
                           "it with --gpuhost-rollback", action=change.describe(),
                           unknown=True) from exc
        except HostError as exc:
            raise FixError(explain(self.host, change, exc), action=change.describe()) from exc
        return ""

    def _still_as_planned(self, change: WriteBytes) -> None:
        """Refuse a config-space write whose bytes changed since the plan read them.

        The write is a read-modify-write of a register: every bit of ``new`` but the ones the
        fix owns is what the plan read. A driver or another tool that changed the register
        since (between the plan's read and this write, or in the time a remote target took to
        answer) would have its change silently undone, so the register is read again, live,
        right before the write, and nothing is written unless it still holds ``old``."""
        self.host.invalidate()
        size = len(bytes.fromhex(change.old))
        now = self.host.read_bytes(change.path)[change.offset:change.offset + size]
        if now.hex() != change.old:
            shown = now.hex() or "nothing (the file is shorter)"
            raise FixError(f"{change.path} @0x{change.offset:02x} holds {shown} now, not the "
                           f"{change.old} the fix was planned from: something else (a driver, "
                           "another tool) changed it since; nothing was written: run the fix "
                           "again to plan it from what the register holds now",
                           action=change.describe())

    def _nvml(self, change: NvmlSetting) -> None:
        if self.nvml is None:
            raise FixError("no NVML to make the change through", action=change.describe())
        try:
            nvml = self.nvml.get()
            if change.setting == "power_limit":
                nvml.set_power_limit(change.address, round(float(change.new) * 1000))
            elif change.setting == "ecc":
                nvml.set_ecc_mode(change.address, change.new == "enabled")
            else:
                nvml.set_persistence_mode(change.address, change.new == "enabled")
        except (NvmlPermissionError, NvmlUnavailable) as exc:
            raise FixError(str(exc), action=change.describe()) from exc

    def _run(self, change: Command) -> str:
        result = self.host.run(list(change.argv), timeout=self.command_timeout)
        output = (result.stderr.strip() + "\n" + result.stdout.strip()).strip()
        if result.returncode != 0:
            raise FixError(f"{result.shown} exited {result.returncode}: {output or 'no output'}",
                           action=result.shown)
        return output

    def close(self) -> None:
        """The end of the run: the last fix's outcome lines made durable, the lock released."""
        try:
            if self.journal is not None:
                self.journal.sync()
        except HostError:  # the lines are written; a host gone now only leaves them unsynced
            pass
        finally:
            for lock in self.held:
                lock.release()
            if self.run_lock is not None:
                self.run_lock.release()
