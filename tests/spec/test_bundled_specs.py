"""Bundled specs: shipped in the package, named by a bare name, listed in --help."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from pytest_gpuhost import bundled

from ..conftest import BLACKWELL8, REPO, assert_valid_junit, crash_worker_at

pytest_plugins = ["pytester"]

SMALL = "version: 1\nname: mine\nsysctl:\n  vm.swappiness: 10\n"


def test_the_bundled_specs_are_the_package_s_yaml_files() -> None:
    assert bundled.names() == ["blackwell8"]
    assert bundled.find("blackwell8") == BLACKWELL8
    assert bundled.find("blackwell9") is None


def test_the_checkout_copy_is_the_bundled_spec() -> None:
    """specs/blackwell8.yaml stays for paths that name it in a checkout (bench/ reads it)."""
    copy = (REPO / "specs" / "blackwell8.yaml").read_text()
    header, _, rest = copy.partition("\n# Tuning")
    assert header.startswith("# A copy of pytest_gpuhost/bundled/blackwell8.yaml"), header
    assert "# Tuning" + rest == BLACKWELL8.read_text(), (
        "specs/blackwell8.yaml differs from pytest_gpuhost/bundled/blackwell8.yaml: edit the "
        "bundled one, then copy it below the two header lines")


def test_a_bare_name_runs_the_bundled_spec(pytester: pytest.Pytester,
                                           example_host: Path) -> None:
    result = pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                                "--gpuhost-report=r.json", "--co", "-q")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["blackwell8.yaml::sysctl[[]kernel.nmi_watchdog]",
                                 "246 tests collected*"])
    run = pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                             "--gpuhost-report=r.json", "-m", "not gpuhost_slow")
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["spec_name"] == "blackwell8" and report["spec"] == str(BLACKWELL8)
    assert run.ret == pytest.ExitCode.TESTS_FAILED  # the untuned host


def test_a_file_of_that_name_wins_over_the_bundled_spec(pytester: pytest.Pytester,
                                                        example_host: Path) -> None:
    (pytester.path / "blackwell8").write_text(SMALL)
    result = pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                                "--co", "-q")
    result.stdout.fnmatch_lines(["blackwell8::sysctl[[]vm.swappiness]", "1 test collected*"])


def ids(result: pytest.RunResult) -> list[str]:
    return [line for line in result.stdout.lines if "::" in line]


def test_a_bundled_spec_s_ids_do_not_depend_on_where_the_package_is(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """The same ids whether the package lies outside the rootdir (an installed package) or
    under it (this checkout as the rootdir): the file name, never a venv's path, so that JUnit
    classnames, Allure's history and --deselect hold across hosts, venvs and Pythons."""
    args = ["--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}", "--co", "-q"]
    outside = pytester.runpytest(*args)
    under = pytester.runpytest(*args, f"--rootdir={REPO}")
    assert ids(outside) == ids(under) and len(ids(outside)) == 246
    assert all(i.startswith("blackwell8.yaml::") for i in ids(outside))
    assert not any(str(BLACKWELL8.parent) in line for line in outside.stdout.lines)


def test_a_bundled_spec_s_check_is_selected_and_deselected_by_its_id(
        pytester: pytest.Pytester, example_host: Path) -> None:
    spec = ["--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}"]
    chosen = pytester.runpytest(*spec, "blackwell8.yaml::dmesg",
                                "blackwell8.yaml::sysctl[vm.swappiness]", "-rA", "--junitxml=j.xml")
    chosen.stdout.fnmatch_lines(["PASSED blackwell8.yaml::dmesg",
                                 "FAILED blackwell8.yaml::sysctl[[]vm.swappiness]*",
                                 "*1 failed, 1 passed*"])
    junit = (pytester.path / "j.xml").read_text()
    assert junit.count('classname="blackwell8.yaml"') == 2, junit
    assert_valid_junit(pytester.path / "j.xml")
    rest = pytester.runpytest(*spec, "--deselect", "blackwell8.yaml::dmesg", "--co", "-q")
    rest.stdout.fnmatch_lines(["245/246 tests collected (1 deselected)*"])


def test_a_copy_of_a_bundled_spec_at_the_top_of_the_rootdir_has_its_ids(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """Copying the bundled spec next to your tests keeps every id; run beside the bundled one
    (two specs), the bundled one is named by its path, so no two checks share an id."""
    shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml")
    root = f"--gpuhost-root={example_host}"
    copy = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", root, "--co", "-q")
    bundled = pytester.runpytest("--gpuhost-spec=blackwell8", root, "--co", "-q")
    assert ids(copy) == ids(bundled) and len(ids(copy)) == 246
    both = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", "--gpuhost-spec=blackwell8",
                              root, "--co", "-q")
    assert len(set(ids(both))) == 2 * 246
    assert sum(i.startswith(f"{BLACKWELL8}::") for i in ids(both)) == 246


def test_the_ini_names_a_bundled_spec_too(pytester: pytest.Pytester,
                                          example_host: Path) -> None:
    pytester.makeini(f"[pytest]\ngpuhost_spec = blackwell8\ngpuhost_root = {example_host}\n")
    result = pytester.runpytest("--co", "-q")
    result.stdout.fnmatch_lines(["246 tests collected*"])


@pytest.mark.parametrize(("given", "line"), [
    ("blackwell9", "ERROR: --gpuhost-spec=blackwell9: no such file, and no bundled spec of "
                   "that name; the bundled specs: blackwell8 (or name a YAML file)"),
    # still a file, never the bundled spec; but the message names the bundled one
    ("blackwell8.yaml", "ERROR: --gpuhost-spec=blackwell8.yaml: no such file here (*); the "
                        "bundled spec of that name runs as --gpuhost-spec=blackwell8 (a bundled "
                        "spec is named without .yaml)"),
    ("specs/blackwell8", "ERROR: bad gpuhost spec: specs/blackwell8: spec file not found"),
], ids=["unknown-name", "yaml-suffix-is-a-file", "a-path-is-a-file"])
def test_an_unknown_name_is_exit_4_listing_the_bundled_specs(pytester: pytest.Pytester,
                                                             given: str, line: str) -> None:
    """Only a bare name (no '/', no .yaml suffix) is looked up among the bundled specs."""
    result = pytester.runpytest(f"--gpuhost-spec={given}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([line])


def test_an_unknown_name_in_the_ini_names_the_ini(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpuhost_spec = nope\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gpuhost_spec in *tox.ini=nope: no such file, and no "
                                 "bundled spec of that name; the bundled specs: blackwell8*"])


def test_help_lists_the_bundled_specs(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = " ".join(result.stdout.str().split())
    assert "--gpuhost-spec=FILE|NAME spec of the host's tuning: a YAML file, or the name of " \
           "a bundled spec (blackwell8)" in text


def test_the_wheel_ships_the_bundled_specs_and_data(tmp_path: Path) -> None:
    """Built as pip builds it (not editable): the data files are in it, and the bundled spec
    is found from the unpacked package."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "pytest_gpuhost", source / "pytest_gpuhost",
                    ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v", "-w",
                            str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    if built.returncode != 0 and "setuptools" in built.stderr and "No matching" in built.stderr:
        pytest.skip(f"no setuptools>=77 to build with: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr
    [wheel] = (tmp_path / "dist").glob("pytest_gpuhost-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next(archive.read(n).decode() for n in names if n.endswith("/METADATA"))
        archive.extractall(tmp_path / "unpacked")
    assert {"pytest_gpuhost/bundled/blackwell8.yaml", "pytest_gpuhost/capture/catalog.yaml",
            "pytest_gpuhost/fleet/page.js", "pytest_gpuhost/fleet/page.css"} <= names
    assert "License-Expression: Apache-2.0" in metadata.splitlines()
    assert "project.license" not in built.stdout + built.stderr  # no deprecation warning
    found = subprocess.run(
        [sys.executable, "-c",
         "from pytest_gpuhost import bundled; print(bundled.find('blackwell8'))"],
        cwd=tmp_path / "unpacked", capture_output=True, text=True, timeout=60, check=True)
    assert found.stdout.strip() == str(tmp_path / "unpacked/pytest_gpuhost/bundled/blackwell8.yaml")


def test_under_xdist_a_bundled_spec_s_check_whose_worker_died_is_in_the_report(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """The controller knows the checks a worker collected by their ids' file part: for a
    bundled spec that is its file name, not a path under the rootdir."""
    crasher = crash_worker_at(pytester, "blackwell8.yaml::sysctl[vm.swappiness]")
    result = pytester.runpytest_subprocess(
        *crasher, "--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}", "-n", "2",
        "-m", "not gpuhost_slow", "--gpuhost-report=out.json", "-p", "no:cacheprovider",
        "--max-worker-restart=4", timeout=120)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    report = json.loads((pytester.path / "out.json").read_text())
    outcomes = {check["id"]: check["outcome"] for check in report["checks"]}
    assert len(outcomes) == 190
    assert outcomes["sysctl[vm.swappiness]"] == "error"
    assert outcomes["kernel.release"] == "failed"  # re-queued after the crash, and run
