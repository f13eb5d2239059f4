"""The GPUs through ``nvidia-smi`` under the root, where the NVML library cannot be loaded: its
``--query-gpu`` answer in the form the library's facts have (settings and health in one
query; where this nvidia-smi lacks a health field, the settings asked alone: it loses those facts
only), one sample (``--query-gpu`` and ``--query-compute-apps``) in the form of the library's, and a
setting changed with its flags. A field nvidia-smi reports as ``[N/A]`` or ``[Not Supported]``
is ``{"error": ..., "unsupported": true}``, as a call the library does not support."""

from __future__ import annotations

import errno
import time

from .errors import OpError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for the type checker only: a start on the target imports neither
    from collections.abc import Callable

    from .commands import Commands

SMI_FIELDS = ("pci.bus_id", "driver_version", "persistence_mode", "pcie.link.gen.max",
              "enforced.power.limit", "power.min_limit", "power.max_limit", "ecc.mode.current",
              "ecc.mode.pending")
"""What ``nvidia-smi --query-gpu`` reports of each GPU where the library cannot be loaded."""


HEALTH_FIELDS = ("pci.bus_id", "name", "temperature.gpu", "clocks_event_reasons.active",
                 "ecc.errors.corrected.volatile.total", "ecc.errors.corrected.aggregate.total",
                 "ecc.errors.uncorrected.volatile.total",
                 "ecc.errors.uncorrected.aggregate.total", "retired_pages.pending",
                 "remapped_rows.correctable", "remapped_rows.uncorrectable",
                 "remapped_rows.pending", "remapped_rows.failure")
"""The health facts' fields (``nvmlreads.health_of``'s), asked with ``SMI_FIELDS`` in one
query; where this nvidia-smi refuses one, the settings are asked alone."""
SAMPLE_FIELDS = ("pci.bus_id", "clocks_event_reasons.active", "clocks.sm", "clocks.mem",
                 "clocks.max.sm", "clocks.max.mem", "temperature.gpu", "power.draw",
                 "enforced.power.limit", "ecc.errors.corrected.volatile.total",
                 "ecc.errors.uncorrected.volatile.total", "remapped_rows.correctable",
                 "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
                 "retired_pages.pending", "pcie.link.gen.gpucurrent", "pcie.link.width.current")
"""A sample's fields (``nvmlreads.moment_of``'s; nvidia-smi has no violation times nor replay
counter to query: those are not supported here)."""
OLD_FIELD_NAMES = {"clocks_event_reasons.active": "clocks_throttle_reasons.active"}
"""What a driver before 535 calls a field (its nvidia-smi refuses the whole query otherwise)."""
APPS_FIELDS = ("gpu_bus_id", "pid", "process_name", "used_memory")
"""``--query-compute-apps``: the compute processes (used memory in MiB)."""
UNSUPPORTED = ("[N/A]", "[Not Supported]", "N/A", "Not Supported")


def bus_id(raw: str) -> str:
    """NVML's ``00000000:81:00.0`` as sysfs names it: ``0000:81:00.0``."""
    parts = raw.strip().lower().split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def smi_facts(root: Commands, problem: str) -> dict[str, object]:
    """The GPUs as ``nvidia-smi --query-gpu`` reports them (``problem``: why the library
    could not be loaded, said with them)."""
    rows, health_problem = smi_query(root, "--query-gpu", SMI_FIELDS + HEALTH_FIELDS[1:])
    if health_problem:  # an nvidia-smi without a health field: the settings alone
        rows, failed = smi_query(root, "--query-gpu", SMI_FIELDS)
        if failed:
            return {"unavailable": f"{problem}; and {failed}"}
    gpus: dict[str, object] = {}
    driver = ""
    for row in rows:
        driver = row["driver_version"]
        gpus[bus_id(row["pci.bus_id"])] = {
            "persistence_mode": _smi(row["persistence_mode"], _enabled),
            "max_link_generation": _smi(row["pcie.link.gen.max"], int),
            "power_limit": _smi(row["enforced.power.limit"], _milliwatts),
            "power_limit_range": _smi(f"{row['power.min_limit']} {row['power.max_limit']}",
                                      lambda text: [_milliwatts(w) for w in text.split()]),
            "ecc_mode": _smi(f"{row['ecc.mode.current']} {row['ecc.mode.pending']}",
                             lambda text: [_enabled(word) for word in text.split()]),
            **smi_health(row, health_problem),
        }
    return {"source": "nvidia-smi --query-gpu", "library_problem": problem,
            "driver_version": driver, "gpus": gpus}


def smi_query(root: Commands, option: str, fields: tuple[str, ...]
              ) -> tuple[list[dict[str, str]], str]:
    """``nvidia-smi --query-...=FIELDS``'s rows by field name, or why there are none (a
    field the driver's nvidia-smi does not know is asked again by its older name)."""
    asked, problem = fields, ""
    for _ in range(2):
        done = root.run(["nvidia-smi", f"{option}={','.join(asked)}",
                         "--format=csv,noheader,nounits"], timeout=60.0)
        if done["returncode"] == 0:
            return [{field: cells[i] for i, field in enumerate(fields)} for cells in
                    ([cell.strip() for cell in line.split(",")]
                     for line in str(done["stdout"]).splitlines())
                    if len(cells) == len(fields)], ""
        said = f"{str(done['stderr']).strip()} {str(done['stdout']).strip()}".strip()
        problem = f"nvidia-smi {option} exited {done['returncode']}: {said[-300:]}"
        older = tuple(OLD_FIELD_NAMES.get(field, field) for field in asked)
        if older == asked:
            break
        asked = older
    return [], problem


def smi_health(row: dict[str, str], problem: str) -> dict[str, object]:
    """One GPU's health facts (as ``nvmlreads.health_of`` gives them) from its row, or
    ``problem`` for each where the query with them failed."""
    if problem:
        return {key: {"error": problem} for key in ("name", "ecc_errors", "remapped_rows",
                                                    "retired_pages_pending", "temperature",
                                                    "clocks_event_reasons")}
    return {"name": _smi(row["name"], _name),
            "ecc_errors": {count: _smi(row[f"ecc.errors.{kind}.{counter}.total"], int)
                           for count, kind, counter in _ECC},
            "remapped_rows": _remapped(row),
            "retired_pages_pending": _smi(row["retired_pages.pending"], _yes),
            "temperature": _smi(row["temperature.gpu"], int),
            "clocks_event_reasons": _smi(row["clocks_event_reasons.active"], _bits)}


def smi_sample(root: Commands, problem: str) -> dict[str, object]:
    """Every GPU now, as ``--query-gpu`` and ``--query-compute-apps`` report it, in the form of
    the library's sample (``problem``: why the library could not be loaded)."""
    rows, failed = smi_query(root, "--query-gpu", SAMPLE_FIELDS)
    if failed:
        return {"unavailable": f"{problem}; and {failed}"}
    apps, apps_failed = smi_query(root, "--query-compute-apps", APPS_FIELDS)
    gpus: dict[str, object] = {}
    for row in rows:
        address = bus_id(row["pci.bus_id"])
        mine = [app for app in apps if bus_id(app["gpu_bus_id"]) == address]
        unsupported = {"error": "nvidia-smi --query-gpu does not report it",
                       "unsupported": True}
        gpus[address] = {
            "monotonic": time.monotonic(),
            "violations": {policy: dict(unsupported) for policy in SMI_POLICIES},
            "clocks_event_reasons": _smi(row["clocks_event_reasons.active"], _bits),
            "sm_clock": _smi(row["clocks.sm"], int), "mem_clock": _smi(row["clocks.mem"], int),
            "max_sm_clock": _smi(row["clocks.max.sm"], int),
            "max_mem_clock": _smi(row["clocks.max.mem"], int),
            "temperature": _smi(row["temperature.gpu"], int),
            "power_usage": _smi(row["power.draw"], _milliwatts),
            "power_limit": _smi(row["enforced.power.limit"], _milliwatts),
            "processes": {"error": apps_failed} if apps_failed else [
                {"pid": int(app["pid"]), "name": app["process_name"],
                 "used_memory": _smi(app["used_memory"], lambda mib: int(mib) * 2**20)}
                for app in mine if app["pid"].isdigit()],
            "ecc_errors": {"corrected_volatile":
                           _smi(row["ecc.errors.corrected.volatile.total"], int),
                           "uncorrected_volatile":
                           _smi(row["ecc.errors.uncorrected.volatile.total"], int)},
            "remapped_rows": _remapped(row),
            "retired_pages_pending": _smi(row["retired_pages.pending"], _yes),
            "pcie_replays": dict(unsupported),
            "link_generation": _smi(row["pcie.link.gen.gpucurrent"], int),
            "link_width": _smi(row["pcie.link.width.current"], int),
        }
    return {"source": "nvidia-smi --query-gpu", "library_problem": problem, "gpus": gpus}


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


_ECC = (("corrected_volatile", "corrected", "volatile"),
        ("corrected_aggregate", "corrected", "aggregate"),
        ("uncorrected_volatile", "uncorrected", "volatile"),
        ("uncorrected_aggregate", "uncorrected", "aggregate"))
SMI_POLICIES = ("power", "thermal", "sync_boost", "board_limit", "reliability",
                "total_app_clocks", "total_base_clocks")


def _remapped(row: dict[str, str]) -> object:
    """remapped_rows.* as nvmlDeviceGetRemappedRows gives them, or why not."""
    cells = [row["remapped_rows.correctable"], row["remapped_rows.uncorrectable"],
             row["remapped_rows.pending"], row["remapped_rows.failure"]]
    for cell in cells:
        if cell in UNSUPPORTED:
            return {"error": f"nvidia-smi reports {cell!r}", "unsupported": True}
    try:
        return {"corrected": int(cells[0]), "uncorrected": int(cells[1]),
                "pending": _yes(cells[2]), "failure": _yes(cells[3])}
    except ValueError as exc:
        return {"error": f"nvidia-smi reports remapped rows {', '.join(cells)!r}: {exc}"}


def _yes(word: str) -> bool:
    if word not in ("Yes", "No", "1", "0"):
        raise ValueError(f"not Yes or No: {word!r}")
    return word in ("Yes", "1")


def _bits(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _name(text: str) -> str:
    if not text:
        raise ValueError("an empty name")
    return text


def _enabled(word: str) -> bool:
    if word not in ("Enabled", "Disabled"):
        raise ValueError(f"not Enabled or Disabled: {word!r}")
    return word == "Enabled"


def _milliwatts(text: str) -> int:
    return round(float(text) * 1000)


def _smi(text: str, parse: Callable[[str], object]) -> object:
    """A value nvidia-smi reported, or why it did not (``[N/A]``, ``[Not Supported]``: not
    supported)."""
    try:
        return parse(text)
    except ValueError:
        if text in UNSUPPORTED:
            return {"error": f"nvidia-smi reports {text!r}", "unsupported": True}
        return {"error": f"nvidia-smi reports {text!r}"}
