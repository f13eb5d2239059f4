"""Over a real OpenSSH server: one target that answers something other
than the agent's answer (JSON of the wrong types, an array nested 200,000 deep, a hello of the
wrong shape) or writes megabytes to stderr without a newline is that target's trouble alone: it
is lost saying so, and every other target runs and is reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH, RELAY_HELLO, stand_in_ssh

pytestmark = NEEDS_OPENSSH

RELAY_FIRST = """\
header = sys.stdin.buffer.readline()
child.stdin.write(header + sys.stdin.buffer.read(int(header)))
child.stdin.flush()
size = child.stdout.readline()
answer = child.stdout.read(int(size))
"""
"""The first batch after the hello goes to the agent; ``answer`` is what it said."""

SEVENS = RELAY_HELLO + RELAY_FIRST + """\
import json
def sevens(value):
    if isinstance(value, list):
        return 7
    if isinstance(value, dict):
        return {key: sevens(item) for key, item in value.items()}
    return value
data = json.dumps([sevens(reply) for reply in json.loads(answer)]).encode()
sys.stdout.buffer.write(b"%d\\n" % len(data) + data)
sys.stdout.buffer.flush()
time.sleep(60)
"""
"""The agent's first answer with every list in it replaced by 7."""

DEEP = RELAY_HELLO + RELAY_FIRST + """\
data = b"[" * 200000 + b"]" * 200000
sys.stdout.buffer.write(b"%d\\n" % len(data) + data)
sys.stdout.buffer.flush()
time.sleep(60)
"""

BAD_HELLO = """\
header = sys.stdin.buffer.readline()
sys.stdin.buffer.read(sum(map(int, header.split()[:2])))
data = b'{"hello": {"euid": "root", "identity": [1, 2]}}'
sys.stdout.buffer.write(b"%d\\n" % len(data) + data)
sys.stdout.buffer.flush()
time.sleep(60)
"""


def answers_replaced(value: str) -> str:
    """A stand-in agent that relays every request to the real one and answers each with
    ``value``, a Python expression of the request's ``op`` and the real ``reply``."""
    return RELAY_HELLO + """\
import json
while header := sys.stdin.buffer.readline():
    request = sys.stdin.buffer.read(int(header))
    child.stdin.write(header + request)
    child.stdin.flush()
    size = child.stdout.readline()
    answer = json.loads(child.stdout.read(int(size)))
    ops = [each["op"] for each in json.loads(request)]
    data = json.dumps([VALUE for op, reply in zip(ops, answer)]).encode()
    sys.stdout.buffer.write(b"%d\\n" % len(data) + data)
    sys.stdout.buffer.flush()
""".replace("VALUE", value)


GLOB_PATHS = answers_replaced('{"value": [["x", None]]} if op == "glob" else reply')
"""The agent's answers with each glob's matches replaced by a path outside its pattern."""

STDERR_FLOOD = """\
chunk = b"x" * (1 << 20)
for _ in range(64):  # 64 MiB, no newline, then the connection ends
    sys.stderr.buffer.write(chunk)
sys.stderr.buffer.flush()
sys.exit(255)
"""


def two_targets(pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
                *extra: str) -> tuple[pytest.RunResult, dict[str, dict[str, object]]]:
    good = FakeHost(tmp_path / "good").sysctl("vm.swappiness", 10)
    hostile = FakeHost(tmp_path / "hostile").sysctl("vm.swappiness", 10)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n")
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(good.root)}?name=good",
        f"--gpuhost-target={sshd.url(hostile.root)}?name=hostile",
        f"--gpuhost-ssh-config={sshd.client_config}", "-p", "no:cacheprovider",
        "--gpuhost-report=r.json", *extra, timeout=300)
    report = json.loads((pytester.path / "r.json").read_text())
    return result, {str(check["target"]): check for check in report["checks"]}


@pytest.mark.parametrize(("body", "words"), [
    (SEVENS, "not the agent's answer: a glob value of the wrong shape: 7"),
    (DEEP, "not the agent's answer: b'[[[[[["),
    (BAD_HELLO, "not the agent's answer: a hello of the wrong shape"),
    (GLOB_PATHS, "not the agent's answer: a glob match 'x' outside its pattern"),
], ids=["lists-replaced-by-7", "200000-deep", "hello", "glob-outside-its-pattern"])
@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_a_target_s_malformed_answer_loses_it_alone(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, body: str, words: str, xdist: list[str]) -> None:
    stand_in_ssh(tmp_path / "bin", monkeypatch, "hostile", body)
    result, by_target = two_targets(pytester, sshd, tmp_path, *xdist)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "INTERNALERROR" not in out + result.stderr.str()
    assert by_target["good"]["outcome"] == "passed"
    assert by_target["hostile"]["outcome"] == "error"
    assert words in str(by_target["hostile"]["message"])


def test_megabytes_of_stderr_without_a_newline_are_cut_to_their_end(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The target writes 64 MiB to stderr as one line, then the connection ends: the message
    says the end of it, and what the controller kept of it is bounded (a unit test of the
    pipes measures the bound itself)."""
    stand_in_ssh(tmp_path / "bin", monkeypatch, "hostile", STDERR_FLOOD)
    result, by_target = two_targets(pytester, sshd, tmp_path)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert by_target["good"]["outcome"] == "passed"
    message = str(by_target["hostile"]["message"])
    assert by_target["hostile"]["outcome"] == "error"
    assert "xxxxxxxx" in message and len(message) < 2000


NVML_SURROGATE = answers_replaced(
    '{"value": {"driver_version": "580\\udcff", "gpus": {}}} if op == "nvml" else reply')
"""The agent's answers, its NVML's driver version a lone surrogate (JSON's ``\\udcff``)."""


def test_a_lone_surrogate_in_a_target_s_value_leaves_the_prometheus_file_written(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A target's NVML says its driver version is ``580\\udcff`` (JSON allows a lone
    surrogate; UTF-8 does not): the check records it, and the textfile, written as UTF-8,
    was not written at all, for any target, leaving node_exporter the last run's values."""
    stand_in_ssh(tmp_path / "bin", monkeypatch, "hostile", NVML_SURROGATE)
    good = FakeHost(tmp_path / "good").sysctl("vm.swappiness", 60)
    hostile = FakeHost(tmp_path / "hostile").sysctl("vm.swappiness", 10)
    spec = pytester.makefile(".yaml", spec="version: 1\nsysctl:\n  vm.swappiness: 10\n"
                                           "gpus:\n  driver_version: {min: '580.0'}\n")
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(good.root)}?name=good",
        f"--gpuhost-target={sshd.url(hostile.root)}?name=hostile",
        f"--gpuhost-ssh-config={sshd.client_config}", "-p", "no:cacheprovider",
        "--gpuhost-prom=out.prom", timeout=300)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "not written" not in out
    prom = (pytester.path / "out.prom").read_text(encoding="utf-8")
    assert 'gpuhost_check_ok{target="good",spec="spec",spec_file="spec.yaml",' \
           'kind="sysctl",key="vm.swappiness"} 0' in prom
    [driver] = [line for line in prom.splitlines() if line.startswith("gpuhost_observed_info")
                and 'target="hostile"' in line and 'kind="gpus.driver_version"' in line]
    assert 'value="580\ufffd' in driver, driver
