"""What a node-health integration (Slurm, node-problem-detector, Node Feature Discovery) says of a
run: whether the node is healthy, which checks kept it from being so, and short, safe text
naming them.

Those tools put our text where others read or parse it (a Slurm drain reason, a Kubernetes node
condition, a label), so every line made here is one line of printable ASCII without quotes,
backslashes, backticks or ``$``, cut to a width.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

import msgspec

from ..printable import counted
from ..result import NOT_RUN, OPEN_OUTCOMES, WILL_REVERT, CheckResult

GOOD_OUTCOMES = frozenset(outcome.value for outcome in OPEN_OUTCOMES)
"""passed, fixed, skipped; any other outcome (and a check that left no record) is a failure."""
PREFIX = "gpuhost:"
"""Starts every line, so a Slurm wrapper knows its own drains from others'."""
_UNSAFE = re.compile(r"""["'`\\$]""")
_NOT_PRINTABLE = re.compile(r"[^\x20-\x7e]")
_PCI_DOMAIN = re.compile(r"\b[0-9a-f]{4}:(?=[0-9a-f]{2}:[0-9a-f]{2}\.[0-7])")


class Health(msgspec.Struct, frozen=True):
    total: int
    """Checks that ran or were selected."""
    failing: tuple[str, ...]
    """Ids of the checks that did not pass, get fixed or skip, in run order."""
    not_run: tuple[str, ...] = ()
    """Those of ``failing`` that never ran (their record says ``not run: ...``): the run
    stopped before them, or no xdist worker started them."""
    reverting: tuple[str, ...] = ()
    """Ids of the good checks whose value the boot configuration sets back (``WILL REVERT``):
    right now, so the node is healthy, but not after its next boot."""
    warned: tuple[str, ...] = ()
    """Ids of the good checks with another warning (an application's Xid in the kernel log, a
    value close to its floor): healthy, and named."""
    action: str = ""
    """What the most severe failing GPU event asks (``reboot (Xid 79 0000:41:00.0)``), from
    the records' ``details.xid_worst``; empty where none failed."""

    @property
    def healthy(self) -> bool:
        """At least one check, and none failing: a run that checked nothing vouches for nothing."""
        return self.total > 0 and not self.failing

    @property
    def failed(self) -> tuple[str, ...]:
        """Those of ``failing`` that ran, in run order."""
        left = Counter(self.not_run)
        kept = []
        for check in self.failing:
            if left[check]:
                left[check] -= 1
            else:
                kept.append(check)
        return tuple(kept)


def health_of(outcomes: Iterable[tuple[str, str]]) -> Health:
    """From (check id, outcome) pairs; ``none`` stands for a check that left no record."""
    return _health((check, outcome, "") for check, outcome in outcomes)


def _health(records: Iterable[tuple[str, str, str]],
            reverting: Iterable[str] = (), warned: Iterable[str] = (),
            worst: Iterable[object] = ()) -> Health:
    """From (check id, outcome, message) triples, the ids of the checks that will revert and
    of those with another warning, and the failing records' ``details.xid_worst``."""
    triples = list(records)
    bad = [(check, message) for check, outcome, message in triples
           if outcome not in GOOD_OUTCOMES]
    return Health(len(triples), tuple(check for check, _ in bad),
                  tuple(check for check, message in bad if message.startswith(NOT_RUN)),
                  tuple(reverting), tuple(warned), _worst(worst))


def _worst(found: Iterable[object]) -> str:
    """The short text of the most severe (highest ``rank``) of the records' worst events."""
    ranked = [(w.get("rank"), str(w.get("short"))) for w in found
              if isinstance(w, Mapping) and isinstance(w.get("rank"), int) and w.get("short")]
    return max(ranked)[1] if ranked else ""


def _reverts(warnings: object) -> bool:
    return isinstance(warnings, (list, tuple)) and \
        any(isinstance(w, str) and w.startswith(WILL_REVERT) for w in warnings)


def _warns(warnings: object) -> bool:
    """A warning other than ``will revert``."""
    return isinstance(warnings, (list, tuple)) and \
        any(isinstance(w, str) and not w.startswith(WILL_REVERT) for w in warnings)


def named(check: str, target: object) -> str:
    """A check's id with the target it ran on, where the run named targets
    (``sysctl[vm.swappiness]@local``): a container and its host both have the check."""
    return check if target is None else f"{check}@{target}"


def on_node(results: Sequence[CheckResult], node: Collection[str] | None
            ) -> list[CheckResult]:
    """The records that speak for the node the run runs on: those of its targets ``node``
    (``settings.node_targets``), or every one where the run named no target (None)."""
    if node is None:
        return list(results)
    return [r for r in results if r.target is None or r.target in node]


def health_of_results(results: Sequence[CheckResult]) -> Health:
    """A run's records (a check that never reported has an error record)."""
    return _health(((named(r.id, r.target), r.outcome.value, r.message or "") for r in results),
                   (named(r.id, r.target) for r in results
                    if r.outcome.value in GOOD_OUTCOMES and _reverts(r.warnings)),
                   (named(r.id, r.target) for r in results
                    if r.outcome.value in GOOD_OUTCOMES and _warns(r.warnings)),
                   (r.details.get("xid_worst") for r in results
                    if r.outcome.value not in GOOD_OUTCOMES))


class NotThisNode(ValueError):
    """A report of other machines only: it says nothing of the node that reads it."""


def report_node(data: Mapping[str, Any]) -> set[str] | None:
    """The targets of a ``--gpuhost-report`` that describe the node it ran on (its
    ``node_targets``; in a report from before them, ``local`` and the containers on its kernel);
    None: a report that named no target (this machine alone)."""
    targets = [t for t in data.get("targets") or () if isinstance(t, Mapping)]
    if not targets:
        return None
    node = data.get("node_targets")
    if isinstance(node, list):
        return {str(name) for name in node}
    local = {t.get("name") for t in targets if t.get("url") == "local"}
    return {str(t.get("name")) for t in targets
            if t.get("name") in local or t.get("kernel_on") in local}


def health_of_report(data: Mapping[str, Any], *, node_only: bool = True) -> Health:
    """From a ``--gpuhost-report`` JSON document (its ``checks[].id``, ``target``, ``outcome``
    and ``warnings``): the checks of the node it ran on alone (``report_node``; every check
    without ``node_only``); NotThisNode for a report of other machines only."""
    checks = data.get("checks")
    if not isinstance(checks, list):
        raise ValueError("the report has no 'checks' list: is it a --gpuhost-report file?")
    node = report_node(data) if node_only else None
    records = [c for c in checks if isinstance(c, Mapping) and
               (node is None or c.get("target") is None or c.get("target") in node)]
    if node is not None and not records and checks:
        others = sorted({str(t.get("name")) for t in data.get("targets") or ()
                         if isinstance(t, Mapping)})
        raise NotThisNode(f"no target of the report is this node ({', '.join(others)})")
    return _health(((named(str(c.get("id", "?")), c.get("target")),
                     str(c.get("outcome", "none")), str(c.get("message") or ""))
                    for c in records),
                   (named(str(c.get("id", "?")), c.get("target")) for c in records
                    if c.get("outcome") in GOOD_OUTCOMES and _reverts(c.get("warnings"))),
                   (named(str(c.get("id", "?")), c.get("target")) for c in records
                    if c.get("outcome") in GOOD_OUTCOMES and _warns(c.get("warnings"))),
                   (_details(c).get("xid_worst") for c in records
                    if c.get("outcome") not in GOOD_OUTCOMES))


def _details(check: Mapping[str, Any]) -> Mapping[str, Any]:
    details = check.get("details")
    return details if isinstance(details, Mapping) else {}


def healthy_line(health: Health, width: int) -> str:
    """A healthy node's line: ``gpuhost: 67 checks ok``, and, where a check's value will not
    survive the next boot, ``gpuhost: 67 checks ok, 1 will revert at boot: sysctl[vm.swappiness]``
    (the first named, the rest counted), then the checks with another warning (``1 warned:
    dmesg``), within ``width``."""
    line = f"{PREFIX} {counted(health.total, 'check')} ok"
    for ids, what in ((health.reverting, "will revert at boot"), (health.warned, "warned")):
        if not ids:
            continue
        more = f" +{len(ids) - 1}" if len(ids) > 1 else ""
        head = f"{line}, {len(ids)} {what}: "
        line = head + short_id(ids[0], max(width - len(head) - len(more), 8)) + more
    return cut(line, width)


def clean(text: str) -> str:
    """One line of printable ASCII without quoting characters: whitespace runs become one space,
    quotes, backslashes, backticks and ``$`` are dropped, anything else unprintable is ``?``."""
    text = " ".join(text.split())
    return _NOT_PRINTABLE.sub("?", _UNSAFE.sub("", text))


def cut(text: str, width: int) -> str:
    """``text`` cleaned and, when longer than ``width``, ending in ``...`` at ``width``."""
    text = clean(text)
    if len(text) <= width:
        return text
    return (text[:max(width - 3, 0)] + "...")[:width]


def short_id(check_id: str, width: int) -> str:
    """A check id within ``width``: first without PCI domains (``0000:81:00.0`` -> ``81:00.0``),
    which every GPU of a host shares, then cut."""
    text = clean(check_id)
    if len(text) > width:
        text = _PCI_DOMAIN.sub("", text)
    return cut(text, width)


def action_template(health: Health) -> str:
    """``reboot (Xid 79 0000:41:00.0): `` where a failing GPU event asks for an action, for a
    template of ``first_and_count`` (its braces doubled)."""
    if not health.action:
        return ""
    return clean(health.action).replace("{", "{{").replace("}", "}}") + ": "


def first_and_count(health: Health, *, width: int, template: str) -> str:
    """``template`` (with ``{count}``, ``{more}``, ``{first}``) filled so the line fits
    ``width``: the first failing id is shortened to what the rest leaves."""
    count, more = len(health.failing), len(health.failing) - 1
    rest = len(template.format(count=count, more=more, first=""))
    first = short_id(health.failing[0], max(width - rest, 8))
    return cut(template.format(count=count, more=more, first=first), width)
