"""In a real browser: a host value ``<!--<script>`` in the fleet page's data
once put the HTML parser in the script's "double escaped" state, so that the page's own script
never ran and the page stayed blank. Skipped without Chromium."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from pytest_gpuhost.fleet import FleetRow
from pytest_gpuhost.fleet.drift import find_drift
from pytest_gpuhost.fleet.page import render

from .test_allure_browser import CHROMIUM
from .test_fleet_browser import chromium

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install chromium")

HOSTILE = "<!--<script>alert(1)</script>"

DRIVER = r"""
<script>
window.addEventListener("load", () => {
  const out = {summary: document.getElementById("summary").textContent,
               cells: document.querySelectorAll("#matrix td.cell").length};
  document.querySelector("#matrix td.cell").click();
  out.detail = document.getElementById("detail").innerText;
  const pre = document.createElement("pre");
  pre.id = "driver-out";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>
"""


def test_a_host_value_that_opens_a_comment_and_a_script_is_shown_as_text(
        tmp_path: Path) -> None:
    record = {"id": "sysctl[kernel.hostname]", "kind": "sysctl", "key": "kernel.hostname",
              "expected": "gpu", "observed": HOSTILE, "outcome": "failed",
              "message": f"{HOSTILE!r} is not 'gpu'", "location": "spec.yaml:3"}
    rows = [FleetRow("node01", "r.json", (record,), facts={"host": HOSTILE})]
    page = render(rows, find_drift(rows), "fleet")
    blob = page.split('id="fleet-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in blob and ">" not in blob
    assert json.loads(blob)["strings"].count(HOSTILE) == 1  # the escapes read back as the text
    copy = tmp_path / "driven.html"
    copy.write_text(page.replace("</body>", DRIVER + "</body>"))
    dom = chromium("--dump-dom", copy.as_uri())
    found = re.search(r'<pre id="driver-out"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, "the page's script never ran: " + dom[-2000:]
    seen = json.loads(html.unescape(found.group(1)))
    assert seen["summary"].startswith("1 target")
    assert seen["cells"] >= 1
    assert f"observed\n{HOSTILE}" in seen["detail"]
