"""A pure-Python GPU sampler whose GPUs a test moves between samples: throttled, a stray
process, an ECC error, a replay burst."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from pytest_gpuhost.envelope.facts import GpuFacts

A = "0000:41:00.0"
B = "0000:c1:00.0"


class FakeGpus:
    """Each GPU's facts as the test last set them; every ``sample()`` reads them as they are
    and counts itself."""

    def __init__(self, *addresses: str) -> None:
        self.gpus = {address: GpuFacts(
            violation_ns={"power": 0, "thermal": 0}, reasons=0, sm_clock=1980, sm_max=1980,
            mem_clock=2619, mem_max=2619, temperature=40, power_mw=300_000,
            power_limit_mw=700_000, processes={}, ecc_corrected=0, ecc_uncorrected=0,
            remapped_pending=False, remapped_failure=False, pcie_replays=0,
            link_generation=5, link_width=16) for address in addresses or (A,)}
        self.calls = 0
        self.error: Exception | None = None

    def describe(self) -> str:
        return "fake GPUs"

    def set(self, address: str, **changes: object) -> None:
        self.gpus[address] = msgspec.structs.replace(self.gpus[address], **changes)

    def sample(self) -> Mapping[str, GpuFacts]:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return dict(self.gpus)
