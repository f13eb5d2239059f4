"""Proof in a real browser: the Allure HTML report of an example --fix run, opened in headless
Chromium, shows the checks, a fix step and an attachment.

Needs the Allure CLI (the npm package ``allure``, installed by .ci/run into .tools/allure, or an
``allure`` on PATH) and Chromium; skipped, saying which is missing, without them. The report is
served from 127.0.0.1 (the report's scripts cannot fetch its data from file://).
``GPUHOST_ALLURE_SCREENSHOT=FILE.png`` keeps a screenshot of the fix step's test page.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ..conftest import BLACKWELL8, REPO

pytest_plugins = ["pytester"]


def _tool(*candidates: str) -> str | None:
    for candidate in candidates:
        found = shutil.which(candidate)
        if found:
            return found
    return None


ALLURE = _tool(str(REPO / ".tools/allure/node_modules/.bin/allure"), "allure")
CHROMIUM = _tool("chromium", "chromium-browser", "google-chrome")

pytestmark = [
    pytest.mark.skipif(ALLURE is None, reason="no Allure CLI: .ci/run installs the npm package "
                       "allure into .tools/allure (or put allure on PATH)"),
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install chromium"),
]


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A directory served on 127.0.0.1 and its base URL."""
    root = tmp_path / "report"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0),
                                 functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/index.html"
    finally:
        server.shutdown()
        server.server_close()


def chromium(*args: str, budget_ms: int = 10000, window: str = "1400,1100") -> str:
    """Headless Chromium's standard output (``--dump-dom``) for a page, letting its scripts
    run for ``budget_ms`` of virtual time; the fleet page's tests use it too."""
    assert CHROMIUM is not None
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-dev-shm-usage", f"--virtual-time-budget={budget_ms}",
                           f"--window-size={window}", *args],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout


def test_allure_report_in_headless_chromium(pytester: pytest.Pytester, example_host: Path,
                                            served: tuple[Path, str], tmp_path: Path) -> None:
    shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml")
    run = pytester.runpytest("--gpuhost-spec=blackwell8.yaml", f"--gpuhost-root={example_host}",
                             "--fix", "--alluredir=allure-results", "-p", "no:cacheprovider")
    assert run.ret == pytest.ExitCode.TESTS_FAILED
    report, url = served
    assert ALLURE is not None
    subprocess.run([ALLURE, "generate", str(pytester.path / "allure-results"), "-o",
                    str(report)], check=True, capture_output=True, timeout=300,
                   cwd=pytester.path)
    results = [json.loads(p.read_text()) for p in (report / "data/test-results").glob("*.json")]
    [peermem] = [r for r in results if r["name"] == "module[nvidia_peermem]"]

    overview = chromium("--dump-dom", url)
    for name in ("sysctl[vm.swappiness]", "module[nvidia_peermem]", "dmesg",
                 "pcie.max_read_request[0000:81:00.0]"):
        assert name in overview, f"{name} not on the report's overview"

    page = chromium("--dump-dom", f"{url}#{peermem['id']}")
    for shown in ("observe: absent", "apply: modprobe -- nvidia_peermem", "read back: absent",
                  "command and output", "what was read", "expected vs observed",
                  "GPUDirect RDMA between the GPUs and the InfiniBand NICs"):
        assert shown in page, f"{shown!r} not on the fix_failed check's page"

    shot = Path(os.environ.get("GPUHOST_ALLURE_SCREENSHOT", str(tmp_path / "allure.png")))
    chromium(f"--screenshot={shot}", f"{url}#{peermem['id']}")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
