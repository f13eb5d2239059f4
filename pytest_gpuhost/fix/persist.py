"""--fix-persist: the files that make runtime tuning survive a reboot (and a GPU re-bind).

Built from the run's records, so only values that are right now are persisted, with the value
that was read back (a ``{min: X}`` sysctl that is already higher keeps its higher value). Each
file lives under the root, is written atomically through the fixer (journaled, undoable) and
carries a header naming the spec; an unchanged file is not rewritten.

Whatever goes into a file is checked first, because a line break in it would be a setting or a
rule of its own (``kernel.core_pattern = |sh``) and a quote or ``$`` in a udev rule is shell run
as root: the spec's path in the header is escaped; the spec's name (in each file name), sysctl
keys, module names, GPU addresses and C-state names must be plain tokens, and a sysctl value may
not hold a line break or another control character. A file with anything else is not written:
its ``persist`` check fails, naming what was refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..checks import CannotFix, Check, Evidence, NotApplicable, Observation, PersistLine
from ..checks.bootconfig import GRUB, dropin_path, dropin_text, parse_boot_config, read_all
from ..checks.changes import Plan, ReplaceFile
from ..checks.modules import module_name_problem
from ..checks.sysctl import sysctl_path
from ..host import COMMAND_DIRS, FileInfo, Host, Stat
from ..linux.pciaddr import normalize_address
from ..linux.pciconfig import SIZES, DeviceControl
from ..result import CheckResult, Outcome
from ..spec import EntryOptions
from ..spec.matchers import Choice, Exact, normalize_ws

CURRENT, ABSENT, DIFFERS = "current", "absent", "differs"
_RIGHT_NOW = (Outcome.PASSED, Outcome.FIXED)


_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")
_STATE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*( [A-Za-z0-9][A-Za-z0-9._+-]*)*\Z")
"""A C-state name: plain words with single spaces between (pseries' ``Shared Cede``)."""
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")


class Unsafe(Exception):
    """A value that cannot go into a persistence file as it is; the message says which."""


def _token(value: str | None, what: str) -> str:
    """A plain word: letters, digits, '.', '_', '+', '-' (not first)."""
    if value is None or not _TOKEN.match(value):
        raise Unsafe(f"{what} {value!r} is not a plain word (letters, digits, '.', '_', '+', "
                     "'-'), so it is not written into a configuration file")
    return value


def _escaped(text: str) -> str:
    """``text`` on one line, whatever it holds (the spec's path in a comment)."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _header(spec: str, source: str) -> str:
    spec = _token(spec, "the spec name")
    return (f"# Written by pytest-gpuhost --fix-persist from spec {spec} "
            f"({_escaped(source)}).\n"
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


def _sysctl_line(record: CheckResult) -> str:
    key = record.key or ""
    try:
        sysctl_path(key)
    except ValueError as exc:
        raise Unsafe(f"sysctl key {key!r}: {exc}") from None
    value = _value(record).rstrip("\n")
    if _CONTROL.search(value):
        raise Unsafe(f"the value of {key} holds a line break or another control character "
                     f"({value[:60]!r}); a sysctl.d line cannot hold it")
    return f"{key} = {normalize_ws(value)}"


def _module(name: str | None) -> str:
    problem = module_name_problem(name or "")
    if problem is not None:
        raise Unsafe(f"module name {name!r}: {problem}")
    return str(name)


def _sysctl_file(results: Sequence[CheckResult]) -> str | None:
    sysctls = _right_now(results, "sysctl")
    return "\n".join(_sysctl_line(r) for r in sysctls) + "\n" if sysctls else None


def _modules_load_file(results: Sequence[CheckResult]) -> str | None:
    loaded = [_module(r.key) for r in _right_now(results, "module")
              if r.expected == "loaded" and _value(r) == "loaded"]
    return "\n".join(loaded) + "\n" if loaded else None


def _modprobe_file(results: Sequence[CheckResult]) -> str | None:
    absent = [_module(r.key) for r in _right_now(results, "module") if r.expected == "absent"]
    return "".join(f"blacklist {name}\ninstall {name} /bin/false\n"
                   for name in absent) or None


Tools = Mapping[str, "str | None"]
"""A command the files name -> its absolute path on the target (None: it has none)."""
TOOLS = ("setpci",)
"""The commands the persistence files run at boot, looked up on the target."""
DEBIAN_TOOLS: Tools = {"setpci": "/usr/bin/setpci"}
"""Where Debian and Proxmox put them: what a file names without a host to look on."""

FILES: tuple[tuple[str, Callable[[Sequence[CheckResult], Tools], str | None]], ...] = (
    ("etc/sysctl.d/90-gpuhost-{spec}.conf", lambda results, _: _sysctl_file(results)),
    ("etc/modules-load.d/gpuhost-{spec}.conf", lambda results, _: _modules_load_file(results)),
    ("etc/modprobe.d/gpuhost-{spec}.conf", lambda results, _: _modprobe_file(results)),
    ("etc/udev/rules.d/90-gpuhost-{spec}.rules",
     lambda results, tools: _udev_rules(results, tools) or None),
)
"""Each persistence file: its path under the root, and what it holds for a run's records and
the target's commands."""


def command_paths(host: Host, names: Sequence[str] = TOOLS) -> dict[str, str | None]:
    """Each command's absolute path as the target's own programs (udev, at boot) name it: the
    first of its sbin/bin directories that holds an executable file of that name (RHEL and
    Fedora keep setpci in /usr/sbin, Debian and Proxmox in /usr/bin), in one batch."""
    wanted = [(name, directory) for name in names for directory in COMMAND_DIRS]
    replies = host.batch([Stat(f"{directory}/{name}") for name, directory in wanted])
    found: dict[str, str | None] = dict.fromkeys(names)
    for (name, directory), reply in zip(wanted, replies, strict=True):
        info = reply.value if reply.error is None else None
        if found[name] is None and isinstance(info, FileInfo) and info.type == "file" and \
                info.mode & 0o111:
            found[name] = f"/{directory}/{name}"
    return found


LineSupply = Callable[[Sequence[CheckResult]], list[PersistLine]]
"""A kind's ``persistence(results)``: the lines its fixed checks need after a reboot."""


def kind_files(spec: str, header: str, results: Sequence[CheckResult],
               read: Callable[[str], str | None], boot_texts: dict[str, str | None],
               supplies: Sequence[LineSupply]) -> dict[str, str | Unsafe]:
    """The files of the kinds' own lines: ``tmpfiles`` lines in etc/tmpfiles.d (applied at
    every boot), ``cmdline`` parameters merged into our grub.d drop-in (which boot-time fixes
    of this run may have written already; only where the host boots with GRUB)."""
    lines = [line for supply in supplies for line in supply(results)]
    files: dict[str, str | Unsafe] = {}
    tmpfiles = [line.text for line in lines if line.target == "tmpfiles"]
    if tmpfiles:
        path = f"etc/tmpfiles.d/gpuhost-{spec}.conf"
        unsafe = [text for text in tmpfiles if _CONTROL.search(text)]
        files[path] = Unsafe(f"a tmpfiles.d line holds a control character: {unsafe[0]!r}") \
            if unsafe else header + "\n".join(tmpfiles) + "\n"
    words = [line.text for line in lines if line.target == "cmdline"]
    if words and parse_boot_config(boot_texts).loader == GRUB:
        unsafe = [word for word in words if _CONTROL.search(word) or " " in word]
        path = dropin_path(spec)
        files[path] = Unsafe(f"a kernel parameter holds a space or a control character: "
                             f"{unsafe[0]!r}") if unsafe else \
            dropin_text(read(path), spec, words)
    return files


def persistence_files(spec: str, source: str, results: Sequence[CheckResult],
                      read: Callable[[str], str | None] = lambda path: None,
                      boot_texts: dict[str, str | None] | None = None,
                      supplies: Sequence[LineSupply] = (),
                      tools: Tools = DEBIAN_TOOLS) -> dict[str, str | Unsafe]:
    """Path under the root -> content, for every kind the run has values of; Unsafe in place
    of the content of a file that would hold something it cannot hold safely. ``read`` gives
    a file's current text (the drop-in shared with boot-time fixes), ``boot_texts`` the boot
    configuration as ``bootconfig`` reads it, ``supplies`` the registered kinds' own
    ``persistence`` (a kind that has one needs no change here), ``tools`` where the target
    keeps the commands the files run (``command_paths``)."""
    try:
        header = _header(spec, source)
    except Unsafe as refused:  # the name is in every file's path: none can be named
        return {"(every --fix-persist file)": Unsafe(f"{refused}; give the spec a 'name:'")}
    files = kind_files(spec, header, results, read, boot_texts or {}, supplies)
    for pattern, build in FILES:
        path = pattern.format(spec=spec)
        try:
            content = build(results, tools)
        except Unsafe as refused:
            files[path] = refused
            continue
        if content is not None:
            files[path] = header + content
    return files


def _udev_rules(results: Sequence[CheckResult], tools: Tools) -> str:
    """MaxReadReq per GPU when its driver binds (by the target's own setpci: udev runs a
    program by its absolute path, and one that is not there fails at boot, unseen), and
    C-states per CPU when it comes online."""
    lines = []
    sizes = _right_now(results, "pcie.max_read_request")
    setpci = tools.get("setpci")
    if sizes and setpci is None:
        raise Unsafe("MaxReadReq is set at boot by setpci, and the target has none in "
                     f"{', '.join('/' + d for d in COMMAND_DIRS)}: install pciutils there, "
                     "then run --fix-persist again")
    for record in sizes:
        code = SIZES.index(int(_value(record))) << 12
        try:
            address = normalize_address(record.key or "")
        except ValueError:
            raise Unsafe(f"GPU {record.key!r} is not a PCI address") from None
        if address != record.key:
            raise Unsafe(f"GPU {record.key!r} is not a PCI address in sysfs form")
        lines.append(f'ACTION=="add|bind", SUBSYSTEM=="pci", KERNEL=="{address}", '
                     f'RUN+="{setpci} -s $kernel CAP_EXP+8.w={code:04x}:7000"')
    states = [r.key for r in _right_now(results, "cpuidle")]
    for state in states:
        if state is None or not _STATE.match(state):
            raise Unsafe(f"the C-state name {state!r} is not plain words (letters, digits, '.', "
                         "'_', '+', '-', single spaces), so it is not written into a udev rule")
    if states:
        names = "|".join(str(state).replace(" ", "\\ ") for state in states)  # Shared\ Cede
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


@dataclass(frozen=True)
class RefusedFile:
    """A persistence file that is not written: it would hold what it cannot hold safely."""

    path: str
    reason: str
    fixable = True

    def observe(self, host: Host) -> Observation:
        return Observation(None, problem=f"{self.path} is not written: {self.reason}")

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        raise CannotFix("nothing is written")


def persistence_checks(spec: str, source: str, results: Sequence[CheckResult],
                       host: Host | None = None, supplies: Sequence[LineSupply] = ()
                       ) -> list[Check]:
    """One ``persist`` check per file: it passes when the file already says the same."""
    def read(path: str) -> str | None:
        return host.read_text(path) if host is not None and host.exists(path) else None

    boot = read_all(host) if host is not None else {}
    tools = command_paths(host) if host is not None else DEBIAN_TOOLS
    options = _options(source)
    checks = []
    files = persistence_files(spec, source, results, read, boot, supplies, tools)
    for path, content in sorted(files.items()):
        if isinstance(content, Unsafe):
            checks.append(Check("persist", path, expected_state(""), options,
                                RefusedFile(path, str(content))))
        else:
            checks.append(Check("persist", path, expected_state(content), options,
                                FileContentProbe(path, content)))
    return checks


# -- the persistence files as checks of their own, known at collection ---------------------------

ORDER = 20_000
"""The rank of the ``persist`` checks: after every other check (dmesg's too), whose records
they are made of."""
EVERY = "(every --fix-persist file)"
"""The one file a spec whose name cannot name files has (its check fails, saying why)."""
_SUPPLIED = ("etc/tmpfiles.d/gpuhost-{spec}.conf", "etc/default/grub.d/90-gpuhost-{spec}.cfg")
"""The files of the lines kinds supply (``PersistLine.target`` ``tmpfiles`` and ``cmdline``)."""
FED_BY: Mapping[str, tuple[str, ...]] = {
    "sysctl": (FILES[0][0],), "module loaded": (FILES[1][0],), "module absent": (FILES[2][0],),
    "module": (FILES[1][0], FILES[2][0]),
    "pcie.max_read_request": (FILES[3][0],), "cpuidle": (FILES[3][0],),
    "cpufreq.governor": (_SUPPLIED[0],), "cpufreq.epp": (_SUPPLIED[0],),
    "memory.transparent_hugepage": (_SUPPLIED[0],), "pcie.acs_redirect": (_SUPPLIED[1],),
}
"""The files a check's record may go into, by its kind (a module's by what it expects):
whether it does is decided by the record at the end of the run (``persistence_files``)."""


def candidate_files(spec: str, checks: Sequence[Check],
                    supplies_lines: Callable[[Check], bool] = lambda check: False
                    ) -> list[str]:
    """Every file --fix-persist may write for ``checks`` (one target's), each a ``persist``
    check collected with the others; ``supplies_lines``: whether a check's kind, not one of
    ``FED_BY``, supplies lines of its own (they may go into either file of supplied lines)."""
    patterns: set[str] = set()
    for check in checks:
        fed = FED_BY.get(f"{check.kind} {check.expect.describe()}") or FED_BY.get(check.kind)
        patterns.update(fed or (_SUPPLIED if supplies_lines(check) else ()))
    if not patterns:
        return []
    try:
        _token(spec, "the spec name")
    except Unsafe:
        return [EVERY]
    return sorted(pattern.format(spec=spec) for pattern in patterns)


@dataclass(frozen=True)
class NothingToPersist:
    """A persistence file that none of the run's records goes into: skipped, saying so."""

    path: str
    fixable = False

    def observe(self, host: Host) -> Observation:
        raise NotApplicable(f"nothing of this run goes into {self.path}: none of the checks "
                            "whose values it holds is right at the end of the run (each says "
                            "why), or the host does not use it")

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        raise CannotFix("nothing is written")


def pending_check(path: str, source: str) -> Check:
    """A persistence file's check as collected: what it holds is known once every other
    check of its target has run (``persistence_checks``, at its turn)."""
    return Check("persist", path, expected_state(""), _options(source), NothingToPersist(path),
                 order=ORDER)


def _options(source: str) -> EntryOptions:
    return EntryOptions(where=f"{_escaped(source)}:1",
                        why="makes the runtime tuning survive a reboot")
