"""The capture reporter: one target's records -> a spec file, checked to load before it is
written, written atomically, and never over a file that exists unless asked."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from ..checks.capturing import ARGUED_AGAINST, Captured
from ..files import OutputError, write_atomically, write_output
from ..result import CheckResult
from ..specmodel import SPEC_VERSION, SectionParser, Spec, SpecError, load_spec
from ..version import __version__
from . import yamltext
from .sections import capture_sections

OVERWRITE_OPTION = "--gpuhost-capture-overwrite"
LOCAL = "local"


def record_target(record: CheckResult) -> str:
    """The target a record came from (``local`` for a record of a one-machine run)."""
    return str(getattr(record, "target", None) or LOCAL)


def pick_target(names: Sequence[str], chosen: str | None) -> str:
    """The golden target: the one named, else the only one; ValueError saying what to pass."""
    if chosen is not None:
        if chosen not in names:
            raise ValueError(f"--gpuhost-capture-from={chosen}: no such target; the targets "
                             f"are: {', '.join(names)}")
        return chosen
    if len(names) != 1:
        raise ValueError(f"--gpuhost-capture: {len(names)} targets ({', '.join(names)}): name "
                         "the golden one with --gpuhost-capture-from=TARGET")
    return names[0]


def spec_name(path: Path) -> str:
    """The captured spec's ``name:``: the file's stem where it is a valid name."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "-", path.stem).lstrip("._-")
    return stem or "captured"


class Source(msgspec.Struct, frozen=True):
    """Where the capture comes from: the target and what its host says of itself."""

    target: str
    hostname: str | None
    kernel: str | None
    driver: str | None
    gpu_models: tuple[str, ...]
    gpus: int
    command: str
    keys: str
    """``specs/blackwell8.yaml`` or ``the built-in catalog``."""


def header(source: Source, when: float, shown: str) -> list[str]:
    models = ", ".join(source.gpu_models) or "no NVIDIA GPU"
    return [
        f"Captured by pytest-gpuhost {__version__} on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(when))}: what target "
        f"{source.target} held then, for the keys of {source.keys}.",
        f"  host: {source.hostname or 'unknown'}",
        f"  kernel: {source.kernel or 'unknown'}",
        f"  driver: {source.driver or 'unknown'}",
        f"  GPUs: {source.gpus} x {models}" if source.gpus else f"  GPUs: {models}",
        f"  command: {source.command}",
        f"Hold another host to it: pytest --gpuhost-spec={shown}",
    ]


def capture_text(specs: Sequence[tuple[str, Spec]], records: Sequence[CheckResult], *,
                 name: str, header_lines: Sequence[str], kinds: Mapping[str, object]) -> str:
    """The captured spec: each spec's sections in order, as their kinds capture them, the first
    spec's entry winning where two specs name one key."""
    return sections_text(capture_sections(specs, records, kinds), name=name,
                         header_lines=header_lines)


def sections_text(sections: Mapping[str, Captured], *, name: str,
                  header_lines: Sequence[str]) -> str:
    """The captured spec's text, of its sections as captured."""
    top = {"version": SPEC_VERSION, "name": name}
    return yamltext.spec_text(header_lines, top, {
        section: (captured.entries or None, captured.notes)
        for section, captured in sections.items()})


SHOWN_REASONS = 3
"""How many entries left out a capture that kept none names (each with why), before a count."""


def nothing_kept(sections: Mapping[str, Captured]) -> str | None:
    """Why a capture holds no entry, where it holds none: each entry left out, with why (a
    spec with no entry would not load: it has no checks)."""
    if any(captured.entries for captured in sections.values()):
        return None
    notes = [note for captured in sections.values() for note in captured.notes]
    if not notes:
        return "no section captured anything"
    more = len(notes) - SHOWN_REASONS
    return "; ".join(notes[:SHOWN_REASONS]) + (f"; and {more} more" if more > 0 else "")


class SpecCapture:
    """The ``--gpuhost-capture`` reporter."""

    def __init__(self, path: Path, shown: str, *, overwrite: bool,
                 specs: Sequence[tuple[str, Spec]], source: Source,
                 parsers: Mapping[str, SectionParser], conditions: Any,
                 also: Sequence[str] = ()) -> None:
        self.also = tuple(also)
        """Targets whose records are the captured target's too: a container's host, where
        its ``kernel`` checks ran."""
        self.notes: list[str] = []
        """What the terminal says after the run: where the spec was written, and a warning
        where the target failed its spec (the capture then records the failing values)."""
        self.path = path
        self.shown = shown
        self.overwrite = overwrite
        self.specs = specs
        self.source = source
        self.parsers = parsers
        self.conditions = conditions

    def write(self, records: Sequence[CheckResult], info: Any) -> None:
        mine = [r for r in records if record_target(r) in (self.source.target, *self.also)]
        if not mine:
            raise OutputError(f"--gpuhost-capture={self.shown}: no check ran on target "
                              f"{self.source.target}, so there is nothing to capture; nothing "
                              "was written")
        sections = capture_sections(self.specs, mine, self.parsers)
        why = nothing_kept(sections)
        if why is not None:
            raise OutputError(f"--gpuhost-capture={self.shown}: every entry was left out, so "
                              f"nothing was written: {why}")
        text = sections_text(sections, name=spec_name(self.path),
                             header_lines=header(self.source, info.finished_at, self.shown))
        self._check_loads(text)
        self._write(text)
        on = " and ".join((self.source.target, *self.also))
        self.notes.append(f"--gpuhost-capture: wrote {self.shown} (what {on} held)")
        failed = [r for r in mine if r.outcome in ARGUED_AGAINST]
        if failed:
            self.notes.append(
                f"--gpuhost-capture: warning: {len(failed)} check(s) failed on {on}: the "
                f"capture records the failing values as the host holds them (their why: left "
                f"out); fix the host first (--fix) if {self.shown} should hold the spec's values")

    def _write(self, text: str) -> None:
        if self.overwrite:  # as every report: a file replaced, a FIFO or a character device
            # (/dev/null) written as it is, never swapped for a new file
            try:
                write_output(self.path, text)
            except OutputError as exc:
                raise OutputError(f"--gpuhost-capture={self.shown}: {exc}") from None
            return
        try:
            write_atomically(self.path, text, replace=False)
        except FileExistsError:
            raise OutputError(f"--gpuhost-capture={self.shown}: the file appeared during the "
                              f"run; nothing was written (pass {OVERWRITE_OPTION} to replace "
                              "it)") from None
        except OSError as exc:
            raise OutputError(f"--gpuhost-capture={self.shown}: cannot write {self.path}: "
                              f"{exc.strerror or exc}") from None

    def _check_loads(self, text: str) -> None:
        """A captured spec that would not load is a bug here: say so, write nothing."""
        with tempfile.TemporaryDirectory() as directory:
            probe = Path(directory) / self.path.name
            probe.write_text(text, encoding="utf-8")
            try:
                load_spec(probe, self.parsers, self.conditions, display=lambda _: self.shown)
            except SpecError as exc:
                raise OutputError(f"--gpuhost-capture={self.shown}: the captured spec would "
                                  f"not load ({exc}); nothing was written") from None
