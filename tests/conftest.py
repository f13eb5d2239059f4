"""Fixtures: fake host trees built in tmp_path, and the bundled example host copied there."""

from __future__ import annotations

import contextvars
import functools
import importlib.util
import inspect
import re
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.host import LocalHost
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer, find_sshd, start_sshd

from .runner import Runner

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_HOST = REPO / "examples" / "hosts" / "blackwell8-untuned"
BLACKWELL8 = REPO / "pytest_gpuhost" / "bundled" / "blackwell8.yaml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def shared_directories() -> list[Path]:
    """Where ``../shared`` (the project's reference data, kept beside the repository, as CI
    clones it) may be: beside this checkout, or, for a git worktree, beside its main checkout
    (``.git`` is then a file naming the worktree's git directory, whose ``commondir`` leads
    to the main one)."""
    found = [REPO.parent / "shared"]
    git = REPO / ".git"
    origin = _local_origin(git / "config") if git.is_dir() else None
    if origin is not None:  # a clone of a checkout on this machine (``git clone -q . $d``)
        found.append(origin.parent / "shared")
    if git.is_file() and git.read_text().startswith("gitdir:"):
        own = Path(git.read_text().split(":", 1)[1].strip())
        own = own if own.is_absolute() else (REPO / own)
        common = own / "commondir"
        if common.is_file():
            main_git = (own / common.read_text().strip()).resolve()
            found.append(main_git.parent.parent / "shared")
    return found


def _local_origin(config: Path) -> Path | None:
    """The checkout this one was cloned from, where its ``origin`` is a path on this machine."""
    try:
        text = config.read_text()
    except OSError:
        return None
    section = re.search(r'\[remote "origin"\]([^\[]*)', text)
    url = re.search(r"^\s*url\s*=\s*(.+?)\s*$", section.group(1), re.M) if section else None
    if url is None or "://" in url.group(1) or not url.group(1).startswith("/"):
        return None
    return Path(url.group(1)).resolve()


JUNIT_XSD = Path("data") / "schemas" / "junit-10.xsd"
"""The xunit2 schema of Jenkins' xUnit plugin, under ../shared (its SOURCE.md says where from)."""


@functools.cache
def _junit_schema() -> Any:
    import xmlschema

    for directory in shared_directories():
        if (directory / JUNIT_XSD).is_file():
            return xmlschema.XMLSchema(str(directory / JUNIT_XSD))
    places = ", ".join(str(d / JUNIT_XSD) for d in shared_directories())
    pytest.fail(f"the xunit2 schema is not there ({places}): the tests read it from "
                "../shared/data/schemas/junit-10.xsd beside the checkout", pytrace=False)


def assert_valid_junit(path: Path, *, interrupted: bool = False) -> None:
    """``path`` is valid under Jenkins' xUnit plugin's xunit2 schema (``junit-10.xsd``),
    which skips a file that is not. Every xunit2 JUnit file a test writes goes through this;
    ``junit_family=xunit1`` files carry pytest's own ``file``/``line`` attributes, which that
    schema does not know: they are for consumers that read properties, and tests read those.

    ``interrupted``: the run was cut short by a KeyboardInterrupt inside a test, for which
    pytest itself writes a ``<testcase time="..."/>`` without a name (any test, without this
    plugin: tests/reports/test_reports.py shows it); that one element is left out, the rest
    must be valid."""
    import xml.etree.ElementTree as ET

    tree = ET.parse(path)
    if interrupted:
        for suite in tree.iter("testsuite"):
            for case in list(suite.iter("testcase")):
                if set(case.attrib) == {"time"} and not len(case):
                    suite.remove(case)
    errors = list(_junit_schema().iter_errors(tree))
    assert not errors, (f"{path} is not valid xunit2 (junit-10.xsd): {len(errors)} error(s), "
                        "the first: " + "; ".join(f"{e.path}: {e.reason}" for e in errors[:3]))


EXTRAS = (
    # (module, the extra that brings it, what in a test's source means it needs it)
    ("xdist", "xdist", ('"-n", "',)),
    ("allure", "allure", ("--alluredir",)),
    ("ansible", "ansible", ("read_inventory(", "--gpuhost-inventory")),
    ("pytest_benchmark", "benchmark", ("--benchmark-",)),
)
"""Tests of optional extras skip where the extra is not installed, naming it: found by
what the test runs, so a new test of -n or --alluredir is covered without a marker to forget."""


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``pytest -n N`` xdist tells its workers so in the environment, which every pytest
    a test starts would inherit (pytest-benchmark then disables itself): a run a test makes is
    its own session."""
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


E2E = Path(__file__).resolve().parent / "e2e"
"""Tests that start real processes beside pytest (an sshd, xdist workers, Chromium): marked
``e2e``, so a quick loop can leave them out with ``-m "not e2e"``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
    missing = [(extra, needles) for module, extra, needles in EXTRAS
               if importlib.util.find_spec(module) is None]
    if not missing:
        return
    for item in items:
        function = getattr(item, "function", None)
        try:
            source = inspect.getsource(function) if function is not None else ""
        except (OSError, TypeError):
            continue
        if 'sys.modules, "ansible", None' in source:  # the test of its absence runs anyway
            continue
        for extra, needles in missing:
            if any(needle in source for needle in needles):
                item.add_marker(pytest.mark.skip(
                    reason=f"needs the [{extra}] extra: pip install '.[{extra}]'"))
                break


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    """An empty fake host (a kernel release and an empty proc/modules) to build on."""
    return FakeHost(tmp_path / "host")


@pytest.fixture
def host(fake: FakeHost) -> LocalHost:
    return LocalHost(fake.root)


@pytest.fixture
def example_host(tmp_path: Path) -> Path:
    """A private copy of the bundled untuned blackwell8 host: --fix may change it."""
    target = tmp_path / "blackwell8-untuned"
    shutil.copytree(EXAMPLE_HOST, target, symlinks=True)
    return target


def counts(result: pytest.RunResult) -> dict[str, int]:
    """A whole run's final counts, FIXED included (assert_outcomes knows only pytest's own)."""
    return {k: v for k, v in result.parseoutcomes().items() if k not in ("warnings", "warning")}


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file's bytes and mtime, to prove that a run wrote nothing."""
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def runner(fake: FakeHost) -> Runner:
    """``run_spec`` and ``open_run`` (``tests/runner.py``) on the test's fake host."""
    return Runner(fake.root)


NEEDS_OPENSSH = pytest.mark.skipif(find_sshd() is None or shutil.which("ssh") is None,
                                   reason="needs OpenSSH: Debian's openssh-server and -client")
"""For a module whose tests run a real sshd on 127.0.0.1 (``pytestmark = NEEDS_OPENSSH``)."""


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """A real OpenSSH server on a free port of 127.0.0.1, its host and user keys, known_hosts
    and client configuration under the test's temporary directory (never ~/.ssh), one per
    module, stopped after it."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def ansible_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Ansible makes its local temporary directory (~/.ansible/tmp) when first used: keep it,
    and any ansible.cfg lookup, inside the tests' own directories."""
    base = tmp_path_factory.mktemp("ansible")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ANSIBLE_LOCAL_TEMP", str(base / "tmp"))
        patch.setenv("ANSIBLE_CONFIG", str(base / "ansible.cfg"))
        patch.setenv("ANSIBLE_HOME", str(base))
        yield


def workers_by_target(result: pytest.RunResult) -> dict[str, set[str]]:
    """TargetAddress name -> the xdist workers (``[gw0]``) that reported its checks passing (-v)."""
    workers: dict[str, set[str]] = {}
    for line in result.stdout.lines:
        if line.startswith("[gw") and "PASSED" in line and "@" in line:
            workers.setdefault(line.rsplit("@", 1)[1].split()[0], set()).add(line.split("]")[0])
    return workers


def crash_worker_at(pytester: pytest.Pytester, nodeid: str, hook: str = "pytest_runtest_call"
                    ) -> list[str]:
    """A plugin (``-p crasher``, the arguments returned) whose ``hook`` ends an xdist worker's
    process at the test ``nodeid``, as a segfault in a driver call would."""
    pytester.makepyfile(crasher=(
        "import os\n\n"
        f"def {hook}(item):\n"
        f"    if item.nodeid == {nodeid!r} and 'PYTEST_XDIST_WORKER' in os.environ:\n"
        "        os._exit(3)\n"))
    return ["-p", "crasher"]


STAND_IN_SSH = """\
#!{python}
# ssh that "reaches" a root whose path names {marker!r} by running the remote command here,
# then does what the test's body says; any other target goes to the real ssh.
import os, subprocess, sys, time
remote = sys.argv[-1]
if {marker!r} not in remote:
    os.execv({ssh!r}, ["ssh", *sys.argv[1:]])
child = subprocess.Popen(["sh", "-c", remote], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
"""

RELAY_HELLO = """\
header = sys.stdin.buffer.readline()  # the agent's source and its compiled code's lengths
child.stdin.write(header + sys.stdin.buffer.read(sum(map(int, header.split()[:2]))))
child.stdin.flush()
size = child.stdout.readline()
sys.stdout.buffer.write(size + child.stdout.read(int(size)))
sys.stdout.buffer.flush()
"""
"""A stand-in ssh's body that passes the agent's hello on (what the run sends, what it says)."""


def stand_in_ssh(directory: Path, monkeypatch: pytest.MonkeyPatch, marker: str, body: str
                 ) -> None:
    """An ``ssh`` first on PATH, made in ``directory``: to a root whose path names ``marker``
    it runs the agent here and then ``body`` (Python, with ``child`` the agent's process),
    to any other the real ssh: a target whose stream the test breaks as it chooses."""
    import os
    import sys

    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / "ssh"
    tool.write_text(STAND_IN_SSH.format(python=sys.executable, ssh=shutil.which("ssh"),
                                        marker=marker) + body)
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}:{os.environ['PATH']}")


def ended_within(seconds: float, call: Callable[[], object], what: str) -> object:
    """What ``call()`` returned, or the exception it raised, made in a daemon thread (in a
    copy of this thread's context: the step ``host.doing`` names): a regression that blocks
    fails the test after ``seconds`` instead of hanging the suite. A bound that only a hang
    passes: never a measure of how fast the call was."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # handed to the test's thread
            outcome.append(exc)

    thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"{what} was not bounded: still waiting after {seconds:g} s"
    return outcome[0]
