"""The run's output files, each its own file and none of them one of the run's inputs.

A report written over the spec the run read (``--gpuhost-report=spec.yaml``), over its targets
file, inventory, journal or ssh configuration, or over a file of the host tree it checks
replaces that input without a word; two reports at one file (``--gpuhost-report=out
--gpuhost-prom=out``) leave only the last one written. Both are refused when the run is
configured (a usage error, exit 4), before anything is read or changed.

Files are compared by identity, not by spelling: ``out``, ``./out``, ``dir/../out``, a symbolic
link to it and a second hard link are one file (the same device and inode where it exists,
else the same real path). A character device (``/dev/stdout``, ``/dev/null``) is written in
place, never replaced, so any number of outputs may share one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from .options import RawOptions, flag

ALLURE_FILES = ("environment.properties", "categories.json", "allurerc.json")
"""The files the run writes into ``--alluredir`` itself (``reports/allure.py``)."""


class OutputClash(Exception):
    """An output that is another output or one of the run's inputs; the message says which."""


class Place(NamedTuple):
    """A file or directory of the run, and how a message names it."""

    what: str
    """``--gpuhost-report=out.json``, ``the spec spec.yaml``, ``the host root --gpuhost-root=t``."""
    path: Path


def identity(path: Path) -> tuple[object, ...]:
    """What makes two paths one file: its device and inode where it exists (links, hard links
    and every spelling of it agree), else its real path (``out`` and ``./out``)."""
    try:
        info = os.stat(path)
    except OSError:
        return ("path", os.path.realpath(path))
    return ("inode", info.st_dev, info.st_ino)


def _in_place(path: Path) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _under(path: Path, directory: Path) -> bool:
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(directory))
    return real != top and top in real.parents


def refuse_clashes(outputs: Sequence[Place], inputs: Sequence[Place],
                   trees: Sequence[Place]) -> None:
    """OutputClash for the first output that is another output, one of ``inputs`` (files the
    run reads), or a file under one of ``trees`` (a host root, an inventory directory, a
    journal directory: directories the run reads or keeps state in)."""
    seen: dict[tuple[object, ...], Place] = {}
    for output in outputs:
        if _in_place(output.path):
            continue
        key = identity(output.path)
        for each in inputs:
            if identity(each.path) == key:
                raise OutputClash(f"{output.what}: {output.path} is {each.what}, which this run "
                                  "reads; the report would replace it: name another file")
        for tree in trees:
            if _under(output.path, tree.path):
                raise OutputClash(f"{output.what}: {output.path} is under {tree.what}; the "
                                  "report would write into it: name a file outside it")
        other = seen.setdefault(key, output)
        if other is not output:
            raise OutputClash(f"{output.what} and {other.what} name one file ({output.path}): "
                              "the last report written would replace the other; give each "
                              "its own file")


class RunFiles(Protocol):
    """What a run's settings say of its files (``settings.Settings``): its specs, its root,
    and each of ``REPORTS``, a path or None."""

    @property
    def specs(self) -> tuple[Path, ...]: ...

    @property
    def root(self) -> Path: ...

    def display(self, path: Path) -> str: ...


REPORTS = ("report", "prom", "nfd", "fleet_html", "capture")
"""The options of the reports a run writes, each a field of its settings (a path or None)."""


def refuse_run_clashes(raw: RawOptions, run: RunFiles, target_files: Sequence[tuple[str, Path]],
                       journals: Path) -> None:
    """``refuse_clashes`` for a run: its reports, pytest's ``--junitxml`` and the files the run
    writes into ``--alluredir``; as inputs its specs and ``target_files`` (an inventory, a
    targets file: how a message names each, its path), the journal, the ssh configuration and
    the journal a rollback reads; as trees the host root (unless ``/``), an inventory directory
    and the ``journals`` directory."""
    outputs = [Place(f"{flag(name)}={raw.text(name)}", path) for name in REPORTS
               for path in (getattr(run, name),) if isinstance(path, Path)]
    if raw.junitxml:  # as pytest's junitxml resolves it
        junit = os.path.expanduser(os.path.expandvars(raw.junitxml))
        outputs.append(Place(f"--junitxml={raw.junitxml}", raw.invocation / junit))
    if raw.alluredir:
        outputs += [Place(f"--alluredir={raw.alluredir} (its {name})",
                          raw.invocation / raw.alluredir / name) for name in ALLURE_FILES]
    inputs = [Place(f"the spec {run.display(spec)}", spec) for spec in run.specs]
    inputs += [Place(what, path) for what, path in target_files]
    for name in ("journal", "ssh_config", "rollback"):
        given = raw.text(name)
        if given:
            inputs.append(Place(f"{flag(name)}={given}", raw.invocation / given))
    trees = [Place(what, path) for what, path in target_files if path.is_dir()]
    if run.root != Path("/"):
        trees.append(Place(f"the host root {run.display(run.root)}", run.root))
    trees.append(Place("the directory of the journals", journals))
    refuse_clashes(outputs, inputs, trees)
