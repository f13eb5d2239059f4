"""Imports go one way between the package's layers: read from the source with ast, every import
form (``import X``, ``import X as Y``, ``from X import Y``, relative, inside functions and under
TYPE_CHECKING, and ``importlib.import_module("...")`` with a literal name), so a lazy import
cannot hide a cycle. Every layer has a floor and imports only layers on lower floors; a module
that belongs to no layer of the table fails until it is placed."""

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
    "host": 0, "linux": 0, "spec": 0, "specs": 0, "targets": 0,
    # floor 0 too: which target of one host state is which of another (plain data)
    "statepairs": 0,
    # floor 1: waiting a bounded time (on the host's clock); the table of options
    "bounded": 1, "options": 1,
    # floor 1 too: comparing two host states, their targets paired (the state's module builds
    # them)
    "statecompare": 1,
    # floor 1 too: a fleet's hosts as rows and plain targets files (no ansible-core)
    "hostlist": 1,
    # floor 2 too: the run's outputs, each its own file and none an input (options' sources)
    "outputs": 2,
    # floor 2: GPUs, inventories, the fleet view
    "gpu": 2, "inventory": 2, "fleet": 2,
    # floor 3: the kinds, the reporters
    "checks": 3, "reports": 3,
    # floor 4: what acts on checks: capture, the fixer; the host state; the fake trees; an old
    # import path
    "capture": 4, "fix": 4, "state": 4, "testing": 4, "nvml": 4,
    # floor 4 too: the run's targets as its options name them (settings resolves them)
    "targetoptions": 4, "specoptions": 4,
    # floor 5: one check's run; the settings (they validate a capture's target);
    # pytest-benchmark's hooks; an old import path
    "engine": 5, "settings": 5, "benchmark": 5, "fakehost": 5,
    # floor 6: the session without pytest; the hooks' specifications; the state's pytest side
    "session": 6, "hookspecs": 6, "runstate": 6,
    # floor 7: the built-in kinds, schemes, hosts and reports as a plugin registers them
    "builtin": 7,
    # floor 8: pytest's glue
    "plugin": 8,
}
ALONE = {
    "host": "it is the only code that touches a machine, and knows no check",
    "linux": "pure parsers of kernel formats",
    "spec": "YAML to a frozen model, no host, no pytest",
}
"""Layers that import nothing of the package at all."""
FORBIDDEN = {
    # lower layers that a layer still must not import
    "checks": {"fleet", "inventory", "hostlist"},
    "reports": {"host", "gpu", "inventory", "hostlist"},
    "fleet": {"host", "gpu", "spec", "inventory", "hostlist"},
}
ROOT_SHIM = (ROOT, "plugin")
"""The package's ``__init__`` registers the plugin when ``-p pytest_gpuhost`` names the package
(a lazy import inside ``pytest_plugin_registered``): the one import that goes up."""


def layer(module: str) -> str:
    parts = module.split(".")
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


def imports(*, top_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the package's modules it imports (a name imported from a package counts as the
    package, or as its submodule where one has that name)."""
    found: dict[str, set[str]] = defaultdict(set)
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        for node in nodes:
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
    importers = {name for name, targets in LAYERS.items() if "session" in targets}
    assert importers == {"plugin"}, sorted(importers)


KNOWN_CYCLES: dict[frozenset[str], str] = {
    # an interface module that re-exports, at its end, the implementations built on it
    frozenset({"pytest_gpuhost.host", "pytest_gpuhost.host.cache", "pytest_gpuhost.host.local"}):
        "host/__init__.py re-exports CachedHost and LocalHost, which build on its names",
    frozenset({"pytest_gpuhost.gpu.nvml", "pytest_gpuhost.gpu.nvmlrecorded"}):
        "gpu/nvml.py re-exports the fakes (a conftest's documented import path); PynvmlNvml "
        "too, imported on first use",
}


def module_cycles() -> list[frozenset[str]]:
    """Strongly connected modules of the import-time graph (module-level imports): a cycle
    makes the import order matter."""
    graph = imports(top_level_only=True)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[frozenset[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, ()):
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


def test_no_module_imports_itself_round_a_cycle() -> None:
    found = [sorted(cycle) for cycle in module_cycles() if cycle not in KNOWN_CYCLES]
    assert not found, f"import cycles: {found}"


def test_the_cycle_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = {"pytest_gpuhost.a": tmp_path / "a.py", "pytest_gpuhost.b": tmp_path / "b.py"}
    fake["pytest_gpuhost.a"].write_text("from .b import x\n")
    fake["pytest_gpuhost.b"].write_text("from pytest_gpuhost import a\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["MODULES"]), "MODULES", fake)
    assert module_cycles() == [frozenset(fake)]

