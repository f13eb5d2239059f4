"""Proof in a real browser: the fleet page, opened from a file in headless Chromium (no server,
no network: the page's own CSP refuses any fetch), shows its cells, filters rows and columns,
and shows a cell's expected, observed and evidence on a click.

A small driver script is added to a copy of the page; it works the controls as a user would
and leaves what it saw as JSON in the DOM, which ``--dump-dom`` prints. Skipped without
Chromium. ``GPUHOST_FLEET_SCREENSHOT=FILE.png`` keeps a screenshot (docs/fleet-view.png).
"""

from __future__ import annotations

import html
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.fleet import FleetRow, read_reports
from pytest_gpuhost.fleet.drift import find_drift
from pytest_gpuhost.fleet.matrix import matrix_lines
from pytest_gpuhost.fleet.page import render
from pytest_gpuhost.reports import RunInfo
from pytest_gpuhost.reports.jsonfile import json_report
from pytest_gpuhost.testing.fakehost import blackwell8_untuned

from ..conftest import BLACKWELL8
from ..fleet.test_view import fleet_reports  # noqa: F401  (the fixture)
from .test_allure_browser import CHROMIUM
from .test_allure_browser import chromium as allure_chromium

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium: apt-get install chromium")

DRIVER = r"""
<script>
window.addEventListener("load", () => {
  const q = (s) => [...document.querySelectorAll(s)];
  const set = (id, value, event) => {
    const el = document.getElementById(id);
    el.value = value;
    el.dispatchEvent(new Event(event));
  };
  const rows = () => q("#matrix tr.target").map((tr) => tr.dataset.target);
  const cells = (name) => q(`#matrix tr[data-target="${name}"] td.cell`).map((td) =>
    [td.dataset.outcome || "", td.textContent, td.classList.contains("dim")]);
  const out = {rendered: Number(document.body.dataset.renderedMs)};
  out.summary = document.getElementById("summary").textContent;
  out.header = q("#matrix thead th").map((th) => th.textContent);
  out.rows = rows();
  out.noresult = q("#matrix tr.noresult td.reason").map((td) => td.textContent);
  out.node01 = cells("node01");
  out.node04 = cells("node04");
  out.drift = q("#drift tr.drift").map((tr) => tr.dataset.check);
  out.minority = q("#drift .minority").map((s) => s.textContent);
  q('#matrix th[data-drill]').find((th) => th.textContent === "pcie").click();
  out.sectionHeader = q("#matrix thead th").map((th) => th.textContent);
  out.sectionChoice = document.getElementById("f-section").value;
  const kind = [...document.getElementById("f-section").options]
    .find((o) => o.text === "pcie.max_link_speed").value;
  set("f-section", kind, "change");
  out.kindHeader = q("#matrix thead th").map((th) => th.textContent);
  out.kindNode03 = cells("node03");
  out.kindDrift = q("#drift tr.drift").map((tr) => tr.dataset.check);
  q('#matrix tr[data-target="node03"] td.cell')[4].click();
  out.detail = document.getElementById("detail").innerText;
  out.chosen = q("td.chosen").length;
  set("f-section", "", "change");
  out.detailHidden = document.getElementById("detail").hidden;
  set("f-outcome", "failed", "change");
  out.failedRows = rows();
  out.failedNode04 = cells("node04");
  set("f-outcome", "no result", "change");
  out.noResultRows = rows();
  set("f-outcome", "", "change");
  set("f-target", "DE0", "input");
  out.targetRows = rows();
  set("f-target", "", "input");
  q('#matrix tr[data-target="node04"] td.cell')[0].click();
  out.sysctlDetail = document.getElementById("detail").innerText;
  document.getElementById("detail-close").click();
  out.closed = [document.getElementById("detail").hidden, q("td.chosen").length];
  q('#matrix tr[data-target="node04"] td.cell')[0].click();  // for the screenshot
  const pre = document.createElement("pre");
  pre.id = "driver-out";
  pre.textContent = JSON.stringify(out);
  pre.hidden = true;
  document.body.appendChild(pre);
});
</script>
"""


def chromium(*args: str) -> str:
    return allure_chromium(*args, budget_ms=5000, window="1500,1000")


def driven(page: Path, driver: str = DRIVER) -> dict[str, Any]:
    copy = page.with_name("driven.html")
    copy.write_text(page.read_text().replace("</body>", driver + "</body>"))
    dom = chromium("--dump-dom", copy.as_uri())
    found = re.search(r'<pre id="driver-out"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return result


@pytest.fixture
def page(fleet_reports: list[Path], tmp_path: Path) -> Path:  # noqa: F811
    targets = read_reports(fleet_reports)
    path = tmp_path / "fleet.html"
    path.write_text(render(targets, find_drift(targets), "GPU fleet"))
    return path


def test_the_fleet_page_in_headless_chromium(page: Path, fleet_reports: list[Path],  # noqa: F811
                                            tmp_path: Path) -> None:
    seen = driven(page)
    assert seen["summary"].startswith("6 targets: 3 healthy, 1 with problems, 2 no result; ")
    # The columns are the sections, as the terminal matrix has them
    terminal = matrix_lines(read_reports(fleet_reports))[3].split()
    assert seen["header"] == terminal == ["target", "sysctl", "gpus", "pcie", "modules"]
    assert seen["rows"] == ["node01", "node02", "node03", "node04", "node05", "node06"]
    assert len(seen["noresult"]) == 2 and "no such report" in seen["noresult"][0]
    assert "No route to host" in seen["noresult"][1]
    assert seen["node01"] == [["passed", "2", False], ["passed", "3", False],
                              ["passed", "16", False], ["passed", "2", False]]
    assert seen["node04"][0] == ["failed", "1/2", False]  # a colour per outcome: the worst
    # A section's heading leads to its kinds, a kind to its checks.
    assert seen["sectionHeader"] == ["target", "max_link_speed", "max_read_request"]
    assert seen["sectionChoice"] == "s2"
    assert seen["drift"] == ["sysctl[vm.swappiness]", "gpus.driver_version",
                             "pcie.max_link_speed[0000:81:00.0]"]
    assert seen["minority"] == ["node04", "node03", "node03"]
    # A kind chosen: its checks are the columns, one per GPU, the drift table follows.
    assert seen["kindHeader"][0] == "target" and len(seen["kindHeader"]) == 9
    assert seen["kindHeader"][1:] == ["01:00.0", "21:00.0", "41:00.0", "61:00.0", "81:00.0",
                                      "a1:00.0", "c1:00.0", "e1:00.0"]
    assert seen["kindNode03"][4] == ["passed", "16.0 GT/s P…", False]
    assert seen["kindDrift"] == ["pcie.max_link_speed[0000:81:00.0]"]
    for shown in ("node03: pcie.max_link_speed[0000:81:00.0]", "expected\n>= 16.0 GT/s",
                  "observed\n16.0 GT/s PCIe", "evidence\nsys/bus/pci/devices/0000:81:00.0/"
                  "max_link_speed: 16.0 GT/s PCIe", "host node03", "passed"):
        assert shown in seen["detail"], shown
    assert seen["chosen"] == 1
    assert seen["detailHidden"] is True  # another view closes the panel
    # The outcome filter keeps the targets with such a check and dims the other cells.
    assert seen["failedRows"] == ["node04"]
    assert seen["failedNode04"][0][2] is False and all(c[2] for c in seen["failedNode04"][1:])
    assert seen["noResultRows"] == ["node05", "node06"]
    assert seen["targetRows"] == ["node01", "node02", "node03", "node04", "node05", "node06"]
    for shown in ("sysctl[vm.swappiness]", "expected\n10", "observed\n60", "failed",
                  "evidence\nproc/sys/vm/swappiness: 60"):
        assert shown in seen["sysctlDetail"], shown
    assert seen["closed"] == [True, 0]

    shot = Path(os.environ.get("GPUHOST_FLEET_SCREENSHOT", str(tmp_path / "fleet.png")))
    copy = page.with_name("driven.html")
    chromium(f"--screenshot={shot}", copy.as_uri() + "#shot")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- the layout at the widths people use ----------------------------------------

LAYOUT = r"""
<script>
window.addEventListener("load", () => {
  const q = (s) => [...document.querySelectorAll(s)];
  const wrap = document.getElementById("matrix-wrap");
  const detail = document.getElementById("detail");
  // A heading is cut when its text reaches past its own box.
  const cut = () => q("#matrix thead th").filter((th) => {
    const box = th.getBoundingClientRect(), range = document.createRange();
    range.selectNodeContents(th);
    const text = range.getBoundingClientRect();
    return text.left < box.left - 1 || text.right > box.right + 1 ||
      text.top < box.top - 1 || text.bottom > box.bottom + 1;
  }).map((th) => th.textContent);
  const layout = () => {
    const edge = wrap.getBoundingClientRect().right;
    return {
      header: q("#matrix thead th").map((th) => th.textContent),
      offscreen: q("#matrix thead th").filter((th) => th.getBoundingClientRect().right > edge + 1)
        .map((th) => th.textContent),
      scroll: wrap.scrollWidth - wrap.clientWidth,
      cut: cut(),
      detail: Math.round(detail.getBoundingClientRect().width),
      page: document.documentElement.clientWidth,
      pageScroll: document.documentElement.scrollWidth - document.documentElement.clientWidth,
    };
  };
  const out = {overview: layout()};
  q("#matrix td.cell")[0].click();
  out.chosen = layout();
  out.chosenText = detail.innerText;
  out.views = {};
  const go = (value) => {
    const select = document.getElementById("f-section");
    select.value = value;
    select.dispatchEvent(new Event("change"));
  };
  const drills = () => q("#matrix th[data-drill]").map((th) => [th.title, th.dataset.drill]);
  for (const [section, value] of drills()) {
    go(value);
    out.views[section] = layout();
    for (const [kind, inner] of drills()) {
      go(inner);
      out.views[kind] = layout();
    }
    go("");
  }
  const pre = document.createElement("pre");
  pre.id = "driver-out";
  pre.textContent = JSON.stringify(out);
  pre.hidden = true;
  document.body.appendChild(pre);
  // what the screenshot shows: the overview with a failing cell's details open
  q("#matrix td.cell")[0].click();
});
</script>
"""


def blackwell8_report(tmp_path: Path, name: str, *, fix: bool) -> Path:
    """The JSON report of the bundled spec on a copy of the example host (every kind)."""
    from ..runner import run_spec

    root = tmp_path / name
    blackwell8_untuned(root, cpus=16)
    done = run_spec([BLACKWELL8], root, workdir=tmp_path, fix=fix)
    info = RunInfo(specs=(("blackwell8.yaml", "blackwell8"),), root=str(root), hostname=name,
                   kernel="6.5.0-44-generic", driver="580.95.05",
                   gpus=tuple(f"gpu{i}" for i in range(8)))
    report = tmp_path / f"{name}.json"
    report.write_text(json.dumps(json_report(done.records, info)))
    return report


@pytest.fixture(scope="module")
def full_fleet(tmp_path_factory: pytest.TempPathFactory) -> list[FleetRow]:
    """Three nodes of the bundled spec, every one of its kinds: untuned, fixed, unreachable."""
    tmp_path = tmp_path_factory.mktemp("full-fleet")
    reports = [blackwell8_report(tmp_path, "gpu-node-01", fix=False),
               blackwell8_report(tmp_path, "gpu-node-02", fix=True), tmp_path / "gpu-node-03.json"]
    return read_reports(reports)


@pytest.mark.parametrize("width", [1280, 1920])
def test_every_section_fits_at_common_widths_headings_whole_details_on_demand(
        full_fleet: list[FleetRow], tmp_path: Path, width: int) -> None:
    kinds = {str(r["kind"]) for t in full_fleet for r in t.records}
    assert len(kinds) >= 30  # the page once showed 19 of 31 such kind columns at 1280 px
    page = tmp_path / "fleet.html"
    page.write_text(render(full_fleet, find_drift(full_fleet), "GPU fleet").replace(
        "</body>", LAYOUT + "</body>"))
    dom = allure_chromium("--dump-dom", page.as_uri(), budget_ms=5000, window=f"{width},900")
    found = re.search(r'<pre id="driver-out"[^>]*>(.*?)</pre>', dom, re.S)
    assert found, dom[-2000:]
    seen: dict[str, Any] = json.loads(html.unescape(found.group(1)))

    # the same columns as the terminal matrix, every one in view, none cut, no empty panel
    overview = seen["overview"]
    assert overview["header"] == matrix_lines(full_fleet)[3].split()
    assert (overview["offscreen"], overview["scroll"], overview["cut"]) == ([], 0, [])
    assert overview["detail"] == 0 and overview["pageScroll"] == 0
    # a cell chosen: its details beside the matrix, which keeps every column in view
    chosen = seen["chosen"]
    assert (chosen["offscreen"], chosen["scroll"], chosen["cut"]) == ([], 0, [])
    assert 0 < chosen["detail"] <= 0.35 * chosen["page"] and chosen["pageScroll"] == 0
    assert "gpu-node-01: sysctl" in seen["chosenText"] and "expected" in seen["chosenText"]
    # each section and each kind: every heading whole (many checks scroll sideways)
    assert set(seen["views"]) >= {"sysctl", "pcie", "pcie.max_read_request", "p2p"}
    for name, view in seen["views"].items():
        assert view["cut"] == [], name
        assert view["pageScroll"] == 0, name
    assert seen["views"]["pcie"]["header"][1:] == [
        "acs_redirect", "aspm", "link_width", "max_link_speed", "max_payload",
        "max_read_request", "aer"]
    assert seen["views"]["pcie"]["scroll"] == 0

    keep = os.environ.get("GPUHOST_FLEET_SCREENSHOTS")
    shot = Path(keep) / f"fleet-{width}.png" if keep else tmp_path / f"fleet-{width}.png"
    allure_chromium(f"--screenshot={shot}", page.as_uri(), budget_ms=5000,
                    window=f"{width},900")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TOOLTIPS = r"""
<script>
window.addEventListener("load", () => {
  const q = (s) => [...document.querySelectorAll(s)];
  const out = {};
  out.sectionTitles = q("#matrix td.cell").map((td) => td.title).filter((t) => t.startsWith("p2p"));
  const section = document.getElementById("f-section");
  section.value = [...section.options].find((o) => o.text === "p2p").value;
  section.dispatchEvent(new Event("change"));
  out.pairTitle = q("#matrix td.cell")[0].title;
  q("#matrix td.cell")[0].click();
  out.detail = document.getElementById("detail").innerText;
  const pre = document.createElement("pre");
  pre.id = "driver-out";
  pre.textContent = JSON.stringify(out);
  pre.hidden = true;
  document.body.appendChild(pre);
});
</script>
"""


def test_a_p2p_cells_tooltip_names_its_top_cause(pytester: pytest.Pytester,
                                                 example_host: Path) -> None:
    """The untuned example host: every pair fails, ACS redirect first."""
    pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}", "-k",
                       "p2p", "--gpuhost-fleet-html=fleet.html", "-p", "no:cacheprovider")
    seen = driven(pytester.path / "fleet.html", TOOLTIPS)
    assert seen["sectionTitles"] == [
        "p2p: 56 of 56 not good: 56 p2p failed; top cause: acs_redirect (56 of 56)"]
    assert seen["pairTitle"] == (
        "p2p[0000:01:00.0->0000:21:00.0]: failed; top cause: acs_redirect at 0000:20:01.1: "
        "sends this pair through the root complex; --fix clears it")
    assert "cause\nacs_redirect at 0000:20:01.1" in seen["detail"]


def test_a_collective_s_cell_names_its_top_cause_as_a_pair_s(pytester: pytest.Pytester,
                                                            tmp_path: Path) -> None:
    """A saved all_reduce run of NCCL_P2P_LEVEL=PIX on a direct-attach board: its cell's
    tooltip and detail name the transport it fell back to, as a P2P pair's name its cause."""
    from pytest_gpuhost.testing.fakenccl import nccl_tests_text

    from ..checks.test_nccl import GPUS, ID, board

    fake = board(tmp_path / "host")
    (pytester.path / "all_reduce.txt").write_text(nccl_tests_text(
        GPUS, 22.2, sizes=(2**30,), channels=8, env={"NCCL_P2P_LEVEL": "PIX"},
        transports={(3, 4): "SHM/direct/direct"}))
    pytester.makefile(".yaml", spec="version: 1\nnccl:\n  all_reduce: {bytes: 1G, min_busbw: "
                                    "35, from: all_reduce.txt}\n")
    pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-p", "no:cacheprovider",
                       "--gpuhost-fleet-html=fleet.html")
    seen = driven(pytester.path / "fleet.html", TOOLTIPS.replace('"p2p"', '"nccl"'))
    assert seen["sectionTitles"] == [
        "nccl: 1 of 1 not good: 1 nccl failed; top cause: nccl_transport (1 of 1)"]
    assert seen["pairTitle"].startswith(
        f"{ID}: failed; top cause: nccl_transport at {GPUS[3]}->{GPUS[4]}: sends ring traffic "
        "through host memory (SHM) instead of GPU to GPU; unset NCCL_P2P_LEVEL")
    assert f"cause\nnccl_transport at {GPUS[3]}->{GPUS[4]}" in seen["detail"]
