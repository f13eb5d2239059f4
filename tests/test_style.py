"""House rules read from the source: every ``type: ignore`` says why, and every module of the
package stays short enough to read at once (400 lines) unless its docstring says why not."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("pytest_gpuhost", "tests", "bench")
MAX_LINES = 400
LONG_REASON = re.compile(r"^\(.*\bover 400 lines\b.*:.+\)$")
"""The form of a long module's reason, a line of its own among its docstring's first lines:
``(One file over 400 lines on purpose: it is sent to a target as one source over stdin.)``"""
REASON_LINES = 5
IGNORE = re.compile(r"#\s*type:\s*ignore\b(\[[^\]]*\])?(?P<after>.*)")
"""mypy's ignore comment, with what follows it on its line."""


def python_files() -> list[Path]:
    return sorted(path for folder in CHECKED for path in (REPO / folder).rglob("*.py")
                  if ".venv" not in path.parts)


def unexplained_ignores(source: str) -> list[int]:
    """The lines of ``source`` whose ``type: ignore`` comment has no reason after it, in the
    form ``# type: ignore[code]  # why`` (comments only: a string that mentions one is no
    ignore)."""
    lines = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        found = IGNORE.search(token.string)
        if found is None:
            continue
        after = found.group("after").strip()
        if not (after.startswith("#") and after.lstrip("#").strip()):
            lines.append(token.start[0])
    return lines


def long_without_reason(source: str) -> bool:
    """More than MAX_LINES lines, and no line of the form LONG_REASON among the first
    REASON_LINES lines of the module's docstring."""
    if len(source.splitlines()) <= MAX_LINES:
        return False
    docstring = ast.get_docstring(ast.parse(source), clean=True) or ""
    head = [line.strip() for line in docstring.splitlines()[:REASON_LINES]]
    return not any(LONG_REASON.match(line) for line in head)


def test_the_rules_see_what_they_are_about() -> None:
    assert unexplained_ignores("x = f()  # type: ignore[misc]\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore[misc]  #\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore[misc]  # xdist is untyped\n") == []
    assert unexplained_ignores('x = "# type: ignore"\n') == []
    body = "x = 1\n" * MAX_LINES
    assert not long_without_reason('"""Short."""\n' + "x = 1\n" * (MAX_LINES - 1))
    assert long_without_reason('"""Long."""\n' + body)
    assert not long_without_reason(
        '"""Long.\n\n(One file over 400 lines on purpose: it is one source.)\n"""\n' + body)
    assert long_without_reason('"""Long.\n\nOver 400 lines.\n"""\n' + body)  # no reason given
    assert long_without_reason(
        '"""Long.\n\n\n\n\n\n(One file over 400 lines on purpose: too late.)\n"""\n' + body)


def test_every_type_ignore_says_why() -> None:
    bare = [f"{path.relative_to(REPO)}:{line}" for path in python_files()
            for line in unexplained_ignores(path.read_text(encoding="utf-8"))]
    assert len(python_files()) > 200
    assert not bare, (f"a type: ignore without a reason at {bare}: fix the type, or add the "
                      "reason after it: `# type: ignore[code]  # why it cannot be typed`")


def test_every_module_is_short_or_says_why() -> None:
    package = REPO / "pytest_gpuhost"
    long = sorted(str(path.relative_to(REPO)) for path in package.rglob("*.py")
                  if long_without_reason(path.read_text(encoding="utf-8")))
    assert not long, (f"modules over {MAX_LINES} lines: {long}: split each where a seam is (a "
                      "helper module of its own, its names re-exported), or give the reason on "
                      "a line among its docstring's first lines: `(One file over 400 lines on "
                      "purpose: why.)`")
