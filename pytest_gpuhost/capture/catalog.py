"""The built-in catalog (``catalog.yaml``): every key pytest-gpuhost knows how to check, each with
its ``why``, for ``--gpuhost-capture`` without a spec.

A catalog run observes and judges nothing: each check passes with whatever value the host holds,
and a key the host has no value for (a sysctl this kernel lacks, a C-state its driver does not
name) is skipped with the probe's reason, so the run says what it could read. What is captured
from it, and in which form, follows each catalog entry (``min:`` entries become floors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from ..checks import Check, NoFix, NotApplicable, Observation, Probe, reads_of
from ..host import Host, Request
from ..specmodel.matchers import Verdict

CATALOG = Path(__file__).with_name("catalog.yaml")


class AnyValue(msgspec.Struct, frozen=True):
    """A catalog check's expectation: any value the host holds passes."""

    def describe(self) -> str:
        return "any value (capture)"

    def judge(self, observed: str | None) -> Verdict:
        return Verdict(observed is not None, "" if observed is not None else "nothing was read")

    def fix_value(self, observed: str | None) -> str | None:
        return None


class ObserveOnly(NoFix, msgspec.Struct, frozen=True):
    """A probe's observation alone: nothing to read is a skip with the probe's reason."""

    probe: Probe

    def reads(self) -> Sequence[Request]:
        return reads_of(self.probe)

    def observe(self, host: Host) -> Observation:
        observed = self.probe.observe(host)
        if observed.value is None:
            raise NotApplicable(observed.problem or "nothing to read on this host")
        return observed


def observe_only(check: Check) -> Check:
    """``check`` as the catalog runs it: observed, never judged against the catalog's value."""
    return msgspec.structs.replace(check, expect=AnyValue(), probe=ObserveOnly(check.probe))
