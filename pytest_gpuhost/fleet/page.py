"""The fleet as one self-contained HTML page: no network, no CDN, its CSS and script inline.

The page holds the fleet as one JSON blob (every string once, each result a row of indices into
it) and draws from it on demand: the matrix is targets by section, the terminal matrix's columns
in its order (``matrix.columns``), a page of rows at a time; choosing a section shows its kinds
as columns (its checks, when it has one kind), choosing a kind its checks; a click on a cell
opens a panel of its records' expected, observed, message and evidence; a cell's tooltip
names the top cause its P2P pairs share; the drift table is below. A thousand targets of 150
checks each make a page of a few MB that draws in well under a second (bench/fleet.py).
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..version import __version__
from . import OUTCOME_ORDER, FleetRow, Sections, check_key
from .drift import Drift
from .matrix import columns, short_key

HERE = Path(__file__).parent
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
"""Nothing but the page's own inline style and script: a page that fetched anything (a CDN, a
font, an image) would be refused by the browser, so it works offline or not at all."""


class _Strings:
    """Each distinct string once; values are its index."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.table: list[str] = []

    def __call__(self, text: object) -> int:
        if text is None:
            return -1
        value = str(text)
        found = self.index.get(value)
        if found is None:
            found = self.index[value] = len(self.table)
            self.table.append(value)
        return found


def _evidence(record: Any) -> str:
    items = record.get("evidence") or ()
    return "\n".join(f"{e.get('source', '')}: {e.get('raw', '')}" for e in items
                     if isinstance(e, dict))


def _cause(record: Any) -> str | None:
    """A P2P or collective record's top cause (its ``explain``'s first entry), as the cell's
    tooltip says it."""
    details = record.get("details")
    causes = details.get("explain") if isinstance(details, dict) else None
    if not isinstance(causes, list) or not causes or not isinstance(causes[0], dict):
        return None
    top = causes[0]
    return (f"{top.get('cause')} at {top.get('at')}: {top.get('effect')}; "
            f"{top.get('remedy')}")


def _facts(target: FleetRow) -> str:
    facts = target.facts
    parts = [f"{name} {facts[name]}" for name in ("host", "kernel", "driver") if facts.get(name)]
    if facts.get("gpus") is not None:
        parts.append(f"{facts['gpus']} GPUs")
    if facts.get("spec"):
        parts.append(f"spec {facts['spec']}")
    if facts.get("kernel_on"):  # a container: its kernel checks ran on its host
        parts.append(f"kernel checks on {facts['kernel_on']}")
    parts.append(f"from {target.source}")
    return ", ".join(parts)


def page_data(targets: Sequence[FleetRow], drifts: Sequence[Drift], title: str) -> dict[str, Any]:
    strings = _Strings()
    outcomes = list(OUTCOME_ORDER)
    outcome_index = {name: i for i, name in enumerate(outcomes)}
    sections = Sections.of(targets)
    section_names = columns(targets, sections)
    """The terminal matrix's columns: the page and the terminal group alike, by construction."""
    section_index = {name: i for i, name in enumerate(section_names)}
    checks: dict[tuple[str, str], int] = {}
    check_rows: list[list[int]] = []
    kinds: dict[str, int] = {}
    kind_section: list[int] = []
    rows = []
    for target in targets:
        results: list[int] = []
        for record in target.records:
            key = check_key(record)
            index = checks.get(key)
            if index is None:
                kind = str(record.get("kind", ""))
                kind_index = kinds.get(kind)
                if kind_index is None:
                    kind_index = kinds[kind] = len(kinds)
                    kind_section.append(section_index[sections.section(record)])
                index = checks[key] = len(check_rows)
                check_rows.append([strings(key[0]), strings(key[1]), kind_index,
                                   strings(short_key(record))])
            results += [index, outcome_index.get(str(record.get("outcome")), 0),
                        strings(record.get("observed")), strings(record.get("expected")),
                        strings(record.get("message")), strings(_evidence(record)),
                        strings(_cause(record))]
        rows.append([target.name, strings(target.reason), strings(_facts(target)), results])
    order = sorted(kinds, key=lambda k: (kind_section[kinds[k]], kinds[k]))
    target_index = {t.name: i for i, t in enumerate(targets)}
    drift_rows = [[checks[(d.spec, d.id)],
                   [[strings(g.value), [target_index[n] for n in g.targets], int(g.passes)]
                    for g in d.groups]]
                  for d in drifts if (d.spec, d.id) in checks]
    return {"title": title, "generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "tool": f"pytest-gpuhost {__version__}", "outcomes": outcomes,
            "sections": section_names, "kinds": list(kinds), "kindSection": kind_section,
            "kindOrder": [kinds[k] for k in order],
            "checks": check_rows, "strings": strings.table, "targets": rows,
            "drift": drift_rows}


def _embedded(text: str) -> str:
    """JSON that is safe inside a ``<script>`` element: every ``<`` (and ``>``, ``&``) as a
    JSON escape. Escaping only ``</`` was not enough: a host value ``<!--<script>`` puts the
    HTML parser in the script element's "double escaped" state, where the element's own
    ``</script>`` no longer ends it, and the page's script never runs. The characters occur
    only inside JSON strings, where the escapes read back as the same text."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(targets: Sequence[FleetRow], drifts: Sequence[Drift], title: str) -> str:
    """The whole page."""
    # ensure_ascii: a report's value may hold a lone surrogate (a target's undecodable byte,
    # ``\udcff`` in its JSON), which no UTF-8 page can carry; escaped, JSON reads it back.
    blob = _embedded(json.dumps(page_data(targets, drifts, title), separators=(",", ":")))
    style = (HERE / "page.css").read_text(encoding="utf-8")
    script = (HERE / "page.js").read_text(encoding="utf-8")
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<title>{html.escape(title)}</title>
<style>
{style}</style>
</head>
<body>
<header><h1>{html.escape(title)}</h1><p id="summary"></p></header>
<section id="controls">
  <label>section <select id="f-section"><option value="">all sections</option></select></label>
  <label>outcome <select id="f-outcome"><option value="">any</option></select></label>
  <label>target <input id="f-target" type="search" placeholder="name contains"></label>
  <span id="pager"><button id="prev" type="button">&lsaquo; prev</button>
  <span id="rows"></span><button id="next" type="button">next &rsaquo;</button></span>
</section>
<div id="legend"></div>
<p id="hint">Click a cell for its checks: expected, observed, message and evidence; a column's
heading for its kinds or checks.</p>
<main>
  <div id="matrix-wrap"><table id="matrix"></table></div>
  <aside id="detail" hidden><button id="detail-close" type="button" title="close">&times;</button>
  <div id="detail-body"></div></aside>
</main>
<section id="drift-section"><h2>Drift</h2><p id="drift-summary"></p>
<table id="drift"></table><button id="drift-more" type="button" hidden>show all</button>
</section>
<script type="application/json" id="fleet-data">{blob}</script>
<script>
{script}</script>
</body>
</html>
"""
