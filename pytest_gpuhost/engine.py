"""Run one check: observe -> compare -> (fix -> re-observe -> compare) -> one result record."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .checks import Applied, CannotFix, Check, FixError, NotApplicable, Observation
from .conditions import ConditionFn
from .host import Host, HostError
from .result import CheckResult, Outcome


@dataclass(frozen=True)
class RunOptions:
    fix: bool = False


def run_check(
    check: Check, host: Host, conditions: Mapping[str, ConditionFn], options: RunOptions
) -> CheckResult:
    expected = check.expect.describe()
    try:
        skip = _skip_reason(check, host, conditions)
        if skip is not None:
            return _result(check, Outcome.SKIPPED, skip, None)
        observed = check.probe.observe(host)
    except NotApplicable as exc:
        return _result(check, Outcome.SKIPPED, str(exc), None)
    except HostError as exc:
        return _result(check, Outcome.ERROR, str(exc), None)
    verdict = check.expect.judge(observed.value)
    if verdict.ok:
        return _result(check, Outcome.PASSED, verdict.warning, observed, warning=verdict.warning)
    problem = _explain(verdict.reason, observed)
    if not options.fix:
        fixable = check.probe.fixable and check.options.fix and observed.value is not None
        hint = " (fixable: run with --fix)" if fixable else ""
        return _result(check, Outcome.FAILED, problem + hint, observed)
    if not check.options.fix:
        return _result(check, Outcome.FAILED, f"{problem}; not fixed: 'fix: false' in the spec",
                       observed)
    if not check.probe.fixable:
        return _result(check, Outcome.FAILED, f"{problem} (a check-only kind: no fixer)",
                       observed)
    value = check.expect.fix_value(observed.value)
    if value is None:
        return _result(check, Outcome.FAILED, f"{problem}; not fixed: '{expected}' names no "
                                              "single value to write", observed)
    return _fix(check, host, observed, value, problem)


def _fix(check: Check, host: Host, before: Observation, value: str, problem: str) -> CheckResult:
    apply_error: str | None = None
    try:
        applied = check.probe.apply(host, value, before)
    except CannotFix as exc:
        return _result(check, Outcome.FAILED, f"{problem}; not fixed: {exc}", before)
    except FixError as exc:
        apply_error = str(exc)
        applied = Applied(exc.action or f"set {value}")
    try:
        after = check.probe.observe(host)
    except HostError as exc:
        reason = apply_error or f"{applied.action}, then the read-back failed: {exc}"
        return _result(check, Outcome.FIX_FAILED, reason, before, before=before, applied=applied)
    if apply_error is not None:
        return _result(check, Outcome.FIX_FAILED, f"apply failed: {apply_error}", after,
                       before=before, applied=applied)
    verdict = check.expect.judge(after.value)
    if verdict.ok:
        return _result(check, Outcome.FIXED, f"{before.value} -> {after.value}", after,
                       before=before, applied=applied)
    message = f"{applied.action}, but read back {after.value!r}: {_explain(verdict.reason, after)}"
    if applied.output:
        message += f"; it printed: {applied.output}"
    return _result(check, Outcome.FIX_FAILED, message, after, before=before, applied=applied)


def _skip_reason(check: Check, host: Host, conditions: Mapping[str, ConditionFn]) -> str | None:
    when = check.options.when
    if when is None:
        return None
    holds, reason = conditions[when.name](host)
    if holds != when.negate:
        return None
    return f"when: {when} is false: {reason}"


def _explain(reason: str, observed: Observation) -> str:
    return observed.problem if observed.value is None and observed.problem else reason


def _result(
    check: Check,
    outcome: Outcome,
    message: str,
    observed: Observation | None,
    *,
    before: Observation | None = None,
    applied: Applied | None = None,
    warning: str = "",
) -> CheckResult:
    evidence = [e.as_dict() for e in observed.evidence] if observed else []
    if before is not None and before is not observed:
        evidence = [{"source": f"before: {e.source}", "raw": e.raw} for e in before.evidence] + \
            evidence
    return CheckResult(
        id=check.id,
        kind=check.kind,
        key=check.key,
        expected=check.expect.describe(),
        observed=observed.value if observed else None,
        outcome=outcome,
        message=message,
        before=before.value if before else None,
        after=observed.value if before is not None and observed is not None else None,
        why=check.options.why,
        location=check.options.where,
        action=applied.action if applied else None,
        action_output=applied.output if applied and applied.output else None,
        evidence=tuple(evidence),
        warning=warning or None,
        details=dict(observed.details) if observed else {},
    )
