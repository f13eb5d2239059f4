"""``-p floorplug`` (with bench/ on PYTHONPATH): a lower bound for figure (1c).

The least a plugin can do for the floor's run: parse the same spec with PyYAML's C loader,
open and read the same paths the gpuhost run opens (plain ``os.open``: no containment, no
model, no records), and yield as many items as it has checks, each comparing a string. What
pytest-gpuhost costs beyond this run is its own machinery, not the reading the checks need.

    FLOORPLUG_PATHS=opened.txt FLOORPLUG_ITEMS=340 python -m pytest -p floorplug spec.yaml

``FLOORPLUG_PATHS``: a file of paths relative to ``FLOORPLUG_ROOT`` (default ``host``), one a
line; a path that is a directory is listed, any other read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.File | None:
    if file_path.suffix == ".yaml":
        return SpecFile.from_parent(parent, path=file_path)
    return None


class SpecFile(pytest.File):
    def collect(self) -> Iterator[pytest.Item]:
        spec = yaml.load(self.path.read_text(), Loader=yaml.CSafeLoader)
        root = os.environ.get("FLOORPLUG_ROOT", "host")
        read: dict[str, object] = {}
        for path in Path(os.environ["FLOORPLUG_PATHS"]).read_text().split():
            try:
                fd = os.open(os.path.join(root, path), os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                read[path] = None
                continue
            try:
                is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
                read[path] = os.listdir(fd) if is_dir else os.read(fd, 1 << 16)
            finally:
                os.close(fd)
        keys = list(spec.get("sysctl") or {"check": None})
        for n in range(int(os.environ["FLOORPLUG_ITEMS"])):
            yield Check.from_parent(self, name=f"{keys[n % len(keys)]}[{n}]", value=str(n))


class Check(pytest.Item):
    def __init__(self, *, value: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.value = value

    def runtest(self) -> None:
        assert self.value.strip() == self.value

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, self.name
