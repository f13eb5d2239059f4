"""The kernel's cpulist format (``0-3,8,10-11``): sysfs ``online``, ``related_cpus``."""

from __future__ import annotations

from collections.abc import Iterable

MAX_CPUS = 65536
"""No kernel has more CPUs (x86's NR_CPUS tops out at 8192): a larger number or a longer list
in a cpulist is a damaged or hostile file, refused before a range of it is walked."""


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format).

    ValueError, saying why, for anything else: a part that is not ``N`` or ``N-M`` with N <= M,
    a CPU number of MAX_CPUS or more, or more than MAX_CPUS CPUs in all."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or not part.isascii():
            raise ValueError(f"{part[:40]!r} is not a CPU number or a range N-M")
        if len(low) > 6 or len(high) > 6 or max(int(low), int(high or low)) >= MAX_CPUS:
            raise ValueError(f"{part[:40]!r} names a CPU number of {MAX_CPUS} or more")
        first, last = int(low), int(high or low)
        if first > last:
            raise ValueError(f"{part!r} is a range that runs backwards")
        if len(cpus) + last - first + 1 > MAX_CPUS:
            raise ValueError(f"the list names more than {MAX_CPUS} CPUs")
        cpus.extend(range(first, last + 1))
    return cpus


def fold_cpu_list(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> ``0-3,8``."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = 0
    while start < len(ordered):
        end = start
        while end + 1 < len(ordered) and ordered[end + 1] == ordered[end] + 1:
            end += 1
        low, high = ordered[start], ordered[end]
        runs.append(str(low) if low == high else f"{low}-{high}")
        start = end + 1
    return ",".join(runs)
