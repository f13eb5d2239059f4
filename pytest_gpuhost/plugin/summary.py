"""The terminal summary of a gpuhost run, its own object on the controller (as pytest-xdist
keeps its ``TerminalDistReporter`` apart): the table of the checks (``reports.terminal``), the
journal and how to undo it, a rollback's state, and what went wrong at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..config.options import BY_NAME, flag
from ..printable import printable
from ..reports.terminal import TerminalSummary
from ..session.containers import own_root

if TYPE_CHECKING:
    from ..reports import RunInfo, TargetInfo
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
        """Each journal the run wrote, as a path of the machine that holds it (a container's
        by its host's path too), and one undo in the form the run was given: a container
        and its host together (a rollback of them pairs their journals of one run), this
        machine's, each other remote target's."""
        if not info.targets:  # this machine alone, its checks named after no target
            if info.journal is not None:
                changes = self.run.session.target.fixrun.journal_changes()
                write(f"journal: {info.journal} "
                      f"{_undo(changes, f'--gpuhost-rollback={info.journal}', *self._root())}")
            return
        kernel_on = {a.name: a.kernel_on for a in self.run.settings.targets} | \
            {t.name: t.kernel_on for t in info.targets}  # a host that ran no check included
        hosts = {host for host in kernel_on.values() if host}

        def kernel_of(name: str) -> str:  # a container's host's host (--gpuhost-host), ...
            seen = [name]
            while kernel_on.get(seen[-1]) and kernel_on[seen[-1]] not in seen:
                seen.append(str(kernel_on[seen[-1]]))
            return seen[-1]

        done: set[str] = set()
        for target in info.targets:
            unit = kernel_of(target.name) if target.kernel_on or target.name in hosts else None
            if unit is not None:  # a host and its containers: one undo
                if unit not in done:
                    done.add(unit)
                    self._unit(write, unit, [t for t in info.targets
                                             if kernel_of(t.name) == unit],
                               {name for name in kernel_on if kernel_of(name) == unit})
            elif target.journal:
                if target.url == "local":
                    undo = _undo(target.journal_changes,
                                 f"--gpuhost-rollback={target.journal}", *self._root())
                else:
                    name = str(target.journal).rsplit("/", 1)[-1]
                    undo = _undo(target.journal_changes, f"--gpuhost-rollback={name}",
                                 *self._naming(target.name, target.url))
                write(f"journal of {target.name}: {self._shown(target)} {undo}")

    def _unit(self, write: Callable[..., None], host: str, unit: list[TargetInfo],
              names: set[str]) -> None:
        """The journals of a host and its containers, and one undo of them in the form the
        run was given: a container's alone by its name (the host left alone), else every
        one of them without a name (a rollback pairs the host's journal of the containers'
        newest run)."""
        journaled = [t for t in unit if t.journal]
        for target in journaled:
            write(f"journal of {target.name}: {self._shown(target)}")
        if not journaled:
            return
        if all(t.journal_changes == 0 for t in journaled):
            write(_undo(0))
            return
        if len(journaled) == 1 and journaled[0].name != host:
            alone = journaled[0]
            journal = str(alone.journal)
            named = journal if alone.url == "local" else journal.rsplit("/", 1)[-1]
            options = self._pair({alone.name, *(name for name in names
                                                if name != alone.name and name in
                                                self._hosts_of(alone.name))}, alone.name)
            write(f"undo: --gpuhost-rollback={named} {' '.join(options)} (its host had "
                  "nothing to change)")
            return
        options = self._pair(names)
        write(f"undo: --gpuhost-rollback {' '.join(options)} (the newest journal of each "
              "container, and its host's of the same run)")

    def _hosts_of(self, name: str) -> list[str]:
        """The targets whose kernel ``name`` runs on: its host, that host's host, ..."""
        kernel_on = {a.name: a.kernel_on for a in self.run.settings.targets}
        found: list[str] = []
        while kernel_on.get(name) and kernel_on[name] not in found:
            name = str(kernel_on[name])
            found.append(name)
        return found

    def _shown(self, target: TargetInfo) -> str:
        """A target's journal as a path of the machine that holds it, and a container's as a
        path of its host too (``/var/lib/lxc/101/rootfs/...``)."""
        shown = self._on_target(target.name, target.url, str(target.journal))
        if target.journal_on_host and target.journal_on_host != shown:
            shown += f" (on {target.kernel_on}: {target.journal_on_host})"
        return shown

    def _pair(self, paired: set[str], first: str | None = None) -> list[str]:
        """The options that name containers and their hosts again, as the run was given them
        (--gpuhost-target=lxc://101, --gpuhost-host=ssh://root@pve, an inventory's hosts),
        with the root where one of them is this machine's tree, and what reaching them took;
        ``first``: the target a named journal is of, named first."""
        options: list[str] = []
        local = False
        addresses = sorted(self.run.settings.targets, key=lambda each: each.name != first)
        for address in addresses:
            if address.name not in paired:
                continue
            local = local or address.local
            if address.implied is not None and any(  # --gpuhost-host (or its ini twin)
                    each.local and each.kernel_on == address.name
                    for each in self.run.settings.targets):
                options.append(f"{flag('host')}={address.url}")
            elif address.implied is None and address.source == flag("targets"):
                options.append(f"{flag('targets')}={address.url}")
            elif address.implied is None and address.source.startswith(
                    ("--gpuhost-inventory=", "gpuhost_inventory ")):
                options.extend(self._reaching_one(address.name, address.url))
        return list(dict.fromkeys([*(self._root() if local else []), *options,
                                   *self._reaching()]))

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
        """What a rollback of this machine's journal needs besides it: its root, unless ``/``,
        as the command line gave it (an absolute one stays absolute), else (the ini's) whole."""
        root = self.run.settings.root
        if str(root) == "/":
            return []
        given = self.run.config.getoption(BY_NAME["root"].dest, None)
        return [f"{flag('root')}={given if given else root}"]

    def _on_target(self, name: str, url: str, journal: str) -> str:
        """A remote journal as a path on its target (``/var/lib/pytest-gpuhost/journal/...``,
        under the target's root), never its URL glued to the path."""
        given = next((t for t in self.run.settings.targets if t.name == name), None)
        if url == "local" or given is None or not journal.startswith(url):
            return journal
        return own_root(given).rstrip("/") + "/" + journal[len(url):].lstrip("/")

    def _naming(self, name: str, url: str) -> list[str]:
        """The options that reach one target again: an inventory's host by the inventory (its
        key and ssh arguments come with it) and --gpuhost-limit, any other by its URL; then
        the run's own options that reaching it took (its ssh configuration, ...)."""
        return [*self._reaching_one(name, url), *self._reaching()]

    def _reaching_one(self, name: str, url: str) -> list[str]:
        """The options that name one target: an inventory's host by the inventory and
        --gpuhost-limit, any other by its URL."""
        given = next((t for t in self.run.settings.targets if t.name == name), None)
        source = given.source if given is not None else ""
        if source.startswith("--gpuhost-inventory="):
            return [source, f"--gpuhost-limit={name}"]
        if source.startswith("gpuhost_inventory "):
            return [f"--gpuhost-limit={name}"]
        return [f"--gpuhost-target={url}"]

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
