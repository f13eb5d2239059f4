"""The terminal summary of a gpuhost run, its own object on the controller (as pytest-xdist
keeps its ``TerminalDistReporter`` apart): the table of the checks (``reports.terminal``), the
journal and how to undo it, a rollback's state, and what went wrong at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config.options import BY_NAME
from ..printable import printable
from ..reports.terminal import TerminalSummary

if TYPE_CHECKING:
    from ..reports import RunInfo
    from .controller import Controller


class Summary:
    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.run = controller.run

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        write = terminalreporter.write_line
        info = self.controller.info()
        terminalreporter.section(self._title(info))
        TerminalSummary(write).write(self.controller.records(), info)
        if info.topologies:
            from ..reports.topology import TopologyView

            TopologyView(write).write(self.controller.records(), info)
        self._journals(write, info)
        self._rollback(write)
        for note in self.run.notes:
            write(printable(note), yellow="warning" in note)
        for problem in self.run.problems:
            write(printable(problem), red=True)

    def _title(self, info: RunInfo) -> str:
        """The section's title: what ran (the specs, or the rollback of a journal) and where
        (the targets, or the root)."""
        rollback = self.run.session.rollback
        this = self.run.session.target
        undone = self._on_target(this.name, this.url, rollback.shown) if rollback else ""
        subject = (f"rollback of {undone}" if rollback is not None else
                   ", ".join(name for name in info.spec_names))
        where = ", ".join(t.name for t in info.targets) if len(info.targets) > 1 else info.root
        return f"gpuhost: {subject} on {where}"

    def _journals(self, write: Callable[..., None], info: RunInfo) -> None:
        """Each journal the run wrote and what undoes it: a container's and its host's as one
        undo, this machine's, each remote target's."""
        remote = [t for t in info.targets if t.journal and t.url != "local"]
        # a container and its host both changed: both journals, one undo for the pair
        paired = any(t.kernel_on for t in info.targets) and \
            sum(1 for t in info.targets if t.journal) > 1
        if paired:
            for target in (t for t in info.targets if t.journal):
                shown = self._on_target(target.name, target.url, str(target.journal))
                write(f"journal of {target.name}: {shown}")
            write("undo: --gpuhost-rollback with the same target options (it restores the "
                  "newest journal of each container and its host's journal of the same run)")
            return
        if info.journal is not None and not remote:
            changes = self.run.session.target.fixrun.journal_changes()
            write(f"journal: {info.journal} "
                  f"{_undo(changes, f'--gpuhost-rollback={info.journal}', *self._root())}")
        for target in remote:
            name = str(target.journal).rsplit("/", 1)[-1]
            undo = _undo(target.journal_changes, f"--gpuhost-rollback={name}",
                         *self._naming(target.name, target.url))
            shown = self._on_target(target.name, target.url, str(target.journal))
            write(f"journal of {target.name}: {shown} {undo}")

    def _rollback(self, write: Callable[..., None]) -> None:
        """A rollback's lines skipped, and whether each journal it restored is closed."""
        rollback = self.run.session.rollback
        if rollback is None:
            return
        if rollback.damaged_lines:
            write(f"journal: {rollback.damaged_lines} line(s) cut short by a crash were skipped")
        if self.run.settings.dry_run or self.controller.close_failed:
            return
        for each in self.run.session.rollbacks:  # a container's and its host's
            rolled = self.run.session.targets[each]
            journal = rolled.fixrun.rollback
            done = self.run.session.rollback_closed.get(each, False)
            shown = self._on_target(rolled.name, rolled.url, journal.shown) \
                if journal is not None else each
            write(f"rollback: {shown} is {'closed' if done else 'still open'}"
                  + ("" if done else " (some changes are not back: run it again once "
                                     "fixed)"))

    def _root(self) -> list[str]:
        """What a rollback of this machine's journal needs besides it: its root, unless ``/``."""
        root = self.run.settings.root
        return [f"--gpuhost-root={self.run.settings.display(root)}"] if str(root) != "/" else []

    def _on_target(self, name: str, url: str, journal: str) -> str:
        """A remote journal as a path on its target (``/var/lib/pytest-gpuhost/journal/...``,
        under the target's root), never its URL glued to the path."""
        given = next((t for t in self.run.settings.targets if t.name == name), None)
        if url == "local" or given is None or not journal.startswith(url):
            return journal
        return given.root.rstrip("/") + "/" + journal[len(url):].lstrip("/")

    def _naming(self, name: str, url: str) -> list[str]:
        """The options that reach one target again: an inventory's host by the inventory (its
        key and ssh arguments come with it) and --gpuhost-limit, any other by its URL; then
        the run's own options that reaching it took (its ssh configuration, ...)."""
        given = next((t for t in self.run.settings.targets if t.name == name), None)
        source = given.source if given is not None else ""
        if source.startswith("--gpuhost-inventory="):
            target = f"{source} --gpuhost-limit={name}"
        elif source.startswith("gpuhost_inventory "):
            target = f"--gpuhost-limit={name}"
        else:
            target = f"--gpuhost-target={url}"
        return [target, *self._reaching()]

    def _reaching(self) -> list[str]:
        """The run's options that reaching a remote target took: the ssh configuration,
        accepting new host keys, a longer time to connect."""
        settings = self.run.settings
        options = []
        if settings.ssh_config is not None:
            options.append(f"--gpuhost-ssh-config={settings.display(settings.ssh_config)}")
        if settings.accept_new_host_keys:
            options.append("--gpuhost-accept-new-host-keys")
        if settings.connect_timeout != BY_NAME["connect_timeout"].default:
            options.append(f"--gpuhost-connect-timeout={settings.connect_timeout:g}")
        return options


def _undo(changes: int | None, *options: str) -> str:
    """``(undo: OPTIONS)``: what rolls the journal back, from where pytest ran; ``(nothing to
    undo: ...)`` where the run made no change there (every fix it tried was refused)."""
    if changes == 0:
        return "(nothing to undo: the host refused every change)"
    return f"(undo: {' '.join(options)})"
