"""sysctl: one check per key, read from and written to proc/sys directly (no sysctl process)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..fix.changes import Plan, WriteText
from ..host import Host, HostError
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Auto, Expectation
from . import CannotFix, Check, Evidence, Facts, Observation

_KEY_CHARS = re.compile(r"[A-Za-z0-9_.:/@+-]+\Z")


def sysctl_path(key: str) -> str:
    """``net.ipv4.conf.eth0/100.rp_filter`` -> ``proc/sys/net/ipv4/conf/eth0.100/rp_filter``.

    As sysctl(8) and tuned do: when the first separator is '.', dots separate the parts and a
    '/' inside a part stands for a '.' in the file name; when it is '/', the key is a path.
    """
    if not _KEY_CHARS.match(key):
        raise ValueError("a sysctl key is letters, digits and . _ - / : @ +, without whitespace")
    if key.startswith("-"):
        raise ValueError("a sysctl key does not start with '-' (sysctl.d reads a leading '-' as "
                         "'ignore a failure')")
    first = re.search(r"[./]", key)
    if first is not None and first.group() == ".":
        parts = [part.replace("/", ".") for part in key.split(".")]
    else:
        parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError("a sysctl key has no empty, '.' or '..' parts and does not start with '/'")
    return "proc/sys/" + "/".join(parts)


SYSCTL_DIRS = ("etc/sysctl.d", "run/sysctl.d", "usr/local/lib/sysctl.d", "usr/lib/sysctl.d",
               "lib/sysctl.d")
SYSCTL_CONF = "etc/sysctl.conf"


def boot_config_files(host: Host) -> list[str]:
    """The files ``sysctl --system`` applies, in its order: every ``*.conf`` of the sysctl.d
    directories sorted by name (a name in an earlier directory hides the same name in a later
    one), then etc/sysctl.conf."""
    by_name: dict[str, str] = {}
    for directory in SYSCTL_DIRS:
        if host.exists(directory):
            for name in host.listdir(directory):
                if name.endswith(".conf"):
                    by_name.setdefault(name, f"{directory}/{name}")
    files = [by_name[name] for name in sorted(by_name)]
    return [*files, SYSCTL_CONF] if host.exists(SYSCTL_CONF) else files


def read_boot_config(host: Host) -> dict[str, tuple[str, str]]:
    """proc/sys path -> (value, ``file:line``) of the last assignment a boot would apply."""
    values: dict[str, tuple[str, str]] = {}
    for path in boot_config_files(host):
        try:
            text = host.read_text(path)
        except HostError:
            continue  # a dangling link or an unreadable file: sysctl skips it too
        for number, line in enumerate(text.splitlines(), 1):
            stripped = line.strip()
            if not stripped or stripped[0] in "#;" or "=" not in stripped:
                continue
            key, _, value = stripped.partition("=")
            try:
                target = sysctl_path(key.strip().lstrip("-"))
            except ValueError:
                continue  # globs and other keys that name no single file
            values[target] = (value.strip(), f"{path}:{number}")
    return values


@dataclass(frozen=True)
class SysctlEntry:
    key: str
    path: str
    expect: Expectation
    options: EntryOptions


@dataclass(frozen=True)
class SysctlProbe:
    path: str
    boot: tuple[str, str] | None = None
    """What boot-time configuration sets this sysctl to, and where."""
    fixable = True

    def observe(self, host: Host) -> Observation:
        try:
            raw = host.read_text(self.path)
        except HostError as exc:
            if not host.exists(self.path):
                return Observation(None, problem=f"{self.path} does not exist: this kernel has "
                                                 "no such sysctl (or its module is not loaded)")
            raise exc
        value = raw.rstrip("\n")
        evidence = [Evidence(self.path, value)]
        if self.boot is not None:
            evidence.append(Evidence(self.boot[1], f"sets {self.boot[0]} at boot"))
        return Observation(value, tuple(evidence), persisted=self.boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        if observed.value is None:
            raise CannotFix(f"{self.path} does not exist; a fix never creates it")
        # The original as bytes: one that is not UTF-8 must come back exactly, not as U+FFFD.
        change = WriteText.of_bytes(self.path, host.read_bytes(self.path), (value + "\n").encode())
        return Plan(f"write {value!r} to {self.path}", (change,))


class SysctlKind:
    section = "sysctl"

    def parse(self, node: Node, context: SpecContext) -> tuple[SysctlEntry, ...]:
        entries = []
        pairs = node.mapping("sysctl")
        if not pairs:
            raise node.error("sysctl is empty; expected 'key: value' entries")
        for key, value in pairs:
            try:
                path = sysctl_path(key)
            except ValueError as exc:
                raise value.key_error(f"sysctl key {key!r} is not allowed: {exc}") from None
            expect, options = parse_expectation(value, context, Auto(), what=f"sysctl {key}")
            entries.append(SysctlEntry(key, path, expect, options))
        return tuple(sorted(entries, key=lambda e: e.key))

    def expand(self, section: tuple[SysctlEntry, ...], facts: Facts) -> Sequence[Check]:
        boot = facts.get(read_boot_config)
        return [Check("sysctl", e.key, e.expect, e.options, SysctlProbe(e.path, boot.get(e.path)))
                for e in section]
