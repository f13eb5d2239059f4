"""Target URLs, targets files, the ini and the fleet CLI's input
that once gave a traceback, were accepted when they must not be, or named a target with
characters a name cannot hold. Each is exit 4 (a usage error) with a message saying what to
do, never a traceback, and a password never reaches any output."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_gpuhost.config.targets import TargetError, parse_target, parse_targets, valid_name
from pytest_gpuhost.testing.fakehost import FakeHost

PASSWORD = "hunter2-secret"


@pytest.mark.parametrize(("url", "words"), [
    ("ssh://[::1", "is not a URL (Invalid IPv6 URL)"),
    ("ssh://[-oProxyCommand=sh]/", "is not a URL"),
    (f"ssh://root:{PASSWORD}@gpu01", "a target URL takes no password"),
    ("ssh://gpu01:0/", "the port must be a number from 1 to 65535"),
    ("ssh://gpu01:65536/", "the port must be a number from 1 to 65535"),
    ("ssh://gpu01:²/", "the port must be a number from 1 to 65535"),
])
def test_a_target_url_that_cannot_be_used_is_a_target_error(url: str, words: str) -> None:
    with pytest.raises(TargetError) as refused:
        parse_target(url)
    assert words in str(refused.value)
    assert PASSWORD not in str(refused.value)


@pytest.mark.parametrize("where", ["option", "targets-file", "ini"])
@pytest.mark.parametrize("url", ["ssh://[::1", f"ssh://root:{PASSWORD}@gpu01",
                                 "ssh://gpu01:0/"])
def test_a_run_given_such_a_target_exits_4_without_a_traceback(
        pytester: pytest.Pytester, fake: FakeHost, where: str, url: str) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    args = ["spec.yaml", "-p", "no:cacheprovider"]
    if where == "option":
        args.append(f"--gpuhost-target={url}")
    elif where == "targets-file":
        (pytester.path / "targets.txt").write_text(f"{url}\n")
        args.append("--gpuhost-targets-file=targets.txt")
    else:
        pytester.makeini(f"[pytest]\ngpuhost_targets = {url}\n")
    result = pytester.runpytest_subprocess(*args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "Traceback" not in out and "INTERNALERROR" not in out
    assert PASSWORD not in out


def test_a_name_derived_from_a_root_holds_only_a_name_s_characters() -> None:
    target, _ = parse_targets(["ssh://gpu01/srv/a%20b%3Cc%0Ad", "ssh://gpu01/"])
    assert target.root == "/srv/a b<c\nd"
    assert target.name == "gpu01:srv.a_b_c_d" and valid_name(target.name)
    one, two = parse_targets(["ssh://gpu01/srv/a%20b", "ssh://gpu01/srv/a%3Cb"])
    assert one.name != two.name and valid_name(one.name) and valid_name(two.name)


def test_the_fleet_cli_says_which_record_it_cannot_read(pytester: pytest.Pytester) -> None:
    (pytester.path / "node01.json").write_text(json.dumps({"host": "node01", "checks": [
        {"id": "sysctl[vm.swappiness]", "kind": "sysctl", "outcome": {"x": 1}}]}))
    done = subprocess.run([sys.executable, "-m", "pytest_gpuhost.fleet", "node01.json",
                           "--html=fleet.html"], cwd=pytester.path, capture_output=True,
                          text=True, check=False)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "node01.json: check 1 is not a pytest-gpuhost record: outcome is dict" in done.stdout
    assert (pytester.path / "fleet.html").exists()
