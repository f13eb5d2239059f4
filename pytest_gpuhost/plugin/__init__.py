"""pytest-gpuhost's entry point: its options, and starting a gpuhost run.

Every pytest run in an environment where the plugin is installed imports this module, so it
imports nothing of its own until a run asks for gpuhost work (a spec, a rollback, or one of its
options): then ``start.start_run`` registers the run's plugins, each only in the role it has
(the checks where they run, the records where they are kept). A run without any pays for this
module, the options table and the hook specifications only.

The package, by role (as pytest-xdist splits its own): ``start`` (settings, the session, which
plugin goes where), ``checks`` (collecting and running the checks: a run without xdist and each
xdist worker), ``items`` (pytest's items of a spec, a journal and its persistence files),
``controller`` (the records, the end of the run, the reports: a run without xdist and the xdist
controller) over ``book`` (the record book, no pytest), ``summary`` (the terminal summary),
``distributing`` and ``worker`` (the two sides of an xdist run), ``workers`` (the log they share)
and ``gate`` (the pre-benchmark gate).
"""

from __future__ import annotations

import sys
from typing import Any, Literal

import pytest

from .. import bundled, hookspecs
from ..config.options import COUNT, FLAG, OPTIONAL, OPTIONS, SECONDS, SPEC_SUFFIXES, WORDS

MARKERS = (
    "gpuhost: on a generated host check: its kind; on a test of yours: run it only after every "
    "host check passed (--gpuhost-gate does this for every test)",
    "gpuhost_slow: a host check that takes long (the p2p bandwidth checks); -m 'not "
    "gpuhost_slow' is the fast subset a scheduler's health check can afford",
)
_ACTIONS = {FLAG: "store_true", WORDS: "append"}
_TYPES: dict[str, type] = {SECONDS: float, COUNT: int}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)
    _rewrite_only_the_testing_helpers(pluginmanager)


PACKAGE = __package__.rpartition(".")[0]
REWRITTEN = f"{PACKAGE}.testing"
"""The helpers tests assert with (``FakeHost``, ``SshServer``): the package's only modules
whose asserts pytest rewrites."""


def _rewrite_only_the_testing_helpers(pluginmanager: pytest.PytestPluginManager) -> None:
    """pytest rewrites the asserts of every module of a distribution with a ``pytest11`` entry
    point, and loads each through its own import hook, which reads the cached code several
    times slower than Python's importer does (``marshal.load`` on the file object): 29 ms of
    CPU at a run's start for this package's modules in a wheel install (bench/RESULTS.md, 1c),
    for asserts that are invariants, not tests. Called as the plugin registers, before it
    imports anything else of its own: the package is left to Python's importer, except
    ``REWRITTEN``. The set of names pytest rewrites is pytest's own (``_must_rewrite``): a
    pytest without it rewrites the whole package as before, which changes only the time."""
    hook = getattr(pluginmanager, "rewrite_hook", None)
    marked = getattr(hook, "_must_rewrite", None)
    known = getattr(hook, "_marked_for_rewrite_cache", None)
    if not isinstance(marked, set) or PACKAGE not in marked or not isinstance(known, dict):
        return
    marked.discard(PACKAGE)
    marked.add(REWRITTEN)
    known.clear()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Every option of ``options.OPTIONS``, and its ini twin."""
    group = parser.getgroup("gpuhost", "GPU host tuning checks (pytest-gpuhost)")
    names = ", ".join(bundled.names())
    for option in OPTIONS:
        extra: dict[str, object] = {"metavar": option.metavar} if option.metavar else {}
        if option.kind == OPTIONAL:
            extra.update(nargs="?", const="")
        if option.kind in _ACTIONS:
            extra["action"] = _ACTIONS[option.kind]
        if option.kind in _TYPES:
            extra["type"] = _TYPES[option.kind]
        group.addoption(option.flag, default=option.default, help=option.help_text(names),
                        **extra)
    for option in OPTIONS:
        if option.ini is None:
            continue
        kind: Literal["linelist", "args", "string", "bool"] = \
            "linelist" if option.ini_list else "args" if option.kind == WORDS else \
            "bool" if option.kind == FLAG else "string"
        parser.addini(option.ini, option.ini_help, type=kind,
                      default=[] if option.kind == WORDS else False if option.kind == FLAG
                      else "")


def _asked(config: pytest.Config) -> bool:
    """Whether anything of gpuhost was asked for: an option, an ini value, a .yaml argument."""
    option = config.option
    if any(each.given(getattr(option, each.dest, each.default)) for each in OPTIONS):
        return True
    if any(config.getini(each.ini) for each in OPTIONS if each.ini is not None):
        return True
    return any(arg.split("::", 1)[0].endswith(SPEC_SUFFIXES) for arg in config.args)


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """--gpuhost-npd: NPD reads standard output as the condition's message, so the terminal
    reporter (made at configure, from sys.stdout) writes to stderr; the real stdout is kept for
    the one line."""
    if config.option.gpuhost_npd and not hasattr(config, "workerinput"):
        from ..reports.npd import STDOUT

        config.stash[STDOUT] = sys.stdout
        sys.stdout = sys.stderr


def pytest_configure(config: pytest.Config) -> None:
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    _yaml_before_pytester(config)
    if not _asked(config):
        if getattr(config.option, "benchmark_compare", None):
            from ..runstate import benchmark_files

            benchmark_files(config, None)  # compares only, saying the host was not checked
        return
    from .. import long_lived

    with long_lived.paused():  # from the run's first import on: what it imports lives to the end
        _start(config)


def _yaml_before_pytester(config: pytest.Config) -> None:
    """A run imports PyYAML only where it parses a spec (``spec/cache.py``). pytester forgets
    the modules each of its inline runs imported, and PyYAML's C extension cannot be imported
    twice in a process: a second import keeps the first's node classes, and the next spec
    composed is refused as a KeyError. Where pytester is loaded (a test suite, this project's
    or a kind author's), PyYAML is imported here, before any inline run, and kept."""
    if config.pluginmanager.has_plugin("pytester"):
        import yaml  # noqa: F401


def _start(config: pytest.Config) -> None:
    from .start import start_run

    if not config.option.gpuhost_npd or hasattr(config, "workerinput"):
        start_run(config)
        return
    from ..reports.npd import STDOUT, cannot_run

    try:
        start_run(config)
    except Exception as exc:  # a bad spec or root, a held lock, a bug: NPD's "unknown"
        message = exc.msg if isinstance(exc, pytest.exit.Exception) else str(exc)
        reply = cannot_run(message or type(exc).__name__)
        print(reply.message, file=config.stash[STDOUT], flush=True)
        pytest.exit(message, returncode=reply.status)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.option.gpuhost_npd and not hasattr(config, "workerinput"):
        from ..reports.npd import STDOUT

        stdout = config.stash.get(STDOUT, None)
        if stdout is not None and sys.stdout is sys.stderr:
            sys.stdout = stdout


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked gpuhost in a run without gpuhost checks: each fails at its setup, saying
    what to pass. Looked for once here rather than in a setup hook of every test of every run."""
    if config.pluginmanager.get_plugin("gpuhost-checks") is not None:
        return  # the run's own hooks gate them
    marked = {item.nodeid for item in items
              if "gpuhost" in item.keywords and item.get_closest_marker("gpuhost") is not None}
    if marked and not config.pluginmanager.has_plugin("gpuhost-unmet"):
        config.pluginmanager.register(_NoSpec(marked), "gpuhost-unmet")


class _NoSpec:
    def __init__(self, nodeids: set[str]) -> None:
        self.nodeids = nodeids

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        __tracebackhide__ = True
        if item.nodeid in self.nodeids:
            pytest.fail(f"{item.nodeid} is marked gpuhost (it needs the host checks to pass) "
                        "but no gpuhost spec was given: pass --gpuhost-spec=FILE", pytrace=False)


@pytest.fixture(scope="session")
def gpuhost_state(request: pytest.FixtureRequest) -> Any:
    """The state the run's host checks verified (after any --fix): a read-only mapping with
    ``digest``, ``spec`` and ``targets``, to keep beside a benchmark's result
    (``gpuhost_state.as_dict()`` is plain JSON). A test that asks for it runs after the host
    checks, as a gated test does, under xdist too; without a spec it is an error."""
    from ..runstate import fixture_state

    return fixture_state(request.config.pluginmanager.get_plugin("gpuhost-run"))


@pytest.fixture
def gpuhost_envelope(request: pytest.FixtureRequest) -> Any:
    """Opens a benchmark's envelope: ``with gpuhost_envelope() as envelope: run()``, then
    ``envelope.valid``, ``envelope.reasons`` and ``envelope.verdict`` say what the host did
    while it ran, judged by the spec's ``envelope:`` limits. Its keywords: ``target`` (a target's
    name; the run's first), ``gpus`` (the PCI addresses the benchmark uses; all), ``limits``,
    ``name``. Each verdict lands in the JSON report's ``benchmarks`` and in Allure; without a
    spec it is an error."""
    hooks = request.config.pluginmanager.get_plugin("gpuhost-envelopes")
    if hooks is None:
        pytest.fail("gpuhost_envelope: no gpuhost run takes envelopes here: pass "
                    "--gpuhost-spec=FILE (and leave out --gpuhost-envelope=off)", pytrace=False)
    return hooks.opener(request.node)
