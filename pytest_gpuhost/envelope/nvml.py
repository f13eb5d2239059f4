"""The built-in GPU sampler of a benchmark's envelope: one sample of every GPU from the host's
own NVIDIA driver (``gpu.nvmlsample.take_sample``: the library through ctypes, or nvidia-smi's
fields where no library loads, read by the host's agent in one round trip, where the GPUs are),
as the envelope's facts.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..gpu.nvmlapi import NvmlUnavailable
from ..gpu.nvmlsample import Moment, take_sample
from ..host import GpuSampling, Host
from .facts import GpuFacts, NoGpus


def facts_of(moment: Moment) -> GpuFacts:
    """One GPU's moment as the envelope's facts (a fact the driver did not give: None)."""
    rows = moment.remapped_rows
    processes = None if moment.processes is None else \
        {process.pid: process.name or "" for process in moment.processes}
    stamps = {v.reference_time for v in moment.violations.values()}
    return GpuFacts(
        violation_ns={policy: v.violation_time for policy, v in moment.violations.items()},
        violation_at_us=max(stamps) if stamps else None,
        reasons=moment.clocks_event_reasons, sm_clock=moment.sm_clock,
        sm_max=moment.max_sm_clock, mem_clock=moment.mem_clock, mem_max=moment.max_mem_clock,
        temperature=moment.temperature, power_mw=moment.power_usage,
        power_limit_mw=moment.power_limit, processes=processes,
        ecc_corrected=moment.ecc_errors.get("corrected_volatile"),
        ecc_uncorrected=moment.ecc_errors.get("uncorrected_volatile"),
        remapped_pending=rows.pending if rows is not None else None,
        remapped_failure=rows.failure if rows is not None else None,
        pcie_replays=moment.pcie_replays, link_generation=moment.link_generation,
        link_width=moment.link_width)


class NvmlSampler:
    """Every GPU of ``host`` through its agent; NoGpus where it has no NVIDIA driver."""

    def __init__(self, host: GpuSampling | Host) -> None:
        self.host = host
        self.source: str | None = None

    def describe(self) -> str:
        return self.source or "NVML"

    def sample(self) -> Mapping[str, GpuFacts]:
        try:
            taken = take_sample(self.host)  # type: ignore[arg-type]  # a Host that samples
        except NvmlUnavailable as exc:
            raise NoGpus(str(exc)) from None
        self.source = taken.source
        return {address: facts_of(moment) for address, moment in taken.gpus.items()}
