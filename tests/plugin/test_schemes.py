"""Target schemes are an open registry: the built-in local, ssh:// and lxc:// are registered
through ``pytest_gpuhost_target_schemes`` as a plugin's are, and the documented ``docker://``
plugin (docs/adding-a-target.md) runs end to end against a stand-in ``docker`` over fake trees:
verify, --fix, rollback, reports, ids and errors all name its targets."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.config.targets import (
    BUILTIN,
    BUILTIN_SCHEMES,
    Scheme,
    TargetAddress,
    TargetError,
    TargetUrl,
    name_targets,
    parse_target,
    parse_target_line,
    scheme_registry,
)
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import REPO
from ..test_docs import python_block

PLUGIN = REPO / "docs" / "adding-a-target.md"
SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n  vm.dirty_ratio: 5\n"


def _docker(url: TargetUrl) -> TargetAddress:
    if not url.parts.netloc:
        raise TargetError(f"{url.text!r}: docker://CONTAINER needs a container")
    return TargetAddress(url.text, "docker", container=url.parts.netloc, root=url.root,
                         name=url.name)


DOCKER = Scheme("docker", ("docker://CONTAINER[/ROOT]",), _docker, parameters=("user",))
WITH_DOCKER = scheme_registry([BUILTIN_SCHEMES, [DOCKER]])


# -- the registry ---------------------------------------------------------------------------------


def test_the_built_in_schemes_are_registered_through_the_hook_a_plugin_uses() -> None:
    assert list(scheme_registry([builtin.pytest_gpuhost_target_schemes()])) == \
        ["local", "ssh", "lxc"]
    assert dict(BUILTIN) == {scheme.name: scheme for scheme in BUILTIN_SCHEMES}
    assert parse_target("ssh://root@pve:2222/tree?lxc=101&name=ct") == TargetAddress(
        "ssh://root@pve:2222/tree?lxc=101&name=ct", "ssh", host="pve", user="root", port=2222,
        root="/tree", container="101", name="ct")
    assert parse_target("local") == TargetAddress("local", "local")
    assert parse_target("lxc://101").container == "101"


def test_a_scheme_nobody_registered_is_refused_naming_every_registered_form() -> None:
    with pytest.raises(TargetError) as refused:
        parse_target("docker://gpubox")
    assert str(refused.value) == (
        "'docker://gpubox' is not a target: expected local, ssh://[USER@]HOST[:PORT][/ROOT], "
        "ssh://USER@HOST?lxc=CTID or lxc://CTID[/ROOT]")
    with pytest.raises(TargetError, match=r"expected local, .* lxc://CTID\[/ROOT\] or "
                                          r"docker://CONTAINER\[/ROOT\]"):
        parse_target("ftp://gpubox", WITH_DOCKER)
    with pytest.raises(TargetError, match="is not a target"):  # local takes nothing more
        parse_target("local://x", WITH_DOCKER)


def test_a_plugins_scheme_parses_names_and_refuses_like_the_built_in_ones() -> None:
    target = parse_target("docker://gpubox/opt/tree?user=ci", WITH_DOCKER)
    assert (target.scheme, target.container, target.root) == ("docker", "gpubox", "/opt/tree")
    assert parse_target("DOCKER://gpubox", WITH_DOCKER).scheme == "docker"
    with pytest.raises(TargetError, match="docker://CONTAINER needs a container"):
        parse_target("docker://", WITH_DOCKER)
    with pytest.raises(TargetError, match=r"unknown parameter\(s\) lxc; a docker:// target "
                                          r"takes name=, spec= and user="):
        parse_target("docker://gpubox?lxc=1", WITH_DOCKER)
    with pytest.raises(TargetError, match="has no #fragment"):
        parse_target("docker://gpubox#x", WITH_DOCKER)
    with pytest.raises(TargetError, match="name='-x' must be"):
        parse_target("docker://gpubox?name=-x", WITH_DOCKER)
    assert parse_target_line("docker://gpubox", WITH_DOCKER).scheme == "docker"
    assert parse_target_line("local", WITH_DOCKER).local
    assert parse_target_line("root@node01", WITH_DOCKER).scheme == "ssh"


def test_a_plugins_targets_are_named_by_scheme_and_container_unless_it_says_otherwise() -> None:
    targets = [parse_target(text, WITH_DOCKER) for text in
               ("docker://gpubox", "docker://other/tree", "ssh://root@gpubox", "lxc://101")]
    assert [t.name for t in name_targets(targets, WITH_DOCKER)] == [
        "docker-gpubox", "docker-other", "gpubox", "lxc-101"]
    named = Scheme("docker", DOCKER.forms, _docker, base_name=lambda t: f"ctr.{t.container}")
    registry = scheme_registry([BUILTIN_SCHEMES, [named]])
    assert [t.name for t in name_targets([parse_target("docker://a", registry)], registry)] == \
        ["ctr.a"]
    twice = [parse_target("docker://gpubox", WITH_DOCKER),
             parse_target("docker://gpubox?name=again", WITH_DOCKER)]
    with pytest.raises(TargetError, match="are the same target"):
        name_targets(twice, WITH_DOCKER)


def test_two_plugins_may_not_claim_one_scheme_and_a_scheme_must_be_a_url_scheme() -> None:
    assert scheme_registry([[DOCKER], [DOCKER]]) == {"docker": DOCKER}  # a re-exported hook
    other = Scheme("docker", ("docker://NAME",), _docker)
    with pytest.raises(TargetError, match="two plugins register the target scheme 'docker': "
                                          r"docker://CONTAINER\[/ROOT\] and docker://NAME"):
        scheme_registry([[DOCKER], [other]])
    for name in ("do cker", "Docker", "9p"):
        with pytest.raises(TargetError, match=f"'{name}' is not a URL scheme"):
            scheme_registry([[Scheme(name, ("x",), _docker)]])


# -- the documented plugin, end to end ---------------------------------------------------------

STAND_IN_DOCKER = """\
#!{python}
# docker exec -i CONTAINER COMMAND...: COMMAND run here, the container's / being {trees}/CONTAINER
import os, sys
args = sys.argv[1:]
if args[:2] != ["exec", "-i"] or len(args) < 4:
    sys.exit("stand-in docker: only 'exec -i CONTAINER COMMAND...'")
container, command = args[2], args[3:]
tree = os.path.join({trees!r}, container)
if not os.path.isdir(tree):
    sys.stderr.write("Error response from daemon: No such container: %s\\n" % container)
    sys.exit(1)
if command[0] == "python3":
    command[0] = {python!r}
command[-1] = tree + command[-1].rstrip("/")  # the agent's root: inside the container
os.execv(command[0], command)
"""


@pytest.fixture
def containers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the stand-in ``docker`` (first on PATH) finds each container's tree."""
    trees = tmp_path / "containers"
    trees.mkdir()
    tool = tmp_path / "bin" / "docker"
    tool.parent.mkdir()
    tool.write_text(STAND_IN_DOCKER.format(python=sys.executable, trees=str(trees)))
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    return trees


def _report(pytester: pytest.Pytester) -> dict[str, Any]:
    """The JSON report as loaded: JSON values, so a dict of Any."""
    data: dict[str, Any] = json.loads((pytester.path / "r.json").read_text())
    return data


def test_the_documented_docker_plugin_checks_fixes_and_rolls_back_its_containers(
        pytester: pytest.Pytester, containers: Path, tmp_path: Path) -> None:
    pytester.makeconftest(python_block(PLUGIN))
    pytester.makefile(".yaml", spec=SPEC)
    box = FakeHost(containers / "gpubox").sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 5})
    local = FakeHost(tmp_path / "local").sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5})
    targets = ["--gpuhost-target=local", "--gpuhost-target=docker://gpubox",
               "--gpuhost-target=docker://gone"]
    verify = pytester.runpytest("spec.yaml", f"--gpuhost-root={local.root}", *targets,
                                "--gpuhost-report=r.json", "-v", "-p", "no:cacheprovider")
    verify.stdout.fnmatch_lines_random([
        "*spec.yaml::sysctl[[]vm.swappiness[]]@docker-gpubox FAILED*",
        "*spec.yaml::sysctl[[]vm.dirty_ratio[]]@docker-gpubox PASSED*",
        "*spec.yaml::sysctl[[]vm.swappiness[]]@docker-gone ERROR*",
        "*spec.yaml::sysctl[[]vm.swappiness[]]@local PASSED*"])
    assert verify.ret == pytest.ExitCode.TESTS_FAILED
    data = _report(pytester)
    checks = data["checks"]
    assert isinstance(checks, list)
    outcomes = {(c["target"], c["id"]): c["outcome"] for c in checks}
    assert outcomes == {
        ("local", "sysctl[vm.swappiness]"): "passed", ("local", "sysctl[vm.dirty_ratio]"): "passed",
        ("docker-gpubox", "sysctl[vm.swappiness]"): "failed",
        ("docker-gpubox", "sysctl[vm.dirty_ratio]"): "passed",
        ("docker-gone", "sysctl[vm.swappiness]"): "error",
        ("docker-gone", "sysctl[vm.dirty_ratio]"): "error"}
    assert {c["message"] for c in checks if c["target"] == "docker-gone"} == {
        "cannot reach docker://gone: Error response from daemon: No such container: gone"}
    targets_info = {t["name"]: t for t in data["targets"]}
    assert targets_info["docker-gpubox"]["url"] == "docker://gpubox"
    assert targets_info["docker-gpubox"]["round_trips"] >= 1  # a Connection: its cost reported
    assert "No such container: gone" in targets_info["docker-gone"]["unreachable"]

    fixed = pytester.runpytest("spec.yaml", "--gpuhost-target=docker://gpubox", "--fix",
                               "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert fixed.ret == pytest.ExitCode.OK
    assert (box.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    [journal] = (box.root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl")  # in the container
    assert '"check": "sysctl[vm.swappiness]"' in journal.read_text()

    back = pytester.runpytest("--gpuhost-rollback", "--gpuhost-target=docker://gpubox",
                              "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK
    assert (box.root / "proc/sys/vm/swappiness").read_text() == "60\n"


def test_a_scheme_is_known_only_where_a_plugin_registers_it(pytester: pytest.Pytester,
                                                            fake: FakeHost) -> None:
    pytester.makefile(".yaml", spec=SPEC)
    unknown = pytester.runpytest("spec.yaml", "--gpuhost-target=docker://gpubox",
                                 "-p", "no:cacheprovider")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines(["*--gpuhost-target: 'docker://gpubox' is not a target: "
                                  "expected local, *lxc://CTID[[]/ROOT]"])
    pytester.makeconftest(python_block(PLUGIN))
    bad = pytester.runpytest("spec.yaml", "--gpuhost-target=docker://", "-p", "no:cacheprovider")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*--gpuhost-target: 'docker://': docker://CONTAINER needs a "
                              "container name or id"])
    listed = pytester.runpytest("spec.yaml", "--gpuhost-target=ftp://gpubox",
                                "-p", "no:cacheprovider")
    listed.stderr.fnmatch_lines(["*expected local, *lxc://CTID[[]/ROOT] or "
                                 "docker://CONTAINER[[]/ROOT]"])


def test_two_plugins_that_claim_one_scheme_are_a_usage_error(pytester: pytest.Pytester,
                                                            fake: FakeHost) -> None:
    pytester.makeconftest(python_block(PLUGIN))
    pytester.syspathinsert()
    pytester.makepyfile(otherdocker=(
        "from pytest_gpuhost.hookspecs import hookimpl\n"
        "from pytest_gpuhost.config.targets import Scheme, TargetAddress\n\n"
        "@hookimpl\n"
        "def pytest_gpuhost_target_schemes():\n"
        "    return [Scheme('docker', ('docker://ID',),\n"
        "                   lambda url: TargetAddress(url.text, 'docker'))]\n"))
    pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "-p", "otherdocker",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*two plugins register the target scheme 'docker': *"])


@pytest.mark.parametrize(("first", "second"), [
    ("ssh://h/srv/tree", "ssh://h/srv/tree/"),
    ("ssh://h/srv/tree", "ssh://h/./srv//tree"),
    ("ssh://h/srv/tree", "ssh://h//srv/tree/."),
    ("ssh://root@h:22/srv", "ssh://h/srv"),
    ("ssh://h", "ssh://h:22/"),
])
def test_two_spellings_of_one_ssh_target_are_the_same_target(first: str, second: str) -> None:
    targets = [parse_target(first), parse_target(f"{second}{'&' if '?' in second else '?'}"
                                                 "name=again")]
    with pytest.raises(TargetError, match="are the same target"):
        name_targets(targets)


def test_a_root_written_with_dots_and_slashes_is_the_root_it_names() -> None:
    assert [parse_target(url).root for url in (
        "ssh://h/srv/tree/", "ssh://h/./srv//tree", "ssh://h//srv/tree/.", "ssh://h/")] == [
        "/srv/tree", "/srv/tree", "/srv/tree", "/"]


@pytest.mark.parametrize("container", ["ssh://h:22/srv/tree/?lxc=101",
                                       "ssh://root@h/./srv/tree?lxc=101"])
def test_a_containers_host_written_another_way_is_the_target_of_that_host(
        container: str) -> None:
    from pytest_gpuhost.config.targetoptions import place_kernels

    placed = place_kernels([parse_target("ssh://h/srv/tree?name=pve"),
                            parse_target(container)])
    assert [t.name for t in placed] == ["pve", "h-lxc-101"]
    assert placed[1].kernel_on == "pve"
