"""A section that could not be expanded on a target: one check that never passes, saying why."""

from __future__ import annotations

import msgspec

from ..checks import NoFix, Observation
from ..host import Host, HostError, raised
from ..specmodel.matchers import Verdict


class Unexpanded(msgspec.Struct, frozen=True):
    """The expectation of a section that could not be expanded: it never passes."""

    section: str

    def describe(self) -> str:
        return f"the {self.section} checks"

    def judge(self, observed: str | None) -> Verdict:
        return Verdict(False, f"the {self.section} section could not be expanded")

    def fix_value(self, observed: str | None) -> str | None:
        return None


class Unexpandable(NoFix, msgspec.Struct, frozen=True):
    """A section whose facts could not be read: its one check is an error with the reason."""

    error: HostError

    def observe(self, host: Host) -> Observation:
        raise raised(self.error)
