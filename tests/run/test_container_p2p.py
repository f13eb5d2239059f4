"""A container's P2P checks measure its host's GPUs: they follow its host's PCIe fixes under
xdist as in a serial run, and a pair's explanation stands on the host's config spaces, which
the container reads only 64 bytes of (the Proxmox-like example, ``lxc://101`` of a copy)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ..test_example_host import PROXMOX_HOST

RUN = ("-p", "no:cacheprovider")


@pytest.fixture
def proxmox(tmp_path: Path) -> Path:
    root = tmp_path / "pve"
    shutil.copytree(PROXMOX_HOST, root, symlinks=True)
    return root


def records(path: Path) -> list[dict[str, object]]:
    checks: list[dict[str, object]] = json.loads(path.read_text())["checks"]
    return checks


def test_a_containers_failing_pair_is_explained_by_its_hosts_config_spaces(
        pytester: pytest.Pytester, proxmox: Path) -> None:
    """The host's bridges redirect P2P (ACS) and its GPUs read 512 bytes a request: the
    container's failing pair names those causes, read on the host, not 'not judged: config
    space is 64 bytes'."""
    pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={proxmox}",
                       "--gpuhost-target=lxc://101", "--gpuhost-report=r.json", *RUN)
    failing = [c for c in records(pytester.path / "r.json")
               if c["kind"] == "p2p" and c["outcome"] == "failed"]
    assert failing
    for record in failing:
        assert record["target"] == "lxc-101"
        details = record["details"]
        assert isinstance(details, dict)
        causes = {cause["cause"] for cause in details["explain"]}
        assert {"acs_redirect", "max_read_request"} <= causes, record["id"]
        assert not details.get("explain_notes"), details.get("explain_notes")
        assert "ACS redirect on" in str(record["message"])


def test_under_xdist_a_containers_pairs_follow_its_hosts_pcie_fixes(
        pytester: pytest.Pytester, proxmox: Path) -> None:
    """``-n 2 --fix``: the container's pairs run on the worker that fixes its host's PCIe, after
    those fixes (one unit of work), and pass as they do in a serial run."""
    pytest.importorskip("xdist")
    common = ("--gpuhost-spec=blackwell8", f"--gpuhost-root={proxmox}",
              "--gpuhost-target=lxc://101", "--fix", *RUN)
    result = pytester.runpytest(*common, "-n", "2", "-v", "--gpuhost-report=spread.json")
    ran = [(match["worker"], match["outcome"], match["id"]) for match in re.finditer(
        r"\[(?P<worker>gw\d+)\] \[ *\d+%\] (?P<outcome>\w+) \S+::(?P<id>\S+)",
        result.stdout.str())]
    fixes = [i for i, (_, outcome, nodeid) in enumerate(ran)
             if outcome == "FIXED" and nodeid.startswith("pcie.")]
    pairs = [i for i, (_, _, nodeid) in enumerate(ran) if nodeid.startswith("p2p[")]
    assert fixes and pairs
    assert len({ran[i][0] for i in fixes + pairs}) == 1, {ran[i][0] for i in fixes + pairs}
    assert max(fixes) < min(pairs)
    outcomes = {c["id"]: c["outcome"] for c in records(pytester.path / "spread.json")
                if c["kind"] == "p2p"}
    assert outcomes and set(outcomes.values()) == {"passed"}, outcomes
