"""sysctl: one check per key, read from and written to proc/sys directly (no sysctl process)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..host import Glob, Host, HostError, Match, Read, Reply, Request
from ..spec import EntryOptions, Node, SpecContext, parse_expectation
from ..spec.matchers import Auto, Expectation
from . import CannotFix, Check, Evidence, Fact, Facts, Observation
from .changes import Plan, WriteText

_KEY_CHARS = re.compile(r"[A-Za-z0-9_.:/@+-]+\Z")
AUTO = Auto()
"""One comparison for every sysctl entry (it holds no state): one object, not one per key."""


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


def _parse_boot_config(replies: Sequence[Reply]) -> dict[str, tuple[str, str]]:
    """proc/sys path -> (value, ``file:line``) of the last assignment a boot would apply: every
    ``*.conf`` of the sysctl.d directories sorted by name (a name in an earlier directory hides
    the same name in a later one), then etc/sysctl.conf, as ``sysctl --system`` does."""
    by_name: dict[str, Match] = {}
    for reply in replies[:-1]:
        for path, data in reply.matches() if reply.error is None else ():
            by_name.setdefault(path.rsplit("/", 1)[-1], (path, data))
    files = [by_name[name] for name in sorted(by_name)]
    conf = replies[-1]
    if conf.error is None:
        files.append((SYSCTL_CONF, conf.data()))
    values: dict[str, tuple[str, str]] = {}
    for path, data in files:
        if not isinstance(data, bytes):
            continue  # an unreadable file: sysctl skips it too
        text = data.decode("utf-8", errors="replace")
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


BOOT_CONFIG = Fact("sysctl boot configuration",
                   (*(Glob(f"{directory}/*.conf") for directory in SYSCTL_DIRS),
                    Read(SYSCTL_CONF)), _parse_boot_config)


def read_boot_config(host: Host) -> dict[str, tuple[str, str]]:
    return BOOT_CONFIG.read(host)


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

    def reads(self) -> Sequence[Request]:
        return (Read(self.path),)

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
            expect, options = parse_expectation(value, context, AUTO, what=f"sysctl {key}")
            entries.append(SysctlEntry(key, path, expect, options))
        return tuple(sorted(entries, key=lambda e: e.key))

    def facts(self, section: tuple[SysctlEntry, ...]) -> Sequence[Fact[Any]]:
        return [BOOT_CONFIG]

    def expand(self, section: tuple[SysctlEntry, ...], facts: Facts) -> Sequence[Check]:
        boot = facts.get(BOOT_CONFIG)
        return [Check("sysctl", e.key, e.expect, e.options, SysctlProbe(e.path, boot.get(e.path)))
                for e in section]
