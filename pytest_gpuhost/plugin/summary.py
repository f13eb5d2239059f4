"""The terminal summary of a gpuhost run, its own object on the controller (as pytest-xdist
keeps its ``TerminalDistReporter`` apart): the table of the checks (``reports.terminal``), the
journal and how to undo it, a rollback's state, and what went wrong at the end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..printable import printable
from ..reports.terminal import TerminalSummary

if TYPE_CHECKING:
    from .controller import Controller


class Summary:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.run = controller.run

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        rollback = self.run.session.rollback
        info = self.controller.info()
        subject = (f"rollback of {rollback.shown}" if rollback is not None else
                   ", ".join(name for name in info.spec_names))
        where = ", ".join(t.name for t in info.targets) if len(info.targets) > 1 else info.root
        terminalreporter.section(f"gpuhost: {subject} on {where}")
        TerminalSummary(write).write(self.controller.records(), info)
        if info.topologies:
            from ..reports.topology import TopologyView

            TopologyView(write).write(self.controller.records(), info)
        remote = [t for t in info.targets if t.journal and t.url != "local"]
        paired = any(t.kernel_on for t in info.targets)
        if paired:  # a container and its host: both journals
            for target in (t for t in info.targets if t.journal):
                write(f"journal of {target.name}: {target.journal}")
            if any(t.journal for t in info.targets):
                write("undo: --gpuhost-rollback with the same target options (it restores "
                      "the newest journal of each target)")
        elif info.journal is not None and not remote:
            write(f"journal: {info.journal} (undo: --gpuhost-rollback={info.journal})")
        for target in remote if not paired else ():
            name = str(target.journal).rsplit("/", 1)[-1]
            write(f"journal of {target.name}: {target.journal} (undo: --gpuhost-rollback={name} "
                  f"{self._naming(target.name, target.url)})")
        if rollback is not None and rollback.damaged_lines:
            write(f"journal: {rollback.damaged_lines} line(s) cut short by a crash were skipped")
        if rollback is not None and not self.run.settings.dry_run and \
                not self.controller.close_failed:
            for each in self.run.session.rollbacks:  # a container's and its host's
                journal = self.run.session.targets[each].fixrun.rollback
                done = self.run.session.rollback_closed.get(each, False)
                shown = journal.shown if journal is not None else each
                write(f"rollback: {shown} is {'closed' if done else 'still open'}"
                      + ("" if done else " (some changes are not back: run it again once "
                                         "fixed)"))
        for note in self.run.notes:
            write(printable(note), yellow="warning" in note)
        for problem in self.run.problems:
            write(printable(problem), red=True)

    def _naming(self, name: str, url: str) -> str:
        """The options that name one target again: an inventory's host by the inventory (its
        key and ssh arguments come with it) and --gpuhost-limit, any other by its URL."""
        given = next((t for t in self.run.settings.targets if t.name == name), None)
        source = given.source if given is not None else ""
        if source.startswith("--gpuhost-inventory="):
            return f"{source} --gpuhost-limit={name}"
        if source.startswith("gpuhost_inventory "):
            return f"--gpuhost-limit={name}"
        return f"--gpuhost-target={url}"
