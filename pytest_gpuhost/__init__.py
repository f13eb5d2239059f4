"""pytest-gpuhost: the tuning of a GPU server, expressed as pytest assertions.

The plugin is ``pytest_gpuhost.plugin`` (entry point ``gpuhost``). ``pytest_plugins =
["pytest_gpuhost"]`` or ``-p pytest_gpuhost`` names this package instead: registering it
registers the plugin module under its entry-point name, unless it already is, so the hooks run
once whichever way (or both ways) the plugin was named, and ``-p no:gpuhost`` still disables it.

PYTEST_DONT_REWRITE: the package is imported before pytest_plugins names it; nothing to rewrite.
"""

from __future__ import annotations

from typing import Any

PLUGIN_NAME = "gpuhost"


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    import sys

    if plugin is not sys.modules[__name__]:
        return
    from . import plugin as gpuhost_plugin

    if not manager.is_registered(gpuhost_plugin) and not manager.is_blocked(PLUGIN_NAME):
        manager.register(gpuhost_plugin, PLUGIN_NAME)


def __getattr__(name: str) -> str:
    """``pytest_gpuhost.__version__`` (``version.py``), read only where asked: a pytest run that
    asks nothing of gpuhost imports this module alone."""
    if name == "__version__":
        from .version import __version__

        return __version__
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
