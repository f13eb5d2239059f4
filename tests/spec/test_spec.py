"""The spec layer: valid specs become models; a bad spec names file:line and what was expected."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import TypeVar

import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.checks.cpuidle import CpuidleSection
from pytest_gpuhost.checks.dmesg import DmesgSection
from pytest_gpuhost.checks.modules import ModulesSection
from pytest_gpuhost.checks.p2p import P2pSection
from pytest_gpuhost.checks.sysctl import SysctlEntry, sysctl_path
from pytest_gpuhost.specmodel import Spec, SpecError, load_spec
from pytest_gpuhost.specmodel.matchers import Exact, Match, OneOf, Range

from ..conftest import BLACKWELL8

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = set(builtin.pytest_gpuhost_conditions())
T = TypeVar("T")


def section(spec: Spec, name: str, model: type[T]) -> T:
    """The section ``name`` of ``spec`` as its kind parsed it: a ``model``."""
    found = spec.sections[name]
    assert isinstance(found, model), found
    return found


def sysctl_entries(spec: Spec) -> list[SysctlEntry]:
    """The sysctl section: its entries, in file order."""
    entries = list(section(spec, "sysctl", tuple))
    assert all(isinstance(entry, SysctlEntry) for entry in entries), entries
    return entries


def load(tmp_path: Path, text: str) -> Spec:
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path, KINDS, CONDITIONS, display=lambda p: p.name)


def test_bundled_spec_is_valid() -> None:
    spec = load_spec(BLACKWELL8, KINDS, CONDITIONS)
    assert spec.name == "blackwell8"
    assert list(spec.sections) == ["sysctl", "kernel", "cpufreq", "memory", "gpus", "pcie",
                                   "iommu", "cpuidle", "modules", "p2p", "dmesg"]
    sysctls = {entry.key: entry for entry in sysctl_entries(spec)}
    numa = sysctls["kernel.numa_balancing"].expect
    assert isinstance(numa, Exact) and numa == Exact("0", numa.domain)
    assert all(entry.options.why for entry in sysctls.values())


def test_every_form_of_expectation(tmp_path: Path) -> None:
    spec = load(tmp_path, """\
        version: 1
        sysctl:
          kernel.numa_balancing: 0
          net.core.rmem_max: {min: 16777216}
          kernel.perf_event_paranoid: {max: 1, why: profilers}
          net.ipv4.tcp_congestion_control: {one_of: [bbr, cubic]}
          kernel.core_pattern: {match: '\\|/usr/share/apport/.*', fix: false}
          net.ipv4.tcp_rmem: "4096 87380 16777216"
    """)
    entries = {e.key: e for e in sysctl_entries(spec)}
    assert spec.name == "spec"
    assert isinstance(entries["kernel.numa_balancing"].expect, Exact)
    assert isinstance(entries["net.core.rmem_max"].expect, Range)
    assert entries["kernel.perf_event_paranoid"].options.why == "profilers"
    assert isinstance(entries["net.ipv4.tcp_congestion_control"].expect, OneOf)
    assert isinstance(entries["kernel.core_pattern"].expect, Match)
    assert entries["kernel.core_pattern"].options.fix is False
    assert entries["net.ipv4.tcp_rmem"].expect.describe() == "4096 87380 16777216"
    assert [e.key for e in sysctl_entries(spec)] == sorted(entries)
    assert entries["net.core.rmem_max"].options.where == "spec.yaml:4"


def test_when_conditions(tmp_path: Path) -> None:
    spec = load(tmp_path, """\
        version: 1
        modules:
          nvidia_peermem: {state: loaded, when: infiniband}
          nouveau: {state: absent, when: not container}
    """)
    entries = {e.name: e for e in section(spec, "modules", ModulesSection).modules}
    assert str(entries["nvidia_peermem"].options.when) == "infiniband"
    assert str(entries["nouveau"].options.when) == "not container"


def test_severity_per_entry_defaults_to_normal(tmp_path: Path) -> None:
    spec = load(tmp_path, """\
        version: 1
        modules:
          nvidia: {state: loaded, severity: blocker}
          nouveau: absent
        cpuidle:
          disabled: [{name: C2, severity: minor}]
        dmesg: {severity: critical}
    """)
    modules = {e.name: e for e in section(spec, "modules", ModulesSection).modules}
    assert modules["nvidia"].options.severity == "blocker"
    assert modules["nouveau"].options.severity == "normal"
    assert section(spec, "cpuidle", CpuidleSection).states[0].options.severity == "minor"
    assert section(spec, "dmesg", DmesgSection).options.severity == "critical"


BAD_SPECS = [
    pytest.param("", "spec.yaml:1: the spec is empty", id="empty-file"),
    pytest.param("version: 1\n", "spec.yaml:1: the spec has no checks", id="only-version"),
    pytest.param("sysctl: {a.b: 1}\n", "spec.yaml:1: the spec needs 'version: 1'", id="no-version"),
    pytest.param("version: 2\nsysctl: {a.b: 1}\n", "spec.yaml:1: unsupported spec version 2",
                 id="version-2"),
    pytest.param("version: 1\nsysclt:\n  a.b: 1\n",
                 "spec.yaml:2: unknown section 'sysclt' (did you mean 'sysctl'?)",
                 id="unknown-section"),
    pytest.param("version: 1\nsysctl: [a]\n", "spec.yaml:2: sysctl must be a mapping, got a list",
                 id="section-type"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {min: 1, maxx: 10}\n",
                 "spec.yaml:3: unknown key 'maxx' in sysctl vm.swappiness (did you mean 'max'?)",
                 id="unknown-key"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: true\n",
                 "spec.yaml:3: sysctl vm.swappiness must be a string or an integer, got bool",
                 id="bool-value"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: 1.5\n",
                 "spec.yaml:3: sysctl vm.swappiness must be a string or an integer, got float",
                 id="float-value"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {min: 10, max: 1}\n",
                 "spec.yaml:3: sysctl vm.swappiness: min 10 is greater than max 1",
                 id="min-gt-max"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {value: 1, min: 1}\n",
                 "spec.yaml:3: sysctl vm.swappiness needs exactly one of value, min/max, one_of, "
                 "match; got value and min/max", id="two-forms"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {why: x}\n",
                 "needs exactly one of value, min/max, one_of, match; got none", id="no-form"),
    pytest.param("version: 1\nsysctl:\n  kernel.core_pattern: {match: '(unclosed'}\n",
                 "spec.yaml:3: sysctl kernel.core_pattern: match is not a valid regular expression",
                 id="bad-regex"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {min: abc}\n",
                 "spec.yaml:3: sysctl vm.swappiness: min/max need a value with an order: not an "
                 "integer", id="min-not-number"),
    pytest.param("version: 1\nsysctl:\n  kernel..x: 1\n", "spec.yaml:3: sysctl key 'kernel..x' "
                 "is not allowed", id="key-empty-part"),
    pytest.param("version: 1\nsysctl:\n  ../../etc/passwd: 1\n", "is not allowed",
                 id="key-dotdot"),
    pytest.param("version: 1\nsysctl:\n  /etc/shadow: 1\n", "is not allowed", id="key-absolute"),
    pytest.param("version: 1\nsysctl:\n  \"vm.swap piness\": 1\n", "without whitespace",
                 id="key-whitespace"),
    pytest.param("version: 1\nsysctl:\n  \"vm.swap\\0\": 1\n", "is not allowed", id="key-nul"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: 1\n  vm.swappiness: 2\n",
                 "spec.yaml:4: duplicate key 'vm.swappiness' in sysctl (first at line 3)",
                 id="duplicate-key"),
    pytest.param("version: 1\nmodules:\n  ../nvidia: loaded\n",
                 "spec.yaml:3: module name '../nvidia' is not allowed", id="module-dotdot"),
    pytest.param("version: 1\nmodules:\n  \"nvidia uvm\": loaded\n", "is not allowed",
                 id="module-whitespace"),
    pytest.param("version: 1\nmodules:\n  nvidia: present\n",
                 "spec.yaml:3: module nvidia: 'present' is not one of loaded, absent",
                 id="module-state"),
    pytest.param("version: 1\nmodules:\n  nvidia-uvm: loaded\n  nvidia_uvm: loaded\n",
                 "listed twice", id="module-twice"),
    pytest.param("version: 1\nmodules:\n  nvidia: {state: loaded, when: infiniband2}\n",
                 "spec.yaml:3: unknown condition 'infiniband2' for when (did you mean "
                 "'infiniband'?)", id="unknown-condition"),
    pytest.param("version: 1\npcie:\n  max_read_request: 1000\n",
                 "spec.yaml:3: pcie max_read_request: 1000 is not one of 128, 256, 512, 1024, "
                 "2048, 4096", id="mrrs-value"),
    pytest.param("version: 1\npcie:\n  max_read_request: {min: 8192}\n", "8192 is not one of",
                 id="mrrs-min"),
    pytest.param("version: 1\npcie:\n  max_read_request: {match: '4.*'}\n", "unknown key 'match'",
                 id="mrrs-match"),
    pytest.param("version: 1\npcie:\n  mrrs: 4096\n", "spec.yaml:3: unknown key 'mrrs' in pcie",
                 id="pcie-key"),
    pytest.param("version: 1\npcie:\n  max_link_speed: fast\n",
                 "spec.yaml:3: pcie max_link_speed: not a link speed", id="speed-value"),
    pytest.param("version: 1\ngpus:\n  count: eight\n", "spec.yaml:3: gpus count: not an integer",
                 id="gpu-count"),
    pytest.param("version: 1\ngpus:\n  cuont: 8\n", "unknown key 'cuont' in gpus", id="gpus-key"),
    pytest.param("version: 1\ncpuidle:\n  disabled: C2\n",
                 "spec.yaml:3: cpuidle disabled must be a list", id="cpuidle-not-list"),
    pytest.param("version: 1\ncpuidle:\n  disabled: []\n", "cpuidle disabled is empty",
                 id="cpuidle-empty"),
    pytest.param("version: 1\ncpuidle:\n  enabled: [C1]\n", "unknown key 'enabled' in cpuidle",
                 id="cpuidle-key"),
    pytest.param("version: 1\ncpuidle:\n  disabled: [C2, C2]\n", "listed twice",
                 id="cpuidle-twice"),
    pytest.param("version: 1\ncpuidle:\n  disabled: [{why: x}]\n", "needs 'name:'",
                 id="cpuidle-no-name"),
    pytest.param("version: 1\ndmesg:\n  levels: [err, loud]\n",
                 "spec.yaml:3: unknown log level 'loud'", id="dmesg-level"),
    pytest.param("version: 1\ndmesg:\n  since: yesterday\n",
                 "spec.yaml:3: dmesg since must be one of: boot, session", id="dmesg-since"),
    pytest.param("version: 1\ndmesg:\n  allow: ['[unclosed']\n",
                 "spec.yaml:3: a dmesg allow pattern is not a valid regular expression",
                 id="dmesg-regex"),
    pytest.param("version: 1\ndmesg:\n  allwo: []\n", "unknown key 'allwo' in dmesg",
                 id="dmesg-key"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {value: 1, fix: maybe}\n",
                 "spec.yaml:3: fix must be true or false", id="fix-type"),
    pytest.param("version: 1\nsysctl: {\n", "spec.yaml:3: not valid YAML", id="yaml-syntax"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {value: 1, severity: critcal}\n",
                 "spec.yaml:3: unknown severity 'critcal' (did you mean 'critical'?); expected "
                 "one of: blocker, critical, normal, minor, trivial", id="severity"),
    pytest.param("version: 1\nsysctl:\n\tvm.swappiness: 1\n",
                 "spec.yaml:3: not valid YAML: found character '\\t' that cannot start any token",
                 id="yaml-tab"),
    pytest.param("version: 1\nname: 'my spec'\nsysctl: {a.b: 1}\n",
                 "spec.yaml:2: name 'my spec' must be letters", id="name-chars"),
]


@pytest.mark.parametrize(("text", "message"), BAD_SPECS)
def test_bad_spec_names_file_line_and_expectation(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(SpecError) as excinfo:
        load(tmp_path, text)
    assert message in str(excinfo.value)
    assert str(excinfo.value).startswith("spec.yaml")


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="spec file not found"):
        load_spec(tmp_path / "nope.yaml", KINDS, CONDITIONS)


@pytest.mark.parametrize(("key", "path"), [
    ("kernel.numa_balancing", "proc/sys/kernel/numa_balancing"),
    ("net.ipv4.conf.eth0/100.rp_filter", "proc/sys/net/ipv4/conf/eth0.100/rp_filter"),
    ("net/ipv4/conf/eth0.100/rp_filter", "proc/sys/net/ipv4/conf/eth0.100/rp_filter"),
    ("vm.swappiness", "proc/sys/vm/swappiness"),
])
def test_sysctl_key_maps_like_tuned(key: str, path: str) -> None:
    assert sysctl_path(key) == path


@pytest.mark.parametrize("key", ["..", "a/../b", "/abs", "a..b", "a b", "a\0b", "a.", ""])
def test_sysctl_key_that_could_leave_the_root_is_refused(key: str) -> None:
    with pytest.raises(ValueError):
        sysctl_path(key)


@pytest.mark.parametrize("section", ["p2p:\n  floors: {same_numa: 45}\n",
                                     "dmesg:\n  since: boot\n"])
def test_every_section_takes_the_entry_options(tmp_path: Path, section: str) -> None:
    """One schema helper for every section: p2p took why/when but refused severity/fix."""
    name = section.split(":", 1)[0]
    text = section + "  severity: critical\n  why: it matters\n  fix: false\n"
    spec = load(tmp_path, f"version: 1\n{text}")
    found = spec.sections[name]
    assert isinstance(found, (P2pSection, DmesgSection)), found
    options = found.options
    assert (options.severity, options.why, options.fix) == ("critical", "it matters", False)


@pytest.mark.parametrize("section", ["p2p:\n  floors: {same_numa: 45}\n  florrs: 1\n",
                                     "dmesg:\n  sincee: boot\n"])
def test_an_unknown_section_key_says_what_was_meant(tmp_path: Path, section: str) -> None:
    with pytest.raises(SpecError, match=r":[34]: unknown key .* \(did you mean '(floors|since)'"
                                        r"\?\); expected one of: .*why, fix, when, severity"):
        load(tmp_path, f"version: 1\n{section}")


@pytest.mark.parametrize(("text", "meant"), [
    ("p2p:\n  floors: {same_numa: 45}\n  florrs: 1\n", "floors"),
    ("p2p:\n  floors: {same_numa: 45}\n  concurrent: {flor: 1}\n", "floor"),
    ("dmesg:\n  sincee: boot\n", "since"),
    ("cpuidle:\n  disabeld: [C2]\n", "disabled"),
    ("cpuidle:\n  disabled: [C2]\n  residency: {windw: 1s}\n", "window"),
    ("cpuidle:\n  disabled: [{nam: C2}]\n", "name"),
    ("pcie:\n  max_read_requst: 4096\n", "max_read_request"),
    ("pcie:\n  aer: {sinse: session}\n", "since"),
    ("pcie:\n  aspm: {valeu: off}\n", "value"),
    ("gpus:\n  cuont: 8\n", "count"),
    ("modules:\n  nvidia_uvm: {state: loaded, paramters: {uvm_disable_hmm: 'Y'}}\n",
     "parameters"),
    ("memory:\n  transparent_hugepages: madvise\n", "transparent_hugepage"),
    ("cpufreq:\n  govenor: performance\n", "governor"),
    ("iommu:\n  gpu_group: identity\n", "gpu_groups"),
    ("kernel:\n  relase: {min: '6.8'}\n", "release"),
    ("kernel:\n  cmdline: {hass: [iommu=pt]}\n", "has"),
    ("sysctl:\n  vm.swappiness: {mn: 1}\n", "min"),
])
def test_every_kind_says_unknown_keys_the_same_way(tmp_path: Path, text: str,
                                                   meant: str) -> None:
    """One schema helper: where, a "did you mean", and every key the place takes."""
    with pytest.raises(SpecError, match=rf"unknown key '\w+' in [^;]+ \(did you mean "
                                        rf"'{meant}'\?\); expected one of: .*{meant}"):
        load(tmp_path, f"version: 1\n{text}")
