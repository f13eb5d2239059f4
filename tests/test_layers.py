"""Imports go one way between the package's layers (issue 10): read from the source with ast,
function-level and TYPE_CHECKING imports included, so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gpuhost"

FORBIDDEN = {
    # a layer: what it must never import
    "host": "everything else: it is the only code that touches a machine, and knows no check",
    "linux": "everything else: pure parsers of kernel formats",
    "spec": "everything else: YAML to a frozen model, no host, no pytest",
    "checks": {"fix", "engine", "session", "plugin", "reports", "capture", "fleet"},
    "reports": {"host", "checks", "fix", "engine", "session", "plugin", "gpu"},
    "fleet": {"host", "checks", "fix", "engine", "session", "plugin", "gpu", "spec"},
}
GLUE = {"plugin"}
"""pytest's glue (``plugin/``): the only layer that imports the session."""


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports() -> dict[str, set[str]]:
    """layer -> the other layers of the package it imports."""
    found: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        package = module.removesuffix(".__init__") if path.name == "__init__.py" else \
            module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not target.startswith("pytest_gpuhost"):
                continue
            names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            found[layer(module)].update(layer(n) for n in names if layer(n) != layer(module))
    return found


GRAPH = imports()


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_a_layer_never_imports_what_sits_above_it(name: str) -> None:
    rule = FORBIDDEN[name]
    others = GRAPH.get(name, set()) - {"__version__"}
    assert GRAPH, "no imports found: the test reads nothing"
    if isinstance(rule, str):
        assert others == set(), f"{name}/ imports {sorted(others)}; it imports {rule}"
    else:
        assert others & rule == set(), f"{name}/ imports {sorted(others & rule)}"


def test_only_pytests_glue_imports_the_session_and_nothing_imports_the_glue() -> None:
    importers = {name for name, targets in GRAPH.items() if targets & {"session", "plugin"}}
    # the package's __init__ registers the entry point when pytest_plugins names the package
    assert importers <= GLUE | {"", "__init__"}, sorted(importers - GLUE)
    assert GRAPH["__init__"] == {"plugin"}
    assert "checks" in GRAPH and "fix" in GRAPH["engine"]  # the graph is really read
