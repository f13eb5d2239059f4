"""The old import paths: each module that moved (the run's configuration into ``config/``, the
bundled specs into ``bundled/``) is still importable where it was, with every name of the module
that moved (the same objects), as a conftest, a script or a doc's example wrote it before; and
``python -m pytest_gpuhost.options`` still prints the reference's table of options."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from .conftest import BLACKWELL8

MOVED = {
    **{f"pytest_gpuhost.{name}": f"pytest_gpuhost.config.{name}"
       for name in ("options", "settings", "targetoptions", "specoptions", "targets", "hostlist",
                    "inventory")},
    "pytest_gpuhost.specs": "pytest_gpuhost.bundled",
    **{f"pytest_gpuhost.spec{part}": f"pytest_gpuhost.specmodel{part}"
       for part in ("", ".cache", ".matchers", ".specfile", ".yamlfile")},
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_import_path_gives_every_name_of_the_module_that_moved(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    module = importlib.import_module(old)
    assert module is not new
    # a package's submodules are names of it once imported: each has its own old path (above)
    names = sorted(name for name, value in vars(new).items() if not name.startswith("_") and
                   not getattr(value, "__name__", "").startswith(f"{MOVED[old]}."))
    assert names
    missing = [name for name in names if getattr(module, name, None) is not getattr(new, name)]
    assert not missing, f"{old} lacks {missing} of {MOVED[old]}"
    assert (module.__doc__ or "").startswith("The old import path of "), module.__doc__


def test_the_old_specs_path_finds_the_bundled_spec() -> None:
    from pytest_gpuhost import specs

    assert specs.names() == ["blackwell8"]
    assert specs.find("blackwell8") == BLACKWELL8


@pytest.mark.parametrize("module", ["pytest_gpuhost.options", "pytest_gpuhost.config.options"])
def test_python_m_options_prints_the_reference_table_at_either_path(module: str) -> None:
    from pytest_gpuhost.config.options import docs_table

    done = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == docs_table()
    assert done.stderr == ""
