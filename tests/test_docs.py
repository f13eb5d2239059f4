"""The documentation's code runs: the complete kind of docs/adding-a-kind.md, verify and fix."""

from __future__ import annotations

import json
import re
from glob import escape
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from pytest_gpuhost.fleet import read_reports
from pytest_gpuhost.fleet.matrix import matrix_lines
from pytest_gpuhost.testing.fakehost import FakeHost

from .conftest import REPO


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
DEMO_ROOT = "/tmp/gpuhost-demo"
VARIABLE = re.compile(r"\.\.\.|\d{8}T\d{6}Z-blackwell8-\d+|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"
                      r"| in \d+\.\d+s")
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


def demo_command() -> list[str]:
    """The README's first command: a venv, the package installed from the checkout, a copy of
    the example host, then pytest; the pytest part as its argument list."""
    command = block_with(README, "--gpuhost-root=/tmp/gpuhost-demo --fix").strip()
    steps = [step.strip() for step in command.split("&&")]
    assert steps[:2] == ["python3 -m venv /tmp/gpuhost", "/tmp/gpuhost/bin/pip install -q ."]
    assert steps[2:4] == [f"rm -rf {DEMO_ROOT}",
                          f"cp -r examples/hosts/blackwell8-untuned {DEMO_ROOT}"]
    pytest_path, *args = steps[4].split()
    assert pytest_path == "/tmp/gpuhost/bin/pytest"
    return args


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
    assert command[-1] == ci[-1] == ".venv/bin/pytest"
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
    from pytest_gpuhost.spec import load_spec

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
    made from it (``python -m pytest_gpuhost.options``), and so is --help."""
    from pytest_gpuhost.options import OPTIONS, docs_table

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
