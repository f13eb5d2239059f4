"""The pre-benchmark gate: a run's other tests wait for every host check, and run only if all
of them passed, were fixed or did not apply.

``--gpuhost-gate`` gates every test that is not a host check; ``@pytest.mark.gpuhost`` gates one
test. A gated test whose gate is closed is an error (not a failure, not a skip) naming the host
checks that closed it. Under xdist the verdicts come from the workers' done-marks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from ..printable import counted
from ..result import OPEN_OUTCOMES, CheckResult

__all__ = ["OPEN_OUTCOMES", "GateVerdict", "judge", "opens_gate", "verdict_text"]


def opens_gate(result: CheckResult | None) -> bool:
    return result is not None and result.outcome in OPEN_OUTCOMES


def verdict_text(check_id: str, result: CheckResult | None) -> str:
    """What a done-mark holds: the outcome (``none`` when the check made no record) and the id."""
    outcome = result.outcome.value if result is not None else "none"
    return f"{'open' if opens_gate(result) else 'closed'} {outcome} {check_id}"


class GateVerdict(msgspec.Struct, frozen=True):
    total: int
    failing: tuple[str, ...]
    """``id (outcome)`` of each host check that closed the gate."""
    unfinished: tuple[str, ...] = ()

    @property
    def open(self) -> bool:
        return self.total > 0 and not self.failing and not self.unfinished

    def message(self) -> str:
        if self.total == 0:
            return ("gpuhost gate: no host check was selected, so nothing vouches for this "
                    "host; select the spec's checks too (or drop --gpuhost-gate)")
        if self.unfinished:
            return (f"gpuhost gate: {len(self.unfinished)} of "
                    f"{counted(self.total, 'host check')} did not finish: "
                    f"{_listed(self.unfinished)}")
        return (f"gpuhost gate closed: {len(self.failing)} of "
                f"{counted(self.total, 'host check')} failed: {_listed(self.failing)}")


NAMED = 12
"""How many checks a gate message names; the rest are counted (the report lists them all)."""


def _listed(ids: Sequence[str]) -> str:
    more = f", and {len(ids) - NAMED} more" if len(ids) > NAMED else ""
    return ", ".join(ids[:NAMED]) + more


def judge(checks: Sequence[tuple[int, str]], verdicts: Mapping[int, str | None]) -> GateVerdict:
    """``checks``: (collection index, id) of the selected host checks; ``verdicts``: index ->
    verdict_text(), None or absent while the check has not finished."""
    failing: list[str] = []
    unfinished: list[str] = []
    for index, check_id in checks:
        text = verdicts.get(index)
        if text is None:
            unfinished.append(check_id)
            continue
        state, outcome, _ = text.split(" ", 2)
        if state != "open":
            failing.append(f"{check_id} ({outcome})")
    return GateVerdict(len(checks), tuple(failing), tuple(unfinished))
