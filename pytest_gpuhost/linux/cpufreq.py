"""The cpufreq sysfs layout: one ``policyN`` directory per group of CPUs that share a clock.

``sys/devices/system/cpu/cpufreq/policyN/`` holds ``scaling_driver``, ``scaling_governor``,
``related_cpus`` and, with amd-pstate-epp and intel_pstate in active mode,
``energy_performance_preference``. Boost is global (``cpufreq/boost``, acpi-cpufreq and
amd-pstate before 6.11), per policy (``policyN/boost``, 6.11 on) or, with intel_pstate,
``intel_pstate/no_turbo`` (inverted: 1 means boost off). A VM often has none of them.
"""

from __future__ import annotations

import re

CPUFREQ = "sys/devices/system/cpu/cpufreq"
GLOBAL_BOOST = f"{CPUFREQ}/boost"
INTEL_NO_TURBO = "sys/devices/system/cpu/intel_pstate/no_turbo"
_POLICY = re.compile(r"policy(\d+)\Z")


def policies(names: list[str]) -> list[str]:
    """The ``policyN`` entries of a cpufreq listing, in CPU order (policy2 before policy10)."""
    found = [(int(m.group(1)), name) for name in names if (m := _POLICY.match(name))]
    return [name for _, name in sorted(found)]


def policy_path(policy: str, attribute: str) -> str:
    return f"{CPUFREQ}/{policy}/{attribute}"
