"""Allure evidence: each check as one Allure test with labels, steps and attachments, and the
run's environment.properties and its categories.

Registered only when allure-pytest is active (``--alluredir``), so without it nothing of Allure
runs. Fed from the result record after the check ran, as every other reporter is: the phases of
a fix (observe, apply, read back, assert) become steps rebuilt from what the record holds.

Each test carries the label ``gpuhost_outcome`` (the record's outcome: pytest's statuses
cannot tell ``fixed`` from ``passed``, nor ``would_fix`` or ``reboot_required`` from
``failed``) and, for those four, a tag of the same name. Categories come in two forms, for the
two generations of Allure: ``categories.json`` in the results (read by Allure 2 and by Allure
3's classic/allure2 plugins only) and ``allurerc.json``, an Allure 3 configuration holding the
same categories matched on that label (Allure 3 reads categories from its configuration, not
from the results: ``allure generate --config DIR/allurerc.json DIR``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any

import allure
import pytest
from allure_commons.model2 import Label
from allure_commons.types import AttachmentType, LabelType

from ..files import write_output
from ..result import WILL_REVERT, CheckResult, Outcome, apply_failed
from . import RunInfo, reverting
from .topology import path_text, ring_text

dynamic: Any = allure.dynamic
"""allure's dynamic API is untyped."""

_ANY = r"[\s\S]*"
NOT_ON_THIS_KERNEL = "this kernel has no such"
"""How the message of a check whose setting the kernel does not have goes on (a sysctl's
``... does not exist: this kernel has no such sysctl``): failed, the host read, not mis-tuned."""
ALLURE3_CONFIG = "allurerc.json"
CATEGORIES = [
    {"name": "Fix failed", "matchedStatuses": ["failed"],
     "traceRegex": f"{_ANY}  {Outcome.FIX_FAILED.shown} {_ANY}",  # format_failure's line
     "description": "--fix applied the value but it did not hold, or the apply itself failed"},
    {"name": "Hardware fault", "matchedStatuses": ["failed", "broken"],
     "traceRegex": f"{_ANY}  (FAILED|ERROR) [^\\n]* \\[hardware\\]{_ANY}",
     "description": "a GPU missing from PCI, a degraded link, errors in the kernel log"},
    {"name": "Reboot required", "matchedStatuses": ["failed"],
     "traceRegex": f"{_ANY}  REBOOT_REQUIRED {_ANY}",
     "description": "set right in the boot configuration, not yet running: reboot (or reload)"},
    {"name": "Would fix", "matchedStatuses": ["failed"],
     "traceRegex": f"{_ANY}  WOULD_FIX {_ANY}",
     "description": "--fix --gpuhost-dry-run: failing, and the plan says what --fix would change"},
    {"name": "Not on this kernel", "matchedStatuses": ["failed"],
     "messageRegex": f"{_ANY}{NOT_ON_THIS_KERNEL}{_ANY}",
     "description": "a sysctl the running kernel does not have: its module is not loaded, or "
                    "the spec misspells it (the message's did you mean); --fix never creates it"},
    {"name": "Mis-tuned", "matchedStatuses": ["failed"], "traceRegex": f"{_ANY}  FAILED {_ANY}",
     "description": "a setting differs from the spec (run with --fix)"},
    {"name": "Not applicable", "matchedStatuses": ["skipped"],
     "messageRegex": f"{_ANY}when: {_ANY}",
     "description": "the entry's when: condition is false on this host"},
]
"""Allure 2's categories.json: matched in order, each regex on the whole message or trace."""
OUTCOME_LABEL = "gpuhost_outcome"
TAGGED = (Outcome.FIXED, Outcome.FIX_FAILED, Outcome.WOULD_FIX, Outcome.REBOOT_REQUIRED)
"""The outcomes pytest's statuses hide (fixed looks passed; the others look failed): tagged."""
WILL_REVERT_TAG = "will_revert"
"""The tag of a passed (or fixed) check whose value the boot configuration sets back."""
WARNING_TAG = "warning"
"""The tag of a passed check with a warning: a value close to its floor, a GPU event that
leaves the node open (an application's Xid)."""


def _outcome_is(*outcomes: Outcome) -> dict[str, str]:
    return {OUTCOME_LABEL: "^(" + "|".join(o.value for o in outcomes) + ")$"}


ALLURE3_CATEGORIES = [
    {"id": "gpuhost-fix-failed", "name": "Fix failed",
     "matchers": {"statuses": ["failed", "broken"], "labels": _outcome_is(Outcome.FIX_FAILED)}},
    {"id": "gpuhost-hardware", "name": "Hardware fault",
     "matchers": {"statuses": ["failed", "broken"],
                  "trace": r"  (FAILED|ERROR) [^\n]* \[hardware\]"}},
    {"id": "gpuhost-reboot-required", "name": "Reboot required",
     "matchers": {"statuses": ["failed"], "labels": _outcome_is(Outcome.REBOOT_REQUIRED)}},
    {"id": "gpuhost-would-fix", "name": "Would fix",
     "matchers": {"statuses": ["failed"], "labels": _outcome_is(Outcome.WOULD_FIX)}},
    {"id": "gpuhost-not-on-this-kernel", "name": "Not on this kernel",
     "matchers": {"statuses": ["failed"], "labels": _outcome_is(Outcome.FAILED),
                  "message": NOT_ON_THIS_KERNEL}},
    {"id": "gpuhost-mis-tuned", "name": "Mis-tuned",
     "matchers": {"statuses": ["failed"], "labels": _outcome_is(Outcome.FAILED)}},
    {"id": "gpuhost-unreadable", "name": "Host not read",
     "matchers": {"statuses": ["broken"], "labels": _outcome_is(Outcome.ERROR)}},
    {"id": "gpuhost-not-applicable", "name": "Not applicable",
     "matchers": {"statuses": ["skipped"], "message": "when: "}},
    {"id": "gpuhost-will-revert", "name": "Will revert at boot",
     "matchers": {"statuses": ["passed"], "labels": {"tag": f"^{WILL_REVERT_TAG}$"}}},
    {"id": "gpuhost-fixed", "name": "Fixed by --fix",
     "matchers": {"statuses": ["passed"], "labels": _outcome_is(Outcome.FIXED)}},
    {"id": "gpuhost-warning", "name": "Passed with a warning",
     "matchers": {"statuses": ["passed"], "labels": {"tag": f"^{WARNING_TAG}$"}}},
]
"""Allure 3's categories (its configuration's ``categories``): matched in order, a test by its
``gpuhost_outcome`` label, a regex anywhere in the message or trace; passed tests too (the
fixed ones)."""


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


def _explained(details: Mapping[str, Any]) -> None:
    """What limits a measurement: a P2P or host copy's PCIe path, a collective's ring."""
    path = path_text(details)
    if path is not None:
        allure.attach(path, name="PCIe path", attachment_type=AttachmentType.TEXT)
    ring = ring_text(details)
    if ring is not None:
        allure.attach(ring, name="ring and causes", attachment_type=AttachmentType.TEXT)


def _label(result: CheckResult) -> None:
    """The current Allure test's labels and tags."""
    dynamic.feature(result.kind)
    dynamic.story(result.key if result.key is not None else result.kind)
    dynamic.severity(result.severity)
    dynamic.label(OUTCOME_LABEL, result.outcome.value)
    if result.outcome in TAGGED:
        dynamic.tag(result.outcome.value)
    if reverting(result):  # right now, but not after the next boot
        dynamic.tag(WILL_REVERT_TAG)
    if _warnings(result):
        dynamic.tag(WARNING_TAG)


def describe(result: CheckResult, host_name: str) -> None:
    """Labels, parameters, description, attachments and steps of the current Allure test."""
    _label(result)
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
    events = _gpu_events(result)
    if events is not None:  # the kernel log's Xid: GPU, code, class and what to do
        allure.attach(events, name="GPU events", attachment_type=AttachmentType.TEXT)
    _explained(result.details)
    for change in result.plan:  # a file a fix wrote (or would write): what it holds
        if isinstance(change.get("new"), str) and change.get("path"):
            allure.attach(str(change["new"]), name=f"{change['path']} (written)",
                          attachment_type=AttachmentType.TEXT)
    if result.outcome is Outcome.SKIPPED:
        return
    fixing = result.action is not None
    observed = result.before if fixing else result.observed
    _step(f"observe: {observed}", [("read", _read(before if fixing else after))])
    if fixing:
        refused = apply_failed(result)
        output = result.action_output or ("" if not refused else result.message)
        _step(f"apply: {result.action}", [("command and output",
                                           _text([result.action or "", output]))],
              failure=result.message if refused else None)
        _step(f"read back: {result.after}", [("read", _read(after))])
    ok = result.outcome in (Outcome.PASSED, Outcome.FIXED)
    final = result.after if fixing else result.observed
    _step(f"assert: {final} is {result.expected}", failure=None if ok else result.message)
    for why in reverting(result):
        _step(f"will revert: {why}")
    for warning in _warnings(result):
        _step(f"warning: {warning}")


def _warnings(result: CheckResult) -> list[str]:
    """The record's warnings that are not ``will revert``: shown as steps, tagged."""
    return [w for w in result.warnings if not w.startswith(WILL_REVERT)]


def _gpu_events(result: CheckResult) -> str | None:
    """The GPU events a dmesg record judged, one kind a line, or None."""
    groups = [g for g in result.details.get("xid_counts", ()) if isinstance(g, dict)]
    if not groups:
        return None
    return _text([f"{g.get('gpu') or 'GPU ?'}: {g.get('kind')} {g.get('code') or ''} "
                  f"({g.get('description')}) x{g.get('count')}: {g.get('class')}, "
                  f"{g.get('action')} -> {g.get('verdict')}" for g in groups])


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


def allure3_config(info: RunInfo) -> dict[str, object]:
    """An Allure 3 configuration (``allure generate --config``): the report's name and the
    categories."""
    where = info.hostname or info.root
    return {"name": f"pytest-gpuhost: {', '.join(info.spec_names)} on {where}",
            "categories": {"rules": ALLURE3_CATEGORIES}}


class AllureSessionFiles:
    """environment.properties, categories.json (Allure 2) and allurerc.json (Allure 3),
    written once by the controller."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def write(self, records: Sequence[CheckResult], info: RunInfo) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        write_output(self.directory / "environment.properties",
                     properties_text(environment(info)))
        write_output(self.directory / "categories.json", json.dumps(CATEGORIES, indent=2) + "\n")
        write_output(self.directory / ALLURE3_CONFIG,
                     json.dumps(allure3_config(info), indent=2) + "\n")


def unreported_results(directory: Path, records: Mapping[str, CheckResult],
                       host_name: Callable[[str | None], str]) -> None:
    """An Allure result for each check no worker reported (nodeid -> its error record): its
    worker crashed while it ran, or died before it, or no worker collected its target; its
    ``host`` the machine the check was to judge (``host_name`` of its target), as
    ``AllureEvidence`` labels a check that reported.
    allure-pytest writes a test's result in the worker that ran it, so these had none: Allure
    lost the checks every other report counts as errors."""
    import hashlib
    import time
    import uuid

    from allure_commons import logger as allure_logger
    from allure_commons.model2 import Label, Parameter, Status, StatusDetails, TestResult

    def md5(text: str) -> str:  # allure's ids are MD5 hex digests: names, not secrets
        return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()

    untyped: Any = allure_logger  # allure-commons is untyped
    logger = untyped.AllureFileLogger(str(directory))
    for nodeid, record in records.items():
        path, _, name = nodeid.partition("::")
        full_name = f"{Path(path).with_suffix('').as_posix().replace('/', '.')}#{record.kind}"
        host = host_name(record.target)
        labels = [Label("tag", "gpuhost"), Label("host", host),
                  Label("feature", record.kind), Label(OUTCOME_LABEL, record.outcome.value),
                  Label("story", record.key if record.key is not None else record.kind)]
        parameters = [Parameter("host", host)]
        if record.target is not None:
            parameters.append(Parameter("target", record.target))
        if record.key is not None:
            parameters.append(Parameter("key", record.key))
        stamp = int(time.time() * 1000)
        logger.report_result(TestResult(
            name=name, fullName=full_name, uuid=str(uuid.uuid4()), historyId=md5(nodeid),
            testCaseId=md5(full_name), status=Status.BROKEN,
            statusDetails=StatusDetails(message=record.message), start=stamp, stop=stamp,
            labels=labels, parameters=parameters))


class AllureEvidence:
    """pytest hook: evidence on each check's Allure test, from its record, and its ``host``
    label: the machine the check judged (allure-pytest labels every test with the machine
    pytest ran on, which for a remote target's check is another machine)."""

    def __init__(self, host_name: Callable[[str | None], str],
                 config: pytest.Config) -> None:
        self.host_name = host_name
        """The name of the machine a check ran on, by its record's target (None: the run's)."""
        self.config = config

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        try:
            return (yield)
        finally:
            result = getattr(item, "result", None)
            if isinstance(result, CheckResult):
                describe(result, self.host_name(result.target))

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # around allure-pytest's, which adds its label
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        try:
            return (yield)
        finally:
            result = getattr(item, "result", None)
            if isinstance(result, CheckResult):
                self._relabel(self.host_name(result.target))

    def _relabel(self, host: str) -> None:
        """The current test's ``host`` label, one, naming ``host``."""
        listener = self.config.pluginmanager.get_plugin("allure_listener")
        test = listener.allure_logger.get_test(None) if listener is not None else None
        if test is None:
            return
        test.labels = [label for label in test.labels if label.name != LabelType.HOST]
        test.labels.append(Label(name=LabelType.HOST, value=host))
