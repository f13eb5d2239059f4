"""House rules read from the source: every ``type: ignore`` says why; every module of the package
holds one idea and its docstring's first line says which; and none is over 600 lines."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKED = ("pytest_gpuhost", "tests", "bench")
MAX_LINES = 600
"""The ceiling for any module of the package: past it, a module holds more than one idea."""
OVER_THE_CEILING: dict[str, str] = {}
"""The modules still over MAX_LINES, each with why: an entry goes when its module is split."""
SUMMARY_WORDS = 4
"""The fewest words of a docstring's first line that can say what a module holds (``Helpers.``
cannot)."""
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


def what_it_holds(source: str) -> str | None:
    """Why the module's docstring does not say what the module holds, or None where it does:
    a docstring whose first line starts its summary, a sentence (its first paragraph ends
    with a full stop, or a colon before a list) that opens with at least SUMMARY_WORDS
    words."""
    docstring = ast.get_docstring(ast.parse(source), clean=True)
    if not docstring or not docstring.strip():
        return "no docstring"
    first = docstring.splitlines()[0].strip()
    if not first:
        return "its docstring's first line is empty"
    if len(first.split()) < SUMMARY_WORDS:
        return f"its docstring's first line {first!r} is too short to say what it holds"
    summary = " ".join(docstring.split("\n\n")[0].split())
    if not summary.endswith((".", ":")):
        return f"its docstring's first paragraph is no sentence (no full stop): {summary!r}"
    return None


def test_the_rules_see_what_they_are_about() -> None:
    assert unexplained_ignores("x = f()  # type: ignore[misc]\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore[misc]  #\n") == [1]
    assert unexplained_ignores("x = f()  # type: ignore[misc]  # xdist is untyped\n") == []
    assert unexplained_ignores('x = "# type: ignore"\n') == []
    assert what_it_holds('"""The fix journal: every change, before it is made."""\n') is None
    assert what_it_holds('"""sysctl: one check per key,\nread from proc/sys."""\n') is None
    assert what_it_holds("x = 1\n") == "no docstring"
    assert what_it_holds('"""  """\n') == "no docstring"
    assert "too short" in str(what_it_holds('"""Helpers."""\n'))
    assert "no sentence" in str(what_it_holds('"""The helpers of the fixer\n\nMore."""\n'))


def test_every_type_ignore_says_why() -> None:
    bare = [f"{path.relative_to(REPO)}:{line}" for path in python_files()
            for line in unexplained_ignores(path.read_text(encoding="utf-8"))]
    assert len(python_files()) > 200
    assert not bare, (f"a type: ignore without a reason at {bare}: fix the type, or add the "
                      "reason after it: `# type: ignore[code]  # why it cannot be typed`")


def package_modules() -> dict[str, str]:
    package = REPO / "pytest_gpuhost"
    return {str(path.relative_to(REPO)): path.read_text(encoding="utf-8")
            for path in sorted(package.rglob("*.py"))}


def test_every_module_says_what_it_holds() -> None:
    modules = package_modules()
    assert len(modules) > 150
    unsaid = [f"{path}: {why}" for path, source in modules.items()
              if (why := what_it_holds(source)) is not None]
    assert not unsaid, ("a module holds one idea, and its docstring's first line says which: "
                        + "; ".join(unsaid))


def test_no_module_is_over_the_ceiling() -> None:
    lines = {path: len(source.splitlines()) for path, source in package_modules().items()}
    over = sorted(f"{path} ({count} lines)" for path, count in lines.items()
                  if count > MAX_LINES and path not in OVER_THE_CEILING)
    assert not over, (f"modules over {MAX_LINES} lines: {over}: each holds more than one idea; "
                      "part them where the ideas part (a module each, its names re-exported "
                      "where they were imported from)")
    stale = sorted(path for path in OVER_THE_CEILING if lines.get(path, 0) <= MAX_LINES)
    assert not stale, (f"no longer over {MAX_LINES} lines: {stale}: take them out of "
                       "OVER_THE_CEILING")
