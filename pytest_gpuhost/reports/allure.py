"""Allure evidence: each check as one Allure test with labels, steps and attachments, and the
run's environment.properties and categories.json.

Registered only when allure-pytest is active (``--alluredir``), so without it nothing of Allure
runs. Fed from the result record after the check ran, as every other reporter is: the phases of
a fix (observe, apply, read back, assert) become steps rebuilt from what the record holds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import allure
import pytest
from allure_commons.types import AttachmentType

from ..files import write_output
from ..result import CheckResult, Outcome
from . import RunInfo
from .topology import path_text

dynamic: Any = allure.dynamic
"""allure's dynamic API is untyped."""

_ANY = r"[\s\S]*"
CATEGORIES = [
    {"name": "Fix failed", "matchedStatuses": ["failed"],
     "traceRegex": f"{_ANY}  FIX_FAILED {_ANY}",
     "description": "--fix applied the value but it did not hold, or the apply itself failed"},
    {"name": "Hardware fault", "matchedStatuses": ["failed", "broken"],
     "traceRegex": f"{_ANY}  (FAILED|ERROR) [^\\n]* \\[hardware\\]{_ANY}",
     "description": "a GPU missing from PCI, a degraded link, errors in the kernel log"},
    {"name": "Reboot required", "matchedStatuses": ["failed"],
     "traceRegex": f"{_ANY}  REBOOT_REQUIRED {_ANY}",
     "description": "set right in the boot configuration, not yet running: reboot (or reload)"},
    {"name": "Mis-tuned", "matchedStatuses": ["failed"], "traceRegex": f"{_ANY}  FAILED {_ANY}",
     "description": "a setting differs from the spec (run with --fix)"},
    {"name": "Not applicable", "matchedStatuses": ["skipped"],
     "messageRegex": f"{_ANY}when: {_ANY}",
     "description": "the entry's when: condition is false on this host"},
]


def _text(lines: Sequence[str]) -> str:
    return "\n".join(lines) + "\n"


def _step(title: str, attachments: Sequence[tuple[str, str]] = (),
          failure: str | None = None) -> None:
    """One step, failed (with the reason) when ``failure`` is given."""
    try:
        with allure.step(title):
            for name, body in attachments:
                allure.attach(body, name=name, attachment_type=AttachmentType.TEXT)
            if failure is not None:
                raise AssertionError(failure)
    except AssertionError:
        pass


def _read(evidence: Sequence[Mapping[str, str]]) -> str:
    return _text([f"{e['source']}: {e['raw']}" for e in evidence]) if evidence else "(nothing)\n"


def describe(result: CheckResult, host_name: str) -> None:
    """Labels, parameters, description, attachments and steps of the current Allure test."""
    dynamic.feature(result.kind)
    dynamic.story(result.key if result.key is not None else result.kind)
    dynamic.severity(result.severity)
    if result.why:
        dynamic.description(result.why)
    # Identity parameters stay in the history id (one history per check and host); the value
    # read is a measurement: shown, but excluded, or each new value would start a new history.
    dynamic.parameter("host", host_name)
    if result.target is not None:
        dynamic.parameter("target", result.target)
    if result.key is not None:
        dynamic.parameter("gpu" if "gpu" in result.subjects else "key", result.key)
    if result.observed is not None:
        dynamic.parameter("observed", result.observed, excluded=True)
    before = [e for e in result.evidence if e["source"].startswith("before: ")]
    after = [e for e in result.evidence if not e["source"].startswith("before: ")]
    allure.attach(_read(result.evidence), name="what was read",
                  attachment_type=AttachmentType.TEXT)
    compared = [f"expected: {result.expected}", f"observed: {result.observed}"]
    if result.before is not None:
        compared += [f"before:   {result.before}", f"after:    {result.after}"]
    allure.attach(_text([*compared, f"outcome:  {result.outcome.value}",
                         f"message:  {result.message}"]),
                  name="expected vs observed", attachment_type=AttachmentType.TEXT)
    allure.attach(json.dumps(result.as_dict(), indent=2), name="gpuhost record",
                  attachment_type=AttachmentType.JSON)
    path = path_text(result.details)
    if path is not None:  # a P2P or host copy: its PCIe path and what limits it
        allure.attach(path, name="PCIe path", attachment_type=AttachmentType.TEXT)
    if result.outcome is Outcome.SKIPPED:
        return
    fixing = result.action is not None
    observed = result.before if fixing else result.observed
    _step(f"observe: {observed}", [("read", _read(before if fixing else after))])
    if fixing:
        apply_failed = result.outcome is Outcome.FIX_FAILED and \
            result.message.startswith("apply failed")
        output = result.action_output or ("" if not apply_failed else result.message)
        _step(f"apply: {result.action}", [("command and output",
                                           _text([result.action or "", output]))],
              failure=result.message if apply_failed else None)
        _step(f"read back: {result.after}", [("read", _read(after))])
    ok = result.outcome in (Outcome.PASSED, Outcome.FIXED)
    final = result.after if fixing else result.observed
    _step(f"assert: {final} is {result.expected}", failure=None if ok else result.message)


def environment(info: RunInfo) -> dict[str, str]:
    """The run's environment as Allure shows it on the overview: the machine as it reports
    itself (its hostname, kernel and driver), never the machine pytest ran on."""
    return {
        "host": info.hostname or "unknown",
        "root": info.root,
        "kernel": info.kernel or "unknown",
        "driver": info.driver or "not loaded",
        "gpu.model": ", ".join(info.gpu_models) or "none",
        "gpu.count": str(len(info.gpus)),
        "spec": ", ".join(info.spec_names),
        "fix": str(info.fix).lower(),
        **({"spec.digest": str(info.state["spec"]["digest"]),
            "state.digest": str(info.state["digest"])} if info.state is not None else {}),
    }


def _escape_property(text: str, *, key: bool) -> str:
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if key:
        for char in (" ", "=", ":"):
            out = out.replace(char, "\\" + char)
    return out


def properties_text(values: Mapping[str, str]) -> str:
    return "".join(f"{_escape_property(k, key=True)}={_escape_property(v, key=False)}\n"
                   for k, v in values.items())


class AllureSessionFiles:
    """environment.properties and categories.json, written once by the controller."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_output(self.directory / "environment.properties",
                     properties_text(environment(info)))
        write_output(self.directory / "categories.json", json.dumps(CATEGORIES, indent=2) + "\n")


class AllureEvidence:
    """pytest hook: evidence on each check's Allure test, from its record."""

    def __init__(self, host_name: Callable[[], str]) -> None:
        self.host_name = host_name

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        try:
            return (yield)
        finally:
            result = getattr(item, "result", None)
            if isinstance(result, CheckResult):
                describe(result, self.host_name())
