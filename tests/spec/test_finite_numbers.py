"""Every number a spec gives is a finite number: NaN passes every comparison it is in
(``observed >= nan`` is never false for a check written as ``not observed < floor``) and an
infinity makes a bound that means nothing, so a spec that holds one is refused, at its line,
wherever the number is read: a YAML float (``.nan``, ``.inf``, ``1.0e+999``) or a string a kind
reads as a number (``nan W``, ``inf%``, ``1e999 GiB``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from pytest_gpuhost import builtin
from pytest_gpuhost.specmodel import SpecError, load_spec

KINDS = {kind.section: kind for kind in builtin.pytest_gpuhost_check_kinds()}
CONDITIONS = set(builtin.pytest_gpuhost_conditions())
EVERY_NUMBER = """\
version: 1
sysctl:
  vm.swappiness: {min: 1, max: 10}  # integers
  vm.dirty_ratio: 5  # text, integers
  net.core.rmem_max: {one_of: [16777216, 33554432]}  # text, integers
gpus:
  count: 8  # integers
  max_link_generation: {min: 5}
  power_limit: {min: 600, max: "700 W"}
  bar1: {min: 96GiB, max: 98304 MiB}
pcie:
  max_read_request: 4096
  max_payload: {min: 256}
  link_width: {one_of: [8, 16]}
  max_link_speed: {min: "32.0 GT/s"}
cpuidle:
  disabled: [{name: C2}]
  residency: {window: 250ms}
p2p:
  size: 256MiB  # integers
  floors: {same_numa: 45, cross_numa: 32.5, h2d: 50, d2h: 50.0, path: 0.85}
  concurrent: {floor: 40}
  warn_margin: 5%
  timeout: 600
"""
"""A spec with a number at every place a built-in kind reads one. ``# text``: a sysctl's exact
value may be any text (``nan`` is compared as text, and equals no number); ``# integers``: an
integer of 400 digits is read exactly, as an integer."""
_LEADING_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def _numbers(text: str) -> Iterator[tuple[int, int, bool]]:
    """Each value of ``text`` that is or starts with a number: where that number is, and
    whether the value is written plain (not quoted)."""
    root = yaml.compose(text)
    assert root is not None
    stack: list[yaml.Node] = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            stack.extend(value for key, value in node.value if key.value != "version")
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
        elif isinstance(node, yaml.ScalarNode):
            start = node.start_mark.index + (0 if node.style is None else 1)
            found = _LEADING_NUMBER.match(text, start)
            if found:
                yield start, found.end(), node.style is None


def _variants() -> Iterator[tuple[str, str]]:
    lines = EVERY_NUMBER.splitlines()
    for start, end, plain in _numbers(EVERY_NUMBER):
        line = EVERY_NUMBER.count("\n", 0, start) + 1
        alone = end == len(EVERY_NUMBER) or EVERY_NUMBER[end] in ",}]\n" or (
            EVERY_NUMBER[end] == '"' and not plain)
        comment = lines[line - 1].partition("#")[2]
        words = [".nan", ".inf", "-.inf", "1.0e+999"] if plain and alone else []
        words += [] if "text" in comment else ["nan", "inf", "1e999"]
        words += [] if "integers" in comment else ["9" * 400]
        for word in words:
            text = EVERY_NUMBER[:start] + word + EVERY_NUMBER[end:]
            yield f"line {line} ({lines[line - 1].partition('#')[0].strip()}): {word[:8]}", text


VARIANTS = dict(_variants())


def test_the_spec_of_every_number_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(EVERY_NUMBER)
    load_spec(path, KINDS, CONDITIONS)
    assert len(VARIANTS) > 90  # every place above, in every form


@pytest.mark.parametrize("text", list(VARIANTS.values()), ids=list(VARIANTS))
def test_a_number_that_is_not_finite_is_refused_at_its_line(tmp_path: Path, text: str) -> None:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as error:
        load_spec(path, KINDS, CONDITIONS, display=lambda p: p.name)
    assert error.value.where.startswith("spec.yaml:")
