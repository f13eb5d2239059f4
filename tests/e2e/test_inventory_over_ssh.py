"""Fleets: Ansible inventories, --gpuhost-limit, targets files and the per-target time
limit, run over a real OpenSSH server on 127.0.0.1.

Every "host" of an inventory is the same sshd (started by the tests, keys and known_hosts under
tmp_path) with a fake root of its own (``gpuhost_root``), reached with the key file the inventory
names: the client configuration the runs get names no key, so a run that reaches a host proves
that the inventory's key was used. Neither this machine's sshd nor anyone's ~/.ssh is used.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost
from pytest_gpuhost.testing.sshd import SshServer

from ..conftest import NEEDS_OPENSSH, RELAY_HELLO, stand_in_ssh, workers_by_target
from .relay import RELAY_FORWARDING

pytestmark = NEEDS_OPENSSH

SPEC = "version: 1\nsysctl:\n  vm.swappiness: 10\n  vm.dirty_ratio: 5\n"



@pytest.fixture(scope="module", autouse=True)
def _ansible_home(ansible_home: None) -> None:
    """Every test here keeps Ansible's files in its own directories."""


def keyless_config(server: SshServer, directory: Path) -> Path:
    """An ssh client configuration that trusts the server's host key and names no usable key:
    only a key given on the command line (the inventory's) can log in."""
    path = directory / "ssh_config_keyless"
    path.write_text(textwrap.dedent(f"""\
        Host *
          IdentitiesOnly yes
          IdentityAgent none
          IdentityFile {directory / 'no-such-key'}
          UserKnownHostsFile {server.known_hosts}
          GlobalKnownHostsFile /dev/null
          StrictHostKeyChecking yes
          LogLevel ERROR
        """))
    return path


def fleet(tmp_path: Path, swappiness: dict[str, int]) -> dict[str, Path]:
    """A fake root per host name, with its swappiness (dirty_ratio is right everywhere)."""
    roots = {}
    for name, value in swappiness.items():
        host = FakeHost(tmp_path / "roots" / name).sysctls({"vm.swappiness": value,
                                                            "vm.dirty_ratio": 5})
        roots[name] = host.root
    return roots


def ini_inventory(server: SshServer, roots: dict[str, Path], *, groups: dict[str, list[str]],
                  key: bool = True, extra: dict[str, str] | None = None) -> str:
    """An INI inventory: every host at the test sshd, with its own root."""
    lines = []
    for group, members in groups.items():
        lines.append(f"[{group}]")
        for name in members:
            more = (extra or {}).get(name, "")
            lines.append(f"{name} gpuhost_root={roots[name]} {more}".rstrip())
    lines += ["", "[all:vars]", "ansible_host=127.0.0.1", f"ansible_port={server.port}",
              f"ansible_user={server.user}"]
    if key:
        lines.append(f"ansible_ssh_private_key_file={server.directory / 'user_key'}")
    return "\n".join(lines) + "\n"


def report(pytester: pytest.Pytester, name: str = "r.json") -> dict[str, Any]:
    """The JSON report as loaded: JSON values, so a dict of Any."""
    data: dict[str, Any] = json.loads((pytester.path / name).read_text())
    return data


def by_target(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """target -> check id -> outcome."""
    found: dict[str, dict[str, str]] = {}
    checks = data["checks"]
    assert isinstance(checks, list)
    for check in checks:
        found.setdefault(check["target"], {})[check["id"]] = check["outcome"]
    return found


def messages(data: dict[str, Any], target: str) -> list[str]:
    checks = data["checks"]
    assert isinstance(checks, list)
    return [check["message"] for check in checks if check["target"] == target]


# -- inventories -------------------------------------------------------------------------------


def test_every_inventory_host_is_an_ssh_target_reached_with_its_key(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots = fleet(tmp_path, {"node01": 10, "node02": 60, "node03": 10})
    pytester.makefile(".ini", hosts=ini_inventory(
        sshd, roots, groups={"gpu": ["node01", "node02"], "login": ["node03"]}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}",
                                "--gpuhost-report=r.json", "-v", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["*spec.yaml::sysctl[[]vm.swappiness]@node01 PASSED*"])
    data = report(pytester)
    assert by_target(data) == {
        "node01": {"sysctl[vm.swappiness]": "passed", "sysctl[vm.dirty_ratio]": "passed"},
        "node02": {"sysctl[vm.swappiness]": "failed", "sysctl[vm.dirty_ratio]": "passed"},
        "node03": {"sysctl[vm.swappiness]": "passed", "sysctl[vm.dirty_ratio]": "passed"},
    }
    targets = {t["name"]: t for t in data["targets"]}
    assert sorted(targets) == ["node01", "node02", "node03"]
    assert targets["node02"]["url"] == (f"ssh://{sshd.user}@127.0.0.1:{sshd.port}"
                                        f"{roots['node02']}?name=node02")
    assert all(t["connections"] == 1 and t["unreachable"] is None for t in targets.values())


def test_without_the_inventory_key_the_same_hosts_are_refused(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """The control of the test above: the client configuration alone logs in nowhere."""
    roots = fleet(tmp_path, {"node01": 10})
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": ["node01"]},
                                                  key=False))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = report(pytester)
    assert by_target(data) == {"node01": {"sysctl[vm.swappiness]": "error",
                                          "sysctl[vm.dirty_ratio]": "error"}}
    assert all("Permission denied (publickey)" in m for m in messages(data, "node01"))


@pytest.mark.parametrize(("limit", "selected"), [
    ("gpu", ["node01", "node02"]),
    ("gpu:!node02", ["node01"]),
    ("cluster:&rack1", ["node02", "node03"]),
    ("node0[13]", None),  # a glob's brackets are not a range: ansible's own reading
    ("~node0[13]", ["node01", "node03"]),
])
def test_limit_selects_hosts_as_ansible_does(pytester: pytest.Pytester, sshd: SshServer,
                                             tmp_path: Path, limit: str,
                                             selected: list[str] | None) -> None:
    roots = fleet(tmp_path, {"node01": 10, "node02": 10, "node03": 10})
    text = ini_inventory(sshd, roots, groups={"gpu": ["node01", "node02"], "login": ["node03"],
                                              "rack1": ["node02", "node03"]})
    text += "[cluster:children]\ngpu\nlogin\n"
    pytester.makefile(".ini", hosts=text)
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                f"--gpuhost-limit={limit}",
                                f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    if selected is None:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        shown = limit.replace("[", "[[]")
        result.stderr.fnmatch_lines([f"*--gpuhost-inventory=hosts.ini --gpuhost-limit={shown}: "
                                     f"the limit '{shown}' matches none of the 3 hosts in *"])
        return
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert sorted(by_target(report(pytester))) == selected
    result.assert_outcomes(passed=2 * len(selected))


def test_a_yaml_inventory_with_children_and_an_ini_twin(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots = fleet(tmp_path, {"g1": 10, "g2": 60})
    pytester.makefile(".yml", hosts=textwrap.dedent(f"""\
        all:
          vars:
            ansible_host: 127.0.0.1
            ansible_port: {sshd.port}
            ansible_user: {sshd.user}
            ansible_ssh_private_key_file: {sshd.directory / 'user_key'}
          children:
            cluster:
              children:
                gpu:
                  hosts:
                    g1: {{gpuhost_root: {roots['g1']}}}
                    g2: {{gpuhost_root: {roots['g2']}}}
        """))
    spec = pytester.makefile(".yaml", spec=SPEC)
    pytester.makeini(f"[pytest]\ngpuhost_inventory = hosts.yml\n"
                     f"gpuhost_ssh_config = {keyless_config(sshd, tmp_path)}\n")
    result = pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", "--gpuhost-limit=cluster",
                                           "--gpuhost-report=r.json", "-p", "no:cacheprovider",
                                           "-n", "2")  # the targets travel to the workers
    assert by_target(report(pytester)) == {
        "g1": {"sysctl[vm.swappiness]": "passed", "sysctl[vm.dirty_ratio]": "passed"},
        "g2": {"sysctl[vm.swappiness]": "failed", "sysctl[vm.dirty_ratio]": "passed"},
    }
    result.assert_outcomes(passed=3, failed=1)


def test_xdist_runs_each_inventory_host_on_one_worker(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    names = ["node01", "node02", "node03", "node04"]
    roots = fleet(tmp_path, {name: 10 for name in names})
    for root in roots.values():
        FakeHost(root).kmsg([(6, "hello")])
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": names}))
    spec = pytester.makefile(".yaml", spec=SPEC + "dmesg: {}\n")
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", "2", "-v",
        f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}", "--gpuhost-report=r.json",
        "--gpuhost-target-timeout=60", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    workers = workers_by_target(result)
    assert sorted(workers) == names
    assert all(len(seen) == 1 for seen in workers.values()), workers
    assert {len(seen) for seen in workers.values()} == {1}
    assert len({worker for seen in workers.values() for worker in seen}) == 2  # both worked
    data = report(pytester)
    assert by_target(data) == {name: {"sysctl[vm.swappiness]": "passed",
                                      "sysctl[vm.dirty_ratio]": "passed",
                                      "dmesg": "passed"} for name in names}
    result.assert_outcomes(passed=12)
    for target in data["targets"]:
        # collected and run by one worker over one agent session (the controller connects to
        # none): the facts, the observations, dmesg
        assert (target["connections"], target["round_trips"]) == (1, 3), target


COUNTING_RELAY = """\
#!{python}
# A ProxyCommand that relays to the test sshd and logs each TCP connection it carries: ssh runs
# one per connection it makes, and ends it with the connection.
import os, selectors, socket, sys
name, log, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(log, "a") as out:
    out.write(f"{{name}} {{os.getpid()}}\\n")
""" + RELAY_FORWARDING


@pytest.mark.parametrize(("dist", "sessions"), [([], 1), (["--dist", "loadfile"], 2)])
def test_xdist_one_tcp_connection_a_host(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path, dist: list[str],
        sessions: int) -> None:
    """One TCP connection a host for the whole -n run. Under xdist's default distribution the
    worker that runs a host collects it too, over one agent session; under one where every
    worker collects every host (``loadfile``) the controller's collection makes the connection
    and the worker that runs the host opens its session over it (OpenSSH's ControlMaster).
    Either way it is ended when the run ends."""
    names = ["node01", "node02", "node03"]
    roots = fleet(tmp_path, {name: 10 for name in names})
    relay, log = tmp_path / "relay", tmp_path / "connections"
    relay.write_text(COUNTING_RELAY.format(python=sys.executable))
    relay.chmod(0o755)
    proxy = {name: f"ansible_ssh_common_args='-o \"ProxyCommand={relay} {name} {log} "
                   f"{sshd.port}\"'" for name in names}
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": names},
                                                  extra=proxy))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", "2", *dist,
        f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}", "--gpuhost-report=r.json",
        "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    counted = {t["name"]: t["connections"] for t in report(pytester)["targets"]}
    assert counted == dict.fromkeys(names, sessions)
    opened = [line.split() for line in log.read_text().splitlines()]
    assert sorted(name for name, _ in opened) == names  # over one TCP connection each
    pids = tmp_path / "relay-pids"
    pids.write_text("".join(f"{pid}\n" for _, pid in opened))
    deadline = time.monotonic() + 60  # a bound only a master left running reaches
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(pids) == []  # the masters ended with the run, and their connections


def test_fix_an_inventory_under_xdist(pytester: pytest.Pytester, sshd: SshServer,
                                      tmp_path: Path) -> None:
    """Each host's worker takes that host's run lock itself (the controller holds none)."""
    names = ["node01", "node02", "node03"]
    roots = fleet(tmp_path, {name: 60 for name in names})
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": names}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini", "-n", "2", "--fix",
        f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}", "--gpuhost-report=r.json",
        "--gpuhost-lock-timeout=5", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert by_target(report(pytester)) == {name: {"sysctl[vm.swappiness]": "fixed",
                                                  "sysctl[vm.dirty_ratio]": "passed"}
                                           for name in names}
    for root in roots.values():
        assert (root / "proc/sys/vm/swappiness").read_text() == "10\n"
        assert len(list((root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl"))) == 1


def test_fix_an_inventory_then_undo_one_host_as_the_summary_says(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots = fleet(tmp_path, {"node01": 60, "node02": 60})
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": list(roots)}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    config = f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}"
    fixed = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                               config, "--fix", "-p", "no:cacheprovider")
    assert fixed.ret == pytest.ExitCode.OK, fixed.stdout.str()
    [line] = [text for text in fixed.stdout.lines if text.startswith("journal of node01: ")]
    undo = line.split("(undo: ", 1)[1].rstrip(")").split()
    # as printed: the ssh configuration that reached node01 too
    assert undo[1:] == ["--gpuhost-inventory=hosts.ini", "--gpuhost-limit=node01", config]
    back = pytester.runpytest(*undo, "-p", "no:cacheprovider")
    assert back.ret == pytest.ExitCode.OK, back.stdout.str()
    back.stdout.fnmatch_lines(["*rollback: *.jsonl is closed*"])
    assert (roots["node01"] / "proc/sys/vm/swappiness").read_text() == "60\n"
    assert (roots["node02"] / "proc/sys/vm/swappiness").read_text() == "10\n"


# -- targets files, and every source together -----------------------------------------------------


def test_targets_file_inventory_and_target_options_together(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    roots = fleet(tmp_path, {"inv1": 10, "file1": 10, "file2": 60, "cli1": 10})
    pytester.makefile(".ini", hosts=ini_inventory(sshd, {"inv1": roots["inv1"]},
                                                  groups={"gpu": ["inv1"]}))
    (pytester.path / "fleet.txt").write_text(
        f"# two more, over the client configuration's alias\n"
        f"{sshd.url(roots['file1'])}?name=file1\n\n"
        f"{sshd.url(roots['file2'])}?name=file2   # swappiness 60\n")
    spec = pytester.makefile(".yaml", spec=SPEC)
    config = tmp_path / "ssh_config"  # the alias's block, then the keyless one for the rest
    config.write_text(sshd.client_config.read_text()
                      + keyless_config(sshd, tmp_path).read_text())
    result = pytester.runpytest(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
        "--gpuhost-targets-file=fleet.txt", f"--gpuhost-target={sshd.url(roots['cli1'])}",
        f"--gpuhost-ssh-config={config}", "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    outcomes = by_target(report(pytester))
    assert sorted(outcomes) == sorted(["file1", "file2", "inv1", sshd.alias])
    assert outcomes["file2"]["sysctl[vm.swappiness]"] == "failed"
    result.assert_outcomes(passed=7, failed=1)


def test_the_same_target_twice_is_refused(pytester: pytest.Pytester, sshd: SshServer,
                                          tmp_path: Path) -> None:
    roots = fleet(tmp_path, {"node01": 10})
    pytester.makefile(".ini", hosts=ini_inventory(sshd, roots, groups={"gpu": ["node01"]}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    same = f"ssh://127.0.0.1:{sshd.port}{roots['node01']}"
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                f"--gpuhost-target={same}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"*{same} (--gpuhost-target) and ssh://*?name=node01 (--gpuhost-inventory=hosts.ini) "
        "are the same target (the same machine and root): give it once*"])
    (pytester.path / "fleet.txt").write_text("ssh://node01\n")
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                "--gpuhost-targets-file=fleet.txt", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ssh://node01 (--gpuhost-targets-file=fleet.txt:1) would be "
                                 "named node01, as ssh://*?name=node01 "
                                 "(--gpuhost-inventory=hosts.ini) is*"])


@pytest.mark.parametrize(("args", "files", "expected"), [
    (["--gpuhost-limit=gpu"], {}, "*--gpuhost-limit=gpu selects hosts of an inventory: pass "
                                  "--gpuhost-inventory=FILE too*"),
    (["--gpuhost-inventory=hosts.ini", "--gpuhost-limit="], {"hosts.ini": "[gpu]\nn1\n"},
     "*--gpuhost-limit is empty: expected an Ansible host pattern*"),
    (["--gpuhost-inventory=nope.ini"], {}, "*--gpuhost-inventory=nope.ini: *nope.ini: no such "
                                           "inventory file*"),
    (["--gpuhost-inventory=hosts.yml"], {"hosts.yml": "all:\n  hosts:\n    a: [1\n"},
     "*--gpuhost-inventory=hosts.yml: *hosts.yml: Ansible could not parse it as an inventory "
     "*: *hosts.yml:4:1: YAML parsing failed*"),
    (["--gpuhost-inventory=hosts.ini"], {"hosts.ini": "[gpu]\nn1\n[gpu:vars]\nnot a var\n"},
     "*--gpuhost-inventory=hosts.ini: *hosts.ini: Ansible could not parse it *Expected "
     "key=value, got: not a var (Ansible's ini plugin)*"),
    (["--gpuhost-inventory=hosts.ini"], {"hosts.ini": "[gpu]\nn1 ansible_port=x\n"},
     "*--gpuhost-inventory=hosts.ini: *hosts.ini: host n1: ansible_port must be a port "
     "number*"),
    (["--gpuhost-inventory=hosts.ini"],
     {"hosts.ini": "[gpu]\nn1 ansible_ssh_common_args='evil -o X=1'\n"},
     "*host n1: ansible_ssh_common_args: 'evil' is not an ssh option*"),
    (["--gpuhost-targets-file=fleet.txt"], {"fleet.txt": "ssh://a\nftp://b\n"},
     "*--gpuhost-targets-file=fleet.txt: *fleet.txt:2: 'ftp://b' is not a target*"),
    (["--gpuhost-targets-file=fleet.txt"], {"fleet.txt": "a b c\n"},
     "*--gpuhost-targets-file=fleet.txt: *fleet.txt:1: one target a line and optionally its "
     "spec, got 'a b c'*"),
    (["--gpuhost-targets-file=none.txt"], {},
     "*--gpuhost-targets-file=none.txt: *none.txt: no such targets file*"),
    (["--gpuhost-target-timeout=nan"], {}, "*--gpuhost-target-timeout=nan: expected a finite "
                                           "number of seconds above 0*"),
    (["--gpuhost-target-timeout=inf"], {}, "*--gpuhost-target-timeout=inf: *"),
    (["--gpuhost-target-timeout=0"], {}, "*--gpuhost-target-timeout=0: *"),
    (["--gpuhost-target-timeout=-3"], {}, "*--gpuhost-target-timeout=-3: *"),
    (["--gpuhost-connect-concurrency=0"], {}, "*--gpuhost-connect-concurrency=0: expected a "
                                              "whole number, 1 or more*"),
    (["--gpuhost-connect-concurrency=two"], {}, "*--gpuhost-connect-concurrency: invalid int "
                                                "value: 'two'*"),
])
def test_usage_errors_name_the_option_and_the_source(
        pytester: pytest.Pytester, args: list[str], files: dict[str, str],
        expected: str) -> None:
    for name, text in files.items():
        (pytester.path / name).write_text(text)
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", *args, "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


def test_without_ansible_an_inventory_names_the_extra(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "ansible" or m.startswith("ansible.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ansible", None)  # what an absent package looks like
    (pytester.path / "hosts.ini").write_text("[gpu]\nn1\n")
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("--gpuhost-inventory=hosts.ini: reading an Ansible inventory needs ansible-core, "
            "which is not installed: pip install 'pytest-gpuhost[ansible]' (from a checkout: "
            "pip install '.[ansible]')") in result.stderr.str()


# -- the per-target time limit ---------------------------------------------------------------------

STALLING = RELAY_HELLO + """\
# then stall: a target whose agent stops answering mid-run
open(os.environ["STALLED_PIDS"], "a").write(f"{os.getpid()}\\n")
time.sleep(600)
"""

SLEEPING_PROXY = """\
#!{python}
# A ProxyCommand that never connects (an ssh server that accepts and never answers). It notes
# its pid, and how many of these proxies run at the moment it starts.
import os, time
pids = os.environ["STALLED_PIDS"]
with open(pids, "a") as out:
    out.write(f"{{os.getpid()}}\\n")

def running(pid):
    try:
        with open(f"/proc/{{pid}}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False

with open(pids) as listed:
    together = sum(running(int(pid)) for pid in listed.read().split())
with open(os.environ["STALLED_TOGETHER"], "a") as out:
    out.write(f"{{together}}\\n")
time.sleep(600)
"""
"""Format with ``python``; STALLED_PIDS and STALLED_TOGETHER name its two files."""

RUN_BOUND = 240
"""Seconds a whole run here may take before the test fails: only a hang passes it."""
LIMIT = 10
"""--gpuhost-target-timeout in these runs: long enough for a healthy target to connect and do
all its work on a loaded machine, far shorter than what the hung ones would wait."""
PATIENT_SSH = "--gpuhost-connect-timeout=600"
"""ssh's own ConnectTimeout (default 10 s, as LIMIT) far past the target's limit in the runs
whose proxy hangs while connecting: the limit, never a race with ssh's timer, ends the wait."""

SLOW_MODPROBE = """\
#!/bin/sh
# modprobe on a machine that hangs while loading a module (ends by itself after 30 s).
exec sleep 30
"""


def alive(pid_file: Path) -> list[int]:
    """The processes the file lists that still run (a killed one not yet reaped by its new
    parent is a zombie: it runs no more)."""
    pids = [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []
    living = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            living.append(pid)
    return living


def sleeping_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    proxy = tmp_path / "proxy"
    proxy.write_text(SLEEPING_PROXY.format(python=sys.executable))
    proxy.chmod(0o755)
    monkeypatch.setenv("STALLED_PIDS", str(tmp_path / "stalled"))
    monkeypatch.setenv("STALLED_TOGETHER", str(tmp_path / "together"))
    return proxy


def test_a_target_that_hangs_connecting_ends_at_the_time_limit(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy never answers (for ten minutes): the message says the time limit ended the
    wait, and the run's own bound (a subprocess's timeout) only catches a hang."""
    roots = fleet(tmp_path, {"node01": 10, "node02": 10, "node03": 60})
    proxy = sleeping_proxy(tmp_path, monkeypatch)
    pytester.makefile(".ini", hosts=ini_inventory(
        sshd, roots, groups={"gpu": ["node01", "node02", "node03"]},
        extra={"node02": f"ansible_ssh_common_args='-o ProxyCommand={proxy}'"}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
        f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}",
        f"--gpuhost-target-timeout={LIMIT}", PATIENT_SSH, "--gpuhost-report=r.json", "-p",
        "no:cacheprovider",
        timeout=RUN_BOUND)
    data = report(pytester)
    assert by_target(data) == {
        "node01": {"sysctl[vm.swappiness]": "passed", "sysctl[vm.dirty_ratio]": "passed"},
        "node02": {"sysctl[vm.swappiness]": "error", "sysctl[vm.dirty_ratio]": "error"},
        "node03": {"sysctl[vm.swappiness]": "failed", "sysctl[vm.dirty_ratio]": "passed"},
    }
    assert messages(data, "node02") == [
        "target node02 hung while connecting: no answer within "
        f"--gpuhost-target-timeout={LIMIT} s, so the run went on without it"] * 2
    [info] = [t for t in data["targets"] if t["name"] == "node02"]
    assert "hung while connecting" in info["unreachable"]
    assert (tmp_path / "stalled").exists() and alive(tmp_path / "stalled") == []
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_a_target_whose_agent_stalls_collecting_facts(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_ssh(tmp_path / "bin", monkeypatch, "stall-after-hello", STALLING)
    monkeypatch.setenv("STALLED_PIDS", str(tmp_path / "stalled"))
    good = FakeHost(tmp_path / "good").sysctls({"vm.swappiness": 10, "vm.dirty_ratio": 5})
    stalls = FakeHost(tmp_path / "stall-after-hello").sysctls({"vm.swappiness": 10,
                                                               "vm.dirty_ratio": 5})
    spec = pytester.makefile(".yaml", spec=SPEC)
    pytester.runpytest_subprocess(f"--gpuhost-spec={spec}",
                                  f"--gpuhost-target={sshd.url(good.root)}?name=good",
                                  f"--gpuhost-target={sshd.url(stalls.root)}?name=stalls",
                                  f"--gpuhost-ssh-config={sshd.client_config}",
                                  f"--gpuhost-target-timeout={LIMIT}", "--gpuhost-report=r.json",
                                  "-p", "no:cacheprovider", timeout=RUN_BOUND)
    data = report(pytester)
    outcomes = by_target(data)
    assert outcomes["good"] == {"sysctl[vm.swappiness]": "passed",
                                "sysctl[vm.dirty_ratio]": "passed"}
    assert set(outcomes["stalls"].values()) == {"error"}
    assert set(messages(data, "stalls")) == {
        "target stalls hung while collecting facts: no answer within "
        f"--gpuhost-target-timeout={LIMIT} s, so the run went on without it"}
    assert alive(tmp_path / "stalled") == []


def test_a_target_that_hangs_in_a_fix_ends_its_other_checks_as_errors(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    hangs = FakeHost(tmp_path / "hangs").sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 5})
    hangs.file("usr/sbin/modprobe", SLOW_MODPROBE, mode=0o755)
    fine = FakeHost(tmp_path / "fine").sysctls({"vm.swappiness": 60, "vm.dirty_ratio": 5})
    fine.module("nvidia")
    for host in (hangs, fine):
        host.kmsg([(6, "hello")])
    spec = pytester.makefile(".yaml", spec=SPEC + "modules:\n  nvidia: loaded\ndmesg: {}\n")
    result = pytester.runpytest_subprocess(
        f"--gpuhost-spec={spec}", f"--gpuhost-target={sshd.url(hangs.root)}?name=hangs",
        f"--gpuhost-target={sshd.url(fine.root)}?name=fine",
        f"--gpuhost-ssh-config={sshd.client_config}", "--fix",
        f"--gpuhost-target-timeout={LIMIT}",
        "--gpuhost-report=r.json", "-p", "no:cacheprovider", timeout=RUN_BOUND)
    data = report(pytester)
    outcomes = by_target(data)
    assert outcomes["fine"] == {"sysctl[vm.swappiness]": "fixed",
                                "sysctl[vm.dirty_ratio]": "passed", "module[nvidia]": "passed",
                                "dmesg": "passed"}
    # the checks before the hang ran; the one it hung in failed; dmesg, run last, is an error
    assert outcomes["hangs"] == {"sysctl[vm.swappiness]": "fixed",
                                 "sysctl[vm.dirty_ratio]": "passed",
                                 "module[nvidia]": "fix_failed", "dmesg": "error"}
    hung = ("target hangs hung while applying a fix of module[nvidia]: no answer within "
            f"--gpuhost-target-timeout={LIMIT} s, so the run went on without it")
    found = dict(zip(outcomes["hangs"], messages(data, "hangs"), strict=True))
    assert hung in found["module[nvidia]"]
    assert found["dmesg"] == hung
    assert (fine.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    assert (hangs.root / "proc/sys/vm/swappiness").read_text() == "10\n"
    [journal] = (hangs.root / "var/lib/pytest-gpuhost/journal").glob("*.jsonl")
    assert '"check": "module[nvidia]"' in journal.read_text()  # journaled before it was tried
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_hung_targets_cost_one_time_limit_together_and_xdist_waits_no_longer(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Collection connects to the targets together: three hung targets cost the run one time
    limit, not three (the last of their proxies to start finds the other two still waiting
    with it); under xdist the controller collects once and the workers do not try the hung
    targets again (no proxy is started for them)."""
    names = ["node01", "node02", "node03", "node04", "node05"]
    roots = fleet(tmp_path, {name: 10 for name in names})
    proxy = sleeping_proxy(tmp_path, monkeypatch)
    hung = {"node02", "node03", "node05"}
    pytester.makefile(".ini", hosts=ini_inventory(
        sshd, roots, groups={"gpu": names},
        extra={name: f"ansible_ssh_common_args='-o ProxyCommand={proxy}'" for name in hung}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    config = f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}"
    for xdist in ([], ["-n", "2"]):
        (tmp_path / "together").unlink(missing_ok=True)
        pytester.runpytest_subprocess(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                      config, f"--gpuhost-target-timeout={LIMIT}", PATIENT_SSH,
                                      "--gpuhost-report=r.json", "-p", "no:cacheprovider",
                                      *xdist, timeout=RUN_BOUND)
        data = report(pytester)
        outcomes = by_target(data)
        assert {name for name, checks in outcomes.items()
                if set(checks.values()) == {"passed"}} == set(names) - hung, xdist
        for name in hung:
            assert set(outcomes[name].values()) == {"error"}
            assert set(messages(data, name)) == {
                f"target {name} hung while connecting: no answer within "
                f"--gpuhost-target-timeout={LIMIT} s, so the run went on without it"}
        counts = [int(n) for n in (tmp_path / "together").read_text().split()]
        assert len(counts) == len(hung), (xdist, counts)  # one connection each, workers none
        assert max(counts) == len(hung), (xdist, counts)  # all three waited at once
    assert alive(tmp_path / "stalled") == []


def test_the_agent_runs_under_the_hosts_ansible_python_interpreter(
        pytester: pytest.Pytester, sshd: SshServer, tmp_path: Path) -> None:
    """RHEL 8's python3 is 3.6, below the agent's floor; Ansible works there with
    ansible_python_interpreter=/usr/bin/python3.9, and so does the run now. The interpreter
    here is a wrapper that leaves a mark, then runs this python."""
    roots = fleet(tmp_path, {"rhel8": 10, "other": 10})
    wrapper = tmp_path / "bin" / "python3.9"
    wrapper.parent.mkdir()
    mark = tmp_path / "ran-under-the-interpreter"
    wrapper.write_text(f"#!/bin/sh\necho \"$@\" > '{mark}'\nexec '{sys.executable}' \"$@\"\n")
    wrapper.chmod(0o755)
    pytester.makefile(".ini", hosts=ini_inventory(
        sshd, roots, groups={"gpu": ["rhel8", "other"]},
        extra={"rhel8": f"ansible_python_interpreter={wrapper}",
               "other": "ansible_python_interpreter=/nonexistent/python3.9"}))
    spec = pytester.makefile(".yaml", spec=SPEC)
    result = pytester.runpytest(f"--gpuhost-spec={spec}", "--gpuhost-inventory=hosts.ini",
                                f"--gpuhost-ssh-config={keyless_config(sshd, tmp_path)}",
                                "--gpuhost-report=r.json", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    data = report(pytester)
    assert by_target(data)["rhel8"] == {"sysctl[vm.swappiness]": "passed",
                                        "sysctl[vm.dirty_ratio]": "passed"}
    assert mark.read_text().split()[-1] == str(roots["rhel8"])  # the agent's root argument
    assert all("/nonexistent/python3.9" in m for m in messages(data, "other"))
