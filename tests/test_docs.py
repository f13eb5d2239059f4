"""The documentation's code runs: the complete kind of docs/adding-a-kind.md, verify and fix."""

from __future__ import annotations

import json
import re
import shutil
from glob import escape
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from pytest_gpuhost.fleet import read_reports
from pytest_gpuhost.fleet.matrix import matrix_lines
from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import start_sshd

from .conftest import NEEDS_OPENSSH, REPO


def python_block(document: Path) -> str:
    [code] = re.findall(r"```python\n(.*?)```", document.read_text(), re.S)
    return str(code)


def test_the_documented_kind_goes_through_every_path(pytester: pytest.Pytester,
                                                    fake: FakeHost) -> None:
    """docs/adding-a-kind.md's kind, one module and one registration line: verify, --fix,
    --fix-persist, capture, rollback, the fleet page and matrix, and every report (JSON,
    JUnit, Prometheus, Allure, terminal)."""
    pytester.makeconftest(python_block(REPO / "docs" / "adding-a-kind.md"))
    fake.file("sys/class/net/eth0/mtu", "1500\n")
    fake.file("sys/class/net/ib0/mtu", "4092\n")
    pytester.makefile(".yaml", spec="version: 1\nmtu:\n  ib0: 4092\n"
                                    "  eth0: {min: 9000, why: jumbo frames}\n")
    root = f"--gpuhost-root={fake.root}"
    verify = pytester.runpytest("spec.yaml", root, "-v")
    verify.stdout.fnmatch_lines(["*spec.yaml::mtu[[]eth0] FAILED*",
                                 "*spec.yaml::mtu[[]ib0] PASSED*"])

    fixed = pytester.runpytest("spec.yaml", root, "--fix", "--fix-persist",
                               "--gpuhost-report=r.json", "--junitxml=junit.xml",
                               "-o", "junit_family=xunit1",
                               "--gpuhost-prom=gpuhost.prom", "--alluredir=allure",
                               "--gpuhost-fleet-html=fleet.html")
    assert fixed.ret == pytest.ExitCode.OK
    fixed.stdout.re_match_lines([r"^mtu +2 +1 .*", r"^persist +1 .*"])  # the terminal's table
    assert (fake.root / "sys/class/net/eth0/mtu").read_text() == "9000\n"
    rules = fake.root / "etc/udev/rules.d/90-gpuhost-spec.rules"
    assert 'ACTION=="add", SUBSYSTEM=="net", KERNEL=="eth0", ATTR{mtu}="9000"' in \
        rules.read_text()
    assert 'KERNEL=="ib0", ATTR{mtu}="4092"' in rules.read_text()

    report = json.loads((pytester.path / "r.json").read_text())
    records = {c["id"]: c for c in report["checks"]}
    eth0 = records["mtu[eth0]"]
    assert (eth0["outcome"], eth0["section"], eth0["scope"], eth0["measured"]) == \
        ("fixed", "mtu", "namespace", False)
    persisted = records["persist[etc/udev/rules.d/90-gpuhost-spec.rules]"]
    assert (persisted["outcome"], persisted["section"]) == ("fixed", "persist")
    junit = ElementTree.parse(pytester.path / "junit.xml").getroot()
    [case] = [c for c in junit.iter("testcase") if "mtu[eth0]" in c.get("name", "")]
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert (properties["kind"], properties["key"], properties["outcome"]) == \
        ("mtu", "eth0", "fixed")
    prom = (pytester.path / "gpuhost.prom").read_text()
    assert re.search(r'^gpuhost_check_ok\{[^}]*kind="mtu",key="eth0"\} 1$', prom, re.M)
    allure = [json.loads(p.read_text()) for p in (pytester.path / "allure").glob("*-result.json")]
    [test] = [t for t in allure if t["name"] == "mtu[eth0]"]
    assert {"name": "feature", "value": "mtu"} in test["labels"]
    assert test["status"] == "passed"
    blob = re.search(r'id="fleet-data">(.*?)</script>', (pytester.path / "fleet.html").read_text(),
                     re.S)
    assert blob is not None and {"mtu", "persist"} <= set(json.loads(blob.group(1))["kinds"])
    matrix = matrix_lines(read_reports([pytester.path / "r.json"]))
    assert matrix[3].split() == ["target", "mtu", "persist"]
    assert matrix[4].split()[1:] == ["ok", "2", "ok", "1"]

    captured = pytester.runpytest("spec.yaml", root, "--gpuhost-capture=captured.yaml")
    assert captured.ret == pytest.ExitCode.OK
    written = yaml.safe_load((pytester.path / "captured.yaml").read_text())
    assert written["mtu"] == {"eth0": {"min": 9000, "why": "jumbo frames"}, "ib0": 4092}
    assert pytester.runpytest("captured.yaml", root).ret == pytest.ExitCode.OK

    back = pytester.runpytest("--gpuhost-rollback", root)
    assert back.ret == pytest.ExitCode.OK
    assert (fake.root / "sys/class/net/eth0/mtu").read_text() == "1500\n"
    assert not rules.exists()


def test_a_bad_section_of_the_documented_kind_is_exit_4(pytester: pytest.Pytester,
                                                        fake: FakeHost) -> None:
    pytester.makeconftest(python_block(REPO / "docs" / "adding-a-kind.md"))
    pytester.makefile(".yaml", spec="version: 1\nmtu:\n  eth0: lots\n")
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*spec.yaml:3: mtu eth0*"])


# --- the README and docs/: commands, sample output, options and links true of the code ----------

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
DEMO = "/tmp/tmp.R2mYq8fTzs"
"""The directory the README's demo made with ``mktemp -d``, as its samples show it."""
DEMO_ROOT = f"{DEMO}/host"
VARIABLE = re.compile(r"\.\.\.|\d{8}T\d{6}Z-[\w.-]+?-\d+(?:-\d+)?(?=\.jsonl)"
                      r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ| in \d+\.\d+s")
"""What a run prints differently each time (times, journal names) and the samples' '...'."""


def blocks(document: Path, language: str | None = None) -> list[str]:
    """The fenced code blocks of a Markdown file (of one language, when given)."""
    found: list[str] = []
    fence: str | None = None
    """The open block's language ('' for none), None outside a block."""
    lines: list[str] = []
    for line in document.read_text().splitlines(keepends=True):
        if not line.startswith("```"):
            lines.append(line)
        elif fence is None:
            fence, lines = line[3:].strip(), []
        else:
            if language is None or fence == language:
                found.append("".join(lines))
            fence = None
    return found


def block_with(document: Path, text: str) -> str:
    [found] = [block for block in blocks(document) if text in block]
    return found


def sample_patterns(sample: str, root: Path) -> list[str]:
    """fnmatch patterns for a sample's lines, in order: a '...' line is a gap, a '...' in a line
    and what varies between runs match anything, a '=== ... ===' or '___ ... ___' rule any
    width."""
    patterns = []
    for line in sample.replace(DEMO_ROOT, str(root)).splitlines():
        if line.strip() == "...":
            continue
        rule = line.startswith(("===", "___"))
        line = line.strip("=_ ") if rule else line
        pieces = VARIABLE.split(line)
        variable = VARIABLE.findall(line)
        pattern = escape(pieces[0])
        for found, piece in zip(variable, pieces[1:], strict=True):
            pattern += (" in *" if found.startswith(" in ") else "*") + escape(piece)
        patterns.append(f"*{pattern}*" if rule else pattern)
    return patterns


def demo_steps(marker: str) -> list[str]:
    """The steps (``&&``) of the README's command holding ``marker``."""
    return [step.strip() for step in block_with(README, marker).strip().split("&&")]


def demo_args(step: str) -> list[str]:
    """A demo step that runs the demo's pytest: its arguments, ``$demo`` as the samples show
    it."""
    pytest_path, *args = step.split()
    assert pytest_path == "$demo/venv/bin/pytest"
    return [arg.replace("$demo", DEMO) for arg in args]


def demo_command() -> list[str]:
    """The README's first command: a directory of its own (``mktemp -d``, never a fixed path
    under the shared /tmp), a venv there with the package installed from the checkout, a
    copy of the example host, then pytest; the pytest part as its argument list."""
    steps = demo_steps("--gpuhost-root=$demo/host --fix")
    assert steps[:3] == ["demo=$(mktemp -d)", "python3 -m venv $demo/venv",
                         "$demo/venv/bin/pip install -q ."]
    assert steps[3] == "cp -r examples/hosts/blackwell8-untuned $demo/host"
    return demo_args(steps[4])


def test_the_readme_demo_works_in_a_directory_mktemp_made() -> None:
    """Every path of the demo and its samples is under the directory ``mktemp -d`` made (its
    ``tmp.`` and ten characters), none a fixed name in the shared /tmp that another user's run
    (or an earlier one) may hold."""
    assert re.fullmatch(r"/tmp/tmp\.[A-Za-z0-9]{10}", DEMO)
    text = README.read_text()
    assert set(re.findall(r"/tmp/[\w.-]+", text)) == {DEMO}
    assert f"`mktemp -d` makes (here `{DEMO}`)" in text


def test_the_readme_says_the_suite_takes_minutes() -> None:
    """A newcomer waited on a silent suite expecting seconds: the README
    says, beside the command that runs it, that it takes minutes and how to leave out the slow
    part."""
    section = README.read_text().split("Run the project's own tests", 1)[1].split("```", 1)[0]
    assert "takes minutes, not seconds" in " ".join(section.split())
    assert '`-m "not e2e"`' in section


def test_the_readme_demo_prints_its_sample_and_a_second_fix_retries_nothing(
        pytester: pytest.Pytester, example_host: Path) -> None:
    args = [arg.replace(DEMO_ROOT, str(example_host)) for arg in demo_command()]
    first = pytester.runpytest(*args)
    assert first.ret == pytest.ExitCode.TESTS_FAILED
    sample = block_with(README, "kind                         checks  passed")
    first.stdout.fnmatch_lines(sample_patterns(sample, example_host))
    second = pytester.runpytest(*args)
    for document in (README, REPO / "docs" / "fix-safety.md"):
        [line] = [line for line in block_with(document, "not retried").splitlines() if line]
        second.stdout.fnmatch_lines(sample_patterns(line, example_host))


def test_the_readme_test_command_is_what_ci_runs() -> None:
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    command = block_with(README, "pip install -q -e '.[test]'").strip().splitlines()
    assert command[-1] == ci[-1] == ".venv/bin/pytest -n auto"  # every test, a worker a core
    assert "python3 -m venv .venv" in ci and ".venv/bin/pip install -q -e '.[test]'" in ci


def test_the_readme_names_every_extra_and_how_to_install() -> None:
    from importlib.metadata import metadata

    installed = metadata("pytest-gpuhost")
    extras = set(installed.get_all("Provides-Extra") or ()) - {"test", "bench"}
    text = README.read_text()
    named = set(re.findall(r"^\| `\[(\w+)\]` \|", text, re.M))
    assert named == extras
    assert "Python 3.10 or later" in text and installed["Requires-Python"] == ">=3.10"
    install = block_with(README, "pip install .")
    assert "pip install pytest-gpuhost" in install
    assert "pip install '.[nvml]'" in text


def test_the_readme_outcomes_are_the_outcomes() -> None:
    from pytest_gpuhost.result import Outcome

    section = README.read_text().split("## Outcomes and exit codes", 1)[1].split("\n## ", 1)[0]
    assert set(re.findall(r"^\| `(\w+)` \|", section, re.M)) == {o.value for o in Outcome}


@pytest.mark.parametrize("document", [README, REPO / "docs" / "reference.md"],
                         ids=lambda p: p.name)
def test_the_spec_examples_load(document: Path, tmp_path: Path) -> None:
    from pytest_gpuhost import builtin
    from pytest_gpuhost.specmodel import load_spec

    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    conditions = dict(builtin.pytest_gpuhost_conditions())
    examples = [b for b in blocks(document, "yaml") if not b.startswith("gpuhost_")]
    assert examples
    for number, example in enumerate(examples):
        path = tmp_path / f"example{number}.yaml"
        path.write_text(example if example.startswith("version:") else "version: 1\n" + example)
        assert load_spec(path, kinds, conditions).sections


def help_options(pytester: pytest.Pytester) -> set[str]:
    text = pytester.runpytest("--help").stdout.str()
    return set(re.findall(r"^  (--(?:gpuhost-[\w-]+|fix(?:-persist|-retry)?))\b", text, re.M))


def test_every_option_is_documented_and_every_documented_option_exists(
        pytester: pytest.Pytester) -> None:
    options = help_options(pytester)
    assert {"--gpuhost-spec", "--fix", "--fix-retry", "--gpuhost-target"} <= options
    table = (REPO / "docs" / "reference.md").read_text().split("## Command line", 1)[1]
    table = table.split("\n## ", 1)[0]
    in_table = set(re.findall(r"^\| `(--[\w-]+)", table, re.M))
    assert in_table == options
    for document in (README, *DOCS):
        named = set(re.findall(r"(--(?:gpuhost-[a-z-]*[a-z]|fix(?:-[a-z]+)?))\b",
                               document.read_text()))
        assert named <= options, f"{document.name} names options that do not exist"
    for ini in ("gpuhost_spec", "gpuhost_root", "gpuhost_targets", "gpuhost_ssh_config"):
        assert f"`{ini}`" in table


def test_what_fix_persist_writes_is_named_in_its_help_and_the_docs(
        pytester: pytest.Pytester, example_host: Path) -> None:
    before = {p for p in example_host.rglob("*") if p.is_file()}
    result = pytester.runpytest("--gpuhost-spec=blackwell8", f"--gpuhost-root={example_host}",
                                "--fix", "--fix-persist")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    written = {p.relative_to(example_host) for p in example_host.rglob("etc/**/*gpuhost*")
               if p.is_file() and p not in before}
    folders = {next(part for part in reversed(path.parts[:-1]) if part != "rules.d")
               for path in written}
    assert folders == {"sysctl.d", "modules-load.d", "modprobe.d", "udev", "tmpfiles.d",
                       "grub.d"}
    [help_text] = [text for name, (_, text) in help_entries(pytester).items()
                   if name == "--fix-persist"]
    assert {folder for folder in folders if folder not in help_text} == set()
    persistence = (REPO / "docs" / "fix-safety.md").read_text().split("## Persistence", 1)[1]
    named = {path.as_posix().replace("blackwell8", "<spec>") for path in written}
    assert {path for path in named if f"`{path}`" not in persistence} == set()


def test_the_reference_table_of_options_is_the_one_the_options_table_makes() -> None:
    """Each option is declared once, in pytest_gpuhost/options.py: the reference's table is
    made from it (``python -m pytest_gpuhost.config.options``), and so is --help."""
    from pytest_gpuhost.config.options import OPTIONS, docs_table

    section = (REPO / "docs" / "reference.md").read_text().split("## Command line", 1)[1]
    start = section.index("| option | ini | meaning |")
    table = section[start:section.index("\n\n", start) + 1]
    assert table == docs_table()
    assert len(table.splitlines()) == 2 + len(OPTIONS) > 20


def command_line_table() -> dict[str, tuple[str, str, str]]:
    """The reference's option table: each option's argument (`=FILE`), ini column and meaning."""
    section = (REPO / "docs" / "reference.md").read_text().split("## Command line", 1)[1]
    rows = re.findall(r"^\| `(--[\w-]+)([^`]*)` \|([^|]*)\| (.*) \|$",
                      section.split("\n## ", 1)[0], re.M)
    return {name: (form.replace("\\|", "|"), ini, meaning) for name, form, ini, meaning in rows}


def help_entries(pytester: pytest.Pytester) -> dict[str, tuple[str, str]]:
    """`pytest --help`'s gpuhost options: each one's argument (`=FILE`) and its help text."""
    text = pytester.runpytest("--help").stdout.str()
    group = text.split("GPU host tuning checks (pytest-gpuhost):\n", 1)[1].split("\n\n", 1)[0]
    entries = {}
    for entry in re.split(r"\n(?=  -)", group):
        found = re.match(r"  (--[\w-]+)(=\S+)?(.*)", entry, re.S)
        assert found, entry
        name, form, rest = found.groups()
        entries[name] = (form or "", " ".join(rest.split()))
    return entries


def test_every_ini_value_is_in_the_reference_with_its_option(pytester: pytest.Pytester) -> None:
    text = pytester.runpytest("--help").stdout.str()
    inis = set(re.findall(r"^  (gpuhost_\w+) \(", text, re.M))
    assert {"gpuhost_spec", "gpuhost_root", "gpuhost_targets"} <= inis
    table = command_line_table()
    twins = {name: set(re.findall(r"`(gpuhost_\w+)`", ini)) for name, (_, ini, _) in table.items()}
    assert set().union(*twins.values()) == inis
    for name, (_, help_text) in help_entries(pytester).items():
        assert set(re.findall(r"ini: (gpuhost_\w+)", help_text)) == twins[name], name


def test_the_reference_gives_each_option_its_argument_and_default(
        pytester: pytest.Pytester) -> None:
    entries = help_entries(pytester)
    config = pytester.parseconfig()
    for name, (form, _, meaning) in command_line_table().items():
        assert form.strip("[]=") == entries[name][0].strip("[]="), name
        default = config.getoption(name.lstrip("-").replace("-", "_"))
        if isinstance(default, float):  # seconds: the table says how many, as --help does
            said = f"default {default:g}"
            assert said in meaning and said in entries[name][1], name


def anchors(document: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (outside code blocks)."""
    text = re.sub(r"^```.*?^```", "", document.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.*)$", text, re.M)}


def test_every_link_of_the_readme_and_docs_resolves() -> None:
    for document in (README, *DOCS):
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)",
                                         document.read_text()):
            if "://" in target:
                continue
            path = (document.parent / target).resolve() if target else document
            assert path.exists(), f"{document.name}: {target}"
            if anchor:
                assert anchor in anchors(path), f"{document.name}: {target}#{anchor}"


def test_the_layout_names_every_folder_and_module() -> None:
    package = REPO / "pytest_gpuhost"
    layout = (REPO / "docs" / "layout.md").read_text()
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    named = set(re.findall(r"^\| `(\w+)/` \|", layout, re.M))
    assert named == folders
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert {m for m in modules if f"`{m}`" not in layout} == set()


# --- transcripts: a doc's '$ command' lines run as written, what each printed compared --------

def transcript(block: str) -> list[tuple[str, list[str]]]:
    """A shell transcript of a doc: each ``$ `` command with the lines it printed (for
    ``cat FILE``, what the file holds)."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


JOURNAL_NAME = re.compile(r"\d{8}T\d{6}Z-[\w.-]+?-\d+(?:-\d+)?\.jsonl")


def run_transcript(pytester: pytest.Pytester, block: str, names: dict[str, str], *,
                   subprocess: bool = False) -> None:
    """Run a transcript's commands in ``pytester.path``, ``names`` (``$root``, a port) put in
    first: ``cat FILE`` shows a file a command before it made (it must hold what is shown;
    one on the host, an absolute path, must be there), or writes the file it shows (a spec the
    doc gives, a relative path); a command other than ``pytest`` runs
    in bash and must succeed, printing what is shown; ``pytest ...`` runs (in a process of its
    own with ``subprocess``, and under ``--gpuhost-npd``, whose line is the real standard
    output; ``2>/dev/null`` keeps standard output alone, ``; echo $?`` prints the exit status
    after it), and what it printed (standard output, then standard error) must hold the
    lines shown, in order, a ``...`` line a gap (times and journal names aside). A journal
    name a command printed stands for the doc's in the commands after it."""
    import shlex

    def named(text: str) -> str:
        for name, value in names.items():
            text = text.replace(name, value)
        return text

    for command, printed in transcript(block):
        command, shown = named(command), [named(line) for line in printed]
        if command.startswith("cat "):
            path = pytester.path / command[4:]
            text = "".join(f"{line}\n" for line in shown)
            if path.exists() or Path(command[4:]).is_absolute():  # on the host: made before
                assert path.read_text() == text, command
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
            continue
        if not command.startswith("pytest "):
            import subprocess as shell

            ran = shell.run(["bash", "-c", command], cwd=pytester.path, capture_output=True,
                            text=True, timeout=60)
            assert ran.returncode == 0, f"{command}: {ran.stderr}"
            assert ran.stdout.splitlines() == shown, command
            continue
        run, _, after = command.partition(";")
        words = shlex.split(run)
        assert words[0] == "pytest", command
        quiet = "2>/dev/null" in words
        args = [word for word in words[1:] if word != "2>/dev/null"]
        result = pytester.runpytest_subprocess(*args) \
            if subprocess or "--gpuhost-npd" in args else pytester.runpytest(*args)
        if after.strip() == "echo $?":
            assert shown[-1] == str(result.ret), command
            shown = shown[:-1]
        lines = result.outlines if quiet else [*result.outlines, *result.errlines]
        if quiet:
            assert [line for line in shown if line != "..."] == lines, command
            continue
        pytest.LineMatcher(lines).fnmatch_lines(
            sample_patterns("\n".join(shown), Path(DEMO_ROOT)))
        for line in shown:  # the journal this run wrote, for the commands after it
            for documented in JOURNAL_NAME.findall(line):
                made = [found for out in lines for found in JOURNAL_NAME.findall(out)]
                if made:
                    names[documented] = made[0]


def test_will_revert_is_what_fix_safety_shows(pytester: pytest.Pytester,
                                              example_host: Path) -> None:
    """docs/fix-safety.md#will-revert, run: right now and passed (exit 0, the node healthy),
    and said so in the summary and the node-health line."""
    section = (REPO / "docs" / "fix-safety.md").read_text().split("### Will revert", 1)[1]
    [block] = [b for b in blocks_of(section) if b.startswith("$ cat spec.yaml")]
    run_transcript(pytester, block, {"$root": str(example_host)})


def blocks_of(text: str) -> list[str]:
    """The fenced code blocks of a piece of Markdown."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)


def test_the_fleet_sample_is_what_the_fleet_command_prints(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/capture-and-drift.md's fleet view, made as it says: four nodes' reports (one on
    another driver and trained at Gen4 on a GPU, one with swappiness 60), node05's report
    missing, node06's from a run whose ssh could not reach it; then the documented command."""
    import os
    import subprocess
    import sys

    from .fleet.test_view import node

    reports = pytester.path / "reports"
    for name, deviation in (("node01", {}), ("node02", {}),
                            ("node03", {"gen4": True, "driver": "580.105.08"}),
                            ("node04", {"swappiness": 60})):
        made = node(tmp_path, name, **deviation)
        reports.mkdir(exist_ok=True)
        made.rename(reports / made.name)
    tools = tmp_path / "bin"  # an ssh that meets a host with no route to it, as ssh says so
    tools.mkdir()
    (tools / "ssh").write_text("#!/bin/sh\necho 'ssh: connect to host node06 port 22: No route "
                               "to host' >&2\nexit 255\n")
    (tools / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    shutil.copy(tmp_path / "fleet.yaml", pytester.path / "fleet.yaml")
    unreachable = pytester.runpytest("--gpuhost-spec=fleet.yaml",
                                     "--gpuhost-target=ssh://root@node06",
                                     "--gpuhost-report=reports/node06.json")
    assert unreachable.ret == pytest.ExitCode.TESTS_FAILED

    document = REPO / "docs" / "capture-and-drift.md"
    command = block_with(document, "python -m pytest_gpuhost.fleet").splitlines()[0]
    shell = command.replace("python ", f"{sys.executable} ", 1)
    page = subprocess.run(["bash", "-c", shell], cwd=pytester.path, capture_output=True,
                          text=True, timeout=120)
    assert page.returncode == 1, page.stderr  # a target with problems, two with no result
    sample = block_with(document, "fleet: 6 targets")
    pytest.LineMatcher(page.stdout.splitlines()).fnmatch_lines(
        sample_patterns(sample, Path(DEMO_ROOT)), consecutive=True)
    assert (pytester.path / "fleet.html").is_file()


@pytest.mark.parametrize("command", [("pytest_gpuhost.fleet",), ("pytest_gpuhost.reports.slurm",),
                                     ("pytest_gpuhost.state", "diff")],
                         ids=lambda words: " ".join(words))
def test_every_option_of_a_python_m_command_is_documented(command: tuple[str, ...]) -> None:
    """``python -m pytest_gpuhost.fleet --title``, ``... reports.slurm --timeout`` were in no
    doc: each command of the package is named in the docs, and so is every
    option its --help lists."""
    import subprocess
    import sys

    made = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True,
                          text=True, timeout=60, check=True)
    options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", made.stdout)) - {"--help"}
    assert options
    text = "\n".join(document.read_text() for document in (README, *DOCS))
    assert f"python -m {command[0]}" in text
    assert {option for option in options
            if not re.search(rf"{re.escape(option)}(?![\w-])", text)} == set()


def test_the_p2p_defaults_the_reference_names_are_the_defaults(tmp_path: Path) -> None:
    """Each ``(default X)`` of the reference's p2p example (the warn_margin's was
    nowhere): a spec that sets X is the spec that leaves the key out."""
    from pytest_gpuhost import builtin
    from pytest_gpuhost.specmodel import load_spec

    kinds = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
    conditions = dict(builtin.pytest_gpuhost_conditions())
    [example] = [b for b in blocks(REPO / "docs" / "reference.md", "yaml")
                 if b.startswith("p2p:\n  probe:")]
    documented = dict(re.findall(r"^  (\w+): .*\(.*default ([^):;]+)", example, re.M))
    assert set(documented) == {"probe", "size", "warn_margin", "timeout"}

    def section(extra: str) -> object:
        path = tmp_path / "spec.yaml"
        path.write_text(f"version: 1\np2p:\n  floors: {{same_numa: 45}}\n{extra}")
        return load_spec(path, kinds, conditions).sections["p2p"]

    for key, default in documented.items():
        assert section(f"  {key}: {default}\n") == section(""), key


@pytest.mark.e2e
@NEEDS_OPENSSH
def test_the_fleet_examples_print_what_fleets_md_shows(
        pytester: pytest.Pytester, ansible_home: None) -> None:
    """docs/fleets.md, run as it says it was: its files written from its blocks, a test sshd
    whose known_hosts and key are in ``sshd/``, one fake root per host (node02's swappiness
    60), and every ``$ pytest`` of it compared with what it shows: the inventory's run, a
    limit, a targets file, the refused duplicate and usage errors, a target that hangs, and
    --fix with its journal (a path on the target) and the rollback its undo line names."""
    pytest.importorskip("ansible")
    pytest.importorskip("xdist")
    document = REPO / "docs" / "fleets.md"
    text = document.read_text()
    quoted_port = re.search(r"port (\d+)\)", text)
    assert quoted_port, "docs/fleets.md names the sshd's port as '(port N)'"
    demo, port = "/tmp/fleet-demo", quoted_port.group(1)
    server = start_sshd(pytester.path / "sshd")
    try:
        for name, swappiness in (("node01", 10), ("node02", 60), ("node03", 10),
                                 ("node04", 10)):
            FakeHost(pytester.path / "roots" / name).sysctl("vm.swappiness", swappiness) \
                .sysctl("vm.dirty_ratio", 5)
        names = {demo: str(pytester.path), port: str(server.port),
                 "root@127.0.0.1": f"{server.user}@127.0.0.1",
                 "ansible_user=root": f"ansible_user={server.user}",
                 "ansible_user: root": f"ansible_user: {server.user}"}
        for block in blocks(document):
            first = block.splitlines()[0]
            if first.startswith("# ") and first.split()[1].endswith((".ini", ".yml:", ".yml")):
                for name, value in names.items():
                    block = block.replace(name, value)
                (pytester.path / first.split()[1].rstrip(":")).write_text(block)
        ran = 0
        for block in blocks(document):
            if block.startswith("$ "):
                run_transcript(pytester, block, names, subprocess=True)
                ran += block.count("\n$ pytest") + block.startswith("$ pytest")
        assert ran == 10
    finally:
        server.stop()


def test_a_json_record_keeps_the_id_and_its_target_apart(
        pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/reference.md said the JSON ``id`` carries ``@TARGET``: the
    record the reference now quotes is what a run over a target named node02 writes, and the
    test id is the one with ``@node02``."""
    import os

    from .e2e.test_ssh import fake_lxc_attach

    quoted = re.search(r'a JSON record holds `("id": [^`]+)`', " ".join(
        (REPO / "docs" / "reference.md").read_text().split()))
    assert quoted is not None
    expected = json.loads("{" + quoted.group(1) + "}")
    assert expected == {"id": "sysctl[vm.swappiness]", "target": "node02"}
    monkeypatch.setenv("PATH", f"{fake_lxc_attach(tmp_path / 'bin')}:{os.environ['PATH']}")
    # a namespace-scoped sysctl: the doc's vm.swappiness of a container is its host's
    container = FakeHost(tmp_path / "ct").sysctl("net.core.somaxconn", 4096)
    pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  net.core.somaxconn: 4096\n")
    result = pytester.runpytest("--gpuhost-spec=spec.yaml", "-v", "--gpuhost-report=r.json",
                                f"--gpuhost-target=lxc://101{container.root}?name=node02")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["spec.yaml::sysctl[[]net.core.somaxconn]@node02 PASSED*"])
    [record] = json.loads((pytester.path / "r.json").read_text())["checks"]
    assert {key: record[key] for key in expected} == {
        **expected, "id": expected["id"].replace("vm.swappiness", "net.core.somaxconn")}
