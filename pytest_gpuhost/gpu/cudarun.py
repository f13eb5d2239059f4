"""The ``cuda`` probe: our own measurement on cuda-python (``cudaprobe``), of this machine only.
Under ``auto`` it is here where the root is this machine and cuda-python is installed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..host import HostError

if TYPE_CHECKING:
    from ..host import Request
    from .bandwidth import Measurements
    from .probe import Measuring, ProbeSettings


class CudaProbe:
    def reads(self, section: ProbeSettings) -> tuple[Request, ...]:
        return ()

    def auto_reads(self) -> tuple[Request, ...]:
        return ()

    def here(self, measuring: Measuring) -> str | None:
        from . import cudaprobe

        return "cuda" if measuring.real and cudaprobe.cuda_available() else None

    def measure(self, measuring: Measuring, source: str | None) -> Measurements:
        from .cudaprobe import (
            CudaBandwidth,
            CudaError,
            CudaUnavailable,
            load_runtime,
            measure_within,
        )

        if not measuring.real:
            raise HostError(f"probe cuda measures this machine, but the host root "
                            f"{measuring.host.describe()} is not it")
        section, wanted = measuring.section, measuring.wanted
        try:
            runtime = load_runtime()
            probe = CudaBandwidth(runtime, section.size)
            return measure_within(section.timeout, lambda: probe.measure(
                measuring.gpus, pairs=wanted["pairs"], h2d=wanted["h2d"], d2h=wanted["d2h"],
                ring=wanted["ring"]))
        except (CudaUnavailable, CudaError) as exc:
            raise HostError(f"probe cuda: {exc}") from exc
