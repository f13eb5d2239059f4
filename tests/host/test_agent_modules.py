"""The agent as modules, sent as one source: each module of ``host/agent/`` imports only the
standard library and its siblings and loads on its own; the modules joined (``host/upload.py``)
are what a target runs, a local agent's pipes and an LXC container's tree here, ssh in
``tests/e2e/test_ssh.py``; and a run with only a local root never builds the joined source."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_gpuhost.host import LocalHost, Read, agent
from pytest_gpuhost.host.remote import AgentHost, agent_command, lxc_argv
from pytest_gpuhost.host.upload import (
    AGENT_PACKAGE,
    DIGEST_LINE,
    JoinError,
    agent_source,
    digest_of,
    joined,
    module_order,
)
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.lxc import lxc_container

MODULES = sorted(path.stem for path in AGENT_PACKAGE.glob("*.py") if path.stem != "__init__")
MOST_LINES = 500


def sent_digest() -> str:
    """The digest of the source a connection sends, computed here from its text."""
    source = agent_source().decode()
    assert f'AGENT_DIGEST = "{digest_of(source)}"' in source
    return digest_of(source)


def test_the_join_takes_every_module_and_is_deterministic() -> None:
    assert module_order() == [*module_order()[:-1], "serving"]
    assert sorted(module_order()) == MODULES
    assert joined().encode() == joined().encode() == agent_source()
    assert agent_source() is agent_source()  # built once a process
    unfilled = agent_source().decode().replace(f'"{sent_digest()}"', '""')
    assert hashlib.sha256(unfilled.encode()).hexdigest() == sent_digest()
    assert DIGEST_LINE in unfilled


@pytest.mark.parametrize("name", MODULES)
def test_no_agent_module_imports_beyond_the_standard_library_and_its_siblings(name: str) -> None:
    """Read with ast, every import form, inside functions and under TYPE_CHECKING too."""
    path = AGENT_PACKAGE / f"{name}.py"
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    outside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            outside |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            outside.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 1 and node.module in MODULES, ast.dump(node)
    assert outside <= set(sys.stdlib_module_names) | {"__future__"}, outside
    assert len(path.read_text().splitlines()) <= MOST_LINES


@pytest.mark.parametrize("name", MODULES)
def test_each_agent_module_loads_on_its_own(name: str) -> None:
    """In a python3 -I -S of its own, without the package around it (its ``__init__`` and
    ``pytest_gpuhost`` never run): only the siblings it imports come with it."""
    code = textwrap.dedent(f"""\
        import importlib, sys, types
        package = types.ModuleType("agent")
        package.__path__ = [{str(AGENT_PACKAGE)!r}]
        sys.modules["agent"] = package
        importlib.import_module("agent.{name}")
        print(" ".join(sorted(m for m in sys.modules if m.startswith(("agent", "pytest_")))))
        """)
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    tree = ast.parse((AGENT_PACKAGE / f"{name}.py").read_text())
    runtime = {node.module for node in tree.body
               if isinstance(node, ast.ImportFrom) and node.level}
    assert {f"agent.{name}"} | {f"agent.{module}" for module in runtime} <= loaded
    assert not any(module.startswith("pytest_") for module in loaded), loaded


def test_the_joined_source_defines_what_the_modules_do() -> None:
    """What runs on a target and what ``LocalHost`` runs in-process are the same code."""
    namespace: dict[str, object] = {"__name__": "joined"}
    exec(compile(agent_source(), "joined", "exec"), namespace)
    operations = namespace["OPERATIONS"]
    assert isinstance(operations, dict) and sorted(operations) == sorted(agent.OPERATIONS)
    root = namespace["Root"]
    assert isinstance(root, type)
    assert [c.__name__ for c in root.__mro__] == [c.__name__ for c in agent.Root.__mro__]
    assert namespace["AGENT_DIGEST"] == sent_digest()


def test_a_local_agent_runs_the_joined_source(fake: FakeHost) -> None:
    """The agent started on this machine's pipes (a target's python3, here this one's)."""
    fake.sysctl("vm.swappiness", 10)
    host = AgentHost(f"test://{fake.root.name}",
                     [sys.executable, *agent_command(str(fake.root))[1:]], str(fake.root))
    try:
        assert host.agent_digest() == sent_digest()
        assert host.batch([Read("proc/sys/vm/swappiness")])[0].data() == b"10\n"
    finally:
        host.close()


def test_a_container_tree_runs_the_joined_source(fake: FakeHost) -> None:
    """``lxc://101``: entered with the host tree's lxc-attach, the container's tree its root."""
    container = lxc_container(fake, "101")
    container.sysctl("net.core.somaxconn", 4096)
    attach = LocalHost(fake.root).which("lxc-attach")
    assert attach is not None
    inner = [sys.executable, *agent_command("/")[1:]]
    host = AgentHost("lxc://101", lxc_argv("101", inner, attach), "/")
    try:
        assert host.agent_digest() == sent_digest()
        assert host.identity().root == str(container.root)
        assert host.batch([Read("proc/sys/net/core/somaxconn")])[0].data() == b"4096\n"
    finally:
        host.close()


def test_a_join_refuses_what_it_cannot_join(tmp_path: Path) -> None:
    """A sibling imported under another name, or as a module, would leave a name undefined
    once the import line is gone; a circle has no order."""
    for name in MODULES:
        (tmp_path / f"{name}.py").write_text((AGENT_PACKAGE / f"{name}.py").read_text())
    assert joined(tmp_path) == joined()
    channel = tmp_path / "channel.py"
    original = channel.read_text()
    for wrong in ("from .errors import OpError as Failure\n", "from . import errors\n",
                  "from .serving import serve\n"):
        channel.write_text(original.replace("import json\n", f"import json\n{wrong}"))
        with pytest.raises(JoinError):
            joined(tmp_path)


def test_a_local_run_never_builds_the_joined_source(tmp_path: Path) -> None:
    """A run whose only target is the local root neither imports the join nor reads it."""
    root = tmp_path / "root"
    FakeHost(root).sysctl("vm.swappiness", 10)
    spec = tmp_path / "node.yaml"
    spec.write_text("version: 1\nsysctl:\n  vm.swappiness: 10\n")
    code = textwrap.dedent(f"""\
        import sys, pytest
        code = pytest.main(["--gpuhost-spec", {str(spec)!r},
                            "--gpuhost-root", {str(root)!r}, "-p", "no:cacheprovider", "-q"])
        print("exit", int(code), "joined" if "pytest_gpuhost.host.upload" in sys.modules
              else "not joined")
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    assert done.stdout.splitlines()[-1] == "exit 0 not joined", done.stdout[-2000:]
