"""``python -m pytest_gpuhost.envelope``: a benchmark that is not a pytest test (vLLM's or
SGLang's serving benchmark, nccl-tests) run inside an envelope.

    python -m pytest_gpuhost.envelope [--gpuhost-spec=FILE] [--gpuhost-target=URL]
        [--gpuhost-root=DIR] [--gpuhost-ssh-config=FILE] [--out FILE] [-p MODULE] -- CMD ARGS...

The host's checks are read first (their state and its digest, as a pytest run records them;
the envelope's start takes their values as read), the command runs with its output passed
through, and the envelope around it is judged by the spec's ``envelope:`` limits: ``--out``
gets it as JSON with the state, stderr one line with the verdict. The exit status is the
command's own (128 + N for a command ended by signal N); 4 when the envelope could not be
taken (a bad spec, a target that cannot be reached), with one line and no traceback. A
SIGTERM or SIGINT is passed to the command, and the envelope still closes.

A program, imported by nothing: it stands above every layer (``tests/test_layers.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

CANNOT = 4
"""The exit status when the envelope could not be taken."""
PREFIX = "gpuhost envelope"


class CannotTake(Exception):
    """The envelope cannot be taken: the message says why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        print(f"{PREFIX}: {message}", file=sys.stderr)
        raise SystemExit(CANNOT)


def parser() -> argparse.ArgumentParser:
    made = _Parser(prog="python -m pytest_gpuhost.envelope",
                   usage="%(prog)s [--gpuhost-spec=FILE] [--gpuhost-target=URL] "
                         "[--gpuhost-root=DIR] [--gpuhost-ssh-config=FILE] [--out FILE] "
                         "[-p MODULE] -- CMD [ARGS...]",
                   description="Run CMD inside a benchmark envelope: what the host did while "
                               "it ran (throttling, other processes on its GPUs, new Xids and "
                               "AER errors, a host check changed), judged by the spec's "
                               "envelope: limits. Exits with CMD's status (4: no envelope).")
    made.add_argument("--gpuhost-spec", action="append", default=[], metavar="FILE|NAME",
                      help="the spec whose checks are the host's state and whose envelope: "
                           "section has the limits (default: no checks, default limits)")
    made.add_argument("--gpuhost-target", action="append", default=[], metavar="URL",
                      help="where the GPUs are (ssh://host, lxc://..., as pytest's option); "
                           "default: this machine")
    made.add_argument("--gpuhost-root", metavar="DIR", help="the host root (default: /)")
    made.add_argument("--gpuhost-ssh-config", metavar="FILE",
                      help="the ssh client configuration for ssh:// targets (as pytest's)")
    made.add_argument("--out", metavar="FILE", type=Path,
                      help="write the envelope, with the host state, as JSON here")
    made.add_argument("-p", dest="plugins", action="append", default=[], metavar="MODULE",
                      help="a gpuhost plugin module to load (its hooks: a GPU sampler, hosts, "
                           "kinds), as pytest's -p loads one")
    made.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    return made


def _hooks(plugins: Sequence[str]) -> Any:
    """The gpuhost hooks of the built-in plugin and the ones named."""
    import importlib

    import pluggy

    from .. import builtin, hookspecs

    manager = pluggy.PluginManager("pytest")
    manager.add_hookspecs(hookspecs)
    for name in plugins:
        try:
            manager.register(importlib.import_module(name), name)
        except ImportError as exc:
            raise CannotTake(f"-p {name}: {exc}") from None
    manager.register(builtin, "gpuhost-builtin")
    return manager


BARE_SPEC = "version: 1\nenvelope:\n"
"""The spec of a run given none: no host check, every limit at its default."""


def _session(options: argparse.Namespace, manager: Any, bare: Path) -> Any:
    from .. import builtin
    from ..config.options import RawOptions
    from ..config.settings import resolve
    from ..session import Session

    here = Path.cwd()
    settings = resolve(RawOptions(here, here, schemes=builtin.target_schemes(manager),
                                  spec=tuple(options.gpuhost_spec) or (str(bare),),
                                  targets=tuple(options.gpuhost_target),
                                  root=options.gpuhost_root,
                                  ssh_config=options.gpuhost_ssh_config))
    kinds = {kind.section: kind for batch in manager.hook.pytest_gpuhost_check_kinds()
             for kind in batch}
    conditions = {name: fn for batch in manager.hook.pytest_gpuhost_conditions()
                  for name, fn in batch.items()}

    def make_host(target: Any, settings: Any) -> Any:
        made = manager.hook.pytest_gpuhost_make_host(url=target.url, settings=settings,
                                                     target=target)
        if made is None:
            raise CannotTake(f"no pytest-gpuhost plugin makes a host for {target.url!r}")
        return made

    return Session(settings, kinds, conditions, make_host,
                   lambda host: manager.hook.pytest_gpuhost_nvml(host=host))


def host_records(session: Any) -> list[Any]:
    """The records of the spec's checks, read (never fixed) as a pytest run reads them; the
    slow ones (bandwidth measurements) left out."""
    records = []
    for spec in session.specs.values():
        for target in session.targets.values():
            if target.dormant:
                continue
            checks = [(c, w) for c, w in session.placed(spec, target) if not c.slow]
            for where in {id(w): w for _, w in checks}.values():
                where.select([c for c, w in checks if w is where])
            records += [session.run(check, where) for check, where in checks]
    return records


@contextlib.contextmanager
def _passed_on(child: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """SIGTERM and SIGINT go to the command while it runs."""
    def forward(number: int, _frame: object) -> None:
        for process in child:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(number)

    before = {number: signal.signal(number, forward) for number in (signal.SIGTERM,
                                                                     signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def run_inside(options: argparse.Namespace) -> tuple[int, dict[str, Any], str]:
    """The command's status, the document written to --out, and the verdict's line."""
    from ..config.settings import SettingsError
    from ..host import HostError
    from ..runstate import state_of
    from ..session.envelopes import KnownState, open_envelope
    from ..specmodel import SpecError
    from .verdict import summary

    try:
        manager = _hooks(options.plugins)
        with tempfile.TemporaryDirectory(prefix="gpuhost-envelope-") as directory:
            bare = Path(directory) / "envelope.yaml"
            bare.write_text(BARE_SPEC)
            session = _session(options, manager, bare)  # the spec is read, and not again
        records = host_records(session)
        state = state_of(session, records)
        child: list[subprocess.Popen[bytes]] = []
        envelope = open_envelope(
            session, lambda host: manager.hook.pytest_gpuhost_envelope_sampler(host=host),
            roots=lambda: [process.pid for process in child] or [os.getpid()],
            known=KnownState(lambda: records))
    except (SettingsError, SpecError, HostError, CannotTake, OSError) as exc:
        raise CannotTake(str(exc)) from None
    with envelope, _passed_on(child):
        try:
            child.append(subprocess.Popen(options.command))
        except OSError as exc:
            status = 127 if isinstance(exc, FileNotFoundError) else 126
            print(f"{PREFIX}: cannot run {options.command[0]!r}: {exc.strerror or exc}",
                  file=sys.stderr)
        else:
            returned = child[0].wait()
            status = 128 - returned if returned < 0 else returned
    verdict = envelope.close()
    session.close()
    document = {"command": list(options.command), "status": status, "envelope": verdict,
                "state": state}
    return status, document, summary(verdict)


def main(argv: Sequence[str] | None = None) -> int:
    options = parser().parse_args(argv)
    command = list(options.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser().error("no command to run: give it after --")
    options.command = command
    try:
        status, document, line = run_inside(options)
    except CannotTake as exc:
        print(f"{PREFIX}: cannot take the envelope: {exc}", file=sys.stderr)
        return CANNOT
    if options.out is not None:
        from ..files import write_output

        write_output(options.out, json.dumps(document, indent=2) + "\n")
    print(f"{PREFIX}: {line}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
