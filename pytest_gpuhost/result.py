"""One result record per check: what every reporter (terminal, JSON, JUnit, Allure...) reads."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable
from typing import Any

import msgspec


class Outcome(str, enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    FIXED = "fixed"
    FIX_FAILED = "fix_failed"
    SKIPPED = "skipped"
    ERROR = "error"
    WOULD_FIX = "would_fix"
    """A dry run (--fix --gpuhost-dry-run): failing, and this is the plan that would fix it."""
    REBOOT_REQUIRED = "reboot_required"
    """The running value is wrong, but the boot configuration already sets the right one:
    right after the next boot. Not a pass: the host is not tuned yet."""

    def __str__(self) -> str:
        return self.value

    @property
    def shown(self) -> str:
        """The outcome as a report's line names it: ``FIX_FAILED``."""
        return self.value.upper()


OUTCOMES = tuple(o.value for o in Outcome)
OPEN_OUTCOMES = (Outcome.PASSED, Outcome.FIXED, Outcome.SKIPPED)
"""The outcomes of a host that is right (they open the pre-benchmark gate); anything else
(failed, fix_failed, error, and any outcome added later) is not."""


INTERRUPTED_FIX = "the run was interrupted ("
"""How the message of a check whose fix the run's interrupt cut short begins (``(SIGTERM
received) during ...; what it did is unknown``): an ``error``, its change ``unknown`` in the
journal, and the terminal's ``--fix`` line counts it as a fix not applied."""
WILL_REVERT = "will revert: "
"""How the warning of a value that is right now but that boot-time configuration sets back
begins: the check passed (or was fixed), and the reports show it as ``WILL REVERT``."""


NOT_RUN = "not run: "
"""How the record of a check that never ran begins (the run stopped before it, or no xdist
worker started it): an error record, told apart from a check that ran and failed."""


APPLY_FAILED = "apply failed"
"""How the record of a fix whose apply itself failed begins (the host refused the write or the
command failed), told apart from a fix that was applied but did not hold."""


BETWEEN_SOCKETS = "between_sockets_gbps"
"""The detail of a p2p record that says what the hop between sockets carries a pair's path (the
spec's ``between_sockets``, else the default): ``--gpuhost-topology``'s pairs of its target take
the same figure (a plugin's own kind may give it too)."""


class FixFailure(msgspec.Struct, frozen=True):
    """How a fix failed, each way worded once (``worded``) for the ``fix_failed`` record's
    message, which every report shows as it is."""

    action: str
    """What the fix did, or was to do."""
    refused: str | None = None
    """The journal's earlier failure of this very change: it was not tried again."""
    apply_error: str | None = None
    read_error: str | None = None
    """Why the value could not be read back after the apply."""
    read_back: str | None = None
    """The value read back, still wrong."""
    reason: str = ""
    """Why the value read back is wrong (and what the fix's command printed)."""

    def worded(self) -> str:
        if self.refused is not None:
            return self.refused
        if self.read_error is not None:
            return self.apply_error or f"{self.action}, then the read-back failed: " \
                                       f"{self.read_error}"
        if self.apply_error is not None:
            return f"{APPLY_FAILED}: {self.apply_error}"
        return f"{self.action}, but read back {self.read_back!r}: {self.reason}"


def apply_failed(record: CheckResult) -> bool:
    """Whether the record is of a fix whose apply itself failed (``FixFailure``)."""
    return record.outcome is Outcome.FIX_FAILED and record.message.startswith(APPLY_FAILED)


class CheckResult(msgspec.Struct, frozen=True):
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
    evidence: tuple[dict[str, str], ...] = ()
    plan: tuple[dict[str, object], ...] = ()
    """The changes a fix made or, in a dry run, would make: path or command, from, to."""
    warnings: tuple[str, ...] = ()
    """Right now, but not for long: boot-time configuration that would set the value back."""
    severity: str = "normal"
    """The spec's ``severity:`` (Allure's levels), how much a failure of this check matters."""
    details: dict[str, Any] = msgspec.field(default_factory=dict)
    """Kind-specific facts for the report (p2p: gbps, class, floor, probe)."""
    subjects: dict[str, str] = msgspec.field(default_factory=dict)
    """What the check was about: the GPU (``gpu``), the CPUs still wrong (``cpus``), ..."""
    hardware: bool = False
    """A failure points at the hardware rather than at a setting."""
    target: str | None = None
    """The target the check ran on (``pve``), in a run with remote or several targets."""
    section: str | None = None
    """The spec section the check came from (``pcie`` for ``pcie.max_read_request``, ``gpus``
    for ``gpu_count``, ``modules`` for ``module``); ``persist`` and ``rollback`` for the checks
    those make. None only for a check that never reported (its xdist worker went down)."""
    scope: str | None = None
    """Where the setting lives: ``kernel``, ``namespace`` or ``userspace`` (see
    ``checks.SCOPES``); None only for a check that never reported."""
    measured: bool = False
    """``observed`` is a result (a bandwidth, kernel log records, error counters, use over a
    window), not a setting: the host's state leaves it out of its digest, and the fleet's drift
    leaves it out (no two runs read the same number)."""

    @property
    def spec_file(self) -> str:
        """The spec (or journal) the check came from, as shown: half of its identity."""
        return self.location.rsplit(":", 1)[0] if self.location else ""

    def as_dict(self) -> dict[str, Any]:
        # msgspec's asdict is shallow (dataclasses.asdict deep-copied: a tenth of a 340-check
        # run); the containers are copied below, one level, as the report needs them.
        data = msgspec.structs.asdict(self)
        data["outcome"] = self.outcome.value
        data["evidence"] = list(self.evidence)
        data["plan"] = list(self.plan)
        data["warnings"] = list(self.warnings)
        data["details"] = dict(self.details)
        data["subjects"] = dict(self.subjects)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckResult:
        values = dict(data)
        values["outcome"] = Outcome(values["outcome"])
        for key in ("evidence", "plan", "warnings"):
            values[key] = tuple(values.get(key, ()))
        known = cls.__struct_fields__
        return cls(**{k: v for k, v in values.items() if k in known})


def summarize(results: Iterable[CheckResult]) -> dict[str, int]:
    """Counts for every outcome, zeros included, in the contract's order."""
    counts = Counter(r.outcome.value for r in results)
    return {outcome: counts.get(outcome, 0) for outcome in OUTCOMES}
