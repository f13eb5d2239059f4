"""The README's demo commands, run as written, in a fresh shell, from a fresh copy of the
checkout: one shell for the lot, as a newcomer pastes them into one terminal (a virtual
environment made from scratch with ``pip install .``), each later one pasted alone into a new
shell where ``demo`` is not set, and the paste-safety of every ``rm -r`` the docs show."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ..test_docs import DOCS, README, blocks

pytestmark = pytest.mark.e2e

DEMO_BLOCKS = ("demo=$(mktemp -d)", 'rm -rf "${demo:?}/host"', "pytest_gpuhost.fakehost --proxmox")
"""What marks each of the README's demo commands, in the README's order."""


def demo_blocks() -> list[str]:
    """The README's code blocks that run the demo, in order, each as written."""
    found = [block for block in blocks(README) if "$demo" in block]
    assert [next(m for m in DEMO_BLOCKS if m in block) for block in found] == list(DEMO_BLOCKS)
    return found


def fresh_checkout(target: Path) -> Path:
    """The files a clone of this checkout has (git's tracked and not ignored ones), copied."""
    repo = README.parent
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=repo, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = repo / name
        if source.is_file() or source.is_symlink():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name, follow_symlinks=False)
    return target


def tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file() and not path.is_symlink():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def fresh_shell_env(tmp_path: Path) -> dict[str, str]:
    """A new terminal's environment: no virtual environment active, ``mktemp`` under
    tmp_path, pip's own configuration kept."""
    keep = {k: v for k, v in os.environ.items() if k.startswith("PIP_") or k in ("LANG",)}
    path = [p for p in os.environ["PATH"].split(":") if ".venv" not in p]
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {**keep, "PATH": ":".join(path), "HOME": str(home), "TMPDIR": str(tmp_path)}


def test_the_readme_demo_commands_run_as_written_in_one_fresh_shell(tmp_path: Path) -> None:
    checkout = fresh_checkout(tmp_path / "checkout")
    examples = tree_digest(checkout / "examples" / "hosts")
    script = "".join(f"{block}echo \"== exit $? ==\"\n" for block in demo_blocks())
    ran = subprocess.run(["bash", "--noprofile", "--norc", "-c", script], cwd=checkout,
                         env=fresh_shell_env(tmp_path), capture_output=True, text=True,
                         timeout=1200)
    out = ran.stdout
    # each pytest fails what needs a reboot, a newer kernel or a module that loads, as shown
    assert re.findall(r"== exit (\d+) ==", out) == ["1", "1", "1"], out[-3000:] + ran.stderr
    first, second, proxmox = out.split("== exit 1 ==")[:3]
    assert "--fix: 45 of 46 fixes applied" in first
    assert "topology of " in second and "P2P measured, GB/s" in second
    assert "wrote the Proxmox-like example host (container 101)" in proxmox
    assert re.search(r"^kind +local +lxc-101", proxmox, re.M) or "lxc-101" in proxmox
    # the --fix on the fresh copy fixed it, and the checkout's own example trees are untouched
    assert re.search(r"--fix: \d+ of \d+ fixes applied", proxmox.split("lxc://101 --fix")[-1]
                     if "lxc://101 --fix" in proxmox else proxmox)
    assert tree_digest(checkout / "examples" / "hosts") == examples
    [demo] = [p for p in tmp_path.iterdir() if p.name.startswith("tmp.")]
    assert (demo / "pve" / "var" / "lib" / "pytest-gpuhost" / "journal").is_dir()


@pytest.mark.parametrize("block", demo_blocks()[1:], ids=["topology", "proxmox"])
def test_a_later_demo_command_in_a_new_shell_removes_nothing(tmp_path: Path, block: str) -> None:
    """Pasted alone, where ``demo`` is not set (as root: ``rm -rf $demo/host`` would be
    ``rm -rf /host``), the command stops at its first step, before any rm or pytest runs."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "ran"
    for name in ("rm", "cp", "pytest", "python", "python3"):
        (tools / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n")
        (tools / name).chmod(0o755)
    env = fresh_shell_env(tmp_path)
    env["PATH"] = f"{tools}:{env['PATH']}"
    ran = subprocess.run(["bash", "--noprofile", "--norc", "-c", block], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode != 0
    assert "demo: parameter null or not set" in ran.stderr
    assert not log.exists(), log.read_text()


def test_no_documented_rm_can_expand_to_the_root() -> None:
    """Every ``rm -r`` of the README's and the docs' commands whose path starts with a variable
    says ``"${VAR:?}"``: unset, the shell stops instead of removing ``/...``."""
    unsafe = []
    for document in (README, *DOCS):
        for block in blocks(document):
            for words in re.findall(r"\brm\s+-\w*r\w*\s+([^&|;\n]+)", block):
                for word in words.split():
                    if "$" in word and not re.match(r'"?\$\{\w+:\?\}', word):
                        unsafe.append(f"{document.name}: rm ... {word}")
    assert unsafe == []
