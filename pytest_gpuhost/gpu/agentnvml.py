"""NVML of a machine that is not this one: what its own NVIDIA driver says, asked by the agent.

This process's NVML describes this machine's GPUs only, so on an ssh target (or a container,
or a fake tree with a driver of its own) the agent asks the target's own libnvidia-ml.so.1
through ctypes (stdlib only, nothing installed), or ``nvidia-smi --query-gpu`` where the
library cannot be loaded (``host.agent.Gpus``): one ``GpuQuery`` answers every NVML check of
the target, read in the run's batches like a file, and a fix of persistence mode, the power
limit or the ECC mode is made there (``GpuControl.set_gpu``), then read back live.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping

import msgspec

from ..host import GpuControl, GpuQuery, Host, HostError
from ..linux.pciaddr import normalize_address
from .nvmlapi import (
    NvmlNotSupported,
    NvmlPermissionError,
    NvmlUnavailable,
    RemappedRows,
    persistence_text,
)


def agent_facts(host: Host) -> Mapping[str, object]:
    """The target's GPU facts (``agent.Gpus.facts``); NvmlUnavailable with why it has none."""
    [reply] = host.batch([GpuQuery()])
    facts = reply.get()
    if not isinstance(facts, Mapping):
        raise HostError(f"{host.describe()}: the NVML facts are not a mapping: {facts!r:.80}")
    if "unavailable" in facts:
        raise NvmlUnavailable(str(facts["unavailable"]))
    return facts


class AgentNvml:
    """``Nvml`` of a target, from its agent's answer to ``GpuQuery`` (read fresh after any change
    made through the host: the run's cache forgets it then)."""

    reads = (GpuQuery(),)

    def __init__(self, host: Host) -> None:
        self.host = host

    def _facts(self) -> Mapping[str, object]:
        try:
            return agent_facts(self.host)
        except NvmlUnavailable as exc:  # it had NVML when opened: a failure, not an absence
            raise HostError(str(exc)) from None

    def _value(self, facts: Mapping[str, object], key: str, source: str = "") -> object:
        value = facts.get(key)
        if isinstance(value, Mapping) and "error" in value:
            if value.get("unsupported") is True:
                raise NvmlNotSupported(str(value["error"]))
            raise HostError(str(value["error"]))
        if value is None:
            raise HostError(f"{source or self._source(facts)} does not report {key}")
        return value

    @staticmethod
    def _source(facts: Mapping[str, object]) -> str:
        return str(facts.get("source") or "the target's NVML")

    def _gpus(self) -> Mapping[str, object]:
        gpus = self._facts().get("gpus")
        if not isinstance(gpus, Mapping):
            raise HostError("the target's NVML lists no GPUs")
        return {normalize_address(str(address)): gpu for address, gpu in gpus.items()}

    def _gpu(self, address: str, key: str) -> object:
        facts = self._facts()
        gpu = self._gpus().get(address)
        if not isinstance(gpu, Mapping):
            raise HostError(f"NVML has no GPU at {address}")
        return self._value(gpu, key, self._source(facts))

    def _number(self, address: str, key: str) -> int:
        value = self._gpu(address, key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise HostError(f"NVML {key} of {address} is not a number: {value!r:.40}")
        return value

    def _pair(self, address: str, key: str) -> tuple[object, object]:
        value = self._gpu(address, key)
        if not isinstance(value, list) or len(value) != 2:
            raise HostError(f"NVML {key} of {address} is not a pair: {value!r:.40}")
        return value[0], value[1]

    def driver_version(self) -> str:
        return str(self._value(self._facts(), "driver_version"))

    def library_version(self) -> str:
        return str(self._value(self._facts(), "library_version"))

    def gpus(self) -> list[str]:
        return list(self._gpus())

    def persistence_mode(self, address: str) -> bool:
        return self._gpu(address, "persistence_mode") is True

    def max_link_generation(self, address: str) -> int:
        return self._number(address, "max_link_generation")

    def power_limit(self, address: str) -> int:
        return self._number(address, "power_limit")

    def power_limit_range(self, address: str) -> tuple[int, int]:
        low, high = self._pair(address, "power_limit_range")
        return int(str(low)), int(str(high))

    def ecc_mode(self, address: str) -> tuple[bool, bool]:
        current, pending = self._pair(address, "ecc_mode")
        return current is True, pending is True

    def bar1_total(self, address: str) -> int:
        return self._number(address, "bar1_total")

    def name(self, address: str) -> str:
        value = self._gpu(address, "name")
        if not isinstance(value, str):
            raise HostError(f"NVML name of {address} is not text: {value!r:.40}")
        return value

    def ecc_errors(self, address: str, count: str) -> int:
        counts = self._gpu(address, "ecc_errors")
        if not isinstance(counts, Mapping):
            raise HostError(f"NVML ecc_errors of {address} is not a mapping: {counts!r:.40}")
        value = self._value(counts, count, self._source(self._facts()))
        if isinstance(value, bool) or not isinstance(value, int):
            raise HostError(f"NVML {count} ECC errors of {address} is not a number: "
                            f"{value!r:.40}")
        return value

    def remapped_rows(self, address: str) -> RemappedRows:
        rows = self._gpu(address, "remapped_rows")
        try:
            return msgspec.convert(rows, RemappedRows)
        except msgspec.ValidationError as exc:
            raise HostError(f"NVML remapped_rows of {address}: {exc}") from None

    def retired_pages_pending(self, address: str) -> bool:
        return self._gpu(address, "retired_pages_pending") is True

    def temperature(self, address: str) -> int:
        return self._number(address, "temperature")

    def clocks_event_reasons(self, address: str) -> int:
        return self._number(address, "clocks_event_reasons")

    def _levels(self, key: str) -> Mapping[str, object]:
        facts = self._facts()
        levels = facts.get(key)
        if not isinstance(levels, Mapping):
            raise HostError(f"{self._source(facts)} does not report {key.replace('_', ' ')}")
        return levels

    def p2p_read_status(self, source: str, target: str) -> str:
        from .nvmlcodes import P2P_STATUS  # the p2p checks' (a spec without them: unread)

        status = self._levels("p2p").get(f"{source}->{target}", 0)
        return "ok" if not status else P2P_STATUS.get(int(str(status)), f"P2P status {status}")

    def topology(self, one: str, other: str) -> str | None:
        from .nvmlcodes import TOPOLOGY  # the p2p checks' and the topology report's

        levels = self._levels("topology")
        level = levels.get(f"{one}->{other}", levels.get(f"{other}->{one}"))
        return TOPOLOGY.get(int(str(level))) if level is not None else None

    def _set(self, address: str, setting: str, value: str) -> None:
        if not isinstance(self.host, GpuControl):
            raise HostError(f"{self.host.describe()} cannot change {setting} (no NVIDIA driver "
                            "of its own to ask)")
        try:
            self.host.set_gpu(address, setting, value)
        except HostError as exc:
            if exc.errno == errno.EPERM:
                raise NvmlPermissionError(f"NVML refused ({exc}): setting {setting} needs "
                                          "root") from None
            raise

    def set_persistence_mode(self, address: str, enabled: bool) -> None:
        self._set(address, "persistence_mode", persistence_text(enabled))

    def set_power_limit(self, address: str, milliwatts: int) -> None:
        self._set(address, "power_limit", f"{milliwatts / 1000:g}")

    def set_ecc_mode(self, address: str, enabled: bool) -> None:
        self._set(address, "ecc", persistence_text(enabled))
