"""``--gpuhost-npd``: the run as a node-problem-detector custom plugin answers.

NPD runs a plugin every ``invoke_interval`` and reads its exit status (0 OK, 1 a problem, any
other status unknown) and its standard output, trimmed and cut at ``max_output_length`` bytes
(80 by default), as the node condition's message; it logs standard error. So this mode prints one
line of at most 80 ASCII characters on standard output and sends everything pytest prints to
standard error.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

import msgspec
import pytest

from ..result import CheckResult
from .nodehealth import (
    PREFIX,
    Health,
    action_template,
    cut,
    first_and_count,
    health_of_results,
    healthy_line,
)

OK, PROBLEM, UNKNOWN = 0, 1, 2
"""NPD's exit statuses: every check good; one is not; the checks could not run."""
MAX_MESSAGE = 80
"""NPD's default max_output_length: a longer message is cut, in bytes, where NPD likes."""
STDOUT = pytest.StashKey[TextIO]()
"""The real standard output, kept when the terminal reporter was sent to stderr."""


class NpdAnswer(msgspec.Struct, frozen=True):
    status: int
    message: str


def answer(health: Health, problem: str | None = None, *, stopped_early: bool = False
           ) -> NpdAnswer:
    """``problem``: why the checks could not run (an internal error, nothing collected); then
    the answer is unknown whatever the records say. ``stopped_early``: the run stopped before
    its last check (``-x``, a collection error, Ctrl-C): a check that ran and failed is still a
    problem on the node, so the answer is 1 saying so and how many did not run; with none
    failed, nothing is known (unknown)."""
    if stopped_early:
        seen = Health(health.total, health.failed, action=health.action)
        if seen.failing:
            return _failed(seen, f" (stopped early, {len(health.not_run)} not run)"
                                 if health.not_run else " (stopped early)")
    if problem is not None:
        return cannot_run(problem)
    if health.total == 0:
        return cannot_run("no gpuhost checks collected")
    if health.failing:
        return _failed(health)
    return NpdAnswer(OK, healthy_line(health, MAX_MESSAGE))


def _failed(health: Health, note: str = "") -> NpdAnswer:
    more = " +{more}" if len(health.failing) > 1 else ""
    return NpdAnswer(PROBLEM, first_and_count(
        health, width=MAX_MESSAGE,
        template=PREFIX + " {count} failed: " + action_template(health) + "{first}" + more + note))


def answer_run(records: Sequence[CheckResult], exit_status: int, stdout: TextIO | None, *,
               stopped_early: bool = False, unwritten: Sequence[str] = ()) -> int:
    """Print the run's one line on ``stdout`` (the real one, kept at startup; else sys.stdout);
    NPD's exit status, which replaces pytest's. ``stopped_early``: the run stopped before its
    last check (``-x``, ``--maxfail``, interrupted). ``unwritten``: the reports (by name) that
    could not be written: a run that would answer OK answers unknown instead, as a node whose
    NFD label was not renewed is not known to be tuned (a failed check still answers 1)."""
    reply = answer(health_of_results(records), pytest_problem(exit_status),
                   stopped_early=stopped_early or exit_status == pytest.ExitCode.INTERRUPTED)
    if unwritten and reply.status == OK:
        reply = cannot_run(f"the {', '.join(unwritten)} report not written (see the log)")
    print(reply.message, file=stdout or sys.stdout, flush=True)
    return reply.status


def pytest_problem(exit_status: int) -> str | None:
    """Why the checks could not run, from how pytest ended: interrupted (a collection error, a
    held lock), an internal error, a usage error; None when the checks ran (whether or not they
    passed; a run that collected none is told by its records)."""
    if exit_status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                       pytest.ExitCode.NO_TESTS_COLLECTED):
        return None
    names = {code.value: code.name.lower().replace("_", " ") for code in pytest.ExitCode}
    return f"pytest exit status {exit_status} ({names.get(exit_status, 'unknown')})"


def cannot_run(reason: str) -> NpdAnswer:
    """A bad spec, a missing root, an interrupted run: NPD shows the condition as unknown."""
    return NpdAnswer(UNKNOWN, cut(f"{PREFIX} could not run: {reason}", MAX_MESSAGE))
