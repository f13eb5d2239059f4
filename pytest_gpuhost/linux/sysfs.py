"""Small sysfs and procfs value formats: the ``[bracketed]`` choice and kernel releases."""

from __future__ import annotations

import re

_BRACKETED = re.compile(r"\[([^\]\s]+)\]")
_RELEASE = re.compile(r"(\d+(?:\.\d+){0,2})(?:-(\d+))?")


def bracketed(text: str, choices: tuple[str, ...] = ()) -> str | None:
    """The selected word of a sysfs choice file: ``always [madvise] never`` -> ``madvise``
    (transparent_hugepage/enabled, lockdown); None when nothing is bracketed. A file that holds
    one of ``choices`` alone (what a write leaves in a fake tree, which has no kernel behind it
    to re-render the list) is that word."""
    match = _BRACKETED.search(text)
    if match:
        return match.group(1)
    return text.strip() if text.strip() in choices else None


def release_version(release: str) -> str:
    """The comparable part of a kernel release: ``6.8.0-49-generic`` -> ``6.8.0.49`` (the
    distribution's ABI number counts: -49 is newer than -31), ``6.12.9+bpo-amd64`` ->
    ``6.12.9``, ``5.15.0`` -> ``5.15.0``. ValueError for a release with no leading number."""
    match = _RELEASE.match(release.strip())
    if not match:
        raise ValueError(f"not a kernel release like '6.8.0-49-generic': {release.strip()!r}")
    version, abi = match.groups()
    parts = version.split(".") + ["0"] * (3 - len(version.split(".")))
    return ".".join(parts + ([abi] if abi else []))
