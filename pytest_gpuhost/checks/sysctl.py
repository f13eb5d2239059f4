"""sysctl: one check per key, read from and written to proc/sys directly (no sysctl process)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from ..host import Host, HostError
from ..matchers import Auto, Expectation
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from . import Applied, CannotFix, Check, Evidence, Facts, FixError, Observation

_KEY_CHARS = re.compile(r"[A-Za-z0-9_.:/@+-]+\Z")


def sysctl_path(key: str) -> str:
    """``net.ipv4.conf.eth0/100.rp_filter`` -> ``proc/sys/net/ipv4/conf/eth0.100/rp_filter``.

    As sysctl(8) and tuned do: when the first separator is '.', dots separate the parts and a
    '/' inside a part stands for a '.' in the file name; when it is '/', the key is a path.
    """
    if not _KEY_CHARS.match(key):
        raise ValueError("a sysctl key is letters, digits and . _ - / : @ +, without whitespace")
    first = re.search(r"[./]", key)
    if first is not None and first.group() == ".":
        parts = [part.replace("/", ".") for part in key.split(".")]
    else:
        parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError("a sysctl key has no empty, '.' or '..' parts and does not start with '/'")
    return "proc/sys/" + "/".join(parts)


@dataclass(frozen=True)
class SysctlEntry:
    key: str
    path: str
    expect: Expectation
    options: EntryOptions


@dataclass(frozen=True)
class SysctlProbe:
    path: str
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
        return Observation(value, (Evidence(self.path, value),))

    def apply(self, host: Host, value: str, observed: Observation) -> Applied:
        if observed.value is None:
            raise CannotFix(f"{self.path} does not exist; a fix never creates it")
        try:
            host.write_text(self.path, value + "\n")
        except HostError as exc:
            raise FixError(str(exc)) from exc
        return Applied(f"write {value!r} to {self.path}")


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
        return [Check("sysctl", e.key, e.expect, e.options, SysctlProbe(e.path)) for e in section]
