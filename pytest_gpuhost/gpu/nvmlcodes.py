"""What NVML's codes mean, in words: P2P status and topology levels. Nothing imported: the
agent's answers (``agentnvml``) and nvidia-ml-py's wrapper (``nvmllib``) both read them."""

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
