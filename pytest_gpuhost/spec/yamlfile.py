"""The old import path of ``pytest_gpuhost.specmodel.yamlfile``: its names are re-exported here
(``spec/`` became ``specmodel/``, named apart from the bundled specs and from a folder name
that tools read as one of tests)."""

from __future__ import annotations

from ..specmodel.yamlfile import *  # noqa: F403
