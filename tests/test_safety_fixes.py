"""Issue 9 ("Safety first"): each case that once wrote the wrong place, lost an undo, hung or
gave a traceback, on fake trees, with canaries outside the tree where anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_gpuhost.testing.fakehost import FakeHost, config_space

from .conftest import counts, snapshot

STATE = "var/lib/pytest-gpuhost"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A file outside every host tree: no run may change it."""
    path = tmp_path / "outside" / "canary"
    path.parent.mkdir()
    path.write_text("untouched\n")
    return path


def unchanged(root: Path, before: dict[str, tuple[bytes, int]], canary: Path) -> bool:
    """The tree is as it was, bar pytest-gpuhost's own state, and the canary is intact."""
    after = {p: v for p, v in snapshot(root).items() if not p.startswith(STATE)}
    return after == {p: v for p, v in before.items() if not p.startswith(STATE)} and \
        canary.read_text() == "untouched\n"


# --- 5. a capability pointer outside 0x40..0xFF is an error, never a write ---------------------


@pytest.mark.parametrize(("pointer", "words"), [
    (0x08, "the capability pointer at 0x34 is 0x08, inside the 64-byte header"),
    (0xFC, "Device Control at 0xfc would reach 0x105, past the standard capabilities"),
])
def test_fix_never_writes_through_a_bad_capability_pointer(
        pytester: pytest.Pytester, fake: FakeHost, canary: Path, pointer: int,
        words: str) -> None:
    config = bytearray(config_space(vendor=0x10DE, device=0x2BB5, class_code=0x030000))
    config[0x34] = pointer
    config[pointer:pointer + 2] = bytes([0x10, 0x00])  # reads like the PCIe capability
    fake.pci_device("0000:01:00.0", vendor=0x10DE, device=0x2BB5, class_code=0x030000,
                    config=bytes(config))
    pytester.makefile(".yaml", spec="version: 1\npcie:\n  max_read_request: 4096\n")
    before = snapshot(fake.root)
    result = pytester.runpytest("spec.yaml", f"--gpuhost-root={fake.root}", "--fix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert counts(result) == {"errors": 1}
    assert words in result.stdout.str()
    assert unchanged(fake.root, before, canary)
