"""One result record per check: what every reporter (terminal, JSON, later Allure) is fed from."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    FIXED = "fixed"
    FIX_FAILED = "fix_failed"
    SKIPPED = "skipped"
    ERROR = "error"

    def __str__(self) -> str:
        return self.value


OUTCOMES = tuple(o.value for o in Outcome)


@dataclass(frozen=True)
class CheckResult:
    id: str
    kind: str
    key: str | None
    expected: str
    observed: str | None
    outcome: Outcome
    message: str
    before: str | None = None
    after: str | None = None
    why: str | None = None
    location: str = ""
    action: str | None = None
    """What a fix did (the write or the command), when one was attempted."""
    action_output: str | None = None
    evidence: tuple[dict[str, str], ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        # Field by field: dataclasses.asdict deep-copies and was a tenth of a 340-check run.
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["outcome"] = self.outcome.value
        data["evidence"] = list(self.evidence)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        values = dict(data)
        values["outcome"] = Outcome(values["outcome"])
        values["evidence"] = tuple(values.get("evidence", ()))
        known = cls.__dataclass_fields__
        return cls(**{k: v for k, v in values.items() if k in known})


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    """Counts for every outcome, zeros included, in the contract's order."""
    counts = Counter(r.outcome.value for r in results)
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}
