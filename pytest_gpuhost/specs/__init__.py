"""The specs that ship with pytest-gpuhost, named by their file's stem: ``--gpuhost-spec=NAME``.

Imported by the plugin's option help, so it stays a directory listing: no YAML, no spec parser.
"""

from __future__ import annotations

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
