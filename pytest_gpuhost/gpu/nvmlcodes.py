"""What NVML's codes mean, in words: P2P status, topology levels and the clocks event
reasons. Nothing imported: the agent's answers (``agentnvml``) and nvidia-ml-py's wrapper
(``nvmllib``) both read them."""

P2P_STATUS = {  # nvmlGpuP2PStatus_t
    0: "ok",
    1: "the chipset does not support P2P",
    2: "the GPU does not support P2P",
    3: "the IOH topology does not support P2P",
    4: "P2P is disabled by a registry key",
    5: "P2P is not supported",
    6: "P2P status unknown",
}

TOPOLOGY = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
"""nvmlGpuTopologyLevel_t: INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM."""

CLOCKS_EVENT_REASONS = {  # nvmlClocksEventReasons (nvml.h's nvmlClocksEventReason* bits)
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
"""Each reason's bit, named as nvidia-smi's ``clocks_event_reasons.*`` fields name them."""


def event_reasons(bits: int) -> list[str]:
    """The names of the reasons set in ``bits`` (an unnamed bit as its hex)."""
    named = [name for name, bit in CLOCKS_EVENT_REASONS.items() if bits & bit]
    rest = bits & ~sum(CLOCKS_EVENT_REASONS.values())
    return named + ([f"{rest:#x}"] if rest else [])
