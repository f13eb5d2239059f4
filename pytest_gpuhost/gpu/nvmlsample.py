"""One sample of every GPU of a host, for a benchmark's envelope: what its own NVIDIA driver
says now, in one round trip, never from a cache (``take_sample``).

The host's agent reads it (``Gpus.sample``: the root's libnvidia-ml.so.1 through ctypes, or
``nvidia-smi --query-gpu`` and ``--query-compute-apps`` where no library loads) on the machine
that has the GPUs: this one for a local root, the target for ssh://, the container's host for
lxc://. Each GPU's answer becomes its ``GpuFacts`` (``gpufacts.py``, the one model a sampler
plugin builds and the envelope judges); a fact the driver does not support (or that failed) is
None, and ``missing`` says why, by the fact's name (``violations.thermal`` for one policy), so
one missing fact never loses the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ..bounded import StillRunning, within
from ..host import SYSTEM_CLOCK, Clock, GpuSampling, Host, HostError
from ..linux.pciaddr import normalize_address
from .gpufacts import POLICIES as POLICIES  # re-exported: this module's name of them
from .gpufacts import GpuFacts
from .nvmlapi import NVML_TIMEOUT_S, NvmlHung, NvmlUnavailable, RemappedRows


class Violation(msgspec.Struct, frozen=True):
    """nvmlViolationTime_t as the agent answers it: the driver's stamp (us) and the time spent
    in violation (ns)."""

    reference_time: int
    violation_time: int


class Process(msgspec.Struct, frozen=True):
    """A compute process as the agent answers it: its pid in the GPU's host's pid namespace,
    its used memory (bytes; None where the driver does not say), its name where nvidia-smi
    gave it."""

    pid: int
    used_memory: int | None = None
    name: str | None = None


class Sample(msgspec.Struct, frozen=True):
    source: str
    """Which driver answered: the library (and its path) or nvidia-smi."""
    monotonic: float
    """The agent's clock when the sample began."""
    gpus: dict[str, GpuFacts]


_PLAIN = ("clocks_event_reasons", "sm_clock", "mem_clock", "max_sm_clock", "max_mem_clock",
          "temperature", "power_usage", "power_limit", "pcie_replays", "link_generation",
          "link_width")


def _why(value: object) -> str | None:
    """Why a fact is missing (the agent's ``{"error": ..., "unsupported": true}``), or None."""
    if isinstance(value, Mapping) and "error" in value:
        said = str(value["error"])
        return f"not supported: {said}" if value.get("unsupported") is True else said
    return None


def moment(wire: Mapping[str, object]) -> GpuFacts:
    """A GPU's facts from the agent's answer (a value of the wrong shape is missing)."""
    missing: dict[str, str] = {}
    found: dict[str, Any] = {}
    for key in (*_PLAIN, "processes", "remapped_rows", "retired_pages_pending"):
        value = wire.get(key)
        why = _why(value) or (None if value is not None else "not reported")
        if why is not None:
            missing[key] = why
        else:
            found[key] = value
    violations: dict[str, Violation] = {}
    reported = wire.get("violations")
    for policy in POLICIES:
        value = reported.get(policy) if isinstance(reported, Mapping) else None
        why = _why(value) or (None if value is not None else "not reported")
        if why is not None:
            missing[f"violations.{policy}"] = why
            continue
        try:
            violations[policy] = msgspec.convert(value, Violation)
        except msgspec.ValidationError as exc:
            missing[f"violations.{policy}"] = str(exc)
    ecc: dict[str, int] = {}
    counts = wire.get("ecc_errors")
    for count in ("corrected_volatile", "uncorrected_volatile"):
        value = counts.get(count) if isinstance(counts, Mapping) else None
        if isinstance(value, int) and not isinstance(value, bool):
            ecc[count] = value
        else:
            missing[f"ecc_errors.{count}"] = _why(value) or "not reported"
    for key, value in list(found.items()):
        try:
            found[key] = msgspec.convert(value, _TYPES[key])
        except msgspec.ValidationError as exc:
            missing[key] = f"not understood: {exc}"
            del found[key]
    return _facts(found, violations, ecc, missing, float(str(wire.get("monotonic", 0.0))))


def _facts(found: Mapping[str, Any], violations: Mapping[str, Violation],
           ecc: Mapping[str, int], missing: dict[str, str], monotonic: float) -> GpuFacts:
    """The facts of the agent's answer, each under its ``GpuFacts`` name."""
    rows: RemappedRows | None = found.get("remapped_rows")
    processes: tuple[Process, ...] | None = found.get("processes")
    stamps = [v.reference_time for v in violations.values()]
    return GpuFacts(
        violation_ns={policy: v.violation_time for policy, v in violations.items()},
        violation_at_us=max(stamps) if stamps else None,
        reasons=found.get("clocks_event_reasons"), sm_clock=found.get("sm_clock"),
        sm_max=found.get("max_sm_clock"), mem_clock=found.get("mem_clock"),
        mem_max=found.get("max_mem_clock"), temperature=found.get("temperature"),
        power_mw=found.get("power_usage"), power_limit_mw=found.get("power_limit"),
        processes=None if processes is None else {p.pid: p.name or "" for p in processes},
        process_memory={p.pid: p.used_memory for p in processes or ()
                        if p.used_memory is not None},
        ecc_corrected=ecc.get("corrected_volatile"),
        ecc_uncorrected=ecc.get("uncorrected_volatile"),
        remapped_pending=None if rows is None else rows.pending,
        remapped_failure=None if rows is None else rows.failure,
        remapped_corrected=None if rows is None else rows.corrected,
        remapped_uncorrected=None if rows is None else rows.uncorrected,
        retired_pages_pending=found.get("retired_pages_pending"),
        pcie_replays=found.get("pcie_replays"), link_generation=found.get("link_generation"),
        link_width=found.get("link_width"), monotonic=monotonic, missing=missing)


_TYPES: dict[str, Any] = {**dict.fromkeys(_PLAIN, int), "processes": tuple[Process, ...],
                             "remapped_rows": RemappedRows, "retired_pages_pending": bool}


def take_sample(host: Host, *, timeout: float = NVML_TIMEOUT_S,
                clock: Clock = SYSTEM_CLOCK) -> Sample:
    """Every GPU of ``host`` now, in one round trip (``GpuSampling.sample_gpus``);
    NvmlUnavailable with why where the host has no NVIDIA driver to ask, HostError where it
    cannot be reached, NvmlHung where the driver did not answer within ``timeout`` seconds of
    ``clock`` (a GPU fallen off the bus blocks NVML in the kernel: on this machine the call is
    left behind in its thread, as ``bounded.within`` does)."""
    if not isinstance(host, GpuSampling):
        raise NvmlUnavailable(f"{host.describe()} has no NVIDIA driver of its own to sample")
    try:
        wire = within(timeout, host.sample_gpus, name="nvml-sample", clock=clock)
    except StillRunning:
        raise NvmlHung(f"the GPU sample of {host.describe()} did not return within "
                       f"{timeout:g} s: a GPU may have fallen off the bus or the driver is "
                       "wedged (look for Xid 79 in the kernel log)") from None
    if "unavailable" in wire:
        raise NvmlUnavailable(str(wire["unavailable"]))
    gpus = wire.get("gpus")
    if not isinstance(gpus, Mapping):
        raise HostError(f"{host.describe()}: the GPU sample lists no GPUs: {wire!r:.80}")
    return Sample(str(wire.get("source", "")), float(str(wire.get("monotonic", 0.0))),
                  {normalize_address(str(address)): moment(gpu) for address, gpu in
                   gpus.items() if isinstance(gpu, Mapping)})
