"""The GPUs through ``nvidia-smi`` under the root, where the NVML library cannot be loaded: its
``--query-gpu`` answer in the form the library's facts have, and a setting changed with its
flags."""

from __future__ import annotations

import errno

from .errors import OpError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from collections.abc import Callable

    from .commands import Commands

SMI_FIELDS = ("pci.bus_id", "driver_version", "persistence_mode", "pcie.link.gen.max",
              "enforced.power.limit", "power.min_limit", "power.max_limit", "ecc.mode.current",
              "ecc.mode.pending")
"""What ``nvidia-smi --query-gpu`` reports of each GPU where the library cannot be loaded."""


def bus_id(raw: str) -> str:
    """NVML's ``00000000:81:00.0`` as sysfs names it: ``0000:81:00.0``."""
    parts = raw.strip().lower().split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def smi_facts(root: Commands, problem: str) -> dict[str, object]:
    """The GPUs as ``nvidia-smi --query-gpu`` reports them (``problem``: why the library
    could not be loaded, said with them)."""
    done = root.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                     "--format=csv,noheader,nounits"], timeout=60.0)
    if done["returncode"] != 0:
        return {"unavailable": f"{problem}; and nvidia-smi --query-gpu exited "
                               f"{done['returncode']}: {str(done['stderr']).strip()[-300:]}"}
    gpus: dict[str, object] = {}
    driver = ""
    for line in str(done["stdout"]).splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            continue
        row = {field: cells[index] for index, field in enumerate(SMI_FIELDS)}
        driver = row["driver_version"]
        gpus[bus_id(row["pci.bus_id"])] = {
            "persistence_mode": _smi(row["persistence_mode"], _enabled),
            "max_link_generation": _smi(row["pcie.link.gen.max"], int),
            "power_limit": _smi(row["enforced.power.limit"], _milliwatts),
            "power_limit_range": _smi(f"{row['power.min_limit']} {row['power.max_limit']}",
                                      lambda text: [_milliwatts(w) for w in text.split()]),
            "ecc_mode": _smi(f"{row['ecc.mode.current']} {row['ecc.mode.pending']}",
                             lambda text: [_enabled(word) for word in text.split()]),
        }
    return {"source": "nvidia-smi --query-gpu", "library_problem": problem,
            "driver_version": driver, "gpus": gpus}


def smi_set(root: Commands, address: str, setting: str, value: str) -> None:
    """One setting of one GPU changed with nvidia-smi's flags."""
    flags = {"persistence_mode": "-pm", "power_limit": "-pl", "ecc": "-e"}
    if setting not in flags:
        raise OpError(f"no NVML setting {setting!r}", errno.EINVAL)
    word = value if setting == "power_limit" else ("1" if value == "enabled" else "0")
    done = root.run(["nvidia-smi", "-i", address, flags[setting], word], timeout=60.0)
    if done["returncode"] != 0:
        said = (str(done["stderr"]) + str(done["stdout"])).strip()[-300:]
        raise OpError(f"nvidia-smi -i {address} {flags[setting]} {word} exited "
                      f"{done['returncode']}: {said}",
                      errno.EPERM if "permission" in said.lower() else errno.EIO)


def _enabled(word: str) -> bool:
    if word not in ("Enabled", "Disabled"):
        raise ValueError(f"not Enabled or Disabled: {word!r}")
    return word == "Enabled"


def _milliwatts(text: str) -> int:
    return round(float(text) * 1000)


def _smi(text: str, parse: Callable[[str], object]) -> object:
    """A value nvidia-smi reported, or why it did not (``[N/A]``, ``[Not Supported]``)."""
    try:
        return parse(text)
    except ValueError:
        return {"error": f"nvidia-smi reports {text!r}"}
