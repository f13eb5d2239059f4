"""What a kind or a host may have is declared, never asked for by name: read from the package's
source with ast, no ``getattr``/``hasattr`` names (as a string literal) a member that a kind's or
a host's protocol declares (``checks.kind``: the optional half of a kind; ``host``: ``Host`` and
``Closable``, ``Connection``, ``Releasable``, ``GpuControl``, ``PhaseCache``; a check's probe:
``checks.Probe``, ``Batched``, ``BootTime``). Such a member is
asked for with ``isinstance`` on its protocol, which says in one place what its absence means."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_gpuhost import checks, host
from pytest_gpuhost.checks import kind

PACKAGE = Path(__file__).resolve().parent.parent / "pytest_gpuhost"
PROTOCOLS = (kind.Kind, kind.Scoped, kind.Measured, kind.NeedsFacts, kind.Persisting,
             kind.PersistsTo, kind.Capturing, kind.StandIn, kind.NamedKind,
             host.Host, host.Closable, host.Connection, host.Releasable, host.GpuControl,
             host.PhaseCache, checks.Probe, checks.Batched, checks.BootTime)


def declared() -> dict[str, str]:
    """Each member a protocol declares (its methods, properties and annotated attributes) ->
    the protocol that declares it."""
    members: dict[str, str] = {}
    for protocol in PROTOCOLS:
        names = {*vars(protocol), *getattr(protocol, "__annotations__", {})}
        for name in sorted(names):
            if not name.startswith("_"):
                members.setdefault(name, f"{protocol.__module__}.{protocol.__qualname__}")
    return members


def asked_by_name(source: str, members: dict[str, str]) -> list[tuple[int, str, str]]:
    """(line, the call, the protocol that declares its member) for every ``getattr(x, "m"...)``
    or ``hasattr(x, "m")`` of ``source`` whose ``m`` is a declared member."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            name = node.args[1]
            if isinstance(name, ast.Constant) and isinstance(name.value, str) and \
                    name.value in members:
                found.append((node.lineno, ast.unparse(node), members[name.value]))
    return sorted(found)


def test_the_protocols_declare_the_optional_members() -> None:
    members = declared()
    for name in ("section", "parse", "expand", "scope", "measured", "facts", "persistence",
                 "persists_to", "capture", "standing_for", "loaded", "let_go", "cached",
                 "lost", "traffic", "close", "batch", "reads", "boot_time", "fixable"):
        assert name in members, name


def test_a_getattr_of_a_declared_member_is_found() -> None:
    """The check itself: it finds what it must, and only that."""
    source = ('facts = getattr(kind, "facts", lambda _: ())(model)\n'
              'if hasattr(host, "cached"):\n    pass\n'
              'let_go = getattr(connection, "let_go", None)\n'
              'dist = getattr(config.option, "dist", "no")\n'
              'value = getattr(kind, name)\n')
    found = asked_by_name(source, declared())
    assert [(line, protocol.rsplit(".", 1)[1]) for line, _, protocol in found] == [
        (1, "NeedsFacts"), (2, "PhaseCache"), (4, "Releasable")]


def test_no_module_asks_a_kind_or_a_host_for_a_declared_member_by_name() -> None:
    members = declared()
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}: {call} (declared by {protocol}: ask "
             "isinstance of it instead)"
             for path in sorted(PACKAGE.rglob("*.py"))
             for line, call, protocol in asked_by_name(path.read_text(), members)]
    assert found == []
