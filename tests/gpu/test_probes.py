"""The bandwidth probes are a registry (``gpu.probes.PROBES``): one module and one line each, the
names the p2p section accepts, and ``auto`` asks them in the registry's order."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from pytest_gpuhost.checks import p2p
from pytest_gpuhost.gpu import measure, probes
from pytest_gpuhost.gpu.probe import BandwidthProbe
from pytest_gpuhost.host import LocalHost, Read, Which
from pytest_gpuhost.specmodel import EntryOptions


def test_every_probe_the_p2p_section_names_is_registered_and_only_those() -> None:
    named = {name.split(":")[0] for name in p2p.PROBES if name != "auto"}
    assert set(probes.PROBES) == named, "a probe is one module and one line of gpu.probes.PROBES"


@pytest.mark.parametrize("name", sorted(probes.PROBES))
def test_each_probe_is_one_module_with_what_a_probe_declares(name: str) -> None:
    probe = probes.probe_named(name)
    module = inspect.getmodule(probe)
    assert module is not None and module.__name__.endswith(f".{probes.PROBES[name][0]}")
    for member in ("reads", "auto_reads", "here", "measure"):
        assert inspect.signature(getattr(type(probe), member)).parameters.keys() == \
            inspect.signature(getattr(BandwidthProbe, member)).parameters.keys(), member


def test_auto_reads_what_each_probe_would_read_to_say_it_is_here() -> None:
    section = p2p.P2pSection("auto", None, 1, (), 0.0, None, EntryOptions("spec.yaml:2"))
    assert measure.probe_reads(section) == (
        Which("nvbandwidth"), *(Read(f"var/lib/pytest-gpuhost/{name}")
                                for name in measure.RECORDED))


def test_auto_in_a_fake_tree_takes_its_recorded_output(tmp_path: Path) -> None:
    recorded = tmp_path / "var/lib/pytest-gpuhost/nvbandwidth.json"
    recorded.parent.mkdir(parents=True)
    recorded.write_text('{"nvbandwidth": {"testcases": []}}')
    section = p2p.P2pSection("auto", None, 1, (), 0.0, None, EntryOptions("spec.yaml:2"))
    measurer = measure.Measurer(section, LocalHost(tmp_path), (), {})
    found = [probe.here(measurer) for probe in probes.every_probe()]
    assert found == [None, None, "var/lib/pytest-gpuhost/nvbandwidth.json"]


@pytest.mark.parametrize("name", sorted(probes.COLLECTIVE_PROBES))
def test_each_collective_probe_is_one_module_and_one_line(name: str) -> None:
    probe = probes.collective_probe(name)
    module = inspect.getmodule(probe)
    assert module is not None and module.__name__.endswith(
        f".{probes.COLLECTIVE_PROBES[name][0]}")
    assert probe.reads("all_reduce") == (Which("all_reduce_perf"),)
    assert probe.reads("all_reduce", "opt/nccl-tests/build") == ()  # run by its path there
