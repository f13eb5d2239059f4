"""The run's specs as its options name them: ``--gpuhost-spec`` (else its ini twin), YAML files
named as arguments, and a bare name that is no file (``blackwell8``) as the bundled spec of that
name. Part of resolving the settings (``settings.py`` makes each SpecOptionError a
SettingsError, the same message); no pytest here.
"""

from __future__ import annotations

from pathlib import Path

from .options import SPEC_SUFFIXES, RawOptions


class SpecOptionError(Exception):
    """A spec that cannot be used as named; the message names where it was named."""


def spec_path(base: Path, value: str, source: str) -> Path:
    """A spec file, or, for a bare name that is no file (``blackwell8``: no ``/``, no ``.yaml``
    suffix), the bundled spec of that name."""
    path = base / value
    if "/" in value or value.endswith(SPEC_SUFFIXES) or path.exists():
        _not_the_bundled(path, value, f"{source}={value}")
        return path
    from .. import bundled

    found = bundled.find(value)
    if found is None:
        raise SpecOptionError(f"{source}={value}: no such file, and no bundled spec of that "
                              f"name; the bundled specs: {', '.join(bundled.names()) or 'none'} "
                              "(or name a YAML file)")
    return found


def _not_the_bundled(path: Path, value: str, shown: str) -> None:
    """A spec file that is not there, named as a bundled spec's file (``blackwell8.yaml``):
    say so, and how to run the bundled one, rather than only "not found"."""
    if "/" in value or path.exists():
        return
    from .. import bundled

    stem = next((value[:-len(suffix)] for suffix in SPEC_SUFFIXES if value.endswith(suffix)),
                None)
    if stem is not None and bundled.find(stem) is not None:
        raise SpecOptionError(f"{shown}: no such file here ({path.parent}); the bundled "
                              f"spec of that name runs as --gpuhost-spec={stem} (a bundled spec "
                              "is named without .yaml)")


def spec_paths(raw: RawOptions) -> tuple[Path, ...]:
    """Specs from --gpuhost-spec (else the ini), then .yaml files named as arguments."""
    paths = [spec_path(raw.invocation, p, "--gpuhost-spec") for p in raw.words("spec")]
    if not paths:
        paths = [spec_path(raw.ini_base, p, f"gpuhost_spec in {raw.ini_name}")
                 for p in raw.ini_words("spec")]
    from .. import bundled

    for arg in raw.args:  # a bundled spec's check by its id (blackwell8.yaml::dmesg) too
        candidate = Path(bundled.from_argument(arg, paths, raw.invocation).split("::", 1)[0])
        if candidate.suffix in SPEC_SUFFIXES:
            _not_the_bundled(raw.invocation / candidate, str(candidate), str(candidate))
            paths.append(raw.invocation / candidate)
    unique: dict[Path, None] = {}
    for path in paths:
        unique.setdefault(path.resolve(), None)
    return tuple(unique)


def may_carry_specs(raw: RawOptions) -> bool:
    """Whether the targets given could name their own specs: a targets file (its second
    column), an inventory (``gpuhost_spec``) or a target URL with ``?spec=``."""
    if any(raw.text(name) or raw.ini_text(name) for name in ("inventory", "targets_file")):
        return True
    return any("spec" in _query(url) for url in (*raw.words("targets"),
                                                 *raw.ini_words("targets")))


def _query(url: str) -> dict[str, list[str]]:
    """The parameters of a target URL as given; none for one that is no URL."""
    from urllib.parse import parse_qs, urlsplit

    try:
        return parse_qs(urlsplit(url.strip()).query, keep_blank_values=True)
    except ValueError:
        return {}
