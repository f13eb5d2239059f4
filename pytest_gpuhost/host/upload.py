"""The agent as a target receives it: the modules of ``host/agent/`` joined into one stdlib-only
source, and that source compiled by this machine's Python, built once a process.

One source is a property of the upload, not of the source tree: each module imports the others
only as ``from .module import name`` (never renamed, never ``from . import module``), so joined
in the order of those imports, with those lines taken out, every name is already where it is
used. ``serving`` comes last (its ``__main__`` block starts the agent) and carries the joined
source's SHA-256 in ``AGENT_DIGEST``, which the agent's hello says: a test compares it with the
source built here. A run whose targets are all local never calls any of this (``LocalHost`` runs
the modules in-process), and nothing here is read before a target is connected.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

AGENT_PACKAGE = Path(__file__).with_name("agent")
"""The folder of the agent's modules."""
AGENT_NAME = "pytest-gpuhost-agent"
"""The joined source's file name in a traceback on the target."""
LAST = "serving"
"""The module whose ``if __name__ == "__main__":`` starts the agent: joined last."""
DIGEST_LINE = 'AGENT_DIGEST = ""'
"""``serving.py``'s line that the join fills with the joined source's digest."""


class JoinError(Exception):
    """An agent module the join cannot take as it is (an import form, a missing module)."""


def _relative(tree: ast.Module, name: str) -> list[ast.ImportFrom]:
    """The module's imports of its siblings, each ``from .module import name, ...``."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        if node.level != 1 or not node.module or any(
                alias.asname not in (None, alias.name) for alias in node.names):
            raise JoinError(f"{name}.py line {node.lineno}: an agent module imports another "
                            "only as 'from .module import name' (the join drops the line)")
        found.append(node)
    return found


def _parsed(package: Path) -> dict[str, tuple[list[str], ast.Module]]:
    """Each module (but ``__init__``, which only gathers names) -> its lines and its tree."""
    modules = {}
    for path in sorted(package.glob("*.py")):
        if path.stem != "__init__":
            text = path.read_text(encoding="utf-8")
            modules[path.stem] = (text.splitlines(), ast.parse(text, str(path)))
    return modules


def module_order(package: Path = AGENT_PACKAGE) -> list[str]:
    """The modules in the order the join puts them: each after every module it imports (ties
    by name), ``LAST`` last."""
    parsed = _parsed(package)
    needs = {name: {node.module for node in _relative(tree, name) if node.module}
             for name, (_, tree) in parsed.items()}
    for name, wanted in needs.items():
        if wanted - set(parsed):
            raise JoinError(f"{name}.py imports {sorted(wanted - set(parsed))}, which are not "
                            "agent modules")
    order: list[str] = []
    while len(order) < len(needs):
        left = [name for name in needs if name not in order]
        ready = sorted(name for name in left if needs[name] <= set(order)
                       and (name != LAST or len(left) == 1))
        if not ready:
            raise JoinError(f"agent modules import each other in a circle, or import {LAST}.py "
                            f"(which is joined last): {sorted(set(needs) - set(order))}")
        order.extend(ready[:1])
    return order


def _without_imports(lines: list[str], tree: ast.Module, name: str) -> list[str]:
    """``lines`` less the imports of sibling modules, ``from __future__`` (said once at the
    top) and the module's docstring (the reader's, not the target's); an import inside a block
    becomes ``pass``, so the block stays one."""
    kept = list(lines)
    dropped: list[ast.stmt] = [*_relative(tree, name), *(
        node for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
            isinstance(first.value.value, str):
        dropped.append(first)
    for node in sorted(dropped, key=lambda node: node.lineno, reverse=True):
        end = node.end_lineno or node.lineno
        stand_in = [" " * node.col_offset + "pass"] if node.col_offset else []
        kept[node.lineno - 1:end] = stand_in
    while kept and not kept[0].strip():
        del kept[0]
    return kept


def joined(package: Path = AGENT_PACKAGE) -> str:
    """The agent's one source, its ``AGENT_DIGEST`` filled in; deterministic."""
    parsed = _parsed(package)
    parts = ['"""pytest-gpuhost\'s agent: the modules of pytest_gpuhost/host/agent/, joined."""',
             "", "from __future__ import annotations"]
    for name in module_order(package):
        lines, tree = parsed[name]
        parts += ["", "", f"# -- {name}.py " + "-" * (91 - len(name)), "",
                  *_without_imports(lines, tree, name)]
    text = "\n".join(parts) + "\n"
    if text.count(f"\n{DIGEST_LINE}\n") != 1:
        raise JoinError(f"{LAST}.py must hold the line {DIGEST_LINE!r} once")
    digest = hashlib.sha256(text.encode()).hexdigest()
    return text.replace(f"\n{DIGEST_LINE}\n", f'\nAGENT_DIGEST = "{digest}"\n')


def digest_of(source: str) -> str:
    """The digest a joined source carries, computed again from the rest of it."""
    head, _, rest = source.partition('\nAGENT_DIGEST = "')
    return hashlib.sha256((head + f"\n{DIGEST_LINE}" + rest.partition('"')[2]).encode()
                          ).hexdigest()


@functools.cache
def agent_source() -> bytes:
    """The joined source, built at its first use in this process."""
    return joined().encode()


@functools.cache
def agent_upload() -> bytes:
    """What the bootstrap reads (``remote.BOOTSTRAP``): a line of the source's length, the
    compiled code's length and this Python's bytecode magic number (hex), then the source,
    then the code (``marshal``); made once a process."""
    import importlib.util
    import marshal

    source = agent_source()
    code = marshal.dumps(compile(source, AGENT_NAME, "exec", dont_inherit=True))
    head = b"%d %d %s\n" % (len(source), len(code), importlib.util.MAGIC_NUMBER.hex().encode())
    return head + source + code
