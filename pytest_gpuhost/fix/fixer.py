"""The fixer: the only code that carries out planned changes.

Each change is written to the journal before it is made, made under the root's lock, and, when
the host refuses it, explained in words an operator can act on (read-only /proc/sys in a
container, kernel lockdown, not root).
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from ..gpu.nvml import NvmlPermissionError, NvmlSource, NvmlUnavailable
from ..host import Host, HostError
from .changes import Change, Command, NvmlSetting, Plan, ReplaceFile, WriteBytes, WriteText
from .journal import Journal
from .locking import RootLock

LOCKDOWN = "sys/kernel/security/lockdown"


class FixError(Exception):
    """A change the host refused; the message carries the reason, the errno or the tool's
    stderr, and what to do."""

    def __init__(self, message: str, action: str | None = None) -> None:
        super().__init__(message)
        self.action = action


@dataclass(frozen=True)
class Applied:
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


def explain(host: Host, change: Change, exc: HostError) -> str:
    """Why the host refused a change, and what to do about it."""
    path = getattr(change, "path", "")
    if exc.errno == errno.EROFS and path.startswith("proc/sys/"):
        return (f"read-only: this sysctl is not namespaced in a container ({exc}); set it on the "
                "host itself, or as a namespaced sysctl in the pod or container spec")
    if exc.errno == errno.EROFS:
        return f"read-only file system: {exc}"
    if exc.errno in (errno.EACCES, errno.EPERM):
        if not host.privileged():
            return f"permission denied: --fix needs root; run it with sudo ({exc})"
        mode = _lockdown_mode(host) if isinstance(change, WriteBytes) else None
        if mode is not None:
            return (f"kernel lockdown ({mode}) refuses PCI config-space writes from user space "
                    f"({exc}); set MaxReadReq in the firmware, or boot without lockdown")
        return (f"refused even as root ({exc}): a container without CAP_SYS_ADMIN, or a security "
                "module (SELinux, AppArmor) denies it")
    if exc.errno == errno.EINVAL and path.startswith("proc/sys/"):
        return f"the kernel rejected the value as invalid for this sysctl ({exc})"
    return str(exc)


class Fixer:
    """Carries out changes for one process of a --fix run.

    ``run_lock`` is taken at the first change and held to the end of the run (two runs never
    interleave); ``apply_lock`` is taken around each fix (the xdist workers of one run, whose
    controller holds the run lock, never interleave either).
    """

    def __init__(self, host: Host, journal: Journal | None, *, run_lock: RootLock | None,
                 apply_lock: RootLock | None, lock_timeout: float,
                 nvml: NvmlSource | None = None) -> None:
        self.host = host
        self.nvml = nvml
        self.journal = journal
        self.run_lock = run_lock
        self.apply_lock = apply_lock
        self.lock_timeout = lock_timeout

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
        """Journal, then make, each change in order; stop at the first one refused."""
        outputs = []
        for change in plan.changes:
            try:
                entry = self.journal.record(check, kind, key, change) if self.journal else None
            except OSError as exc:
                where = self.journal.path if self.journal else "?"
                raise FixError(f"cannot write the journal {where}: {exc.strerror or exc}; the "
                               "change was not made", action=change.describe()) from exc
            try:
                output = self._execute(change)
            except FixError as exc:
                if self.journal and entry:
                    self._journal_outcome(entry, str(exc))
                raise
            if self.journal and entry:
                self._journal_outcome(entry, None)
            if output:
                outputs.append(output)
        return Applied(plan.summary, "\n".join(outputs))

    def _journal_outcome(self, entry: str, error: str | None) -> None:
        """An outcome line that cannot be written leaves the entry pending: rollback treats a
        pending change as possibly made, so nothing is lost."""
        assert self.journal is not None
        with contextlib.suppress(OSError):
            self.journal.outcome(entry, error)

    def _execute(self, change: Change) -> str:
        try:
            if isinstance(change, WriteText):
                self.host.write_text(change.path, change.new)
            elif isinstance(change, WriteBytes):
                self.host.write_bytes(change.path, bytes.fromhex(change.new), change.offset)
            elif isinstance(change, NvmlSetting):
                self._nvml(change)
            elif isinstance(change, ReplaceFile):
                if change.new is None:
                    self.host.remove(change.path)
                else:
                    self.host.replace_file(change.path, change.new)
            else:
                return self._run(change)
        except HostError as exc:
            raise FixError(explain(self.host, change, exc), action=change.describe()) from exc
        return ""

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
        result = self.host.run(list(change.argv))
        output = (result.stderr.strip() + "\n" + result.stdout.strip()).strip()
        if result.returncode != 0:
            raise FixError(f"{result.shown} exited {result.returncode}: {output or 'no output'}",
                           action=result.shown)
        return output

    def close(self) -> None:
        if self.run_lock is not None:
            self.run_lock.release()
