"""A failed fix is decided in one place (``engine._fix_failed``) and worded by one function
(``result.FixFailure.worded``), which every report shows as it is; a report that tells an apply
that failed from a value that did not hold asks ``result.apply_failed``."""

from __future__ import annotations

import ast
from pathlib import Path

from pytest_gpuhost.result import CheckResult, FixFailure, Outcome, apply_failed

PACKAGE = Path(__file__).resolve().parent.parent.parent / "pytest_gpuhost"


def test_each_way_a_fix_fails_is_worded_once() -> None:
    action = "write 10 to proc/sys/vm/swappiness"
    assert FixFailure(action, refused="journal j:3 failed; not retried").worded() == \
        "journal j:3 failed; not retried"
    assert FixFailure(action, apply_error="EACCES").worded() == "apply failed: EACCES"
    assert FixFailure(action, read_error="ENOENT").worded() == \
        f"{action}, then the read-back failed: ENOENT"
    assert FixFailure(action, apply_error="EACCES", read_error="ENOENT").worded() == "EACCES"
    assert FixFailure(action, read_back="60", reason="'60' != '10'").worded() == \
        f"{action}, but read back '60': '60' != '10'"


def test_an_apply_that_failed_is_told_from_a_value_that_did_not_hold() -> None:
    def record(outcome: Outcome, failure: FixFailure) -> CheckResult:
        return CheckResult("sysctl[vm.swappiness]", "sysctl", "vm.swappiness", "10", "60",
                           outcome, failure.worded())

    assert apply_failed(record(Outcome.FIX_FAILED, FixFailure("w", apply_error="EACCES")))
    assert not apply_failed(record(Outcome.FIX_FAILED, FixFailure("w", read_back="60")))
    assert not apply_failed(record(Outcome.FAILED, FixFailure("w", apply_error="EACCES")))


def _names_fix_failed(path: Path) -> list[int]:
    """The lines of ``path`` that name ``Outcome.FIX_FAILED``."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr == "FIX_FAILED"
            and isinstance(node.value, ast.Name) and node.value.id == "Outcome"]


def test_the_engine_decides_a_failed_fix_in_one_place() -> None:
    assert len(_names_fix_failed(PACKAGE / "engine.py")) == 1, \
        "a fix_failed record is made by engine._fix_failed alone"


def test_no_report_words_a_failed_fix_itself() -> None:
    worded = [f"{path.name}:{node.lineno}" for path in sorted((PACKAGE / "reports").glob("*.py"))
              for node in ast.walk(ast.parse(path.read_text()))
              if isinstance(node, ast.Constant) and isinstance(node.value, str)
              and node.value.startswith(("apply failed", "FIX_FAILED", "  FIX_FAILED"))]
    assert worded == [], "a report asks result.apply_failed and Outcome.shown instead"
