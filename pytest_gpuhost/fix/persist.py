"""--fix-persist: the files that make runtime tuning survive a reboot (and a GPU re-bind).

Built from the run's records, so only values that are right now are persisted, with the value
that was read back (a ``{min: X}`` sysctl that is already higher keeps its higher value). Each
file lives under the root, is written atomically through the fixer (journaled, undoable) and
carries a header naming the spec; an unchanged file is not rewritten.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from ..checks import CannotFix, Check, Evidence, Observation
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


def persistence_files(spec: str, source: str, results: Sequence[CheckResult]) -> dict[str, str]:
    """Path under the root -> content, for every kind the run has values of."""
    header = _header(spec, source)
    files: dict[str, str] = {}
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
        names = "|".join(states)
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


def persistence_checks(spec: str, source: str, results: Sequence[CheckResult]) -> list[Check]:
    """One ``persist`` check per file: it passes when the file already says the same."""
    return [Check("persist", path, expected_state(content),
                  EntryOptions(where=f"{source}:1", why="makes the runtime tuning survive a "
                                                        "reboot"),
                  FileContentProbe(path, content))
            for path, content in sorted(persistence_files(spec, source, results).items())]
