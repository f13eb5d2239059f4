"""The built-in GPU sampler of a benchmark's envelope: one sample of every GPU from the host's
own NVIDIA driver (``gpu.nvmlsample.take_sample``: the library through ctypes, or nvidia-smi's
fields where no library loads, read by the host's agent in one round trip, where the GPUs are),
whose ``GpuFacts`` are the envelope's facts as they come.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..gpu.nvmlapi import NvmlUnavailable
from ..gpu.nvmlsample import take_sample
from ..host import GpuSampling, Host
from .facts import GpuFacts, NoGpus


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
        return taken.gpus
