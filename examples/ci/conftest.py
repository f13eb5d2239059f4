"""In the benchmark repository: load pytest-gpuhost even where plugin autoloading is off
(PYTEST_DISABLE_PLUGIN_AUTOLOAD=1); with it on, the plugin is still registered only once.

Under sudo (root, with SUDO_UID and SUDO_GID set), the reports the run wrote inside the
directory it ran from (--junitxml, --alluredir, --gpuhost-report, ...) are handed back to the
user who ran sudo, who owns that directory: the CI runner uploads them, and its next checkout's
``git clean`` removes them. Nothing else changes owner: not a path outside that directory or
reached through a symbolic link, not a file with a second hard link.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["pytest_gpuhost"]

REPORTS = ("xmlpath", "allure_report_dir", "gpuhost_report", "gpuhost_prom", "gpuhost_nfd",
           "gpuhost_fleet_html", "gpuhost_capture")
"""The options (by their pytest dest) whose files or folders a run writes."""


def _hand_back(path: Path, uid: int, gid: int) -> None:
    info = path.lstat()
    if info.st_uid == 0 and (path.is_dir() or path.is_symlink() or info.st_nlink == 1):
        os.chown(path, uid, gid, follow_symlinks=False)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit() or not gid.isdigit():
        return
    here = Path(config.invocation_params.dir).resolve()
    if here.stat().st_uid != int(uid):
        return  # not the directory of the user who ran sudo
    for name in REPORTS:
        value = getattr(config.option, name, None)
        if not value:
            continue
        path = Path(os.path.abspath(here / value))
        if not path.is_relative_to(here) or os.path.realpath(path) != str(path):
            continue  # outside, or through a link
        for parent in reversed(path.relative_to(here).parents[:-1]):
            _hand_back(here / parent, int(uid), int(gid))  # folders the run made
        if not path.exists():
            continue
        _hand_back(path, int(uid), int(gid))
        for top, folders, files in os.walk(path):  # links are not followed
            for entry in (*folders, *files):
                _hand_back(Path(top) / entry, int(uid), int(gid))
