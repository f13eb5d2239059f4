"""What a kind says of itself beside its checks: its scope (where its settings live), whether its
checks are measurements, and the section each check came from, carried into every record."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.checks import (
    KERNEL,
    NAMESPACE,
    SCOPES,
    USERSPACE,
    Capturing,
    Check,
    NoFix,
    Observation,
    StandIn,
    capturer_of,
    owned,
    scope_of,
)
from pytest_gpuhost.checks.sysctl import GLOBAL_NET, sysctl_scope
from pytest_gpuhost.host import Host
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact
from pytest_gpuhost.testing.fakehost import blackwell8_untuned

from ..conftest import BLACKWELL8
from ..runner import KINDS, run_spec


@pytest.mark.parametrize(("key", "scope"), [
    ("vm.swappiness", KERNEL),
    ("kernel.numa_balancing", KERNEL),
    ("net.core.rmem_max", KERNEL),  # global: a container reads it, cannot set it (EACCES)
    ("net.core.wmem_default", KERNEL),
    ("net.core.netdev_max_backlog", KERNEL),
    ("net.ipv4.tcp_mem", KERNEL),
    ("net.ipv4.route.gc_thresh", KERNEL),
    ("net.netfilter.nf_conntrack_max", KERNEL),
    ("net/core/rmem_max", KERNEL),  # the path form names the same sysctl
    ("net.core.somaxconn", NAMESPACE),
    ("net.ipv4.tcp_rmem", NAMESPACE),
    ("net.ipv4.ip_local_port_range", NAMESPACE),
    ("net.ipv4.route.min_pmtu", NAMESPACE),
    ("net.ipv4.conf.eth0/100.rp_filter", NAMESPACE),  # a '/' in a part is a '.' of the name
    ("net/ipv4/tcp_wmem", NAMESPACE),
    ("net.ipv6.conf.all.forwarding", NAMESPACE),
    # IPC namespace (ipc/ipc_sysctl.c, ipc/mq_sysctl.c): a container has its own
    ("kernel.shmmax", NAMESPACE),
    ("kernel.shmall", NAMESPACE),
    ("kernel.shmmni", NAMESPACE),
    ("kernel.shm_rmid_forced", NAMESPACE),
    ("kernel.msgmax", NAMESPACE),
    ("kernel.msgmnb", NAMESPACE),
    ("kernel.msgmni", NAMESPACE),
    ("kernel.sem", NAMESPACE),
    ("kernel/shmmax", NAMESPACE),
    ("fs.mqueue.msg_max", NAMESPACE),
    ("fs.mqueue.queues_max", NAMESPACE),
    # UTS namespace (kernel/utsname_sysctl.c): the writable names are the container's
    ("kernel.hostname", NAMESPACE),
    ("kernel.domainname", NAMESPACE),
    ("kernel.osrelease", KERNEL),  # the running kernel's, the same in every namespace
    ("kernel.shmmax_other", KERNEL),  # only the kernel's own names, not a prefix
    ("fs.mqueue", KERNEL),
    ("fs.file-max", KERNEL),
])
def test_a_sysctl_lives_where_the_kernel_keeps_it(key: str, scope: str) -> None:
    assert sysctl_scope(key) == scope


def test_the_global_net_sysctls_are_all_net_keys() -> None:
    assert all(key.startswith("net.") for key in GLOBAL_NET)
    assert {"net.core.rmem_max", "net.core.wmem_max"} <= GLOBAL_NET


def test_every_record_names_its_section_and_scope_and_whether_it_was_measured(
        tmp_path: Path) -> None:
    root = tmp_path / "host"
    blackwell8_untuned(root, cpus=4)
    records = run_spec([BLACKWELL8], root, workdir=tmp_path).records
    sections = {r.section for r in records}
    assert sections == {"sysctl", "kernel", "cpufreq", "memory", "iommu", "gpus", "pcie",
                        "cpuidle", "modules", "p2p", "dmesg"}
    by_kind = {r.kind: r for r in records}
    assert (by_kind["gpu_count"].section, by_kind["gpu_count"].scope) == ("gpus", KERNEL)
    assert by_kind["module.parameter"].section == "modules"
    assert by_kind["module"].section == "modules"
    assert by_kind["pcie.max_read_request"].section == "pcie"
    assert by_kind["gpus.nvml_inventory"].scope == USERSPACE
    assert by_kind["gpus.persistence_mode"].scope == KERNEL
    assert by_kind["cpuidle"].scope == KERNEL
    measured = {r.kind for r in records if r.measured}
    # results, not settings: the bandwidths, the kernel log since boot, AER counters, residency
    assert measured == {r.kind for r in records if r.section == "p2p"} | {
        "dmesg", "pcie.aer", "cpuidle.residency"}
    assert {r.scope for r in records if r.section == "p2p"} == {USERSPACE}
    assert {r.scope for r in records if r.kind == "sysctl"} == {KERNEL}  # rmem/wmem are global
    assert all(r.scope in SCOPES for r in records)
    as_json = by_kind["gpu_count"].as_dict()
    assert (as_json["section"], as_json["scope"], as_json["measured"]) == ("gpus", KERNEL, False)


def test_a_check_of_another_scope_than_its_kinds_says_so(tmp_path: Path) -> None:
    root = tmp_path / "host"
    blackwell8_untuned(root, cpus=4)
    (root / "proc/sys/net/ipv4/tcp_rmem").write_text("4096\t131072\t6291456\n")
    spec = tmp_path / "net.yaml"
    spec.write_text("version: 1\nsysctl:\n  net.ipv4.tcp_rmem: '4096 131072 6291456'\n"
                    "  net.core.rmem_max: {min: 1}\ngpus:\n  driver_match: true\n")
    records = {r.id: r for r in run_spec([spec], root, workdir=tmp_path).records}
    assert records["sysctl[net.ipv4.tcp_rmem]"].scope == NAMESPACE
    assert records["sysctl[net.core.rmem_max]"].scope == KERNEL
    assert records["gpus.driver_match"].scope == USERSPACE  # the library of this root
    assert records["gpus.nvml_inventory"].scope == USERSPACE
    assert records["gpus.driver_match"].section == "gpus"


class _Probe(NoFix):
    def observe(self, host: Host) -> Observation:
        return Observation("1")


def _check(scope: str | None = None, measured: bool | None = None) -> Check:
    return Check("lab.thing", None, Exact("1", Auto()), EntryOptions(where="lab.yaml:1"),
                 _Probe(), scope=scope, measured=measured)


class _LabKind:
    section = "lab"
    scope = NAMESPACE
    measured = True


class _HostKind:
    section = "lab"
    scope = "host"


def test_a_check_takes_its_kinds_scope_and_section_unless_it_says_its_own() -> None:
    plain, own = owned(_LabKind(), "lab", [_check(), _check(scope=USERSPACE, measured=False)])
    assert (plain.section, plain.scope, plain.measured) == ("lab", NAMESPACE, True)
    assert (own.section, own.scope, own.measured) == ("lab", USERSPACE, False)
    assert scope_of(object()) == KERNEL  # a kind that says nothing lives in the kernel
    assert _check().owner == "lab.thing"  # made outside a section: its own


def test_an_unknown_scope_is_refused_naming_the_check_or_the_kind() -> None:
    with pytest.raises(ValueError, match=r"check lab.thing: scope 'host' is not one of "
                                         r"kernel, namespace, userspace"):
        _check(scope="host")
    with pytest.raises(ValueError, match=r"test_parts._HostKind of section 'lab' declares "
                                         r"scope 'host'; a scope is one of kernel"):
        owned(_HostKind(), "lab", [_check()])


def test_every_builtin_kind_declares_a_scope_and_a_capture() -> None:
    for section, kind in KINDS.items():
        assert isinstance(kind, StandIn), section
        own = kind.standing_for()
        assert scope_of(kind) in SCOPES, section  # its own, or the default (kernel)
        assert isinstance(own, Capturing) and capturer_of(kind) is not None, \
            f"built-in kind {section} has no capture (checks.kind.Capturing): every built-in " \
            "kind writes its section back for --gpuhost-capture (docs/adding-a-kind.md)"
