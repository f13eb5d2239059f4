"""Each option declared once (pytest_gpuhost/options.py): pytest's options and ini values, what
asks a run for gpuhost work and the raw settings all come from that one table."""

from __future__ import annotations

import pytest

from pytest_gpuhost.config.options import BY_NAME, FLAG, OPTIONAL, OPTIONS, WORDS, RawOptions
from pytest_gpuhost.plugin import _asked

pytest_plugins = ["pytester"]


def test_every_option_reaches_pytest_with_the_tables_default_and_ini_twin(
        pytester: pytest.Pytester) -> None:
    config = pytester.parseconfig()
    for option in OPTIONS:
        assert config.getoption(option.dest) == option.default, option.flag
        if option.ini is not None:
            assert config.getini(option.ini) in ([], "", False), option.ini
    assert len({option.dest for option in OPTIONS}) == len(OPTIONS) == len(BY_NAME)


def given(flag: str, kind: str) -> list[str]:
    """The option on a command line, with a value where it takes one."""
    if kind in (FLAG, OPTIONAL):
        return [flag]
    return [f"{flag}=7" if kind in ("seconds", "count") else f"{flag}=x"]


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_any_option_alone_asks_the_run_for_gpuhost_work(pytester: pytest.Pytester,
                                                        name: str) -> None:
    option = BY_NAME[name]
    assert _asked(pytester.parseconfig(*given(option.flag, option.kind)))


def test_a_run_without_any_asks_nothing(pytester: pytest.Pytester) -> None:
    assert not _asked(pytester.parseconfig())
    assert _asked(pytester.parseconfig("spec.yaml"))  # a spec named as an argument
    pytester.makeini("[pytest]\ngpuhost_targets = ssh://a\n")
    assert _asked(pytester.parseconfig())


def test_raw_options_have_the_tables_defaults_and_refuse_other_names(
        pytester: pytest.Pytester) -> None:
    raw = RawOptions(pytester.path, pytester.path)
    for option in OPTIONS:
        assert raw.value(option.name) == option.default
        if option.kind == WORDS:
            assert raw.words(option.name) == ()
    assert raw.seconds("lock_timeout") == 120.0
    with pytest.raises(TypeError, match=r"no gpuhost option .* named fixx"):
        RawOptions(pytester.path, pytester.path, fixx=True)
    with pytest.raises(TypeError, match="named root_dir"):
        RawOptions(pytester.path, pytester.path, ini={"root_dir": "/"})


@pytest.mark.parametrize(("value", "problem"), [
    (float("nan"), "expected a finite number of seconds, 0 or more"),
    (float("inf"), "expected a finite number of seconds, 0 or more"),
    (-1.0, "expected a finite number of seconds, 0 or more"),
    (0.0, None), (3.5, None),
])
def test_seconds_are_checked_as_the_table_says(value: float, problem: str | None) -> None:
    assert BY_NAME["lock_timeout"].seconds_problem(value) == problem
    above = BY_NAME["connect_timeout"].seconds_problem(value)
    assert above == (None if value > 0 and problem is None else
                     "expected a finite number of seconds above 0")


def test_gpuhost_hosts_help_states_the_docs_rule_of_where_a_setting_lives(
        pytester: pytest.Pytester) -> None:
    """Not "sysctls other than net.*": the global net.* ones (net.core.rmem_max) go to the
    host too, the IPC and UTS namespaces' stay; the help names the reference's section."""
    from pytest_gpuhost.checks.sysctl import sysctl_scope

    from ..conftest import REPO

    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    help_text = text.split("--gpuhost-host=URL", 1)[1].split("--gpuhost-ssh-config", 1)[0]
    assert "other than net.*" not in help_text
    assert "the global net.* such as net.core.rmem_max go there" in help_text
    assert "the IPC and UTS ones" in help_text
    assert "docs/reference.md#where-a-setting-lives" in help_text
    assert (REPO / "docs" / "reference.md").read_text().count("\n## Where a setting lives\n") == 1
    # what the help says, the kinds say
    assert sysctl_scope("net.core.rmem_max") == "kernel"
    assert sysctl_scope("net.ipv4.tcp_rmem") == sysctl_scope("kernel.shmmax") == "namespace"
