"""What a run imports: every pytest run of an environment where pytest-gpuhost is installed pays
for its entry point, and a gpuhost run for what its spec and options use, not for all of it.

Structure, not timing: the modules a run imports are what makes it cost (bench/bench.py measures
the time, figures 1a-1c).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import pytest_gpuhost.bundled as pytest_gpuhost_bundled
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import REPO

pytest_plugins = ["pytester"]

LOADED = """
    import sys

    def pytest_unconfigure(config):
        names = sorted(m for m in sys.modules if m.split(".")[0] in {packages!r})
        with open("loaded.txt", "w") as out:
            out.write("\\n".join(names))
"""


def loaded(pytester: pytest.Pytester, *args: str,
           packages: tuple[str, ...] = ("pytest_gpuhost", "yaml", "_yaml"),
           ret: int = pytest.ExitCode.OK, cache: bool = False) -> list[str]:
    """The modules of ``packages`` (pytest_gpuhost's and YAML's) of a fresh pytest process at
    its end; ``cache``: with pytest's cache (parsed specs kept there), as pytest runs by
    default."""
    pytester.makeconftest(textwrap.dedent(LOADED).format(packages=packages))
    result = pytester.runpytest_subprocess(*(() if cache else ("-p", "no:cacheprovider")),
                                           *args)
    assert result.ret == ret, result.stdout.str()
    return (pytester.path / "loaded.txt").read_text().split()


def test_a_run_that_asks_nothing_of_gpuhost_imports_its_entry_point_only(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="""
        import pytest

        @pytest.mark.parametrize("n", range(3))
        def test_trivial(n):
            assert n >= 0
    """)
    # bundled: a directory listing (no YAML) for --gpuhost-spec's help, which names them;
    # config.options: the table every option is declared in (no import of its own; its
    # folder's __init__ imports nothing)
    assert loaded(pytester) == ["pytest_gpuhost", "pytest_gpuhost.bundled",
                                "pytest_gpuhost.config", "pytest_gpuhost.config.options",
                                "pytest_gpuhost.hookspecs", "pytest_gpuhost.plugin"]


def test_a_verify_run_imports_the_kinds_of_its_spec_and_no_fix_or_unasked_report(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    modules = loaded(pytester, "spec.yaml", f"--gpuhost-root={fake.root}")
    kinds = [m for m in modules if m.startswith("pytest_gpuhost.checks.")]
    # gpus: every run reads the GPU list for its reports; conditions: the `when:` names;
    # kind: what a Kind is and its optional half; persistence: the lines a kind supplies (part
    # of what a Kind is, stdlib only); no capture's helpers (checks.capturing), no plan's
    # changes (checks.changes: a check that passes plans nothing)
    assert kinds == ["pytest_gpuhost.checks.conditions", "pytest_gpuhost.checks.gpus",
                     "pytest_gpuhost.checks.kind", "pytest_gpuhost.checks.persistence",
                     "pytest_gpuhost.checks.sysctl"]
    fix = [m for m in modules if m.startswith("pytest_gpuhost.fix.")]
    # fix.run: the empty FixRun every target holds; fix.state: where journals are named (its
    # count of this process's journals must outlive a run: pytester drops the modules an
    # inline run imported, and a second run in the same second then took the first's name);
    # no journal, no fixer, no lock (the exception a lock raises is the fix package's own)
    assert fix == ["pytest_gpuhost.fix.run", "pytest_gpuhost.fix.state"]
    reports = [m for m in modules if m.startswith("pytest_gpuhost.reports.")]
    # no failure's text: nothing failed
    assert reports == ["pytest_gpuhost.reports.junit", "pytest_gpuhost.reports.terminal"]
    session = [m for m in modules if m.startswith("pytest_gpuhost.session.")]
    # no capture's, persistence's, lost target's or unexpandable section's module
    assert not {"pytest_gpuhost.session.capturing", "pytest_gpuhost.session.persisting",
                "pytest_gpuhost.session.unreachable",
                "pytest_gpuhost.session.unexpanded"} & set(session)
    absent = ("capture", "fleet", "plugin.worker", "plugin.distributing", "host.remote",
              "gpu.bandwidth", "gpu.cudaprobe", "gpu.measure", "gpu.nvmllib",
              "gpu.nvmlrecorded", "bounded", "linux.cmdline", "state", "benchmark", "files")
    # plugin.worker: plugin.workers too; the host's state: for a report, the fixture, a
    # benchmark; gpu.nvmllib: nvidia-ml-py's wrapper, for the root / only; gpu.nvmlrecorded:
    # a recorded snapshot's NVML, for a tree that holds one; linux.cmdline: the kernel command
    # line's readers, for the kinds that read it; files: the reports' writer
    assert not [m for m in modules if m.removeprefix("pytest_gpuhost.").startswith(absent)]


def test_a_spec_parsed_by_an_earlier_run_is_loaded_without_yaml(pytester: pytest.Pytester,
                                                                fake: FakeHost) -> None:
    """The spec cache (spec/cache.py) in pytest's cache directory: the first run parses the
    spec and keeps it, the next loads it and imports no YAML parser at all; without pytest's
    cache, and after --cache-clear, the spec is parsed."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    run = ("spec.yaml", f"--gpuhost-root={fake.root}")
    kept = pytester.path / ".pytest_cache" / "d" / "gpuhost-spec"
    assert "yaml" in loaded(pytester, *run)  # -p no:cacheprovider: parsed, nothing kept
    assert not (pytester.path / ".pytest_cache").exists()
    first = loaded(pytester, *run, cache=True)
    assert "yaml" in first and len(list(kept.glob("*.pickle"))) == 1
    second = loaded(pytester, *run, cache=True)
    assert not [m for m in second if m.split(".")[0] in ("yaml", "_yaml")]
    assert "pytest_gpuhost.specmodel.yamlfile" not in second
    assert [m for m in second if m.startswith("pytest_gpuhost.checks.")] == \
        [m for m in first if m.startswith("pytest_gpuhost.checks.")]
    assert "yaml" in loaded(pytester, *run, "--cache-clear", cache=True)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 11\n")
    assert "yaml" in loaded(pytester, *run, cache=True, ret=pytest.ExitCode.TESTS_FAILED)


def test_a_node_problem_detector_run_measures_nothing_and_opens_no_library(
        pytester: pytest.Pytester, example_host: Path) -> None:
    """What NPD runs every interval (examples/k8s/gpuhost-monitor.json) on the example host:
    the p2p checks are left out (``-m "not gpuhost_slow"``), so neither the bandwidth parsers
    nor the CUDA probe load, and a fake root's recorded NVML needs no nvidia-ml-py wrapper."""
    spec = Path(pytest_gpuhost_bundled.__file__).parent / "blackwell8.yaml"
    modules = loaded(pytester, "-m", "not gpuhost_slow", "--gpuhost-npd", f"--gpuhost-spec={spec}",
                     f"--gpuhost-root={example_host}", ret=1)
    assert "pytest_gpuhost.gpu.measure" in modules  # p2p's checks are expanded, then left out
    absent = ("gpu.bandwidth", "gpu.cudaprobe", "gpu.nvmllib", "bounded", "host.remote",
              "capture", "fleet", "fix.fixer", "fix.journal", "plugin.worker", "state")
    assert not [m for m in modules if m.removeprefix("pytest_gpuhost.").startswith(absent)]


def test_the_example_monitors_runs_after_the_first_load_the_spec_without_yaml(
        pytester: pytest.Pytester, example_host: Path, tmp_path: Path) -> None:
    """examples/k8s/gpuhost-monitor.json's rule as NPD runs it every interval, its paths made
    this test's: its ``cache_dir`` (a directory the image makes root's alone) keeps the spec
    the first run parsed, and every run after it loads that instead of importing a YAML
    parser; the outcome is the same."""
    rule = json.loads((REPO / "examples" / "k8s" / "gpuhost-monitor.json").read_text())
    [args] = [r["args"] for r in rule["rules"]]
    cache = tmp_path / "npd-cache"
    cache.mkdir(mode=0o700)
    spec = Path(pytest_gpuhost_bundled.__file__).parent / "blackwell8.yaml"
    here = {"--gpuhost-spec=": str(spec), "--gpuhost-root=": str(example_host),
            "--gpuhost-nfd=": str(pytester.path / "features"), "cache_dir=": str(cache)}
    words = [next((prefix + value for prefix, value in here.items() if word.startswith(prefix)),
                  word) for word in args]
    assert f"cache_dir={cache}" in words and "no:cacheprovider" not in words
    first = loaded(pytester, *words, ret=1, cache=True)
    assert "yaml" in first
    assert [path.name for path in (cache / "d" / "gpuhost-spec").iterdir()]  # kept
    second = loaded(pytester, *words, ret=1, cache=True)
    assert "yaml" not in second and "pytest_gpuhost.specmodel.yamlfile" not in second
    features = (pytester.path / "features").read_text()
    assert "feature.node.kubernetes.io/gpuhost.tuned=false" in features


def test_the_bridges_checks_load_only_for_their_keys(pytester: pytest.Pytester,
                                                     fake: FakeHost) -> None:
    """pcie's own keys read the GPUs' config space; the bridges' module (ACS, ASPM, AER, and
    the extended-capability parser) loads for a spec with one of their keys only."""
    fake.gpu("0000:01:00.0", audio=False, max_read_request=4096)
    pytester.makefile(".yaml", spec="version: 1\npcie: {max_read_request: 4096}\n")
    modules = loaded(pytester, "spec.yaml", f"--gpuhost-root={fake.root}")
    assert "pytest_gpuhost.checks.pcie" in modules
    assert not {"pytest_gpuhost.checks.pcie_path", "pytest_gpuhost.linux.pciext"} & set(modules)
    pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n"
                                    "  aer: {since: session}\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "spec.yaml",
                                           f"--gpuhost-root={fake.root}")
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)
    assert "pytest_gpuhost.checks.pcie_path" in \
        (pytester.path / "loaded.txt").read_text().split()


def test_a_fix_run_imports_the_fixer_and_its_journal(pytester: pytest.Pytester,
                                                     fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 60)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    modules = loaded(pytester, "spec.yaml", f"--gpuhost-root={fake.root}", "--fix",
                     "--gpuhost-report=out.json")
    assert {"pytest_gpuhost.fix.fixer", "pytest_gpuhost.fix.journal",
            "pytest_gpuhost.reports.jsonfile"} <= set(modules)
    assert Path(pytester.path / "out.json").exists()


PER_PROCESS = """
    import os, sys

    def pytest_unconfigure(config):
        who = os.environ.get("PYTEST_XDIST_WORKER", "controller")
        with open(f"loaded-{who}.txt", "w") as out:
            out.write("\\n".join(sorted(m for m in sys.modules
                                        if m.startswith("pytest_gpuhost"))))
"""


def test_with_xdist_each_process_imports_its_role_only(pytester: pytest.Pytester,
                                                       fake: FakeHost) -> None:
    """The controller collects nothing and runs no check; a worker writes no summary; neither
    loads ssh's code for a local target (figure (1d): what each process imports, it pays)."""
    for n in range(4):
        fake.sysctl(f"kernel.k{n}", n)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n" + "".join(
        f"  kernel.k{n}: {n}\n" for n in range(4)))
    pytester.makeconftest(textwrap.dedent(PER_PROCESS))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "spec.yaml",
                                           f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    modules = {who: set((pytester.path / f"loaded-{who}.txt").read_text().split())
               for who in ("controller", "gw0", "gw1")}
    ours = "pytest_gpuhost."
    controller_only = {ours + m for m in ("plugin.controller", "plugin.summary",
                                          "plugin.distributing", "reports.terminal")}
    worker_only = {ours + m for m in ("plugin.worker", "plugin.checks", "plugin.gate")}
    assert controller_only <= modules["controller"]
    assert not worker_only & modules["controller"]
    for worker in ("gw0", "gw1"):
        assert worker_only <= modules[worker]
        assert not controller_only & modules[worker]
    assert not {m for found in modules.values() for m in found
                if m.startswith((ours + "host.remote", ours + "gpu.nvmllib"))}


BENCHMARK = """
def test_sum(benchmark):
    benchmark.pedantic(sum, args=(range(10),), rounds=2, iterations=1)
"""


def test_pytest_benchmark_loads_the_state_only_where_it_saves_or_compares(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.makepyfile(test_bench=BENCHMARK)
    ours = ("pytest_gpuhost.benchmark", "pytest_gpuhost.state")
    run = ("test_bench.py", "spec.yaml", f"--gpuhost-root={fake.root}")
    assert not set(ours) & set(loaded(pytester, *run))
    assert set(ours) <= set(loaded(pytester, *run, "--benchmark-json=out.json"))
    # A run without host checks that compares (nothing saved to compare with here)
    assert "pytest_gpuhost.benchmark" in loaded(pytester, "test_bench.py", "--benchmark-compare")
    assert not set(ours) & set(loaded(pytester, "test_bench.py", "--benchmark-json=out.json"))


def test_without_pytest_benchmark_nothing_of_it_is_imported(pytester: pytest.Pytester,
                                                            fake: FakeHost) -> None:
    """-p no:benchmark: what a run has where pytest-benchmark is not installed. The fixture
    still gives the state (the state's module loads for it, not the benchmark hooks)."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.makepyfile(test_state="def test_state(gpuhost_state):\n"
                                   "    assert len(gpuhost_state['digest']) == 64\n")
    modules = loaded(pytester, "test_state.py", "spec.yaml", f"--gpuhost-root={fake.root}",
                     "-p", "no:benchmark", packages=("pytest_gpuhost", "pytest_benchmark"))
    assert "pytest_gpuhost.state" in modules
    assert not [m for m in modules if m.startswith(("pytest_benchmark",
                                                    "pytest_gpuhost.benchmark"))]


def test_a_run_gives_the_garbage_collector_back(pytester: pytest.Pytester,
                                               fake: FakeHost) -> None:
    """The run pauses the collector while it is built and freezes what it keeps; after it the
    process's collector is as it was (inline runs share this process)."""
    import gc

    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    result.assert_outcomes(passed=1)
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_collector_frozen_or_off_before_the_run_is_left_so(pytester: pytest.Pytester,
                                                             fake: FakeHost) -> None:
    import gc

    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}").assert_outcomes(passed=1)
        # Still frozen (a few frozen objects died meanwhile): ours to thaw, not the run's.
        assert gc.get_freeze_count() > frozen // 2
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}").assert_outcomes(passed=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_sessions_lazy_names_are_their_modules_own() -> None:
    """``capture_report`` and ``UnreachableHost`` load with their first use (a verify run uses
    neither), and are then the names their modules define."""
    import pytest_gpuhost.session as session
    from pytest_gpuhost.session.capturing import capture_report
    from pytest_gpuhost.session.unreachable import UnreachableHost

    assert session.capture_report is capture_report
    assert session.UnreachableHost is UnreachableHost
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        session.nothing  # noqa: B018


LOADERS = """
    import sys

    def pytest_configure(config):
        import pytest_gpuhost.testing.fakehost

    def pytest_unconfigure(config):
        names = ("pytest_gpuhost.session", "pytest_gpuhost.specmodel",
                 "pytest_gpuhost.testing.fakehost")
        with open("loaders.txt", "w") as out:
            out.write(" ".join(type(sys.modules[n].__loader__).__name__ for n in names))
"""


def test_pytest_rewrites_the_asserts_of_the_testing_helpers_only(
        pytester: pytest.Pytester, fake: FakeHost) -> None:
    """pytest marks a plugin's package for assert rewriting (every module of a distribution
    with a pytest11 entry point, in an installed wheel; here ``-p``, which marks the same way)
    and then loads each of its modules through its own hook, several times slower: the plugin
    hands its package back to Python's importer as it registers, except the testing helpers."""
    fake.sysctl("vm.swappiness", 10)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    pytester.makeconftest(textwrap.dedent(LOADERS))
    result = pytester.runpytest_subprocess("-p", "pytest_gpuhost", "-p", "no:cacheprovider",
                                           "spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    session, spec, helpers = (pytester.path / "loaders.txt").read_text().split()
    assert (session, spec) == ("SourceFileLoader", "SourceFileLoader")
    assert helpers == "AssertionRewritingHook"
