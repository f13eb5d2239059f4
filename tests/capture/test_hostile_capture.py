"""A host's own values never make its capture fail. A value with DEL, C1
controls or U+FFFE (one USB product string in the kernel log is enough) once made the captured
YAML refuse to load; U+0085 and U+2028, folded by YAML inside double quotes, made the captured
dmesg allow-patterns fail on their own host; three 1.5 MB values pushed the spec past what a
spec may hold and failed the whole capture instead of leaving the huge ones out."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pytest_gpuhost.capture.yamltext import comment, scalar
from pytest_gpuhost.testing.fakehost import FakeHost

from .capturing import round_trip

pytest_plugins = ["pytester"]

HOSTILE = "lab\x7f\x9b[31m\x85\u2028\u2029\ufffe\ud800end"


def test_every_character_a_value_can_hold_is_written_so_that_yaml_reads_it_back() -> None:
    for value in (HOSTILE, "\x00\x1b", "a\u0085b", "\ufeffx", "\U0001f600"):
        written = scalar(value)
        assert "\n" not in written
        assert yaml.safe_load(f"key: {written}\n") == {"key": value}
    assert yaml.safe_load(comment(HOSTILE) + "\nkey: 1\n") == {"key": 1}


def test_a_capture_of_hostile_values_loads_and_passes_on_its_host(tmp_path: Path) -> None:
    root = tmp_path / "host"
    fake = FakeHost(root).sysctls({"kernel.domainname": HOSTILE.replace("\ud800", ""),
                                   "vm.swappiness": 10})
    fake.kmsg([(6, "Linux version 6.8.0-49-generic"),
               (4, "usb 1-1: Product: Hub\\xc2\\x85\\xe2\\x80\\xa8X\\x7f\\xc2\\x9b\\xef\\xbf\\xbe"),
               (4, "usb 1-2: Product: Cam\\xc2\\x85 \\xe2\\x80\\xa9Y")])
    spec = tmp_path / "keys.yaml"
    spec.write_text("version: 1\nsysctl:\n  kernel.domainname: x\n  vm.swappiness: 10\n"
                    "dmesg: {}\n")
    text, verified = round_trip(root, tmp_path, [spec])
    assert verified.bad() == [], text
    assert verified["dmesg"].outcome.value == "passed"


def test_huge_values_are_left_out_with_a_comment_and_the_rest_captured(tmp_path: Path) -> None:
    root = tmp_path / "host"
    huge = {f"kernel.huge{n}": str(n) * 1_500_000 for n in range(3)}
    FakeHost(root).sysctls({**huge, "vm.swappiness": 10})
    spec = tmp_path / "keys.yaml"
    spec.write_text("version: 1\nsysctl:\n" + "".join(f"  {key}: x\n" for key in huge)
                    + "  vm.swappiness: 10\n")
    text, verified = round_trip(root, tmp_path, [spec])
    assert verified.bad() == []
    assert [r.id for r in verified.records] == ["sysctl[vm.swappiness]"]
    for key in huge:
        assert f"# left out: {key}: its value is 1500002 characters of YAML, more than the " \
               "65536 a captured entry holds" in text
    assert len(text) < 100_000


def test_a_capture_whose_every_entry_is_left_out_says_why_and_writes_nothing(
        pytester: pytest.Pytester) -> None:
    """Three huge values and nothing else: not "the captured spec would not load ... the spec
    has no checks", but every entry left out, each with why, and no file (exit 1)."""
    root = pytester.path / "host"
    huge = {f"kernel.huge{n}": str(n) * 1_500_000 for n in range(3)}
    FakeHost(root).sysctls(huge)
    spec = pytester.path / "keys.yaml"
    spec.write_text("version: 1\nsysctl:\n" + "".join(f"  {key}: x\n" for key in huge))
    result = pytester.runpytest(f"--gpuhost-spec={spec}", f"--gpuhost-root={root}",
                                "--gpuhost-capture=huge.yaml", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "would not load" not in out and "has no checks" not in out
    assert "--gpuhost-capture=huge.yaml: every entry was left out, so nothing was written: " \
           "kernel.huge0: its value is 1500002 characters of YAML, more than the 65536 a " \
           "captured entry holds" in out
    assert "kernel.huge2: its value is 1500002 characters" in out
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert not (pytester.path / "huge.yaml").exists()
