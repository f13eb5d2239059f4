"""What a JUnit consumer sees of a check.

pytest writes xunit2 by default (``junit_family``), the format of Jenkins' xUnit plugin, whose
schema (``junit-10.xsd``) has no ``<properties>`` in a ``<testcase>``: the plugin skips a file
that holds them, and pytest's own ``record_property`` warns against them there. So a check's
facts go where each family has room for them:

- ``xunit1`` and ``legacy``: ``<property>`` elements of its test case (``kind``, ``key``,
  ``expected``, ``observed``, ``outcome``, ``before``/``after``, ``severity``, ``target``, and a
  ``warning`` per warning: a value close to its floor, a GPU event that leaves the node open,
  or ``will revert: ...``; an ``xid`` per kind of GPU event the kernel log held: GPU, code,
  class and action);
- ``xunit2``: the same facts as lines of the test case's captured output, which pytest writes
  to its ``<system-out>`` when ``junit_logging`` is ``system-out``, ``out-err`` or ``all``
  (with the default ``no``, a failing check's facts are in its ``<failure>`` text).
"""

from __future__ import annotations

from typing import Any

from ..result import CheckResult

PROPERTY_FAMILIES = ("xunit1", "legacy")
"""The junit_family values whose test cases may carry <properties>."""
FACTS_SECTION = "Captured stdout gpuhost"
"""The report section that holds a check's facts under xunit2 (pytest's JUnit writes every
``Captured stdout`` section into <system-out>; the terminal shows only those of the phase that
failed, and this one belongs to no phase)."""


def junit_properties(result: CheckResult) -> list[tuple[str, str]]:
    """What a JUnit consumer sees of a check, as <property> elements of its test case."""
    values = [("kind", result.kind), ("key", result.key), ("expected", result.expected),
              ("observed", result.observed), ("outcome", result.outcome.value),
              ("before", result.before), ("after", result.after),
              ("severity", result.severity), ("target", result.target),
              *(("warning", warning) for warning in result.warnings),
              *(("xid", _xid(group)) for group in result.details.get("xid_counts", ())
                if isinstance(group, dict))]
    return [(name, value) for name, value in values if value is not None]


def _xid(group: dict[str, Any]) -> str:
    """``0000:41:00.0 Xid 79 (GPU has fallen off the bus) x1: hardware, reboot, fail``."""
    code = f" {group.get('code')}" if group.get("code") is not None else ""
    return (f"{group.get('gpu') or 'GPU ?'} {group.get('kind')}{code} "
            f"({group.get('description')}) x{group.get('count')}: {group.get('class')}, "
            f"{group.get('action')}, {group.get('verdict')}")


def facts_text(result: CheckResult) -> str:
    """The same facts as ``name: value`` lines, for <system-out>."""
    return "".join(f"gpuhost.{name}: {value}\n" for name, value in junit_properties(result))


def junit_family(config: Any) -> str:
    """The run's ``junit_family`` (``xunit2`` where pytest's JUnit plugin is not loaded)."""
    try:
        return str(config.getini("junit_family") or "xunit2")
    except ValueError:  # -p no:junitxml: the ini value is not even declared
        return "xunit2"


def add_junit_facts(report: Any, result: CheckResult, family: str) -> None:
    """Put a check's facts on the report JUnit reads its test case from (its teardown
    report): properties under xunit1/legacy, a captured-output section under xunit2."""
    if family in PROPERTY_FAMILIES:
        report.user_properties = [*report.user_properties, *junit_properties(result)]
    else:
        report.sections = [*report.sections, (FACTS_SECTION, facts_text(result))]
