"""--gpuhost-capture-from a target that runs a spec of its own (``?spec=``) in a run of several
specs captures the keys of that spec only: another target's spec is not its business, and its
keys were listed as "left out: no check of it ran" beside the ones it captured."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

OWN = "version: 1\nsysctl:\n  net.core.somaxconn: 4096\n"
OTHER = "version: 1\nsysctl:\n  net.ipv4.tcp_rmem: \"4096 87380 6291456\"\nmemory:\n" \
        "  transparent_hugepage: madvise\n"


def test_a_capture_speaks_of_the_keys_of_the_spec_its_target_ran(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "pve").sysctls({"net.core.somaxconn": 4096,
                                               "net.ipv4.tcp_rmem": "4096 87380 6291456"})
    lxc_container(host, "101")
    lxc_container(host, "102")
    pytester.makefile(".yaml", own=OWN, other=OTHER)
    result = pytester.runpytest("--gpuhost-spec=other.yaml", f"--gpuhost-root={host.root}",
                                "--gpuhost-target=lxc://101?spec=own.yaml",
                                "--gpuhost-target=lxc://102",
                                "--gpuhost-capture=golden.yaml",
                                "--gpuhost-capture-from=lxc-101", "-p", "no:cacheprovider")
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), result.stdout.str()
    text = (pytester.path / "golden.yaml").read_text()
    assert set(yaml.safe_load(text)["sysctl"]) == {"net.core.somaxconn"}, text
    assert "tcp_rmem" not in text and "memory" not in text and "no check of it ran" not in text
    assert "for the keys of own.yaml." in text, text
