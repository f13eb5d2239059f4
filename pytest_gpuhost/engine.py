"""Run one check: observe -> compare -> (plan -> journal -> apply -> re-observe -> compare).

One result record comes out, whatever happens. A dry run stops after the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import msgspec

from .checks import KERNEL, CannotFix, Check, NotApplicable, Observation, is_boot_time
from .host import Host, HostError, PhaseCache, TargetLost, doing
from .result import WILL_REVERT, CheckResult, FixFailure, Outcome

FIXABLE = " (fixable: run with --fix)"
"""How a failure that --fix would fix ends (``_hint``)."""
BOOT_FIXABLE = " (a boot-time setting: --fix --fix-persist writes it, then reboot)"
"""How a failure of a boot-time setting that --fix --fix-persist would write ends."""
OFFERS = (FIXABLE, BOOT_FIXABLE)
"""The endings that offer --fix: left out where --fix would not do it (a container's own
run of its host's kernel checks)."""

if TYPE_CHECKING:  # the fixer (journal, locks, NVML settings) is imported by a fix only
    from .checks.changes import Plan
    from .checks.conditions import ConditionFn
    from .fix.fixer import Applied, Fixer
    from .fix.history import FixHistory


class RunOptions(msgspec.Struct, frozen=True):
    fix: bool = False
    dry_run: bool = False
    persist: bool = False
    """--fix-persist: boot-time checks may write the boot configuration (a drop-in)."""
    simulate: bool = False
    """A dry run whose later checks read the files as the earlier ones' plans would leave
    them (a rollback's preview: an older change of a file is undone after the newer ones)."""


def run_check(
    check: Check,
    host: Host,
    conditions: Mapping[str, ConditionFn],
    options: RunOptions,
    fixer: Fixer | None = None,
    history: FixHistory | None = None,
) -> CheckResult:
    """Raises only LockUnavailable (the root's lock cannot be had); all else is a record.
    ``history``: the host's earlier fixes, whose failures are not retried (None: retry)."""
    try:
        skip = _skip_reason(check, host, conditions)
        if skip is not None:
            return _result(check, Outcome.SKIPPED, skip, None)
        observed = check.probe.observe(host)
        if observed.expect is not None:  # the bar the observation found (a path floor)
            check = msgspec.structs.replace(check, expect=observed.expect)
    except NotApplicable as exc:
        return _result(check, Outcome.SKIPPED, str(exc), None)
    except HostError as exc:
        return _result(check, Outcome.ERROR, str(exc), None)
    except Exception as exc:  # a probe's bug must still leave a record, not a traceback
        return _result(check, Outcome.ERROR, f"{type(exc).__name__}: {exc}", None)
    verdict = check.expect.judge(observed.value)
    if verdict.ok:
        return _result(check, Outcome.PASSED, verdict.warning, observed,
                       notes=(verdict.warning,) if verdict.warning else ())
    problem = _explain(verdict.reason, observed)
    pending = _reboot_required(check, observed, problem)
    if pending is not None:
        return pending
    if not options.fix:
        return _result(check, Outcome.FAILED, problem + _hint(check, host, observed), observed)
    unfixed = _not_fixed(check, observed, options)
    if unfixed is not None:
        return _result(check, Outcome.FAILED, problem + unfixed, observed)
    if options.dry_run:
        return _plan_only(check, host, observed, problem, history, simulate=options.simulate)
    if fixer is None:
        from .fix.fixer import Fixer

        fixer = Fixer(host, None, run_lock=None, apply_lock=None, lock_timeout=0)
    try:
        with doing(f"applying a fix of {check.id}"), fixer.locked():
            return _fix(check, host, fixer, problem, history)
    except TargetLost as exc:  # the connection, lost taking the lock: that target only
        return _result(check, Outcome.ERROR, str(exc), observed)


def _not_fixed(check: Check, observed: Observation, options: RunOptions) -> str | None:
    """Why --fix leaves a failing check as it is (the end of its message), or None."""
    if not check.options.fix:
        return "; not fixed: 'fix: false' in the spec"
    if not check.probe.fixable:
        return " (a check-only kind: no fixer)"
    if check.expect.fix_value(observed.value) is None:
        return f"; not fixed: '{check.expect.describe()}' names no single value to write"
    if is_boot_time(check.probe) and not options.persist:
        return ("; not fixed: a boot-time setting; --fix --fix-persist writes it to the boot "
                "configuration, then a reboot applies it")
    return None


def _plan(check: Check, host: Host, observed: Observation) -> Plan:
    value = check.expect.fix_value(observed.value)
    if value is None:
        raise CannotFix(f"'{check.expect.describe()}' names no single value to write")
    plan = check.probe.plan(host, value, observed)
    if not plan.changes:
        raise CannotFix("the probe planned no change")
    return plan


def _hint(check: Check, host: Host, observed: Observation) -> str:
    """Whether --fix would fix this failure, decided the way --fix decides it (by planning)."""
    if not check.probe.fixable or not check.options.fix or observed.value is None:
        return ""  # nothing was read: the problem already says why
    try:
        _plan(check, host, observed)
    except CannotFix as exc:
        return f" (not fixable: {exc})"
    except (HostError, ValueError):
        return ""
    if is_boot_time(check.probe):
        return BOOT_FIXABLE
    return FIXABLE


def _reboot_required(check: Check, observed: Observation, problem: str,
                     done: str = "") -> CheckResult | None:
    """The record of a value that is wrong now but that the boot configuration sets right."""
    boot = observed.next_boot
    if boot is None or not check.expect.judge(boot.value).ok:
        return None
    return _result(check, Outcome.REBOOT_REQUIRED,
                   f"{done}{problem}; {boot.where} sets {boot.value!r} for the next boot: "
                   f"{boot.apply}", observed)


def _plan_only(check: Check, host: Host, observed: Observation, problem: str,
               history: FixHistory | None, *, simulate: bool = False) -> CheckResult:
    try:
        plan = _plan(check, host, observed)
    except CannotFix as exc:
        return _result(check, Outcome.FAILED, f"{problem}; not fixable: {exc}", observed)
    except HostError as exc:
        return _result(check, Outcome.ERROR, f"planning the fix failed: {exc}", observed)
    earlier = history.failed_before(check.id, plan.changes) if history else None
    if earlier is not None:
        return _result(check, Outcome.FAILED, earlier.preview(problem), observed)
    if simulate:
        _assume(host, plan)
    return _result(check, Outcome.WOULD_FIX, f"{problem}; would {plan.brief or plan.summary}",
                   observed,
                   plan=plan)


def _assume(host: Host, plan: Plan) -> None:
    """Have the host's reads show the files as the plan would leave them, writing nothing
    (a host without a read cache to hold them, nothing). Commands and NVML settings are not
    simulated."""
    from .checks.changes import ReplaceFile, WriteBytes, WriteText  # a plan's

    if not isinstance(host, PhaseCache):
        return
    assume = host.assume
    for change in plan.changes:
        if isinstance(change, WriteText):
            assume(change.path, change.new_bytes)
        elif isinstance(change, ReplaceFile):
            assume(change.path, None if change.new is None else change.new.encode())
        elif isinstance(change, WriteBytes):
            try:
                data = bytearray(host.read_bytes(change.path))
            except HostError:
                continue  # the change itself will say why it cannot be read
            new = bytes.fromhex(change.new)
            data[change.offset:change.offset + len(new)] = new
            assume(change.path, bytes(data))


def _fix(check: Check, host: Host, fixer: Fixer, problem: str,
         history: FixHistory | None) -> CheckResult:
    from .fix.fixer import Applied, FixError

    # Observed again under the lock, live: another run may have fixed it while we waited.
    host.invalidate()
    try:
        before = check.probe.observe(host)
    except HostError as exc:
        return _result(check, Outcome.ERROR, str(exc), None)
    if check.expect.judge(before.value).ok:
        return _result(check, Outcome.PASSED, "right by the time the lock was taken", before)
    pending = _reboot_required(check, before, problem)
    if pending is not None:  # another worker's boot-time fix wrote it meanwhile
        return pending
    try:
        plan = _plan(check, host, before)
    except CannotFix as exc:
        return _result(check, Outcome.FAILED, f"{problem}; not fixed: {exc}", before)
    except HostError as exc:
        return _result(check, Outcome.ERROR, f"planning the fix failed: {exc}", before)
    earlier = history.failed_before(check.id, plan.changes) if history else None
    if earlier is not None:  # the host refused this very change before: nothing is run
        return _fix_failed(check, FixFailure(plan.summary, refused=earlier.message()), before)
    apply_error: str | None = None
    try:
        applied = fixer.apply(check.id, check.kind, check.key, plan)
    except FixError as exc:
        apply_error = str(exc)
        applied = Applied(exc.action or plan.summary)
    try:
        after = check.probe.observe(host)
    except HostError as exc:
        return _fix_failed(check, FixFailure(applied.action, apply_error=apply_error,
                                             read_error=str(exc)),
                           before, before=before, applied=applied, plan=plan)
    if apply_error is not None:
        return _fix_failed(check, FixFailure(applied.action, apply_error=apply_error), after,
                           before=before, applied=applied, plan=plan)
    verdict = check.expect.judge(after.value)
    printed = f"; it printed: {applied.output}" if applied.output else ""
    if verdict.ok:
        return _result(check, Outcome.FIXED, f"{before.value} -> {after.value}{printed}", after,
                       before=before, applied=applied, plan=plan)
    pending = _reboot_required(check, after, _explain(verdict.reason, after),
                               done=f"{applied.action}; running: ")
    if pending is not None:
        return _result(check, Outcome.REBOOT_REQUIRED, pending.message, after, before=before,
                       applied=applied, plan=plan)
    reason = _explain(verdict.reason, after) + (
        printed or _read_back_reason(check, before, after, len(plan.changes)))
    return _fix_failed(check, FixFailure(applied.action, read_back=after.value, reason=reason),
                       after, before=before, applied=applied, plan=plan)


def _fix_failed(check: Check, failure: FixFailure, observed: Observation, *,
                before: Observation | None = None, applied: Applied | None = None,
                plan: Plan | None = None) -> CheckResult:
    """The one place a check's outcome is ``fix_failed``: its message is how it failed."""
    return _result(check, Outcome.FIX_FAILED, failure.worded(), observed, before=before,
                   applied=applied, plan=plan)


def _read_back_reason(check: Check, before: Observation, after: Observation,
                      writes: int) -> str:
    """What the read-back says about the write: left as it was (ignored), another value than
    the one written (clamped or rounded), or, of several writes, some that did not hold."""
    if after.value == before.value:
        return f" (unchanged from {before.value!r}: the device or kernel ignored the write)"
    if writes > 1:
        return f" (some of the {writes} writes did not hold)"
    written = check.expect.fix_value(before.value)
    return (f" (wrote {written!r}, read back {after.value!r}: the kernel or device clamped or "
            "rounded it)")


def _skip_reason(check: Check, host: Host, conditions: Mapping[str, ConditionFn]) -> str | None:
    when = check.options.when
    if when is None:
        return None
    holds, reason = conditions[when.name](host)
    if holds != when.negate:
        return None
    return f"when: {when} is false: {reason}"


def _explain(reason: str, observed: Observation) -> str:
    if observed.value is None and observed.problem:
        return observed.problem
    return f"{reason}: {observed.culprits}" if observed.culprits else reason


def _warnings(check: Check, outcome: Outcome, observed: Observation | None) -> tuple[str, ...]:
    """A value that is right now but that boot-time configuration would set back."""
    if observed is None or observed.persisted is None or outcome not in (Outcome.PASSED,
                                                                         Outcome.FIXED):
        return ()
    value, source = observed.persisted
    if check.expect.judge(value).ok:
        return ()
    return (f"{WILL_REVERT}{source} sets {value!r} on the next boot or `sysctl --system`",)


def error_result(check: Check, message: str) -> CheckResult:
    """The record of a check that could not be run at all (its target cannot be reached)."""
    return _result(check, Outcome.ERROR, message, None)


def _result(
    check: Check,
    outcome: Outcome,
    message: str,
    observed: Observation | None,
    *,
    before: Observation | None = None,
    applied: Applied | None = None,
    plan: Plan | None = None,
    notes: tuple[str, ...] = (),
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
        after=observed.value if before is not None and observed is not None
        and observed is not before else None,
        why=check.options.why,
        location=check.options.where,
        action=applied.action if applied else None,
        action_output=applied.output if applied and applied.output else None,
        evidence=tuple(evidence),
        plan=_plan_record(plan) if plan else (),
        warnings=(*notes, *_warnings(check, outcome, observed)),
        severity=check.options.severity,
        details=dict(observed.details) if observed else {},
        subjects={**check.subjects, **_seen_subjects(before or observed)},
        hardware=check.hardware,
        section=check.owner,
        scope=check.scope or KERNEL,
        measured=bool(check.measured),
    )


def _plan_record(plan: Plan) -> tuple[dict[str, object], ...]:
    from .checks.changes import to_dict  # a plan's: a check that passes makes none

    return tuple({"change": c.describe(), **to_dict(c)} for c in plan.changes)


def _seen_subjects(observation: Observation | None) -> dict[str, str]:
    """What was wrong when the check looked first (a fix's before, else what it observed)."""
    return dict(observation.subjects) if observation is not None else {}
