"""Whole-plugin runs with pytester: verify, --fix, reports, exit codes, xdist, -p no:gpuhost."""

from __future__ import annotations

import json
import shutil
from glob import escape
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, counts, snapshot

pytest_plugins = ["pytester"]

SMALL_SPEC = """\
version: 1
name: small
dmesg:
  since: boot
  allow: ['vxlan: non-ECT from']
sysctl:
  vm.swappiness: {value: 10, why: keep weights in RAM}
  net.core.rmem_max: {min: 16777216}
modules:
  nvidia: loaded
"""


@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    """The bundled blackwell8 spec, copied beside the test run."""
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


@pytest.fixture
def fake_root(fake: FakeHost) -> Path:
    fake.sysctl("vm.nr_hugepages", 16)
    return fake.root


def row(kind: str, cells: str, detail: str = "") -> str:
    """A glob for one row of the summary table: the kind, its counts, then the keys (a glob)."""
    pattern = kind + "".join(f" *{escape(cell)}" for cell in cells.split())
    return pattern + (f"  {detail}" if detail else "")


def report(path: Path) -> dict[str, Any]:
    """The JSON report as loaded: JSON values, so a dict of Any."""
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def by_id(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in data["checks"]}


def test_verify_the_untuned_example_host(pytester: pytest.Pytester, spec: Path,
                                         example_host: Path) -> None:
    before = snapshot(example_host)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--gpuhost-report=out.json")
    result.assert_outcomes(passed=129, failed=115, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert snapshot(example_host) == before  # verification writes nothing
    result.stdout.fnmatch_lines([
        "*= gpuhost: blackwell8 on *blackwell8-untuned =*",
        "kind * checks  passed  failed  fixed  fix_failed  skipped",
        "sysctl  * 9       -       9      -           -        -",
    ])
    result.stdout.fnmatch_lines([
        row("gpus.persistence_mode", "8 - 8 - - -", "0000:01:00.0 *"),
        row("pcie.link_width", "8 8 - - - -"),
        row("pcie.max_link_speed", "8 8 - - - -"),
        row("pcie.max_payload", "8 8 - - - -"),
        row("pcie.max_read_request", "8 - 8 - - -",
            "0000:01:00.0 0000:21:00.0 0000:41:00.0 0000:61:00.0 0000:81:00.0 0000:a1:00.0 "
            "0000:c1:00.0 0000:e1:00.0"),
        row("iommu.gpu_groups", "8 - 8 - - -", "0000:01:00.0 *"),
        row("cpuidle", "1 - 1 - - -", "C2 cpus 0-63"),
        row("module", "4 2 2 - - -"),
        row("cpuidle.residency", "1 - - - - 1"),  # C2 is disabled nowhere yet
        row("module.parameter", "1 - 1 - - -"),
        row("p2p", "56 - 56 - - -"),  # ACS redirect on every root port: all pairs slow
        row("pcie.aer", "8 8 - - - -"),
        row("dmesg", "1 1 - - - -"),
        row("total", "246 129 115 - - 2"),
    ])
    result.stdout.fnmatch_lines([
        row("kernel.release", "1 - 1 - - -"),
        row("kernel.cmdline", "3 1 2 - - -"),
        row("cpufreq.boost", "1 1 - - - -"),
        row("cpufreq.driver", "1 - 1 - - -"),
        row("cpufreq.epp", "1 - - - - 1"),  # acpi-cpufreq has no EPP: not applicable
        row("cpufreq.governor", "1 - 1 - - -"),
        row("memory.transparent_hugepage", "1 - 1 - - -"),
    ], consecutive=True)
    result.stdout.fnmatch_lines([
        row("pcie.acs_redirect", "8 - 8 - - -",
            "0000:00:01.1 0000:20:01.1 0000:40:01.1 0000:60:01.1 0000:80:01.1 0000:a0:01.1 "
            "0000:c0:01.1 0000:e0:01.1"),  # not the NIC's root port 0000:80:03.1
        row("pcie.aspm", "8 8 - - - -"),
    ], consecutive=True)
    result.stdout.fnmatch_lines([escape(  # the bandwidth measurement shows progress
        "  p2p[0000:01:00.0->0000:21:00.0]: running nvbandwidth -j -b 256 -t "
        "device_to_device_memcpy_read_ce") + "*"])
    result.stdout.fnmatch_lines([
        "'1' != '0' (fixable: run with --fix)",
        escape("  FAILED sysctl[kernel.numa_balancing] at blackwell8.yaml:9"),
        "  expected  0",
        "  observed  1",
        "  why       automatic NUMA balancing *",
        "  read      proc/sys/kernel/numa_balancing: 1",
    ])
    data = report(pytester.path / "out.json")
    assert data["fix"] is False
    assert data["summary"] == {"passed": 129, "failed": 115, "fixed": 0, "fix_failed": 0,
                               "skipped": 2, "error": 0, "would_fix": 0, "reboot_required": 0}
    pair = by_id(data)["p2p[0000:01:00.0->0000:81:00.0]"]
    assert (pair["kind"], pair["key"], pair["observed"], pair["outcome"]) == (
        "p2p", "0000:01:00.0->0000:81:00.0", "17.12", "failed")  # 27.62 GB/s x ACS redirect
    assert pair["details"]["gbps"] == 17.12
    assert pair["details"]["class"] == "cross_numa"
    assert pair["details"]["floor"] == 32.0
    acs = by_id(data)["pcie.acs_redirect[0000:00:01.1]"]
    assert (acs["kind"], acs["key"], acs["outcome"]) == ("pcie.acs_redirect", "0000:00:01.1",
                                                         "failed")
    assert acs["observed"] == "on: ACSCtl 0x001d: ReqRedir+ CmpltRedir+ EgressCtrl-"
    assert acs["details"]["gpus"] == ["0000:01:00.0"]
    assert "(fixable: run with --fix)" in str(acs["message"])
    driver = by_id(data)["cpufreq.driver"]
    assert "a boot-time setting: --fix --fix-persist writes it" in str(driver["message"])
    check = by_id(data)["pcie.max_read_request[0000:81:00.0]"]
    assert {k: check[k] for k in ("kind", "key", "expected", "observed", "before", "after",
                                  "outcome")} == {
        "kind": "pcie.max_read_request", "key": "0000:81:00.0", "expected": "4096",
        "observed": "512", "before": None, "after": None, "outcome": "failed"}


def test_fix_the_example_host_reproduces_the_real_story(pytester: pytest.Pytester, spec: Path,
                                                        example_host: Path) -> None:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}",
                                "--fix", "--gpuhost-report=out.json", "-v")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    # The P2P pairs are measured after the fixes: with MaxReadReq 4096 and ACS redirect off
    # all 56 clear their floor. Boot-time settings need --fix-persist: they stay failed.
    assert counts(result) == {"passed": 185, "failed": 15, "fixed": 45, "skipped": 1}
    result.stdout.fnmatch_lines([
        escape("blackwell8.yaml::sysctl[kernel.numa_balancing] FIXED") + "*",
        escape("blackwell8.yaml::gpus.persistence_mode[0000:01:00.0] FIXED") + "*",
        escape("blackwell8.yaml::module[nvidia_peermem] FIX_FAILED") + "*",
        "--fix: 45 of 46 fixes applied",
        escape("  FIX_FAILED module[nvidia_peermem]: apply failed: modprobe -- nvidia_peermem "
               "exited 1: modprobe: ERROR: could not insert 'nvidia_peermem': Invalid argument"),
    ])
    checks = by_id(report(pytester.path / "out.json"))
    fixed = sorted(i for i, c in checks.items() if c["outcome"] == "fixed")
    assert len(fixed) == 45 and all(i.startswith(("sysctl", "pcie.max_read_request",
                                                  "gpus.persistence_mode", "cpuidle",
                                                  "module[nvidia_uvm]", "pcie.acs_redirect",
                                                  "gpus.power_limit", "cpufreq.governor",
                                                  "memory.transparent_hugepage"))
                                    for i in fixed)
    acs = checks["pcie.acs_redirect[0000:80:01.1]"]
    assert (acs["before"], acs["after"]) == (
        "on: ACSCtl 0x001d: ReqRedir+ CmpltRedir+ EgressCtrl-", "off")
    assert checks["module[nvidia_peermem]"]["outcome"] == "fix_failed"
    # The dmesg check ran last and saw what the failed load wrote to the kernel log.
    assert list(checks)[-1] == "dmesg"
    assert checks["dmesg"]["outcome"] == "failed"
    assert "Unknown symbol ib_register_peer_memory_client (err -22)" in json.dumps(
        checks["dmesg"]["evidence"])
    assert (example_host / "proc/sys/vm/swappiness").read_text() == "10\n"
    numa = checks["sysctl[kernel.numa_balancing]"]
    assert (numa["before"], numa["after"], numa["observed"]) == ("1", "0", "0")
    pair = checks["p2p[0000:01:00.0->0000:81:00.0]"]
    assert (pair["outcome"], pair["observed"]) == ("passed", "41.34")


def test_second_fix_is_idempotent_and_writes_nothing(pytester: pytest.Pytester, spec: Path,
                                                     example_host: Path) -> None:
    shutil.rmtree(example_host / "sys/class/infiniband")  # peermem is then not applicable
    (example_host / "proc/sys/kernel/osrelease").write_text("6.8.0-49-generic\n")
    args = [f"--gpuhost-spec={spec}", f"--gpuhost-root={example_host}", "--fix", "--fix-persist"]
    first = pytester.runpytest(*args)
    assert counts(first) == {"passed": 187, "fixed": 51, "skipped": 2, "reboot_required": 12}
    assert first.ret == pytest.ExitCode.TESTS_FAILED  # a reboot is still due
    tuned = snapshot(example_host)
    second = pytester.runpytest(*args)
    assert counts(second) == {"passed": 238, "skipped": 2, "reboot_required": 12}
    second.stdout.fnmatch_lines(["--fix: 0 of 0 fixes applied",
                                 "--fix-persist: 0 of 0 files written"])
    assert snapshot(example_host) == tuned


def test_spec_named_as_an_argument_and_ids_are_stable(pytester: pytest.Pytester,
                                                      example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    result = pytester.runpytest("small.yaml", f"--gpuhost-root={example_host}", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([
        escape("small.yaml::sysctl[net.core.rmem_max]"),
        escape("small.yaml::sysctl[vm.swappiness]"),
        escape("small.yaml::module[nvidia]"),
        "small.yaml::dmesg",
    ], consecutive=True)


def test_ini_twins(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    pytester.makeini(f"[pytest]\ngpuhost_spec = small.yaml\ngpuhost_root = {example_host}\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=2, failed=2)


def test_option_overrides_the_ini(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    pytester.makeini("[pytest]\ngpuhost_spec = small.yaml\ngpuhost_root = /does/not/exist\n")
    result = pytester.runpytest(f"--gpuhost-root={example_host}")
    result.assert_outcomes(passed=2, failed=2)
    bad = pytester.runpytest()
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["ERROR: gpuhost_root in *tox.ini=/does/not/exist: no such "
                              "directory*"])


def test_spec_beside_explicit_test_paths(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    pytester.makepyfile(test_bench="def test_benchmark():\n    assert True\n")
    result = pytester.runpytest("test_bench.py", "--gpuhost-spec=small.yaml",
                                f"--gpuhost-root={example_host}")
    result.assert_outcomes(passed=3, failed=2)


def test_spec_alone_when_no_paths_are_given(pytester: pytest.Pytester, example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    pytester.makepyfile(test_other="def test_other():\n    assert False\n")
    result = pytester.runpytest("--gpuhost-spec=small.yaml", f"--gpuhost-root={example_host}")
    result.assert_outcomes(passed=2, failed=2)


BAD = [
    pytest.param("version: 1\nsysclt: {a.b: 1}\n", [],
                 escape("ERROR: bad gpuhost spec: bad.yaml:2: unknown section 'sysclt' (did you "
                        "mean 'sysctl'?)") + "*", id="unknown-section"),
    pytest.param("version: 1\nsysctl:\n  vm.swappiness: {match: '('}\n", [],
                 "ERROR: bad gpuhost spec: bad.yaml:3: sysctl vm.swappiness: match is not a "
                 "valid regular expression*", id="bad-regex"),
    pytest.param("version: 1\npcie:\n  max_read_request: 8192\n", [],
                 "ERROR: bad gpuhost spec: bad.yaml:3: pcie max_read_request: 8192 is not one "
                 "of 128, 256, 512, 1024, 2048, 4096", id="mrrs"),
    pytest.param("", [], "ERROR: bad gpuhost spec: bad.yaml:1: the spec is empty*", id="empty"),
    pytest.param("version: 1\nsysctl:\n  ../../etc/shadow: 1\n", [],
                 "ERROR: bad gpuhost spec: bad.yaml:3: sysctl key '../../etc/shadow' is not "
                 "allowed*", id="escaping-key"),
    pytest.param(None, [], "ERROR: bad gpuhost spec: missing.yaml: spec file not found",
                 id="missing-spec"),
    pytest.param("version: 1\nsysctl: {vm.swappiness: 1}\n", ["--gpuhost-root=/no/such/dir"],
                 "ERROR: --gpuhost-root=/no/such/dir: no such directory*", id="missing-root"),
]


@pytest.mark.parametrize(("text", "extra", "line"), BAD)
def test_usage_errors_exit_4_with_one_clear_message(pytester: pytest.Pytester, text: str | None,
                                                    extra: list[str], line: str) -> None:
    name = "missing.yaml"
    if text is not None:
        pytester.makefile(".yaml", bad=text)
        name = "bad.yaml"
    result = pytester.runpytest(f"--gpuhost-spec={name}", *extra)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_fix_without_a_spec_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--fix")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --fix needs a spec: pass --gpuhost-spec=FILE*"])


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    plain = pytester.runpytest("-p", "no:gpuhost", "test_plain.py")
    plain.assert_outcomes(passed=1)
    refused = pytester.runpytest("-p", "no:gpuhost", "--gpuhost-spec=small.yaml")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*unrecognized arguments: --gpuhost-spec=small.yaml*"])


def test_without_a_spec_the_plugin_stays_out_of_the_way(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    pytester.makefile(".yaml", other="just: some yaml\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    assert "= gpuhost:" not in result.stdout.str()


def test_dmesg_runs_last_whatever_the_spec_order(pytester: pytest.Pytester,
                                                 example_host: Path) -> None:
    pytester.makefile(".yaml", small=SMALL_SPEC)
    result = pytester.runpytest("small.yaml", f"--gpuhost-root={example_host}", "-v")
    lines = [line for line in result.stdout.lines if line.startswith("small.yaml::")]
    assert lines[-1].startswith("small.yaml::dmesg PASSED")


def test_xdist_collects_identically_and_reports_once(pytester: pytest.Pytester, spec: Path,
                                                     example_host: Path, tmp_path: Path) -> None:
    serial_host = tmp_path / "serial"
    shutil.copytree(example_host, serial_host, symlinks=True)
    serial = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                           f"--gpuhost-root={serial_host}", "--fix",
                                           "--gpuhost-report=serial.json", "-p",
                                           "no:cacheprovider")
    parallel = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                             f"--gpuhost-root={example_host}", "--fix", "-n", "2",
                                             "--gpuhost-report=parallel.json", "-p",
                                             "no:cacheprovider")
    assert serial.ret == parallel.ret == pytest.ExitCode.TESTS_FAILED
    parallel.stdout.fnmatch_lines(["*2 workers*", "--fix: 45 of 46 fixes applied"])
    assert parallel.stdout.str().count("= gpuhost: blackwell8 on") == 1
    one, two = report(pytester.path / "serial.json"), report(pytester.path / "parallel.json")
    outcome = {i: c["outcome"] for i, c in by_id(one).items()}
    assert list(by_id(one)) == list(by_id(two))  # same checks, same order
    assert {i: c["outcome"] for i, c in by_id(two).items()} == outcome
    assert outcome["dmesg"] == "failed"  # it waited for the failed peermem load on the other worker
    assert one["summary"]["fixed"] == two["summary"]["fixed"] == 45


THIRD_PARTY = """
from dataclasses import dataclass

from pytest_gpuhost.checks import Check, Evidence, NoFix, Observation
from pytest_gpuhost.hookspecs import hookimpl
from pytest_gpuhost.specmodel.matchers import Integer
from pytest_gpuhost.specmodel import parse_expectation


@dataclass(frozen=True)
class HugepagesProbe(NoFix):
    def observe(self, host):
        value = host.read_text("proc/sys/vm/nr_hugepages").strip()
        return Observation(value, (Evidence("proc/sys/vm/nr_hugepages", value),))


class HugepagesKind:
    section = "hugepages"

    def parse(self, node, context):
        return parse_expectation(node, context, Integer(), what="hugepages")

    def expand(self, section, facts):
        expect, options = section
        return [Check("hugepages", None, expect, options, HugepagesProbe())]


@hookimpl
def pytest_gpuhost_check_kinds():
    return [HugepagesKind()]


@hookimpl
def pytest_gpuhost_conditions():
    return {"lab": lambda host: (host.exists("etc/lab"), "etc/lab exists")}
"""


def test_a_third_party_kind_and_condition_register_like_the_built_ins(
        pytester: pytest.Pytester, fake_root: Path) -> None:
    pytester.makeconftest(THIRD_PARTY)
    pytester.makefile(".yaml", spec="version: 1\nhugepages: {min: 1024, when: not lab}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake_root}", "-rs")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["16 < min 1024"])
    (fake_root / "etc").mkdir()
    (fake_root / "etc/lab").write_text("")
    skipped = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake_root}", "-rs")
    skipped.assert_outcomes(skipped=1)
    skipped.stdout.fnmatch_lines(["*when: not lab is false: etc/lab exists*"])


def test_a_conflicting_section_is_a_usage_error(pytester: pytest.Pytester,
                                                fake_root: Path) -> None:
    pytester.makeconftest(THIRD_PARTY.replace('section = "hugepages"', 'section = "sysctl"'))
    pytester.makefile(".yaml", spec="version: 1\nsysctl: {vm.swappiness: 1}\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake_root}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: two gpuhost check kinds claim section 'sysctl': "
                                 "pytest_gpuhost.checks.sysctl.SysctlKind and "
                                 "conftest.HugepagesKind"])


def test_an_unreadable_host_value_is_an_error_and_fails_the_run(pytester: pytest.Pytester,
                                                                fake: FakeHost) -> None:
    from pytest_gpuhost.testing.fakehost import config_space

    short = config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000)[:64]
    fake.pci_device("0000:01:00.0", vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                    config=short)
    pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"errors": 1}
    result.stdout.fnmatch_lines([escape("ERROR spec.yaml::pcie.max_read_request[0000:01:00.0]")
                                 + " - *"])
    assert "reads past 64 bytes of sysfs config need root" in result.stdout.str()


def test_a_gpu_whose_class_cannot_be_read_is_an_error_not_left_out(pytester: pytest.Pytester,
                                                                    fake: FakeHost) -> None:
    """An NVIDIA device whose class cannot be read may be a GPU: the GPU sections are errors
    that name the file, never a count of one GPU fewer; the other sections run as usual."""
    fake.gpu("0000:01:00.0", audio=False, max_read_request=4096)
    fake.gpu("0000:02:00.0", audio=False, max_read_request=4096)
    unreadable = fake.root / "sys/devices/pci0000:02/0000:02:00.0/class"
    unreadable.unlink()
    unreadable.mkdir()  # reading it fails with EISDIR: an error that is not "missing"
    fake.sysctls({"vm.swappiness": 10})
    pytester.makefile(".yaml", spec="version: 1\nsysctl: {vm.swappiness: 10}\ngpus: {count: 1}\n"
                                    "pcie:\n  max_read_request: 4096\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-rE")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"passed": 1, "errors": 2}
    result.stdout.fnmatch_lines([
        "whether NVIDIA device 0000:02:00.0 is a GPU is unknown: cannot read */host/sys/bus/pci/"
        "devices/0000:02:00.0/class: it is a directory, not a file",
        "  ERROR gpu_count at spec.yaml:3 *",
        "whether NVIDIA device 0000:02:00.0 is a GPU is unknown: *",
        "  ERROR pcie at spec.yaml:1"])


SERIALIZING = """
import json

def pytest_runtest_logreport(report):
    if report.when != "call" or not hasattr(report, "gpuhost"):
        return
    config = report_config[0]
    data = config.hook.pytest_report_to_serializable(config=config, report=report)
    text = json.dumps(data)  # what a report log or an xdist worker sends
    back = config.hook.pytest_report_from_serializable(config=config, data=json.loads(text))
    with open("serialized.jsonl", "a") as out:
        out.write(json.dumps({"sent": data["gpuhost"]["result"]["outcome"],
                              "back": back.gpuhost["result"].outcome.value,
                              "same": back.gpuhost["result"] == report.gpuhost["result"]}) + "\\n")

report_config = []

def pytest_configure(config):
    report_config.append(config)
"""


def test_a_check_report_leaves_the_process_as_json_and_comes_back_as_its_record(
        pytester: pytest.Pytester, fake_root: Path) -> None:
    """A run holds each record once (the report's is the item's); it crosses a process
    boundary (xdist, a report log) as a dict and is one record again on arrival."""
    pytester.makeconftest(SERIALIZING)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.nr_hugepages: 16\n"
                                    "  vm.swappiness: {value: 1}\n")
    fake = FakeHost(fake_root)
    fake.sysctl("vm.swappiness", 60)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake_root}")
    result.assert_outcomes(passed=1, failed=1)
    lines = [json.loads(line) for line in
             (pytester.path / "serialized.jsonl").read_text().splitlines()]
    assert sorted(line["sent"] for line in lines) == ["failed", "passed"]
    assert all(line["sent"] == line["back"] and line["same"] for line in lines)


PER_WORKER_KIND = '''
import os
import time
from pathlib import Path
from pytest_gpuhost.checks import Check, NoFix, Observation
from pytest_gpuhost.hookspecs import hookimpl
from pytest_gpuhost.specmodel import EntryOptions
from pytest_gpuhost.specmodel.matchers import Auto, Exact

HEARD = Path(__file__).parent / "heard-gw1"

class PerWorker(NoFix):
    def observe(self, host):
        # wrong on gw1; right on gw0, which answers only once the controller has gw1's report
        # (so that its pass is the last report of the check: bounded, the test's timeout is
        # longer)
        if os.environ.get("PYTEST_XDIST_WORKER") != "gw0":
            return Observation("0")
        deadline = time.monotonic() + 60
        while not HEARD.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return Observation("1")

def pytest_runtest_logreport(report):
    # the controller: gw1's report of the check has come in
    node = getattr(report, "node", None)
    if report.when == "teardown" and "per_worker" in report.nodeid and \
            getattr(getattr(node, "gateway", None), "id", "") == "gw1":
        HEARD.touch()

class PerWorkerKind:
    section = "per_worker"

    def parse(self, node, context):
        return node.where

    def expand(self, section, facts):
        return [Check("per_worker", None, Exact("1", Auto()), EntryOptions(where=section),
                      PerWorker())]

@hookimpl
def pytest_gpuhost_check_kinds():
    return [PerWorkerKind()]
'''


def test_under_dist_each_a_check_failed_on_one_worker_is_failed_in_the_reports(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """``--dist each`` runs every check on every worker: one that failed on gw1 and then
    passed on gw0 is failed in the JSON report (the last report of it had been the one kept)."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makeconftest(PER_WORKER_KIND)
    pytester.makefile(".yaml", spec="version: 1\nper_worker: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(
        "spec.yaml", f"--gpuhost-root={fake.root}", "-n", "2", "--dist", "each",
        "--gpuhost-report=out.json", "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert outcomes == {"per_worker": "failed", "sysctl[vm.swappiness]": "passed"}
