"""Node-health integrations: the gpuhost_slow marker, --gpuhost-npd, --gpuhost-nfd, and the
short, safe lines they print."""

from __future__ import annotations

import datetime
import re
import shutil
import stat
from fnmatch import fnmatch
from pathlib import Path

import pytest

from pytest_gpuhost.reports import npd
from pytest_gpuhost.reports.nfd import expiry_time, feature_text
from pytest_gpuhost.reports.nodehealth import (
    Health,
    clean,
    health_of,
    health_of_report,
    short_id,
)
from pytest_gpuhost.testing.fakehost import FakeHost

from ..conftest import BLACKWELL8, EXAMPLE_HOST

pytest_plugins = ["pytester"]

GOOD_SPEC = """\
version: 1
name: good
sysctl:
  vm.swappiness: 10
modules:
  nvidia: loaded
"""


# The example host is only verified here (never --fix): used in place, never written.

@pytest.fixture
def spec(pytester: pytest.Pytester) -> Path:
    return Path(shutil.copy(BLACKWELL8, pytester.path / "blackwell8.yaml"))


@pytest.fixture
def good_root(fake: FakeHost, pytester: pytest.Pytester) -> Path:
    """A host on which every check of GOOD_SPEC passes."""
    fake.sysctl("vm.swappiness", 10).module("nvidia")
    (pytester.path / "good.yaml").write_text(GOOD_SPEC)
    return fake.root


def collected_ids(result: pytest.RunResult) -> list[str]:
    return [line.split("::", 1)[1] for line in result.outlines if "::" in line]


# -- gpuhost_slow ------------------------------------------------------------------------------

def test_not_gpuhost_slow_deselects_exactly_the_56_p2p_pairs(
        pytester: pytest.Pytester, spec: Path) -> None:
    args = (f"--gpuhost-spec={spec}", f"--gpuhost-root={EXAMPLE_HOST}", "--co", "-q",
            "--strict-markers")
    everything = collected_ids(pytester.runpytest(*args))
    fast = pytester.runpytest(*args, "-m", "not gpuhost_slow")
    fast.stdout.fnmatch_lines(["190/246 tests collected (56 deselected)*"])
    slow = collected_ids(pytester.runpytest(*args, "-m", "gpuhost_slow"))
    assert len(everything) == 246 and len(slow) == 56
    assert all(check.startswith("p2p[") and "->" in check for check in slow)
    assert sorted(collected_ids(fast) + slow) == sorted(everything)
    assert not any(check.startswith("p2p") for check in collected_ids(fast))


def test_every_p2p_kind_is_slow_and_nothing_else(pytester: pytest.Pytester,
                                                 fake: FakeHost) -> None:
    fake.gpu("0000:01:00.0").gpu("0000:81:00.0", numa_node=1).sysctl("vm.swappiness", 10)
    (pytester.path / "p2p.yaml").write_text(
        "version: 1\nsysctl:\n  vm.swappiness: 10\ngpus:\n  count: 2\n"
        "p2p:\n  probe: cuda\n  floors: {same_numa: 45, cross_numa: 32, h2d: 50, d2h: 50}\n"
        "  concurrent: {floor: 20}\n")
    args = ("--gpuhost-spec=p2p.yaml", f"--gpuhost-root={fake.root}", "--co", "-q")
    slow = collected_ids(pytester.runpytest(*args, "-m", "gpuhost_slow"))
    assert sorted({check.split("[", 1)[0] for check in slow}) == [
        "p2p", "p2p.concurrent", "p2p.d2h", "p2p.h2d"]
    assert len(slow) == 2 + 2 + 2 + 2  # pairs, h2d, d2h, the ring's two flows
    assert collected_ids(pytester.runpytest(*args, "-m", "not gpuhost_slow")) == [
        "sysctl[vm.swappiness]", "gpu_count"]


def test_the_marker_is_registered(pytester: pytest.Pytester) -> None:
    pytester.runpytest("--markers").stdout.fnmatch_lines(["@pytest.mark.gpuhost_slow: *p2p*"])


# -- the short lines ---------------------------------------------------------------------------

def test_health_counts_every_outcome_but_passed_fixed_skipped_as_failing() -> None:
    health = health_of([("a", "passed"), ("b", "failed"), ("c", "fixed"), ("d", "skipped"),
                        ("e", "fix_failed"), ("f", "error"), ("g", "would_fix"), ("h", "none")])
    assert health == Health(8, ("b", "e", "f", "g", "h"))
    assert not health.healthy
    assert health_of([("a", "passed"), ("b", "skipped")]).healthy
    assert not health_of([]).healthy  # nothing checked vouches for nothing


def test_health_of_a_json_report() -> None:
    data = {"checks": [{"id": "sysctl[a]", "outcome": "passed"},
                       {"id": "dmesg", "outcome": "failed"}]}
    assert health_of_report(data) == Health(2, ("dmesg",))
    data["checks"].append({"id": "aer", "outcome": "error",
                           "message": "not run: the run stopped before it (-x)"})
    assert health_of_report(data) == Health(3, ("dmesg", "aer"), not_run=("aer",))
    with pytest.raises(ValueError, match="no 'checks' list"):
        health_of_report({"summary": {}})


def test_clean_text_cannot_inject_quotes_newlines_or_control_characters() -> None:
    assert clean('sysctl[a"b]\n$(reboot)`x`\\ \t\x1b[31mé') == "sysctl[ab] (reboot)x ?[31m?"


def test_short_id_drops_pci_domains_only_when_it_must_then_cuts() -> None:
    pair = "p2p[0000:01:00.0->0000:81:00.0]"
    assert short_id(pair, 40) == pair
    assert short_id(pair, 25) == "p2p[01:00.0->81:00.0]"
    assert short_id("sysctl[" + "x" * 60 + "]", 20) == "sysctl[xxxxxxxxxx..."


# -- --gpuhost-npd -----------------------------------------------------------------------------

def test_npd_answers() -> None:
    failing = Health(67, ("pcie.max_read_request[0000:81:00.0]", "b", "c"))
    assert npd.answer(failing) == npd.NpdAnswer(
        1, "gpuhost: 3 failed: pcie.max_read_request[0000:81:00.0] +2")
    assert npd.answer(Health(67, ("dmesg",))).message == "gpuhost: 1 failed: dmesg"
    assert npd.answer(Health(67, ())) == npd.NpdAnswer(0, "gpuhost: 67 checks ok")
    assert npd.answer(Health(0, ())) == npd.NpdAnswer(
        2, "gpuhost: could not run: no gpuhost checks collected")
    assert npd.answer(Health(67, ()), "interrupted").status == 2
    assert npd.answer(Health(67, ()), "interrupted", stopped_early=True).status == 2
    assert npd.answer(Health(67, ("dmesg",)), "interrupted", stopped_early=True) == \
        npd.NpdAnswer(1, "gpuhost: 1 failed: dmesg (stopped early)")  # a failure seen
    stopped = Health(67, ("a", "dmesg", "b", "c"), not_run=("a", "c"))
    assert stopped.failed == ("dmesg", "b")
    assert npd.answer(stopped, stopped_early=True) == npd.NpdAnswer(
        1, "gpuhost: 2 failed: dmesg +1 (stopped early, 2 not run)")
    assert npd.answer(Health(67, ("a",), not_run=("a",)), "interrupted",
                      stopped_early=True).status == 2  # nothing failed that ran: unknown
    assert npd.answer(Health(67, ("dmesg",)), "internal error").status == 2
    long = npd.answer(Health(500, ("sysctl[net.ipv4.conf." + "eth0" * 30 + ".rp_filter]",) * 500))
    assert len(long.message) <= 80 and long.message.endswith("... +499")


def test_npd_pytest_problems() -> None:
    assert npd.pytest_problem(0) is None and npd.pytest_problem(1) is None
    assert npd.pytest_problem(5) is None  # told by the records: nothing collected
    assert npd.pytest_problem(2) == "pytest exit status 2 (interrupted)"
    assert npd.pytest_problem(3) == "pytest exit status 3 (internal error)"
    assert npd.pytest_problem(99) == "pytest exit status 99 (unknown)"


def npd_run(pytester: pytest.Pytester, *args: str) -> tuple[int, list[str], str]:
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--gpuhost-npd", *args)
    return result.ret, result.outlines, "\n".join(result.errlines)


def test_npd_failing_host_one_line_on_stdout(pytester: pytest.Pytester, spec: Path) -> None:
    ret, out, err = npd_run(pytester, f"--gpuhost-spec={spec}",
                            f"--gpuhost-root={EXAMPLE_HOST}", "-m", "not gpuhost_slow")
    assert ret == 1
    assert out == ["gpuhost: 59 failed: sysctl[kernel.nmi_watchdog] +58"]
    assert "59 failed, 129 passed, 2 skipped, 56 deselected" in err  # pytest's own, on stderr


def test_npd_healthy_host(pytester: pytest.Pytester, good_root: Path) -> None:
    ret, out, _ = npd_run(pytester, "--gpuhost-spec=good.yaml", f"--gpuhost-root={good_root}",
                          "-n", "2")
    assert (ret, out) == (0, ["gpuhost: 2 checks ok"])


@pytest.mark.parametrize("xdist", [(), ("-n", "2")], ids=["serial", "xdist"])
def test_npd_a_run_stopped_at_its_first_failure_is_a_problem_not_unknown(
        pytester: pytest.Pytester, spec: Path, xdist: tuple[str, ...]) -> None:
    """-x: the check that failed is a problem on the node and the checks after it did not run
    (not 190 failures); under xdist pytest ends "interrupted" (2), still NPD's 1, not
    "unknown"."""
    ret, out, _ = npd_run(pytester, f"--gpuhost-spec={spec}", f"--gpuhost-root={EXAMPLE_HOST}",
                          "-m", "not gpuhost_slow", "-x", *xdist)
    assert ret == 1, out
    if not xdist:
        assert out == ["gpuhost: 1 failed: sysctl[kernel.nmi_watchdog] (stopped early, "
                       "189 not run)"]
    else:  # the other worker may have run (and failed) a few more before the stop
        assert len(out) == 1 and re.fullmatch(
            r"gpuhost: \d+ failed: \S+( \+\d+)? \(stopped early, \d+ not run\)", out[0]), out


def test_npd_a_value_that_cannot_be_read_is_a_problem(pytester: pytest.Pytester,
                                                       good_root: Path) -> None:
    """The checks ran; one of them found nothing to read: NPD's 1, not unknown."""
    (good_root / "proc/sys/vm/swappiness").unlink()
    ret, out, _ = npd_run(pytester, "--gpuhost-spec=good.yaml", f"--gpuhost-root={good_root}")
    assert ret == 1 and out == ["gpuhost: 1 failed: sysctl[vm.swappiness]"]


@pytest.mark.parametrize(("spec_text", "args", "expected"), [
    ("version: 1\nsysctl:\n  vm.swapiness: [1\n", ("--gpuhost-spec=bad.yaml",),
     "gpuhost: could not run: bad gpuhost spec: bad.yaml:4: not valid YAML*"),
    ("version: 1\nsysctl: {vm.swappiness: 1}\n", ("--gpuhost-spec=bad.yaml",
                                                  "--gpuhost-root=missing"),
     "gpuhost: could not run: --gpuhost-root=missing: no such directory*"),
    ("version: 1\nsysctl: {vm.swappiness: 1}\n", ("--gpuhost-spec=bad.yaml", "-k", "nothing"),
     "gpuhost: could not run: no gpuhost checks collected"),
    ("", (), "gpuhost: could not run: --gpuhost-npd needs a spec*"),
])
def test_npd_checks_that_cannot_run_exit_2_with_one_line(
        pytester: pytest.Pytester, spec_text: str, args: tuple[str, ...], expected: str) -> None:
    (pytester.path / "bad.yaml").write_text(spec_text)
    ret, out, err = npd_run(pytester, *args)
    assert ret == 2
    assert len(out) == 1 and len(out[0]) <= 80, out
    assert fnmatch(out[0], expected), out[0]
    assert "Traceback" not in err


def test_npd_internal_error_in_a_kind_is_unknown(pytester: pytest.Pytester,
                                                good_root: Path) -> None:
    """A check kind that raises while collecting: a collection error, pytest exit 2."""
    pytester.makeconftest("""
        from pytest_gpuhost.hookspecs import hookimpl

        class Broken:
            section = "broken"
            def parse(self, node, context):
                return None
            def expand(self, section, facts):
                raise RuntimeError("boom")

        @hookimpl
        def pytest_gpuhost_check_kinds():
            return [Broken()]
    """)
    (pytester.path / "good.yaml").write_text(GOOD_SPEC + "broken: {}\n")
    ret, out, _ = npd_run(pytester, "--gpuhost-spec=good.yaml", f"--gpuhost-root={good_root}")
    assert ret == 2 and out == ["gpuhost: could not run: pytest exit status 2 (interrupted)"]


# -- --gpuhost-nfd -----------------------------------------------------------------------------

def test_nfd_feature_text() -> None:
    assert feature_text(Health(3, ("x",)), subject="s on h") == (
        "# pytest-gpuhost: s on h: 1 of 3 checks not ok\n"
        "feature.node.kubernetes.io/gpuhost.tuned=false\n"
        "feature.node.kubernetes.io/gpuhost.failed=1\n")
    assert feature_text(Health(3, ()), subject='bad"\n# +expiry-time=0').splitlines()[:2] == [
        "# pytest-gpuhost: bad # +expiry-time=0: 0 of 3 checks not ok",
        "feature.node.kubernetes.io/gpuhost.tuned=true"]
    assert "gpuhost.tuned=false" in feature_text(Health(0, ()), subject="s")
    assert feature_text(Health(1, ()), subject="s", expires="2026-12-03T08:00:00Z"
                        ).splitlines()[1] == "# +expiry-time=2026-12-03T08:00:00Z"
    assert expiry_time(0.0, 3600.0) == "1970-01-01T01:00:00Z"
    assert expiry_time(1796284799.9, 0.5) == "2026-12-03T08:00:00Z"


def nfd_worker_labels(text: str, now: datetime.datetime) -> dict[str, str]:
    """The labels nfd-worker's local source makes of a feature file (its parseFeatureFile, in
    source/local/local.go of node-feature-discovery v0.17+: directives ``# +key=value``, an
    expiry time that drops every later line once past, ``name`` alone meaning true), then
    what nfd-master labels with them: a name without a namespace gets
    feature.node.kubernetes.io/ only while auto-prefixing lasts (not under its
    DisableAutoPrefix gate), so such a name is returned bare here."""
    expiry = now
    labels: dict[str, str] = {}
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +"):
                key, _, value = line[3:].partition("=")
                assert key in ("expiry-time", "no-label", "no-feature"), line
                if key == "expiry-time":
                    expiry = datetime.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            continue
        if expiry < now:
            continue
        name, sep, value = line.partition("=")
        labels[name] = value if sep else "true"
    return labels


def nfd_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_nfd_file_of_a_failing_and_a_healthy_run(pytester: pytest.Pytester, spec: Path,
                                                 good_root: Path) -> None:
    """The labels carry NFD's namespace (nfd-master's DisableAutoPrefix gate leaves
    an unprefixed name bare, and nodeSelectors on feature.node.kubernetes.io/gpuhost.tuned
    stop matching) and lapse an hour after the run (--gpuhost-nfd-expiry), so a removed
    DaemonSet does not leave tuned=true forever."""
    features = pytester.path / "features.d"
    features.mkdir()
    pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={EXAMPLE_HOST}",
                       "--gpuhost-nfd=features.d/gpuhost")
    assert nfd_lines(features / "gpuhost") == ["feature.node.kubernetes.io/gpuhost.tuned=false",
                                               "feature.node.kubernetes.io/gpuhost.failed=115"]
    assert stat.S_IMODE((features / "gpuhost").stat().st_mode) == 0o644
    result = pytester.runpytest("--gpuhost-spec=good.yaml", f"--gpuhost-root={good_root}",
                                "--gpuhost-nfd=features.d/gpuhost", "--gpuhost-nfd-expiry=600")
    assert result.ret == 0
    text = (features / "gpuhost").read_text()
    assert nfd_lines(features / "gpuhost") == ["feature.node.kubernetes.io/gpuhost.tuned=true",
                                               "feature.node.kubernetes.io/gpuhost.failed=0"]
    assert [p.name for p in features.iterdir()] == ["gpuhost"]  # no temporary file left
    written = datetime.datetime.fromtimestamp((features / "gpuhost").stat().st_mtime,
                                              tz=datetime.timezone.utc)
    [directive] = [line for line in text.splitlines() if line.startswith("# +")]
    expires = datetime.datetime.fromisoformat(directive.split("=", 1)[1].replace("Z", "+00:00"))
    assert written - datetime.timedelta(seconds=1) < expires <= written + datetime.timedelta(
        seconds=600)  # made from the run's end, before the file was written
    assert nfd_worker_labels(text, now=written) == {
        "feature.node.kubernetes.io/gpuhost.tuned": "true",
        "feature.node.kubernetes.io/gpuhost.failed": "0"}  # namespaced: no prefix to add
    assert nfd_worker_labels(text, now=expires + datetime.timedelta(seconds=1)) == {}


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_nfd_expiry_must_be_a_time(pytester: pytest.Pytester, spec: Path, value: str) -> None:
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={EXAMPLE_HOST}",
                                "--gpuhost-nfd=out", f"--gpuhost-nfd-expiry={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--gpuhost-nfd-expiry={value}: expected a finite number of "
                                 "seconds above 0*"])


def test_nfd_needs_a_spec(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gpuhost-nfd=x")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--gpuhost-nfd needs a spec*"])
