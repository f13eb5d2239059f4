"""sysctl: one check per key, read from and written to proc/sys directly (no sysctl process).

Its checks are of two scopes: a ``net.*`` sysctl belongs to a network namespace (a container
owns its own), except those the kernel keeps global (``GLOBAL_NET``), and so do the sysctls of
an IPC namespace (``IPC_SYSCTLS``, ``fs.mqueue.*``) and a UTS one (``UTS_SYSCTLS``); every other
sysctl is the kernel's. ``--fix-persist`` writes the values into etc/sysctl.d; capture writes
sizes and limits as ``min:``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from ..host import Glob, Host, HostError, ListDir, Match, Read, Reply, Request
from ..result import CheckResult
from ..specmodel import EntryOptions, SpecContext, parse_expectation
from ..specmodel.matchers import Auto, Expectation, normalize_ws
from . import (
    KERNEL,
    NAMESPACE,
    CannotFix,
    Check,
    Evidence,
    Fact,
    Facts,
    Observation,
    PersistLine,
    settled,
)

if TYPE_CHECKING:  # capture's helpers and a plan's changes load when used
    from ..specmodel import Node
    from .capturing import Captured, Records
    from .changes import Plan

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
    dot, slash = key.find("."), key.find("/")
    if dot != -1 and (slash == -1 or dot < slash):  # the first separator is a '.'
        parts = key.split(".")
        if slash != -1:
            parts = [part.replace("/", ".") for part in parts]
    else:
        parts = key.split("/")
    if "" in parts or "." in parts or ".." in parts:
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


class SysctlEntry(msgspec.Struct, frozen=True):
    key: str
    path: str
    expect: Expectation
    options: EntryOptions


class SysctlProbe(msgspec.Struct, frozen=True):
    path: str
    boot: tuple[str, str] | None = None
    """What boot-time configuration sets this sysctl to, and where."""
    fixable = True

    def reads(self) -> Sequence[Request]:
        # the names beside it, in the same batch: a key that is not there gets a did-you-mean
        return (Read(self.path), ListDir(self.path.rsplit("/", 1)[0]))

    def observe(self, host: Host) -> Observation:
        try:
            raw = host.read_text(self.path)
        except HostError as exc:
            if not host.exists(self.path):
                return Observation(None, problem=f"{self.path} does not exist: this kernel has "
                                                 "no such sysctl (or its module is not loaded)"
                                                 f"{_did_you_mean(host, self.path)}")
            raise exc
        value = raw.rstrip("\n")
        evidence = [Evidence(self.path, value)]
        if self.boot is not None:
            evidence.append(Evidence(self.boot[1], f"sets {self.boot[0]} at boot"))
        return Observation(value, tuple(evidence), persisted=self.boot)

    def plan(self, host: Host, value: str, observed: Observation) -> Plan:
        from .changes import Plan, WriteText  # a plan's: a check that passes makes none

        if observed.value is None:
            raise CannotFix(f"{self.path} does not exist; a fix never creates it")
        # The original as bytes: one that is not UTF-8 must come back exactly, not as U+FFFD.
        change = WriteText.of_bytes(self.path, host.read_bytes(self.path), (value + "\n").encode())
        return Plan(f"write {value!r} to {self.path}", (change,))


def _did_you_mean(host: Host, path: str) -> str:
    """``; did you mean vm.swappiness?``: the sysctl beside a missing one whose name is
    closest to its (from the listing its check read in the observation's batch); empty when
    none is close, or the directory itself is missing."""
    import difflib

    directory, name = path.rsplit("/", 1)
    [listing] = host.batch([ListDir(directory)])
    if listing.error is not None:
        return ""
    close = difflib.get_close_matches(name, listing.names(), n=1, cutoff=0.75)
    keys = [f"{directory.removeprefix('proc/sys/')}/{found}".replace("/", ".") for found in close
            if "." not in found]  # a name with a dot is a VLAN's: its key spells it with '/'
    return f"; did you mean {keys[0]}?" if keys else ""


GLOBAL_NET = frozenset({
    # net/core/sysctl_net_core.c: net_core_table, registered for the initial namespace only
    # (rmem/wmem are read-only copies in every other one since Linux 6.x)
    *(f"net.core.{name}" for name in (
        "rmem_max", "wmem_max", "rmem_default", "wmem_default", "dev_weight",
        "dev_weight_rx_bias", "dev_weight_tx_bias", "netdev_max_backlog", "netdev_rss_key",
        "netdev_tstamp_prequeue", "message_cost", "message_burst", "netdev_budget",
        "netdev_budget_usecs", "rps_sock_flow_entries", "flow_limit_cpu_bitmap",
        "flow_limit_table_len", "busy_poll", "busy_read", "default_qdisc", "warnings",
        "bpf_jit_enable", "bpf_jit_harden", "bpf_jit_kallsyms", "bpf_jit_limit",
        "max_skb_frags", "fb_tunnels_only_for_init_net", "devconf_inherit_init_net",
        "high_order_alloc_disable", "gro_normal_batch", "netdev_unregister_timeout_secs",
        "skb_defer_max", "mem_pcpu_rsv")),
    # net/ipv4/sysctl_net_ipv4.c: ipv4_table (ipv4_net_table holds the per-namespace ones)
    *(f"net.ipv4.{name}" for name in (
        "tcp_max_orphans", "inet_peer_threshold", "inet_peer_minttl", "inet_peer_maxttl",
        "tcp_mem", "tcp_low_latency", "cipso_cache_enable", "cipso_cache_bucket_size",
        "cipso_rbm_optfmt", "cipso_rbm_strictvalid", "tcp_available_ulp", "udp_mem",
        "fib_sync_mem")),
    # net/ipv4/route.c: ipv4_route_table (flush, min_pmtu, mtu_expires, min_adv_mss are per
    # namespace)
    *(f"net.ipv4.route.{name}" for name in (
        "gc_thresh", "max_size", "gc_min_interval", "gc_min_interval_ms", "gc_timeout",
        "gc_interval", "redirect_load", "redirect_number", "redirect_silence", "error_cost",
        "error_burst", "gc_elasticity")),
    # net/ipv6/sysctl_net_ipv6.c: ipv6_rotable
    "net.ipv6.mld_max_msf", "net.ipv6.mld_qrv", "net.ipv6.calipso_cache_enable",
    "net.ipv6.calipso_cache_bucket_size",
    # net/netfilter/nf_conntrack_standalone.c: read-only outside the initial namespace
    "net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_expect_max",
    "net.netfilter.nf_conntrack_buckets", "net.nf_conntrack_max",
})
"""The ``net.*`` sysctls the kernel keeps global, from the kernel's own tables (Linux 6.12):
a container can read them but not set them (LXC: EACCES), so they live on its host. Every other
``net.*`` sysctl is its network namespace's own: ``net.ipv4.tcp_rmem``, ``net.core.somaxconn``,
``net.ipv4.conf.*``; ``net.core.optmem_max`` and ``net.core.tstamp_allow_data`` became per
namespace in Linux 6.9 (global before)."""


IPC_SYSCTLS = frozenset({
    # ipc/ipc_sysctl.c: ipc_sysctls, registered per IPC namespace (the *_next_id ones with
    # CONFIG_CHECKPOINT_RESTORE; auto_msgmni is kept there as a no-op)
    *(f"kernel.{name}" for name in (
        "shmmax", "shmall", "shmmni", "shm_rmid_forced", "msgmax", "msgmnb", "msgmni",
        "auto_msgmni", "sem", "msg_next_id", "sem_next_id", "shm_next_id")),
})
"""The sysctls of an IPC namespace beside ``fs.mqueue.*`` (ipc/mq_sysctl.c): a container has
its own (LXC, Docker and Kubernetes always give it one), so a container's are its own values,
not its host's; the list ``runc`` and ``docker run --sysctl`` accept as the IPC namespace's."""
UTS_SYSCTLS = frozenset({"kernel.hostname", "kernel.domainname"})
"""The writable sysctls of a UTS namespace (kernel/utsname_sysctl.c: ``ostype``, ``osrelease``
and ``version`` are there too, read-only: the running kernel's in every namespace)."""


def sysctl_scope(key: str) -> str:
    """Where a sysctl lives: ``namespace`` for a key the kernel keeps per namespace (a
    ``net.*`` key of a network namespace, an IPC or UTS one), else ``kernel`` (``/`` and ``.``
    separate alike, as in ``sysctl_path``)."""
    first = re.search(r"[./]", key)
    dotted = key.replace("/", ".") if first is not None and first.group() == "/" else key
    if dotted in IPC_SYSCTLS or dotted in UTS_SYSCTLS or dotted.startswith("fs.mqueue."):
        return NAMESPACE
    if not dotted.startswith("net.") or dotted in GLOBAL_NET:
        return KERNEL
    return NAMESPACE


BUFFER_SYSCTLS = (
    r"(?:^|\.)(?:[rw]mem_(?:max|default)|optmem_max|netdev_max_backlog|somaxconn|"
    r"max_map_count|file-max|nr_open|max_user_watches|max_user_instances|shmmax|shmall)\Z")
"""Sysctls that are sizes or limits: more is as good, so they are captured as ``min:``
(the pattern: a capture compiles it, ``re`` caches it; a verify run never needs it)."""


def capture_sysctl(model: Sequence[SysctlEntry], records: Records) -> Captured:
    from .capturing import Captured, Rule, capture_key, records_of

    out = Captured()
    for item in model:
        rule = Rule(floor=bool(re.search(BUFFER_SYSCTLS, item.key)), one_of=True,
                    show=normalize_ws)
        capture_key(item.key, records_of(records, "sysctl", item.key), item.expect,
                    item.options, rule, out, f"sysctl[{item.key}]")
    return out


def sysctl_persistence(results: Sequence[CheckResult]) -> list[PersistLine]:
    """One etc/sysctl.d line per key whose value is right now (or would be after a dry run's
    plan): the value read back, so a ``{min: X}`` already higher keeps its higher value."""
    return [_persist_line(record.key or "", value) for record, value in settled(results, "sysctl")]


def _persist_line(key: str, value: str) -> PersistLine:
    try:
        sysctl_path(key)
    except ValueError as exc:
        return PersistLine.refuse("sysctl", f"sysctl key {key!r}: {exc}")
    from .persistence import CONTROL  # --fix-persist's

    value = value.rstrip("\n")
    if CONTROL.search(value):
        return PersistLine.refuse("sysctl", f"the value of {key} holds a line break or another "
                                            f"control character ({value[:60]!r}); a sysctl.d "
                                            "line cannot hold it")
    return PersistLine("sysctl", f"{key} = {normalize_ws(value)}")


class SysctlKind:
    section = "sysctl"
    capture = staticmethod(capture_sysctl)
    persistence = staticmethod(sysctl_persistence)

    @staticmethod
    def persists_to(check: Check) -> Sequence[str]:
        return ("sysctl",)

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
        return [Check("sysctl", e.key, e.expect, e.options, SysctlProbe(e.path, boot.get(e.path)),
                      scope=sysctl_scope(e.key)) for e in section]
