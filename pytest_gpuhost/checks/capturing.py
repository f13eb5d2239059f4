"""What every kind's ``capture`` uses: a section as captured, and the usual ways to turn the
run's records (the values observed) and a section's model (its entries' options and forms) into
the section's YAML value, or into what had to be left out and why.

The rules: exact values for switches and enums; ``min:`` at the lowest value seen for sizes,
limits and versions (``Rule(floor=True)``, and wherever the spec itself asked for a minimum;
``max:`` where it asked for a maximum); values that differ between GPUs as ``one_of`` where the
key takes it. Every value is judged with the spec's own matcher against every record before it
is kept, so the captured spec passes on the host it came from; what cannot be written that way
(a value that could not be read, values that differ where one is wanted) is left out with the
reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec

from ..result import CheckResult, Outcome
from ..specmodel import EntryOptions
from ..specmodel.matchers import Auto, Domain, Exact, Expectation, Match, OneOf, Range

OBSERVED = frozenset({Outcome.PASSED, Outcome.FAILED, Outcome.FIXED, Outcome.FIX_FAILED,
                      Outcome.WOULD_FIX, Outcome.REBOOT_REQUIRED})
"""Outcomes whose record holds the value the host has now (after a fix, the read-back)."""


class Captured(msgspec.Struct):
    """One section as captured: its entries (None: none could be kept) and what was left out."""

    entries: dict[str, Any] = msgspec.field(default_factory=dict)
    notes: list[str] = msgspec.field(default_factory=list)

    def leave_out(self, what: str, why: str) -> None:
        self.notes.append(f"{what}: {' '.join(why.split())[:160]}")

    def warn(self, what: str, why: str) -> None:
        """A note that the host already fails what the entry holds (a health fact that is
        bad), written as a ``WARNING:`` comment whether or not the entry was kept."""
        self.notes.append(f"{WARNING} {what}: {' '.join(why.split())[:300]}")


WARNING = "WARNING:"
"""How a note that warns starts (``Captured.warn``): the YAML shows it as it is, not as an
entry left out."""


Records = Mapping[str, Sequence[CheckResult]]
"""A spec's records by kind, in run order."""


ARGUED_AGAINST = frozenset({Outcome.FAILED, Outcome.FIX_FAILED, Outcome.WOULD_FIX,
                            Outcome.REBOOT_REQUIRED})
"""Outcomes whose observed value is not what the entry asked: its ``why:`` argued against it."""


def argued_against(records: Sequence[CheckResult]) -> bool:
    """Whether the value captured from ``records`` is one the entry's ``why:`` argued against
    (a record did not pass): the captured entry then goes without that ``why:``."""
    return any(record.outcome in ARGUED_AGAINST for record in records)


def options_of(options: EntryOptions, *, why: bool = True) -> dict[str, Any]:
    """The entry options as a spec writes them (only those that differ from the defaults;
    ``why=False``: without its ``why:``, for a value it argued against)."""
    shown: dict[str, Any] = {}
    if options.when is not None:
        shown["when"] = str(options.when)
    if not options.fix:
        shown["fix"] = False
    if options.severity != "normal":
        shown["severity"] = options.severity
    if options.why and why:
        shown["why"] = options.why
    return shown


def entry(form: Mapping[str, Any], options: EntryOptions, value_key: str = "value", *,
          why: bool = True) -> Any:
    """``{value: X, why: ...}``, or the bare value when there is nothing beside it."""
    extra = options_of(options, why=why)
    if list(form) == [value_key] and not extra:
        return form[value_key]
    return {**form, **extra}


def spec_form(expect: Expectation, value_key: str = "value") -> dict[str, Any] | None:
    """An expectation written back as the spec had it (for an entry whose ``when:`` was false)."""
    if isinstance(expect, Exact):
        return {value_key: expect.value}
    if isinstance(expect, OneOf):
        return {"one_of": list(expect.values)}
    if isinstance(expect, Match):
        return {"match": expect.pattern.pattern}
    if isinstance(expect, Range):
        bounds = {"min": expect.min, "max": expect.max}
        return {k: v for k, v in bounds.items() if v is not None}
    return None


def problem(records: Sequence[CheckResult]) -> str | None:
    """Why these records hold no value to capture, or None when every one does."""
    if not records:
        return "no check of it ran (nothing here it applies to, or it was deselected)"
    for record in records:
        if record.outcome is Outcome.SKIPPED:
            return f"skipped: {record.message}"
        if record.outcome is Outcome.ERROR:
            return f"could not be read: {record.message}"
        if record.outcome not in OBSERVED or record.observed is None:
            return f"nothing was read: {record.message}"
    return None


def when_false(records: Sequence[CheckResult], options: EntryOptions) -> bool:
    """Every record skipped by the entry's own ``when:``: kept as the spec has it."""
    return bool(records) and options.when is not None and all(
        r.outcome is Outcome.SKIPPED and r.message.startswith("when:") for r in records)


class Rule(msgspec.Struct, frozen=True):
    """How one key's values are captured."""

    floor: bool = False
    """Captured as ``min:`` the lowest value seen (sizes, limits, versions)."""
    one_of: bool = False
    """The key takes ``one_of`` (values that differ between GPUs are kept as a list)."""
    show: Callable[[str], str] = str.strip
    """The observed value as the spec writes it."""


def _domain(expect: Expectation) -> Domain:
    found = getattr(expect, "domain", None)
    return found if found is not None else Auto()


def capture_values(values: Sequence[str], expect: Expectation, rule: Rule
                   ) -> tuple[dict[str, Any] | None, str]:
    """The expectation form that every one of ``values`` passes, or None and why not."""
    domain = _domain(expect)
    shown = list(dict.fromkeys(rule.show(v) for v in values))
    bound = "min" if rule.floor else None
    if isinstance(expect, Range) and (expect.min is None) != (expect.max is None):
        bound = "min" if expect.min is not None else "max"
    form: dict[str, Any] | None = None
    matcher: Expectation | None = None
    if bound is not None:
        try:
            ordered = sorted(shown, key=domain.order_key)
        except ValueError:
            bound = None  # no order (a multi-value sysctl under min:): the exact value
        else:
            limit = ordered[0] if bound == "min" else ordered[-1]
            form = {bound: limit}
            matcher = Range(limit if bound == "min" else None, limit if bound == "max" else None,
                            domain)
    if bound is None:
        if len(shown) == 1:
            form, matcher = {"value": shown[0]}, Exact(shown[0], domain)
        elif rule.one_of:
            form, matcher = {"one_of": shown}, OneOf(tuple(shown), domain)
        else:
            return None, f"the values differ ({', '.join(shown)}) and this key takes one value"
    assert form is not None and matcher is not None
    try:
        for value in shown:
            domain.validate(value)
    except ValueError as exc:
        return None, f"{exc} (the spec could not say it)"
    failing = [v for v in values if not matcher.judge(v).ok]
    if failing:
        return None, f"{failing[0]!r} would not pass {matcher.describe()}"
    return form, ""


def capture_key(name: str, records: Sequence[CheckResult], expect: Expectation,
                options: EntryOptions, rule: Rule, out: Captured, label: str) -> None:
    """One spec key over its records (one per GPU, bridge, or a single one) into ``out``."""
    if when_false(records, options):
        form = spec_form(expect)
        if form is not None:
            out.entries[name] = entry(form, options)
            return
    why = problem(records)
    if why is not None:
        out.leave_out(label, why)
        return
    form, reason = capture_values([str(r.observed) for r in records], expect, rule)
    if form is None:
        out.leave_out(label, reason)
        return
    out.entries[name] = entry(form, options, why=not argued_against(records))


def records_of(records: Records, kind: str, key: str | None = None
               ) -> list[CheckResult]:
    """The records of one check kind (and key)."""
    found = records.get(kind, ())
    return [r for r in found if key is None or r.key == key]
