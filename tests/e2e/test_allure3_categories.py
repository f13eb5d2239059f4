"""Allure 3 (the version CI pins) reads categories from its configuration, not from
the results' categories.json (only its classic and allure2 plugins read that). The run writes
``allurerc.json`` beside the results; the real Allure 3 CLI, given it with ``--config``, files
every check under its category: fixed ones included (a passed test to pytest), would_fix with a
category of its own.

Needs the Allure CLI (the npm package ``allure``, installed by .ci/run into .tools/allure, or an
``allure`` on PATH); skipped, saying so, without it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ..conftest import BLACKWELL8, EXAMPLE_HOST
from .test_allure_browser import ALLURE

pytestmark = pytest.mark.skipif(ALLURE is None, reason="no Allure CLI: .ci/run installs the npm "
                                "package allure into .tools/allure (or put allure on PATH)")


def generate(results: Path, report: Path, cwd: Path) -> dict[str, list[str]]:
    """Allure 3's report of ``results`` with the run's own configuration: check -> the
    categories Allure filed it under."""
    assert ALLURE is not None
    subprocess.run([ALLURE, "generate", "--config", str(results / "allurerc.json"),
                    str(results), "-o", str(report)], check=True, capture_output=True,
                   timeout=300, cwd=cwd)
    found: dict[str, list[str]] = {}
    for path in (report / "data" / "test-results").glob("*.json"):
        data = json.loads(path.read_text())
        found[data["name"]] = [c["name"] for c in data.get("categories") or []]
    return found


def test_allure3_files_each_check_under_its_category(pytester: pytest.Pytester,
                                                     tmp_path: Path) -> None:
    shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml")
    host = tmp_path / "host"
    shutil.copytree(EXAMPLE_HOST, host, symlinks=True)
    pytester.runpytest("--gpuhost-spec=blackwell8.yaml", f"--gpuhost-root={host}", "--fix",
                       "--fix-persist", "--alluredir=fix", "-p", "no:cacheprovider")
    fixed = generate(pytester.path / "fix", tmp_path / "fix-report", pytester.path)
    assert len(fixed) == 246 + 6  # and the --fix-persist files, each a test of its own
    assert fixed["sysctl[vm.swappiness]"] == ["Fixed by --fix"]
    assert fixed["module[nvidia_peermem]"] == ["Fix failed"]
    assert fixed["dmesg"] == ["Hardware fault"]
    assert fixed["kernel.cmdline[iommu=pt]"] == ["Reboot required"]
    assert fixed["kernel.release"] == ["Mis-tuned"]
    assert fixed["gpu_count"] == []  # passed as it was: no category

    fresh = tmp_path / "fresh"
    shutil.copytree(EXAMPLE_HOST, fresh, symlinks=True)
    pytester.runpytest("--gpuhost-spec=blackwell8.yaml", f"--gpuhost-root={fresh}", "--fix",
                       "--gpuhost-dry-run", "--alluredir=dry", "-p", "no:cacheprovider")
    dry = generate(pytester.path / "dry", tmp_path / "dry-report", pytester.path)
    assert dry["sysctl[vm.swappiness]"] == ["Would fix"]
    assert dry["kernel.release"] == ["Mis-tuned"]
