"""Each spec section as captured, from what its kind gives: every kind turns its own section's
model and the run's records into the section's YAML value (its ``capture``, beside its checks in
its module; ``checks.capturing`` holds the forms they share). Here the sections of one or more
specs are only merged, in order, the first spec's entry winning where two name one key.

A kind without a capture says so, naming itself, and nothing of its section is captured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..checks import capturer_of, kind_name
from ..checks.capturing import Captured
from ..result import CheckResult
from ..specmodel import Spec
from .yamltext import flow

MAX_ENTRY_CHARS = 64 * 1024
"""The longest entry a capture writes (a spec may hold 4 MiB in all): a host's huge value (a
1.5 MB sysctl) is left out with a comment, and everything else is still captured."""


def capture_sections(specs: Sequence[tuple[str, Spec]], records: Sequence[CheckResult],
                     kinds: Mapping[str, object]) -> dict[str, Captured]:
    """Section -> what its kind captured of it, over every spec (``(shown path, spec)``)."""
    sections: dict[str, Captured] = {}
    for shown, spec in specs:
        by_kind: dict[str, list[CheckResult]] = {}
        for record in records:
            if record.spec_file == shown:
                by_kind.setdefault(record.kind, []).append(record)
        for section, model in spec.sections.items():
            merged = sections.setdefault(section, Captured())
            kind = kinds.get(section)
            capture = capturer_of(kind) if kind is not None else None
            if capture is None:
                owner = kind_name(kind) if kind is not None else "no registered kind"
                merged.leave_out(section, f"its check kind {owner} has no capture, so nothing "
                                 "of it is captured (docs/adding-a-kind.md)")
                continue
            captured = capture(model, by_kind)
            for key, value in captured.entries.items():
                size = len(flow(value))
                if size > MAX_ENTRY_CHARS:  # a spec is a short file: the rest still captured
                    merged.leave_out(key, f"its value is {size} characters of YAML, more "
                                     f"than the {MAX_ENTRY_CHARS} a captured entry holds: write "
                                     "it by hand if it must be checked")
                    continue
                merged.entries.setdefault(key, value)
            merged.notes += captured.notes
    return sections
