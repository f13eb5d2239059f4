"""The specs that ship with pytest-gpuhost, named by their file's stem: ``--gpuhost-spec=NAME``.

Imported by the plugin's option help, so it stays a directory listing: no YAML, no spec parser.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent
SUFFIX = ".yaml"


def names() -> list[str]:
    """Every bundled spec's name, sorted."""
    return sorted(p.name[:-len(SUFFIX)] for p in DIRECTORY.iterdir()
                  if p.name.endswith(SUFFIX) and p.is_file())


def find(name: str) -> Path | None:
    """The bundled spec called ``name``, or None."""
    if name not in names():
        return None
    return DIRECTORY / f"{name}{SUFFIX}"


def bundled_name(path: Path) -> str | None:
    """The file name of ``path`` when it is a bundled spec (``blackwell8.yaml``), else None."""
    resolved = path.resolve()
    if resolved.parent != DIRECTORY or not resolved.name.endswith(SUFFIX):
        return None
    return resolved.name if resolved.is_file() else None


def from_argument(argument: str, run: Iterable[Path], base: Path) -> str:
    """A test argument that names a check of a bundled spec by its id
    (``blackwell8.yaml::dmesg``), where no such file is, as the spec's path with the same
    ``::`` parts; pytest finds the file by its path. Any other argument (``base``: where
    pytest was invoked) as it is."""
    name, sep, rest = argument.partition("::")
    if "/" in name or (base / name).exists():
        return argument
    for path in run:
        if bundled_name(path) == name:
            return f"{path}{sep}{rest}"
    return argument
