"""Imports go one way between the package's layers: read from the source with ast, every import
form (``import X``, ``import X as Y``, ``from X import Y``, relative, inside functions and under
TYPE_CHECKING, and ``importlib.import_module("...")`` with a literal name), so a lazy import
cannot hide a cycle. Every layer has a floor and imports only layers on lower floors; a module
that belongs to no layer of the table fails until it is placed. Inside a layer, no module
imports itself round a circle either (a lazy import ties two modules as a top-level one does;
an import under TYPE_CHECKING is only for the type checker, and does not count)."""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gpuhost"
ROOT = ""
"""The package itself (``pytest_gpuhost/__init__.py``, and its version: ``version.py``)."""

FLOORS: dict[str, int] = {
    # floor 0: the base, which imports no layer but the package root
    ROOT: 0, "result": 0, "files": 0, "progress": 0, "long_lived": 0, "printable": 0,
    "host": 0, "linux": 0, "specmodel": 0, "bundled": 0,
    # floor 0 too: which target of one host state is which of another (plain data)
    "statepairs": 0,
    # floor 1: waiting a bounded time (on the host's clock); the old import paths of bundled/
    # and specmodel/
    "bounded": 1, "specs": 1, "spec": 1,
    # floor 2: GPUs, the fleet view
    "gpu": 2, "fleet": 2,
    # floor 3: the kinds, the reporters
    "checks": 3, "reports": 3,
    # floor 4: what acts on checks: capture, the fixer; the host state; the fake trees; an old
    # import path
    "capture": 4, "fix": 4, "state": 4, "testing": 4, "nvml": 4,
    # floor 4 too: a benchmark's envelope (its facts, verdict, sampler and host half)
    "envelope": 4,
    # floor 5: one check's run; the run's configuration: options, targets, inventories, the
    # settings resolved (they validate a capture's target and name the journals' directory);
    # pytest-benchmark's hooks; an old import path
    "engine": 5, "config": 5, "benchmark": 5, "fakehost": 5,
    # floor 6: the session without pytest; the hooks' specifications; the state's pytest side;
    # the old import paths of config/'s modules
    "session": 6, "hookspecs": 6, "runstate": 6,
    "options": 6, "settings": 6, "targetoptions": 6, "specoptions": 6, "targets": 6,
    "hostlist": 6, "inventory": 6,
    # floor 7: the built-in kinds, schemes, hosts and reports as a plugin registers them
    "builtin": 7,
    # floor 8: pytest's glue
    "plugin": 8,
    # floor 9: programs imported by nothing, over the session and the built-ins (a package's
    # __main__ named in PROGRAMS)
    "envelope.__main__": 9,
}
PROGRAMS = {"envelope.__main__"}
"""A package's ``__main__`` that is a program over the whole run (``python -m
pytest_gpuhost.envelope``): its own layer, on the top floor, which nothing imports."""
ALONE = {
    "host": "it is the only code that touches a machine, and knows no check",
    "linux": "pure parsers of kernel formats",
    "specmodel": "YAML to a frozen model, no host, no pytest",
}
"""Layers that import nothing of the package at all."""
FORBIDDEN = {
    # lower layers that a layer still must not import
    "checks": {"fleet"},
    "reports": {"host", "gpu"},
    "fleet": {"host", "gpu", "specmodel"},
}
OLD_PATHS = {
    "fakehost": "testing.fakehost", "nvml": "gpu.nvml", "specs": "bundled", "spec": "specmodel",
    **{name: f"config.{name}" for name in ("options", "settings", "targetoptions", "specoptions",
                                           "targets", "hostlist", "inventory")},
}
"""Modules kept at an old import path for users (a conftest, a script): each re-exports the
module that moved; the package itself imports the new path."""
ROOT_SHIM = (ROOT, "plugin")
"""The package's ``__init__`` registers the plugin when ``-p pytest_gpuhost`` names the package
(a lazy import inside ``pytest_plugin_registered``): the one import that goes up."""


def layer(module: str) -> str:
    parts = module.split(".")
    if ".".join(parts[1:]) in PROGRAMS:
        return ".".join(parts[1:])
    return parts[1] if len(parts) > 1 and parts[1] not in ("__version__", "version") else ROOT


def _imported(node: ast.AST, package: str) -> Iterator[str]:
    """The package's modules (or names in them) an AST node imports."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        if node.level:
            base = package.split(".")[:len(package.split(".")) - node.level + 1]
            target = ".".join([*base, *([node.module] if node.module else [])])
        else:
            target = node.module or ""
        if node.module:
            yield target
        yield from (f"{target}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if name in ("import_module", "__import__") and node.args and \
                isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            yield node.args[0].value


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[module.removesuffix(".__init__")] = path
    return found


MODULES = modules()


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _is_type_checking(node: ast.AST) -> bool:
    """``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``): imports only the type checker runs."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.Module, *, runtime_only: bool) -> Iterator[ast.AST]:
    """Every node of a module, inside functions too; without the bodies of ``if
    TYPE_CHECKING:`` where only the imports that run count."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if runtime_only and _is_type_checking(node):
            assert isinstance(node, ast.If)
            pending.extend(node.orelse)
            continue
        yield node
        pending.extend(ast.iter_child_nodes(node))


def imports(*, runtime_only: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name imported from a package counts as the
    package, or as its submodule where one has that name)."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _nodes(tree, runtime_only=runtime_only):
            for name in _imported(node, _package(module)):
                if not name.startswith("pytest_gpuhost"):
                    continue
                while name not in MODULES and "." in name:
                    name = name.rsplit(".", 1)[0]
                if name in MODULES and name != module:
                    found[module].add(name)
    return found


GRAPH = imports()


def layer_graph() -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        found[layer(module)].update(layer(t) for t in targets if layer(t) != layer(module))
    return found


LAYERS = layer_graph()


def test_the_graph_is_read() -> None:
    assert len(MODULES) > 50
    assert "fix" in LAYERS["engine"] and "session" in LAYERS["plugin"]
    # each import form is seen: plain, relative, lazy (in a function), TYPE_CHECKING
    assert "pytest_gpuhost.plugin" in GRAPH["pytest_gpuhost"]  # lazy, relative
    assert "pytest_gpuhost.gpu.nvml" in GRAPH["pytest_gpuhost.checks"]  # TYPE_CHECKING


def test_every_layer_has_a_floor() -> None:
    unplaced = sorted({layer(module) for module in MODULES} - set(FLOORS))
    assert not unplaced, f"layers with no floor in FLOORS: {unplaced}: place them"


@pytest.mark.parametrize("name", sorted(FLOORS))
def test_a_layer_imports_only_what_sits_below_it(name: str) -> None:
    wrong = sorted(other for other in LAYERS.get(name, set())
                   if FLOORS.get(other, 99) >= FLOORS[name] and (name, other) != ROOT_SHIM)
    assert not wrong, (f"{name}/ (floor {FLOORS[name]}) imports {wrong} on the same floor or "
                       "above: move the shared part down, or the importer up")
    if name in ALONE:
        others = LAYERS.get(name, set()) - {ROOT}
        assert not others, f"{name}/ imports {sorted(others)}; it imports nothing: {ALONE[name]}"
    banned = LAYERS.get(name, set()) & FORBIDDEN.get(name, set())
    assert not banned, f"{name}/ imports {sorted(banned)}"


def test_only_pytests_glue_imports_the_session() -> None:
    """pytest's glue, and the programs over a whole run without pytest (``PROGRAMS``)."""
    importers = {name for name, targets in LAYERS.items() if "session" in targets}
    assert importers - PROGRAMS == {"plugin"}, sorted(importers)


def test_the_package_imports_no_old_import_path() -> None:
    old = {f"pytest_gpuhost.{name}" for name in OLD_PATHS}
    found = sorted(f"{module} imports {target}" for module, targets in GRAPH.items()
                   if module not in old for target in targets & old)
    assert not found, (f"{found}: import the module where it lives now "
                       f"({', '.join(f'{k} -> {v}' for k, v in sorted(OLD_PATHS.items()))})")


def module_cycles() -> list[frozenset[str]]:
    """Strongly connected modules of the graph of every import that runs (at import time or
    in a function: TYPE_CHECKING's aside): each is a circle of modules that need each other."""
    graph = imports(runtime_only=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                cycles.append(frozenset(component))

    for module in sorted(MODULES):
        if module not in index:
            visit(module)
    return cycles


def circle(cycle: frozenset[str]) -> str:
    """One circle through the first module of ``cycle``, the shortest, as ``a -> b -> a``."""
    graph = imports(runtime_only=True)
    start = min(cycle)
    paths = {start: [start]}
    queue = [start]
    while queue:
        module = queue.pop(0)
        for target in sorted(graph.get(module, set()) & cycle):
            if target == start:
                return " -> ".join(name.removeprefix("pytest_gpuhost.")
                                   for name in [*paths[module], start])
            if target not in paths:
                paths[target] = [*paths[module], target]
                queue.append(target)
    raise AssertionError(f"no circle through {start}")  # pragma: no cover


def test_no_module_imports_itself_round_a_circle() -> None:
    found = [circle(cycle) for cycle in module_cycles()]
    assert not found, (
        "import circles (lazy imports count; TYPE_CHECKING's do not): " + "; ".join(found) +
        ". Break each: move what both need into a module of its own (a seam), or join the "
        "two where they are one idea")


def test_the_circle_check_finds_a_circle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                         ) -> None:
    """A circle of a top-level import and a lazy one is found and named; one closed only under
    TYPE_CHECKING is not a circle."""
    names = ("a", "b", "c", "d")
    fake = {f"pytest_gpuhost.checks.{name}": tmp_path / f"{name}.py" for name in names}
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from pytest_gpuhost.checks import a\n")
    (tmp_path / "c.py").write_text("from . import d\n")
    (tmp_path / "d.py").write_text("from typing import TYPE_CHECKING\n"
                                   "if TYPE_CHECKING:\n    from .c import y\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["MODULES"]), "MODULES", fake)
    cycles = module_cycles()
    assert cycles == [frozenset(list(fake)[:2])]
    assert circle(cycles[0]) == "checks.a -> checks.b -> checks.a"
