"""--fix-persist: the files that make runtime tuning survive a reboot (and a GPU re-bind).

Built from the run's records, so only values that are right now are persisted, with the value
that was read back (a ``{min: X}`` sysctl that is already higher keeps its higher value). Each
file lives under the root, is written atomically through the fixer (journaled, undoable) and
carries a header naming the spec; an unchanged file is not rewritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..checks import CannotFix, Check, Evidence, Observation, PersistLine
from ..checks.bootconfig import (
    GRUB,
    dropin_path,
    dropin_text,
    parse_boot_config,
    read_all,
)
from ..checks.cpufreq import persistence as cpufreq_lines
from ..checks.memory import persistence as memory_lines
from ..checks.pcie_path import acs_persistence
from ..host import Host
from ..linux.pciconfig import SIZES, DeviceControl
from ..result import CheckResult, Outcome
from ..spec import EntryOptions
from ..spec.matchers import Choice, Exact, normalize_ws
from .changes import Plan, ReplaceFile

CURRENT, ABSENT, DIFFERS = "current", "absent", "differs"
_RIGHT_NOW = (Outcome.PASSED, Outcome.FIXED)


def _header(spec: str, source: str) -> str:
    return (f"# Written by pytest-gpuhost --fix-persist from spec {spec} ({source}).\n"
            "# It makes the runtime tuning stick across reboots; edit the spec and run "
            "--fix-persist again\n# rather than this file.\n")


def _right_now(results: Sequence[CheckResult], kind: str) -> list[CheckResult]:
    """Records whose value is right now, or (in a dry run) would be after the planned fix."""
    return [r for r in results if r.kind == kind and r.observed and (
        r.outcome in _RIGHT_NOW or r.outcome is Outcome.WOULD_FIX)]


def _value(record: CheckResult) -> str:
    """The value to persist: the one read back, or the one a dry run's plan would write."""
    if record.outcome is not Outcome.WOULD_FIX:
        return record.observed or ""
    new = str(record.plan[0]["new"]) if record.plan else ""
    if record.kind == "pcie.max_read_request":
        return str(DeviceControl(0, int.from_bytes(bytes.fromhex(new), "little"))
                   .max_read_request)
    return new.strip() if record.kind == "sysctl" else record.expected


KIND_LINES: tuple[Callable[[Sequence[CheckResult]], list[PersistLine]], ...] = (
    cpufreq_lines, memory_lines, acs_persistence)
"""The kinds that supply their own persistence lines (a later refactor moves every kind here)."""


def kind_files(spec: str, header: str, results: Sequence[CheckResult],
               read: Callable[[str], str | None], boot_texts: dict[str, str | None]
               ) -> dict[str, str]:
    """The files of the kinds' own lines: ``tmpfiles`` lines in etc/tmpfiles.d (applied at
    every boot), ``cmdline`` parameters merged into our grub.d drop-in (which boot-time fixes
    of this run may have written already; only where the host boots with GRUB)."""
    lines = [line for supply in KIND_LINES for line in supply(results)]
    files: dict[str, str] = {}
    tmpfiles = [line.text for line in lines if line.target == "tmpfiles"]
    if tmpfiles:
        files[f"etc/tmpfiles.d/gpuhost-{spec}.conf"] = header + "\n".join(tmpfiles) + "\n"
    words = [line.text for line in lines if line.target == "cmdline"]
    if words and parse_boot_config(boot_texts).loader == GRUB:
        path = dropin_path(spec)
        files[path] = dropin_text(read(path), spec, words)
    return files


def persistence_files(spec: str, source: str, results: Sequence[CheckResult],
                      read: Callable[[str], str | None] = lambda path: None,
                      boot_texts: dict[str, str | None] | None = None) -> dict[str, str]:
    """Path under the root -> content, for every kind the run has values of. ``read`` gives
    a file's current text (for the drop-in shared with boot-time fixes), ``boot_texts`` the
    boot configuration as ``bootconfig`` reads it."""
    header = _header(spec, source)
    files: dict[str, str] = kind_files(spec, header, results, read, boot_texts or {})
    sysctls = _right_now(results, "sysctl")
    if sysctls:
        lines = [f"{r.key} = {normalize_ws(_value(r))}" for r in sysctls]
        files[f"etc/sysctl.d/90-gpuhost-{spec}.conf"] = header + "\n".join(lines) + "\n"
    modules = _right_now(results, "module")
    loaded = [r.key for r in modules if r.expected == "loaded" and _value(r) == "loaded"]
    if loaded:
        files[f"etc/modules-load.d/gpuhost-{spec}.conf"] = header + "\n".join(
            str(name) for name in loaded) + "\n"
    absent = [r.key for r in modules if r.expected == "absent"]
    if absent:
        files[f"etc/modprobe.d/gpuhost-{spec}.conf"] = header + "".join(
            f"blacklist {name}\ninstall {name} /bin/false\n" for name in absent)
    rules = _udev_rules(results)
    if rules:
        files[f"etc/udev/rules.d/90-gpuhost-{spec}.rules"] = header + rules
    return files


def _udev_rules(results: Sequence[CheckResult]) -> str:
    """MaxReadReq per GPU when its driver binds, and C-states per CPU when it comes online."""
    lines = []
    for record in _right_now(results, "pcie.max_read_request"):
        code = SIZES.index(int(_value(record))) << 12
        lines.append(f'ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="{record.key}", '
                     f'RUN+="/usr/bin/setpci -s $kernel CAP_EXP+8.w={code:04x}:7000"')
    states = [str(r.key) for r in _right_now(results, "cpuidle")]
    if states:
        names = "|".join(state.replace(" ", "\\ ") for state in states)  # Shared\ Cede
        lines.append(
            'ACTION=="add|online", SUBSYSTEM=="cpu", KERNEL=="cpu[0-9]*", '
            'RUN+="/bin/sh -c \'for d in /sys/devices/system/cpu/%k/cpuidle/state[0-9]*; do '
            f'case $$(cat $$d/name) in {names}) echo 1 > $$d/disable;; esac; done\'"')
    return "\n".join(lines) + "\n" if lines else ""


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FileContentProbe:
    """Whether a file holds exactly ``content``; the fix replaces it atomically."""

    path: str
    content: str | None
    """None: the file should not exist (a rollback of a file that persistence created)."""
    only_if: str | None = None
    """For a rollback: change the file only while it still holds what the fix wrote."""
    fixable = True

    def _current(self, host: Host) -> str | None:
        return host.read_text(self.path) if host.exists(self.path) else None

    def observe(self, host: Host) -> Observation:
        current = self._current(host)
        if current is None:
            return Observation(ABSENT, (Evidence(self.path, "absent"),))
        state = CURRENT if current == self.content else DIFFERS
        return Observation(state, (Evidence(self.path, f"{_digest(current)}, "
                                                       f"{len(current.splitlines())} lines"),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if self.only_if is not None and self._current(host) != self.only_if:
            raise CannotFix(f"{self.path} was edited since the fix: left as it is")
        if self.content is None:
            if not host.exists(self.path):
                raise CannotFix(f"{self.path} is already absent")
            return Plan(f"remove {self.path}",
                        (ReplaceFile(self.path, self._current(host), None),))
        verb = "create" if observed.value == ABSENT else "update"
        return Plan(f"{verb} {self.path}",
                    (ReplaceFile(self.path, self._current(host), self.content),))


def expected_state(content: str | None) -> Exact:
    return Exact(CURRENT if content is not None else ABSENT, Choice((CURRENT, ABSENT)))


def persistence_checks(spec: str, source: str, results: Sequence[CheckResult],
                       host: Host | None = None) -> list[Check]:
    """One ``persist`` check per file: it passes when the file already says the same."""
    def read(path: str) -> str | None:
        return host.read_text(path) if host is not None and host.exists(path) else None

    boot = read_all(host) if host is not None else {}
    files = persistence_files(spec, source, results, read, boot)
    return [Check("persist", path, expected_state(content),
                  EntryOptions(where=f"{source}:1", why="makes the runtime tuning survive a "
                                                        "reboot"),
                  FileContentProbe(path, content))
            for path, content in sorted(files.items())]
