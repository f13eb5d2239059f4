"""A file named as a spec, a targets file or an inventory may be no such file at all (a private
key, an env file with a token): its errors name the file and at most a short, escaped excerpt
of the offending line, never the file's content."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost import builtin
from pytest_gpuhost.specmodel import SpecError, load_spec

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = set(builtin.pytest_gpuhost_conditions())
SECRET = "c2VjcmV0LXNlY3JldC1zZWNyZXQ"
"""Stands for the secret part of each file: never on a line's first 32 characters."""
KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       f"b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtz{SECRET}\n"
       f"QyNTUxOQAAACB{SECRET}AAAAJgAAAAAAAAAAAAAAAA\n"
       "-----END OPENSSH PRIVATE KEY-----\n")
FILES = {
    "private key": KEY,
    "env file": f"GITHUB_TOKEN=ghp_0123456789abcdefghij{SECRET}\nOTHER=1\n",
    "exported token": f"export TOKEN=ghp_0123456789abcdefghijk{SECRET}\n",
    "ini file": f"[default]\naws_secret_access_key = {SECRET}\n",
    "one long line": f"{'x' * 40}{SECRET}",
    "a value of a spec": f"version: 1\nsysctl: 'password: 0123456789abcdef{SECRET}'\n",
    "a version": f"version: 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa{SECRET}'\nsysctl: {{}}\n",
    "a section's name": f"version: 1\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa{SECRET}: 1\n",
    "an entry's key": ("version: 1\np2p:\n  floors: {same_numa: 1}\n"
                       f"  aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa{SECRET}: 1\n"),
    "a duplicate key": (f"version: 1\n{'a' * 40}{SECRET}: 1\n{'a' * 40}{SECRET}: 2\n"),
    "a value its tag cannot read": f"version: 1\nsysctl: !!int '{'1' * 40}{SECRET}'\n",
}


@pytest.mark.parametrize("content", list(FILES.values()), ids=list(FILES))
def test_a_spec_error_shows_no_more_than_an_excerpt_of_a_line(tmp_path: Path,
                                                               content: str) -> None:
    path = tmp_path / "secret"
    path.write_text(content)
    with pytest.raises(SpecError) as error:
        load_spec(path, KINDS, CONDITIONS, display=lambda p: p.name)
    message = str(error.value)
    assert message.startswith("secret:"), message
    assert SECRET[:8] not in message, message
    assert len(message) < 400, message


def test_an_excerpt_is_escaped_and_says_how_long_the_value_is(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(f"version: 1\nsysctl: \"\\e]0;title\\a{'x' * 60}\"\n")
    with pytest.raises(SpecError) as error:
        load_spec(path, KINDS, CONDITIONS, display=lambda p: p.name)
    message = str(error.value)
    assert "\x1b" not in message and "\\x1b]0;title\\x07" in message, message
    assert "(70 characters)" in message, message


def test_a_short_value_is_still_shown_whole(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text("version: 1\nsysctl: performance\n")
    with pytest.raises(SpecError, match=r"sysctl must be a mapping, got str 'performance'$"):
        load_spec(path, KINDS, CONDITIONS, display=lambda p: p.name)


def _inventory(pytester: pytest.Pytester, content: str) -> list[str]:
    (pytester.path / "hosts.ini").write_text(content)
    return ["--gpuhost-inventory=hosts.ini"]


SOURCES = {
    "--gpuhost-spec": lambda pytester: ["--gpuhost-spec=secret"],
    "?spec= of a target": lambda pytester: ["--gpuhost-target=ssh://127.0.0.1/?spec=secret"],
    "a targets file's spec column": lambda pytester: (
        (pytester.path / "targets.txt").write_text("ssh://127.0.0.1 secret\n"),
        ["--gpuhost-targets-file=targets.txt"])[1],
    "an inventory's gpuhost_spec": lambda pytester: _inventory(
        pytester, "node01 ansible_host=127.0.0.1 gpuhost_spec=secret\n"),
    "the targets file itself": lambda pytester: ["--gpuhost-targets-file=secret"],
    "the inventory itself": lambda pytester: ["--gpuhost-inventory=secret"],
}


@pytest.mark.usefixtures("ansible_home")
@pytest.mark.parametrize("content", [FILES["private key"], FILES["env file"]],
                         ids=["private key", "env file"])
@pytest.mark.parametrize("source", list(SOURCES))
def test_a_run_naming_a_secret_file_exits_4_without_its_content(
        pytester: pytest.Pytester, source: str, content: str) -> None:
    (pytester.path / "secret").write_text(content)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    args = SOURCES[source](pytester)
    if source != "--gpuhost-spec":
        args.append("--gpuhost-spec=spec.yaml")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "secret" in out, out
    assert SECRET[:8] not in out and "ghp_0123456789abcdefghij" not in out, out
