"""The fleet view: merging the JSON reports of separate runs, the terminal matrix, drift, the
HTML page from a run (--gpuhost-fleet-html) and the Prometheus series of observed values."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.fleet import FleetRow, read_reports, targets_of_report
from pytest_gpuhost.fleet.drift import NO_VALUE, find_drift
from pytest_gpuhost.fleet.matrix import cell, drift_lines, matrix_lines
from pytest_gpuhost.fleet.page import page_data, render
from pytest_gpuhost.reports import RunInfo
from pytest_gpuhost.reports.jsonfile import json_report
from pytest_gpuhost.reports.prometheus import textfile
from pytest_gpuhost.result import CheckResult, Outcome
from pytest_gpuhost.testing.fakehost import blackwell8_untuned

from ..conftest import BLACKWELL8, REPO
from ..reports.test_reports import parse_exposition
from ..runner import run_spec

pytest_plugins = ["pytester"]

FLEET_SPEC = """\
version: 1
sysctl:
  vm.swappiness: 10
  net.core.rmem_max: {min: 16777216}
gpus:
  count: 8
  driver_version: {min: "580.0"}
pcie:
  max_read_request: 4096
  max_link_speed: {min: "16.0 GT/s", why: "Gen4 or better"}
modules: {nvidia: loaded, nouveau: absent}
"""


def tuned_node(tmp_path: Path, name: str, *, gen4: bool = False, driver: str | None = None,
               swappiness: int = 10) -> Path:
    """The root of a blackwell8 box named ``name``, tuned for FLEET_SPEC, with its own
    deviations."""
    root = tmp_path / name
    blackwell8_untuned(root, cpus=4)
    (root / "proc/sys/kernel/hostname").write_text(f"{name}\n")
    for key, value in (("vm/swappiness", swappiness), ("net/core/rmem_max", 16777216)):
        (root / "proc/sys" / key).write_text(f"{value}\n")
    for config in root.glob("sys/devices/*/*/0000:*:00.0/config"):
        data = bytearray(config.read_bytes())
        data[0x78 + 9] = (data[0x78 + 9] & 0x8F) | (5 << 4)  # MaxReadReq 4096
        config.write_bytes(bytes(data))
    if gen4:
        [speed] = root.glob("sys/devices/*/*/0000:81:00.0/max_link_speed")
        speed.write_text("16.0 GT/s PCIe\n")
    if driver:
        (root / "var/lib/pytest-gpuhost/nvml/driver_version").write_text(f"{driver}\n")
    return root


def node(tmp_path: Path, name: str, *, gen4: bool = False, driver: str | None = None,
         swappiness: int = 10) -> Path:
    """A blackwell8 box named ``name``, tuned, with its own deviations; returns its report."""
    root = tuned_node(tmp_path, name, gen4=gen4, driver=driver, swappiness=swappiness)
    spec = tmp_path / "fleet.yaml"
    spec.write_text(FLEET_SPEC)
    done = run_spec([Path("fleet.yaml")], root, workdir=tmp_path)
    info = RunInfo(specs=(("fleet.yaml", "fleet"),), root=str(root), hostname=name,
                   kernel="6.5.0-44-generic", driver=driver or "580.95.05",
                   gpus=tuple(f"gpu{i}" for i in range(8)))
    report = tmp_path / f"{name}.json"
    report.write_text(json.dumps(json_report(done.records, info)))
    return report


@pytest.fixture(scope="module")
def fleet_reports(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four nodes: two alike, one trained at Gen4 on one GPU and on a newer driver (both pass
    the spec), one with swappiness 60 (fails); a fifth report missing, a sixth unreachable."""
    tmp_path = tmp_path_factory.mktemp("fleet")
    reports = [node(tmp_path, "node01"), node(tmp_path, "node02"),
               node(tmp_path, "node03", gen4=True, driver="580.105.08"),
               node(tmp_path, "node04", swappiness=60)]
    unreachable = json.loads(reports[0].read_text())
    unreachable["host"] = "node06"
    for record in unreachable["checks"]:
        record.update(outcome="error", observed=None,
                      message="ssh: connect to host node06 port 22: No route to host")
    (tmp_path / "node06.json").write_text(json.dumps(unreachable))
    return [*reports, tmp_path / "node05.json", tmp_path / "node06.json"]


def test_reports_merge_into_one_row_per_node_none_missing(fleet_reports: list[Path]) -> None:
    targets = read_reports(fleet_reports)
    assert [t.name for t in targets] == ["node01", "node02", "node03", "node04", "node05",
                                         "node06"]
    assert [t.healthy for t in targets] == [True, True, True, False, False, False]
    assert targets[4].reason == f"{fleet_reports[4]}: no such report"
    assert targets[5].reason == ("every check is an error: ssh: connect to host node06 port 22: "
                                 "No route to host")
    assert len(targets[0].records) == len(targets[3].records) == 23


def test_drift_groups_targets_by_value_majority_first(fleet_reports: list[Path]) -> None:
    drifts = {d.id: d for d in find_drift(read_reports(fleet_reports))}
    speed = drifts["pcie.max_link_speed[0000:81:00.0]"]
    assert [(g.value, g.targets) for g in speed.groups] == [
        ("32.0 GT/s PCIe", ("node01", "node02", "node04")), ("16.0 GT/s PCIe", ("node03",))]
    assert speed.minority == ("node03",) and speed.all_pass  # drift where every value passes
    driver = drifts["gpus.driver_version"]
    assert driver.majority.value == "580.95.05" and driver.minority == ("node03",)
    assert driver.all_pass and driver.spec == "fleet.yaml"
    swappiness = drifts["sysctl[vm.swappiness]"]
    assert swappiness.minority == ("node04",) and not swappiness.all_pass
    assert not swappiness.groups[1].passes and swappiness.groups[0].passes
    assert "pcie.max_link_speed[0000:01:00.0]" not in drifts  # one value everywhere
    assert all("node05" not in d.minority and "node06" not in d.minority for d in drifts.values())


@pytest.mark.parametrize("folders", [("bundled", "bundled"), ("specs", "bundled")],
                         ids=["one-version", "a-node-before-the-rename-of-bundled"])
def test_a_bundled_spec_is_one_spec_across_installs(tmp_path: Path,
                                                    folders: tuple[str, str]) -> None:
    """Two nodes' reports of the bundled spec, installed under two Pythons: their checks are the
    same checks, so a value that differs is drift (it was two specs, each holding one value).
    So too where one node runs a version from before the bundled specs' folder was renamed
    (``pytest_gpuhost/specs``, now ``pytest_gpuhost/bundled``): a fleet upgrades node by node."""
    folder = dict(zip(("node01", "node02"), folders, strict=True))

    def report(name: str, site: str, swappiness: str) -> dict[str, Any]:
        location = f"{site}/pytest_gpuhost/{folder[name]}/blackwell8.yaml:14"
        return {"host": name, "checks": [
            {"id": "sysctl[vm.swappiness]", "kind": "sysctl", "key": "vm.swappiness",
             "observed": swappiness, "outcome": "passed" if swappiness == "10" else "failed",
             "location": location}]}
    reports = []
    for name, site, value in (("node01", "/opt/gpuhost/lib/python3.11/site-packages", "10"),
                              ("node02", "/usr/lib/python3.12/site-packages", "60")):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(report(name, site, value)))
        reports.append(path)
    [drift] = find_drift(read_reports(reports))
    assert drift.spec == "blackwell8.yaml" and drift.minority == ("node02",)


def test_the_terminal_matrix_shows_counts_failing_keys_and_no_result(
        fleet_reports: list[Path]) -> None:
    lines = matrix_lines(read_reports(fleet_reports))
    assert lines[0] == "fleet: 6 targets: 3 healthy, 1 with problems, 2 no result"
    header = lines[3].split()
    assert header == ["target", "sysctl", "gpus", "pcie", "modules"]
    rows = {line.split()[0]: line for line in lines[4:]}
    assert rows["node01"].split()[1:] == ["ok", "2", "ok", "3", "ok", "16", "ok", "2"]
    assert rows["node04"].split()[1:4] == ["F", "vm.swappiness", "ok"]
    assert "no result: " in rows["node05"] and "no such report" in rows["node05"]
    assert "no result: every check is an error: ssh: connect to host node06" in rows["node06"]


def test_a_cell_shows_counts_once_more_than_two_keys_fail() -> None:
    def rec(key: str, outcome: str) -> dict[str, str]:
        return {"id": f"pcie.aspm[0000:{key}:00.0]", "kind": "pcie.aspm", "section": "pcie",
                "outcome": outcome}

    assert cell([]) == "-"
    assert cell([rec("01", "passed"), rec("02", "skipped")]) == "ok 2"
    assert cell([rec("01", "failed"), rec("02", "passed")]) == "F aspm[01:00.0]"
    assert cell([rec("01", "failed"), rec("02", "error"), rec("03", "failed"),
                 rec("04", "passed")]) == "2F 1E /4"


def test_the_cli_prints_the_matrix_and_drift_and_writes_the_page(
        fleet_reports: list[Path], tmp_path: Path) -> None:
    page = tmp_path / "fleet.html"
    done = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet", *map(str, fleet_reports),
                           "--html", str(page)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 1, done.stderr  # node04 fails, node05 and node06 gave nothing
    out = done.stdout
    assert "fleet: 6 targets: 3 healthy, 1 with problems, 2 no result" in out
    assert ("fleet.yaml::pcie.max_link_speed[0000:81:00.0]: '32.0 GT/s PCIe'* on 3; "
            "'16.0 GT/s PCIe'* on node03") in out
    assert "fleet.yaml::sysctl[vm.swappiness]: '10'* on 3; '60' on node04" in out
    assert f"fleet page: {page}" in out
    text = page.read_text()
    assert "<script src" not in text and "http://" not in text and "https://" not in text
    healthy = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet",
                              *map(str, fleet_reports[:3])], capture_output=True, text=True,
                             timeout=120, cwd=REPO)
    assert healthy.returncode == 0, healthy.stdout
    usage = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet"], capture_output=True,
                           text=True, timeout=120, cwd=REPO)
    assert usage.returncode == 2 and "REPORT.json" in usage.stderr


def test_a_directory_stands_for_its_reports(fleet_reports: list[Path]) -> None:
    targets = read_reports([fleet_reports[0].parent])
    assert [t.name for t in targets] == ["node01", "node02", "node03", "node04", "node06"]


def test_unreadable_reports_are_rows_of_no_result(tmp_path: Path) -> None:
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text('{"tool": "something else"}')
    (tmp_path / "empty.json").write_text('{"host": "n9", "checks": []}')
    targets = read_reports(sorted(tmp_path.glob("*.json")))
    reasons = {t.name: t.reason or "" for t in targets}
    assert reasons["garbage"].endswith("not JSON: Expecting property name enclosed in double "
                                       "quotes: line 1 column 2 (char 1)")
    assert reasons["list"].endswith("not a pytest-gpuhost report")
    assert reasons["other"].endswith("not a pytest-gpuhost report (no 'checks' list)")
    assert reasons["n9"] == "no check reported for it"
    assert not any(t.healthy for t in targets)


def _record(target: str | None, observed: str, outcome: str = "passed") -> dict[str, Any]:
    found = {"id": "sysctl[a]", "kind": "sysctl", "key": "a", "observed": observed,
             "outcome": outcome, "location": "s.yaml:3", "message": ""}
    return found if target is None else {**found, "target": target}


def test_a_multi_target_report_is_one_row_per_target() -> None:
    """Reports of a run over several targets: each record names its target; a listed target
    without records (unreachable) is a row of no result with its error."""
    data = {"host": "controller", "targets": [{"name": "a"}, {"name": "b"},
                                              {"name": "c", "error": "ssh: timed out"}],
            "checks": [_record("a", "1"), _record("b", "2"), _record("a", "x", "failed")]}
    rows = targets_of_report(data, "run.json")
    assert [(t.name, len(t.records), t.reason) for t in rows] == [
        ("a", 2, None), ("b", 1, None), ("c", 0, "ssh: timed out")]
    plain = targets_of_report({"host": "n1", "checks": [_record(None, "1")]}, "n1.json")
    assert [(t.name, len(t.records)) for t in plain] == [("n1", 1)]


def test_a_run_over_several_targets_is_one_row_each_none_missing() -> None:
    """As the JSON report of a run writes its targets: ``hostname`` says what the target calls
    itself; ``unreachable`` is the reason a target gave no result."""
    data = {"host": "controller",
            "targets": [{"name": "a", "hostname": "gpu-a", "kernel": "6.8.0"},
                        {"name": "b", "hostname": "gpu-b"},
                        {"name": "c", "unreachable": "ssh: Connection refused"},
                        {"name": "d"}],
            "checks": [_record("a", "1"), _record("b", "2"),
                       {**_record("c", "x", "error"), "message": "ssh: Connection refused"}]}
    rows = targets_of_report(data, "this run")
    assert [(t.name, len(t.records), t.reason) for t in rows] == [
        ("a", 1, None), ("b", 1, None), ("c", 1, "ssh: Connection refused"),
        ("d", 0, "no check reported for it")]
    assert (rows[0].facts["host"], rows[0].facts["kernel"]) == ("gpu-a", "6.8.0")
    assert rows[3].facts["host"] is None  # said nothing of itself: not the controller's name


def test_the_same_node_twice_is_two_rows(tmp_path: Path) -> None:
    for name in ("first", "second"):
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"host": "n1", "checks": [_record(None, name)]}))
    targets = read_reports([tmp_path / "first.json", tmp_path / "second.json"])
    assert [t.name for t in targets] == ["n1", f"n1 ({tmp_path / 'second.json'})"]


def test_drift_leaves_measurements_out_and_counts_no_value() -> None:
    """A record says it is a measurement (``measured``); one of a report that predates the
    field is taken as its kind's other records say."""
    def rows(name: str, gbps: str, observed: str | None, *, legacy: bool = False) -> FleetRow:
        said = {} if legacy else {"measured": True, "section": "p2p"}
        return FleetRow(name, "x", ({"id": "p2p[a->b]", "kind": "p2p", "observed": gbps,
                                   "outcome": "passed", "location": "s.yaml:9", **said},
                                  {"id": "sysctl[k]", "kind": "sysctl", "observed": observed,
                                   "outcome": "failed" if observed is None else "passed",
                                   "location": "s.yaml:3"}))

    drifts = find_drift([rows("n1", "41.07", "1"), rows("n2", "41.43", "1", legacy=True),
                         rows("n3", "40.99", None, legacy=True)])
    assert [(d.id, d.minority, d.groups[1].value) for d in drifts] == [
        ("sysctl[k]", ("n3",), NO_VALUE)]
    assert drift_lines([], 20) == ["drift: every check holds one value on every target"]
    legacy = find_drift([rows("n2", "41.43", "1", legacy=True), rows("n3", "40.99", "1",
                                                                     legacy=True)])
    assert [d.id for d in legacy] == ["p2p[a->b]"]  # nothing says it is a measurement


def test_the_page_data_holds_each_string_once(fleet_reports: list[Path]) -> None:
    targets = read_reports(fleet_reports)
    data = page_data(targets, find_drift(targets), "t")
    assert len(data["strings"]) == len(set(data["strings"]))
    assert [row[0] for row in data["targets"]] == [t.name for t in targets]
    assert all(len(row[3]) == 7 * len(t.records) for row, t in zip(data["targets"], targets,
                                                                  strict=True))
    text = render(targets, find_drift(targets), "a </script> title")
    assert "a &lt;/script&gt; title" in text and text.count("</script>") == 2


def test_fleet_html_from_a_run(pytester: pytest.Pytester, example_host: Path) -> None:
    shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml")
    result = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", f"--gpuhost-root={example_host}",
                                "--gpuhost-fleet-html=fleet.html", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    text = (pytester.path / "fleet.html").read_text()
    blob = text.split('<script type="application/json" id="fleet-data">', 1)[1]
    data = json.loads(blob.split("</script>", 1)[0].replace("<\\/", "</"))
    [row] = data["targets"]
    assert row[1] == -1 and len(row[3]) == 7 * 246  # one target, every check, a result
    causes = {data["strings"][row[3][i + 6]] for i in range(0, len(row[3]), 7)
              if row[3][i + 6] >= 0}  # each P2P pair's top cause, for its cell's tooltip
    assert causes and all(c.startswith("acs_redirect at 0000:") for c in causes)
    assert data["title"] == "pytest-gpuhost: blackwell8"
    usage = pytester.runpytest("--gpuhost-fleet-html=fleet.html")
    assert usage.ret == pytest.ExitCode.USAGE_ERROR
    assert "--gpuhost-fleet-html needs a spec" in usage.stderr.str()


def test_prometheus_has_the_observed_values_that_are_not_numbers() -> None:
    records = [
        CheckResult("gpus.driver_version", "gpus.driver_version", None, ">= 580.0", "580.95.05",
                    Outcome.PASSED, "", location="specs/b8.yaml:12"),
        CheckResult("pcie.max_link_speed[0000:81:00.0]", "pcie.max_link_speed", "0000:81:00.0",
                    "32.0 GT/s", '16.0 GT/s "PCIe"\n', Outcome.FAILED, "",
                    location="specs/b8.yaml:20"),
        CheckResult("sysctl[vm.swappiness]", "sysctl", "vm.swappiness", "10", "10",
                    Outcome.PASSED, "", location="specs/b8.yaml:3"),
        CheckResult("dmesg", "dmesg", None, "0", None, Outcome.ERROR, "", location="b8.yaml:9"),
    ]
    metrics = parse_exposition(textfile(records, specs=["specs/b8.yaml"], timestamp=1.0))
    info = metrics["gpuhost_observed_info"]
    assert info == [
        ({"target": "local", "spec": "b8", "spec_file": "specs/b8.yaml",
          "kind": "gpus.driver_version", "key": "", "value": "580.95.05"}, 1.0),
        ({"target": "local", "spec": "b8", "spec_file": "specs/b8.yaml",
          "kind": "pcie.max_link_speed", "key": "0000:81:00.0",
          "value": '16.0 GT/s "PCIe"\n'}, 1.0)]
    assert [labels["key"] for labels, _ in metrics["gpuhost_check_observed"]] == ["vm.swappiness"]
    assert set(metrics["gpuhost_check_ok"][0][0]) == {"spec", "spec_file", "kind", "key"}


def test_a_lone_surrogate_in_a_report_is_written_to_the_page(tmp_path: Path) -> None:
    """A run's JSON report keeps a target's undecodable byte as ``\\udcff`` (valid JSON, no
    UTF-8 text): the fleet page of such reports is written, the value readable back as it was,
    not lost to an encoding error that loses the whole page."""
    report = tmp_path / "n1.json"
    report.write_text('{"host": "n1", "checks": [{"id": "sysctl[a]", "kind": "sysctl", '
                      '"observed": "x\\udcffy", "outcome": "failed", "location": "s.yaml:3", '
                      '"message": "m"}]}')
    page = tmp_path / "fleet.html"
    done = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet", str(report),
                           "--html", str(page)], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert done.returncode == 1, done.stderr
    text = page.read_text(encoding="utf-8")
    blob = text.split('<script type="application/json" id="fleet-data">', 1)[1]
    data = json.loads(blob.split("</script>", 1)[0])
    assert "x\udcffy" in data["strings"]
