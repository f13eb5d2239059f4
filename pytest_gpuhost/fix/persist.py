"""--fix-persist: the files that make runtime tuning survive a reboot (and a GPU re-bind).

Every kind supplies its own lines (``Kind.persistence``: sysctl.d lines, modules to load or keep
out, udev rules, tmpfiles.d lines, kernel parameters), from the run's records, so only values
that are right now are persisted, with the value that was read back (a ``{min: X}`` sysctl that
is already higher keeps its higher value). Here the lines are merged into their files: each lives
under the root, is written atomically through the fixer (journaled, undoable) and carries a
header naming the spec; an unchanged file is not rewritten.

Whatever goes into a file is checked first, because a line break in it would be a setting or a
rule of its own (``kernel.core_pattern = |sh``) and a quote or ``$`` in a udev rule is shell run
as root: each kind refuses a line it cannot write (a sysctl key or module name that is not a
plain token, a value with a control character); the spec's path in the header is escaped, the
spec's name (in each file name) must be a plain token, and no line may hold a control
character. A file with anything refused is not written: its ``persist`` check fails, naming
what was refused.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence

import msgspec

from ..checks import CONTROL, CannotFix, Check, Evidence, NotApplicable, Observation, PersistLine
from ..checks.bootpersist import CMDLINE, cmdline_file, cmdline_path
from ..checks.bootpersist import boot_texts as read_boot_texts
from ..checks.changes import Plan, ReplaceFile
from ..host import COMMAND_DIRS, FileInfo, Host, Stat
from ..printable import one_line
from ..result import CheckResult
from ..specmodel import EntryOptions
from ..specmodel.matchers import Choice, Exact

CURRENT, ABSENT, DIFFERS = "current", "absent", "differs"
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\Z")


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
    return one_line(text)


def _header(spec: str, source: str) -> str:
    spec = _token(spec, "the spec name")
    return (f"# Written by pytest-gpuhost --fix-persist from spec {spec} "
            f"({_escaped(source)}).\n"
            "# It makes the runtime tuning stick across reboots; edit the spec and run "
            "--fix-persist again\n# rather than this file.\n")


FILES = {
    "sysctl": ("etc/sysctl.d/90-gpuhost-{spec}.conf", "sysctl.d"),
    "modules-load": ("etc/modules-load.d/gpuhost-{spec}.conf", "modules-load.d"),
    "modprobe": ("etc/modprobe.d/gpuhost-{spec}.conf", "modprobe.d"),
    "udev": ("etc/udev/rules.d/90-gpuhost-{spec}.rules", "udev rule"),
    "tmpfiles": ("etc/tmpfiles.d/gpuhost-{spec}.conf", "tmpfiles.d"),
}
"""A line's target -> its file under the root, and what a line of it is called. ``cmdline``
words go into the grub.d drop-in instead (``checks.bootpersist``), merged with boot-time
fixes'."""

Tools = Mapping[str, "str | None"]
"""A command the files run -> its absolute path on the target (None: it has none)."""
DEFAULT_COMMAND_DIR = "/usr/bin"
"""Where Debian and Proxmox keep the commands: what a file names without a host to look on."""


def command_paths(host: Host, names: Sequence[str]) -> dict[str, str | None]:
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


LineSupply = Callable[[Sequence[CheckResult]], Sequence[PersistLine]]
"""A kind's ``persistence(results)``: the lines its checks' values need after a reboot."""


def lines_of(results: Sequence[CheckResult], supplies: Sequence[LineSupply]
             ) -> list[PersistLine]:
    """Every kind's lines, in the kinds' order."""
    return [line for supply in supplies for line in supply(results)]


def commands_of(lines: Sequence[PersistLine]) -> list[str]:
    """The commands the lines run at boot, each once."""
    return list(dict.fromkeys(line.runs.name for line in lines if line.runs is not None))


def _file_text(target: str, lines: Sequence[PersistLine], tools: Tools) -> str | Unsafe:
    """One file's lines, each command named by its path on the target; Unsafe where a line was
    refused, runs a command the target lacks, or holds a control character."""
    what = FILES[target][1]
    texts = []
    for line in lines:
        text = line.text
        if line.runs is not None:
            found = tools.get(line.runs.name, f"{DEFAULT_COMMAND_DIR}/{line.runs.name}")
            if found is None:
                return Unsafe(f"{line.runs.sets} is set at boot by {line.runs.name}, and the "
                              f"target has none in {', '.join('/' + d for d in COMMAND_DIRS)}: "
                              f"install {line.runs.package} there, then run --fix-persist "
                              "again")
            text = text.replace("{" + line.runs.name + "}", found)
        if line.refused is not None:
            return Unsafe(line.refused)
        if CONTROL.search(text):
            return Unsafe(f"a {what} line holds a control character: {text!r}")
        texts.append(text)
    return "\n".join(texts) + "\n"


def _dropin(spec: str, lines: Sequence[PersistLine], read: Callable[[str], str | None],
            boot_texts: dict[str, str | None]) -> dict[str, str | Unsafe]:
    """The kernel parameters' file (``checks.bootpersist``), if the host has one for them."""
    made = cmdline_file(spec, lines, read, boot_texts)
    if made is None:
        return {}
    return {made.path: Unsafe(made.refused) if made.text is None else made.text}


def persistence_files(spec: str, source: str, results: Sequence[CheckResult],
                      read: Callable[[str], str | None] = lambda path: None,
                      boot_texts: dict[str, str | None] | None = None,
                      supplies: Sequence[LineSupply] = (),
                      tools: Tools | None = None) -> dict[str, str | Unsafe]:
    """Path under the root -> content, for every file the kinds (``supplies``: their
    ``persistence``) give lines for; Unsafe in place of the content of a file that would hold
    something it cannot hold safely. ``read`` gives a file's current text (the drop-in shared
    with boot-time fixes), ``boot_texts`` the boot configuration as ``bootpersist`` reads it,
    ``tools`` where the target keeps the commands the files run (``command_paths``; None:
    where Debian keeps them)."""
    return files_of(spec, source, lines_of(results, supplies), read, boot_texts or {}, tools)


def files_of(spec: str, source: str, lines: Sequence[PersistLine],
             read: Callable[[str], str | None], boot_texts: dict[str, str | None],
             tools: Tools | None) -> dict[str, str | Unsafe]:
    """``persistence_files`` of the kinds' lines."""
    try:
        header = _header(spec, source)
    except Unsafe as refused:  # the name is in every file's path: none can be named
        return {"(every --fix-persist file)": Unsafe(f"{refused}; give the spec a 'name:'")}
    files: dict[str, str | Unsafe] = {}
    for target, (pattern, _) in FILES.items():
        mine = [line for line in lines if line.target == target]
        if mine:
            text = _file_text(target, mine, tools or {})
            files[pattern.format(spec=spec)] = text if isinstance(text, Unsafe) else header + text
    files.update(_dropin(spec, lines, read, boot_texts))
    return files


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


class FileContentProbe(msgspec.Struct, frozen=True):
    """Whether a file holds exactly ``content``; the fix replaces it atomically."""

    path: str
    content: str | None
    """None: the file should not exist (a rollback of a file that persistence created)."""
    only_if: str | None = None
    """For a rollback: change the file only while it still holds what the fix wrote."""
    content_raw: bytes | None = None
    """``content``'s exact bytes where they are not UTF-8 (a rollback's original)."""
    fixable = True

    def _original(self, host: Host) -> bytes | None:
        """The file's bytes, read once a step (None: absent): its text is what read_text
        gives, and a change keeps them exactly."""
        return host.read_bytes(self.path) if host.exists(self.path) else None

    def observe(self, host: Host) -> Observation:
        original = self._original(host)
        if original is None:
            return Observation(ABSENT, (Evidence(self.path, "absent"),))
        current = original.decode("utf-8", "replace")
        holds = original == self.content_raw if self.content_raw is not None else \
            current == self.content
        return Observation(CURRENT if holds else DIFFERS,
                           (Evidence(self.path, f"{_digest(current)}, "
                                                f"{len(current.splitlines())} lines"),))

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        original = self._original(host)
        current = None if original is None else original.decode("utf-8", "replace")
        if self.only_if is not None and current != self.only_if:
            raise CannotFix(f"{self.path} was edited since the fix: left as it is")
        if self.content is None:
            if original is None:
                raise CannotFix(f"{self.path} is already absent")
            return Plan(f"remove {self.path}",
                        (ReplaceFile.of_bytes(self.path, original, None),))
        verb = "create" if observed.value == ABSENT else "update"
        change = ReplaceFile.of_bytes(self.path, original, self.content)
        if self.content_raw is not None:
            change = msgspec.structs.replace(change, new_raw=self.content_raw)
        return Plan(f"{verb} {self.path}", (change,))


def expected_state(content: str | None) -> Exact:
    return Exact(CURRENT if content is not None else ABSENT, Choice((CURRENT, ABSENT)))


class RefusedFile(msgspec.Struct, frozen=True):
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

    boot = read_boot_texts(host) if host is not None else {}
    lines = lines_of(results, supplies)
    needed = commands_of(lines)
    tools = command_paths(host, needed) if host is not None and needed else None
    options = _options(source)
    checks = []
    files = files_of(spec, source, lines, read, boot, tools)
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


def candidate_files(spec: str, checks: Sequence[Check],
                    targets_of: Callable[[Check], Sequence[str]]) -> list[str]:
    """Every file --fix-persist may write for ``checks`` (one target's), each a ``persist``
    check collected with the others: the files of the persistence targets each check's kind
    says its lines may go to (``Kind.persists_to``); whether one does is decided by the
    records at the end of the run (``persistence_checks``)."""
    targets: set[str] = set()
    for check in checks:
        targets.update(targets_of(check))
    if not targets:
        return []
    try:
        _token(spec, "the spec name")
    except Unsafe:
        return [EVERY]
    return sorted(cmdline_path(spec) if target == CMDLINE else FILES[target][0].format(spec=spec)
                  for target in targets if target == CMDLINE or target in FILES)


class NothingToPersist(msgspec.Struct, frozen=True):
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
