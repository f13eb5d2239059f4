"""A check of a named target as every report names it: its test id, ``sysctl[vm.swappiness]@pve``.

pytest 9.2 reads a node id's parameters from its first ``[`` to its end (``NodeId.parse``), so
an id with text after its brackets became ``sysctl[vm.swappiness]@pve]`` wherever pytest
parses the id back from its text: JUnit's test case names (``mangle_test_address``), and,
under xdist, whose reports cross as text, the short summary and every line built from the
report's id. The controller gives such a report the id its item has (the whole name, no
parameters) before any reporter reads it, and JUnit's test case its name: JUnit keeps an
attribute set before its own (``record_testreport`` restores them), as ``record_xml_attribute``
relies on.
"""

from __future__ import annotations

from typing import Any

import pytest


def ill_parsed(nodeid: str) -> bool:
    """Whether pytest 9.2 reads text after the id's brackets as parameters."""
    rest = nodeid.partition("::")[2]
    return "[" in rest and not rest.endswith("]")


def whole_id(report: pytest.TestReport) -> None:
    """``report``'s id as its item has it, where the report holds a parsed one (pytest >= 9.2;
    earlier versions keep the id as text): the names after the path whole, no parameters."""
    parsed = getattr(report, "_id", None)  # the item's own id has no parameters
    if getattr(parsed, "params", None) is None:
        return
    from _pytest.nodeid import NodeId  # pytest >= 9.2, which made ``parsed``

    path, _, rest = report.nodeid.partition("::")
    # pytest's structured id has no setter but the text, which would parse it the same way
    report._id = NodeId(path=path, names=tuple(rest.split("::")))


def junit_name(config: pytest.Config, report: pytest.TestReport) -> None:
    """JUnit's test case for ``report`` named as its id's last part, where a JUnit file is
    written."""
    from _pytest.junitxml import bin_xml_escape, xml_key

    xml: Any = config.stash.get(xml_key, None)
    if xml is not None:
        name = report.nodeid.rpartition("::")[2]
        xml.node_reporter(report).attrs["name"] = bin_xml_escape(name)


class NodeNames:
    """Registered on the controller (xdist's, or the one process): each report of a check
    of a named target is named as its id says, before the terminal and JUnit read it."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if ill_parsed(report.nodeid):
            whole_id(report)
            junit_name(self.config, report)
