"""What a JUnit consumer sees of a check: <property> elements of its test case."""

from __future__ import annotations

from ..result import CheckResult


def junit_properties(result: CheckResult) -> list[tuple[str, str]]:
    """What a JUnit consumer sees of a check, as <property> elements of its test case."""
    values = [("kind", result.kind), ("key", result.key), ("expected", result.expected),
              ("observed", result.observed), ("outcome", result.outcome.value),
              ("before", result.before), ("after", result.after),
              ("severity", result.severity), ("target", result.target)]
    return [(name, value) for name, value in values if value is not None]
