"""--gpuhost-capture's side of the session: the target it writes down and its reporter (the
spec is written at the end from the run's records, ``capture/writer.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config.settings import SettingsError

if TYPE_CHECKING:
    from pathlib import Path

    from ..capture.writer import SpecCapture
    from ..reports import ReportRun
    from . import Session
    from .target import Target


def capture_target(session: Session) -> Target:
    """The target --gpuhost-capture writes down: --gpuhost-capture-from, else the only one."""
    from ..capture.writer import pick_target

    try:
        named = [name for name, target in session.targets.items()  # not a host it added
                 if target.address.implied is None]
        return session.targets[pick_target(named, session.settings.capture_from)]
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def capture_reporter(session: Session, command: str) -> SpecCapture:
    """The reporter that writes the captured spec, with what the target says of itself."""
    from ..capture.writer import Source, SpecCapture

    settings = session.settings
    assert settings.capture is not None
    target = capture_target(session)
    facts = target.host_facts()
    ran = session.specs_of(target)  # its own spec, else the run's: never another target's
    shown = [(settings.display(path), spec) for path, spec in session.specs.items()
             if any(spec is own for own in ran)]
    catalog = settings.catalog and target.address.spec is None
    keys = "the built-in catalog" if catalog else ", ".join(s for s, _ in shown)
    source = Source(target.name, facts.hostname, facts.kernel, facts.driver,
                    facts.gpu_models, len(facts.gpus), command, keys)
    return SpecCapture(settings.capture, settings.capture_shown,
                       overwrite=settings.capture_overwrite, specs=shown, source=source,
                       parsers=session.kinds, conditions=session.conditions,
                       also=(target.kernel_on.name,) if target.kernel_on else ())


def capture_report(path: Path, run: ReportRun) -> SpecCapture:
    """--gpuhost-capture's reporter (``reports.REPORTS``), with the run's command line."""
    session: Session = run.session
    return capture_reporter(session, run.command)
