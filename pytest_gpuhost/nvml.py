"""The old import path of the NVML interface and its fakes (a conftest's ``pytest_gpuhost_nvml``
returns ``lambda: FakeNvml(...)``): they live in ``pytest_gpuhost.gpu.nvml``."""

from __future__ import annotations

from .gpu.nvml import (
    FakeGpu,
    FakeNvml,
    Nvml,
    NvmlFactory,
    NvmlPermissionError,
    NvmlUnavailable,
    RecordedNvml,
)

__all__ = ["FakeGpu", "FakeNvml", "Nvml", "NvmlFactory", "NvmlPermissionError",
           "NvmlUnavailable", "RecordedNvml"]
