"""A machine's own NVIDIA driver, faked under a host root: a ``libnvidia-ml.so.1`` built from C
with the system's compiler (what the agent loads with ctypes on a target), and an
``nvidia-smi`` script (what it runs where no library loads). Both keep the GPUs' state in a
file of the tree, so a fix made through one connection is read back by the next, as a driver
keeps it.

- ``nvml_library(host, gpus)``: ROOT/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; its state in
  ``nvml-fake.state`` beside it (one GPU a line, then ``set ADDR KEY N``, ``process ADDR PID
  BYTES``, ``name ADDR TEXT`` and ``unsupported ADDR CALL`` lines), re-read at every call, so
  a test moves it between two reads. ``refuse=True``: every setter answers
  NVML_ERROR_NO_PERMISSION, as the driver does without root; ``omit``: calls the library is
  built without (a symbol an older driver lacks).
- ``NvmlCounters(state)``: moves that state: ``set(address, key, n)`` and ``add(address, key,
  n)`` of ``COUNTER_KEYS`` (violation time advancing, the clocks event reasons' bits, an ECC
  error, a replay burst, a pending remap), ``process(address, pid, used)`` (a compute process
  on the GPU), ``unsupported(address, call)`` (NVML_ERROR_NOT_SUPPORTED from then on).
- ``nvidia_smi(host, gpus)``: ROOT/usr/bin/nvidia-smi answering ``--query-gpu`` and
  ``--query-compute-apps`` in CSV (by nvidia-smi's own field names; a field it has no value
  for is ``[N/A]``) and ``-i ADDR -pm|-pl|-e VALUE``; its state in
  ROOT/var/lib/fake-nvidia-smi.json, moved by ``SmiFields(state)``: ``set(address, field,
  text)``, ``process(address, pid, name, used_mib)``, ``unknown(field)`` (a field this
  nvidia-smi refuses, as one older than the field does).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..gpu.nvml import ECC_COUNTS, FakeGpu
from .fakenvmlc import SOURCE
from .faketools import FAKE_TOOL_START
from .hosttree import FakeHost

LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
STATE = "nvml-fake.state"
SMI_STATE = "var/lib/fake-nvidia-smi.json"


NVIDIA_SMI = FAKE_TOOL_START + r'''
"""A fake nvidia-smi for a pytest-gpuhost fake host tree (pytest_gpuhost.testing.fakenvml): its
GPUs' state in ROOT/var/lib/fake-nvidia-smi.json; answers --query-gpu (CSV, no header, no
units) and -i ADDR -pm 0|1, -pl WATTS, -e 0|1."""
import json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = ROOT / "var/lib/fake-nvidia-smi.json"

def main(argv):
    state = json.loads(STATE.read_text())
    query = next((a for a in argv if a.startswith(("--query-gpu=", "--query-compute-apps="))),
                 None)
    if query is not None:
        option, fields = query.split("=", 1)
        for field in fields.split(","):
            if field in state.get("unknown", ()):
                print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
                return 2
        rows = [dict(gpu, **{"pci.bus_id": "0000" + address.upper(),
                             "driver_version": state["driver"]})
                for address, gpu in state["gpus"].items()] if option == "--query-gpu" else [
                dict(app, gpu_bus_id="0000" + app["gpu_bus_id"].upper())
                for app in state.get("apps", ())]
        for row in rows:
            print(", ".join(str(row.get(field, "[N/A]")) for field in fields.split(",")))
        return 0
    if len(argv) == 4 and argv[0] == "-i" and argv[2] in ("-pm", "-pl", "-e"):
        if state.get("refuse"):
            print("Unable to set: Insufficient Permissions", file=sys.stderr)
            return 4
        gpu = state["gpus"][argv[1].lower()]
        if argv[2] == "-pm":
            gpu["persistence_mode"] = "Enabled" if argv[3] == "1" else "Disabled"
        elif argv[2] == "-e":
            gpu["ecc.mode.pending"] = "Enabled" if argv[3] == "1" else "Disabled"
        else:
            watts = float(argv[3])
            if not float(gpu["power.min_limit"]) <= watts <= float(gpu["power.max_limit"]):
                print(f"Provided power limit {watts:.2f} W is not a valid power limit",
                      file=sys.stderr)
                return 2
            gpu["enforced.power.limit"] = f"{watts:.2f}"
        STATE.write_text(json.dumps(state, indent=1))
        return 0
    print("nvidia-smi (fake): unsupported arguments: " + " ".join(argv), file=sys.stderr)
    return 2

sys.exit(main(sys.argv[1:]))
'''


COUNTER_KEYS = (
    "ecc.corrected_volatile", "ecc.corrected_aggregate", "ecc.uncorrected_volatile",
    "ecc.uncorrected_aggregate", "remapped.corrected", "remapped.uncorrected",
    "remapped.pending", "remapped.failure", "retired_pending", "temperature", "reasons",
    "clock.sm", "clock.mem", "max_clock.sm", "max_clock.mem", "power_usage", "replays",
    "link_gen", "link_width", "reference_time", "violation.power", "violation.thermal",
    "violation.sync_boost", "violation.board_limit", "violation.reliability",
    "violation.total_app_clocks", "violation.total_base_clocks")
"""What ``NvmlCounters`` sets: the fake library's C ``keys`` (``reasons``: the clocks event
reasons' bits; ``reference_time``: every violation's referenceTime, us; ``violation.*``: ns
in violation; ``power_usage``: mW; clocks in MHz)."""
HEALTH_CALLS = {
    "name": ("nvmlDeviceGetName",), "ecc_errors": ("nvmlDeviceGetTotalEccErrors",),
    "remapped_rows": ("nvmlDeviceGetRemappedRows",),
    "retired_pages_pending": ("nvmlDeviceGetRetiredPagesPendingStatus",),
    "temperature": ("nvmlDeviceGetTemperature",),
    "clocks_event_reasons": ("nvmlDeviceGetCurrentClocksEventReasons",
                             "nvmlDeviceGetCurrentClocksThrottleReasons")}
"""The calls that give each health fact (``FakeGpu.unsupported`` names facts)."""


def _health_lines(address: str, gpu: FakeGpu) -> list[str]:
    rows = gpu.remapped_rows
    values = {f"ecc.{count}": gpu.ecc_errors.get(count, 0) for count in ECC_COUNTS}
    values.update({"remapped.corrected": rows[0], "remapped.uncorrected": rows[1],
                   "remapped.pending": int(rows[2]), "remapped.failure": int(rows[3]),
                   "retired_pending": int(gpu.retired_pages_pending),
                   "temperature": gpu.temperature, "reasons": gpu.clocks_event_reasons})
    lines = [f"name {address} {gpu.name}"]
    lines += [f"set {address} {key} {value}" for key, value in values.items()]
    lines += [f"unsupported {address} {call}" for fact in gpu.unsupported
              for call in HEALTH_CALLS[fact]]
    return lines


def _replace(path: Path, text: str) -> None:
    """The whole state at once: a reader (the library, nvidia-smi) never sees half of it."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


class NvmlCounters:
    """Moves the fake library's state between two reads (each call re-reads it)."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def _lines(self) -> list[str]:
        return self.state.read_text().splitlines()

    def get(self, address: str, key: str) -> int:
        """What ``key`` of the GPU holds now (its C default where never set: None)."""
        for line in self._lines():
            words = line.split()
            if words[:3] == ["set", address, key]:
                return int(words[3])
        raise KeyError(f"{key} of {address} was never set (the library's default holds)")

    def set(self, address: str, key: str, value: int) -> None:
        if key not in COUNTER_KEYS:
            raise ValueError(f"not a fake NVML counter: {key!r} (one of {COUNTER_KEYS})")
        lines = [line for line in self._lines() if line.split()[:3] != ["set", address, key]]
        _replace(self.state, "\n".join([*lines, f"set {address} {key} {value}"]) + "\n")

    def add(self, address: str, key: str, amount: int) -> None:
        """``key`` moved on by ``amount`` (a counter that counts on: violation time, errors,
        replays)."""
        try:
            now = self.get(address, key)
        except KeyError:
            now = 0
        self.set(address, key, now + amount)

    def process(self, address: str, pid: int, used: int = 512 * 2**20) -> None:
        """A compute process on the GPU (``used``: its memory, bytes)."""
        _replace(self.state, self.state.read_text() + f"process {address} {pid} {used}\n")

    def no_processes(self, address: str) -> None:
        lines = [line for line in self._lines() if line.split()[:2] != ["process", address]]
        _replace(self.state, "\n".join(lines) + "\n")

    def unsupported(self, address: str, calls: Iterable[str]) -> None:
        """These calls answer NVML_ERROR_NOT_SUPPORTED on this GPU from now on."""
        _replace(self.state, self.state.read_text()
                 + "".join(f"unsupported {address} {call}\n" for call in calls))


class SmiFields:
    """Moves the fake nvidia-smi's state between two runs of it."""

    def __init__(self, state: Path) -> None:
        self.state = state

    def _change(self, change: Callable[[dict[str, Any]], None]) -> None:
        data = json.loads(self.state.read_text())
        change(data)
        _replace(self.state, json.dumps(data, indent=1))

    def set(self, address: str, field: str, text: str) -> None:
        """``field`` (nvidia-smi's name) of the GPU reports ``text`` (``[N/A]``, ``Yes``)."""
        self._change(lambda data: data["gpus"][address].__setitem__(field, text))

    def process(self, address: str, pid: int, name: str = "python3",
                used_mib: int = 512) -> None:
        """A compute process on the GPU, as ``--query-compute-apps`` lists it."""
        app = {"gpu_bus_id": address, "pid": str(pid), "process_name": name,
               "used_memory": str(used_mib)}
        self._change(lambda data: data.setdefault("apps", []).append(app))

    def unknown(self, field: str) -> None:
        """This nvidia-smi refuses ``field`` (``Field ... is not a valid field to query``)."""
        self._change(lambda data: data.setdefault("unknown", []).append(field))


def compiler() -> str | None:
    """The system's C compiler, or None where it has none."""
    return shutil.which("cc") or shutil.which("gcc")


def nvml_library(host: FakeHost, gpus: Mapping[str, FakeGpu], *, driver: str = "580.95.05",
                 refuse: bool = False, omit: Iterable[str] = ()) -> Path:
    """Build ROOT/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 (RuntimeError without a compiler)
    holding ``gpus``' state, without the calls ``omit`` names (of the health and sample
    calls); returns the state file (``NvmlCounters`` moves it)."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build the fake libnvidia-ml.so.1 with")
    directory = host.root / LIBRARY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "fake-nvml.c"
    source.write_text(SOURCE)
    library = directory / f"libnvidia-ml.so.{driver}"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", *(f"-DOMIT_{call}" for call in omit),
                    "-o", str(library), str(source)], check=True, capture_output=True)
    source.unlink()
    link = directory / "libnvidia-ml.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(library.name)
    state = directory / STATE
    lines = [f"driver {driver}", f"refuse {int(refuse)}"]
    lines += [f"gpu {address} {int(g.persistence_mode)} {g.max_link_generation} "
              f"{g.power_limit} {g.power_limit_range[0]} {g.power_limit_range[1]} "
              f"{int(g.ecc_current)} {int(g.ecc_pending)} {g.bar1_total}"
              for address, g in gpus.items()]
    lines += [line for address, g in gpus.items() for line in _health_lines(address, g)]
    state.write_text("\n".join(lines) + "\n")
    return state


def nvml_state(state: Path) -> dict[str, dict[str, int]]:
    """The fake library's GPUs as its state file holds them now."""
    names = ("persistence_mode", "max_link_generation", "power_limit", "power_min",
             "power_max", "ecc", "ecc_pending", "bar1")
    found = {}
    for line in state.read_text().splitlines():
        words = line.split()
        if words and words[0] == "gpu":
            found[words[1]] = dict(zip(names, map(int, words[2:]), strict=True))
    return found


def nvidia_smi(host: FakeHost, gpus: Mapping[str, FakeGpu], *, driver: str = "580.95.05",
               refuse: bool = False) -> Path:
    """Install ROOT/usr/bin/nvidia-smi holding ``gpus``' state; returns the state file."""
    def mode(enabled: bool) -> str:
        return "Enabled" if enabled else "Disabled"

    state = {"driver": driver, "refuse": refuse, "apps": [], "gpus": {
        address: {"persistence_mode": mode(g.persistence_mode),
                  "pcie.link.gen.max": str(g.max_link_generation),
                  "enforced.power.limit": f"{g.power_limit / 1000:.2f}",
                  "power.min_limit": f"{g.power_limit_range[0] / 1000:.2f}",
                  "power.max_limit": f"{g.power_limit_range[1] / 1000:.2f}",
                  "ecc.mode.current": mode(g.ecc_current),
                  "ecc.mode.pending": mode(g.ecc_pending), **_smi_health(g)}
        for address, g in gpus.items()}}
    path = host.file(SMI_STATE, json.dumps(state, indent=1))
    tool = host.file("usr/bin/nvidia-smi", NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


SMI_UNSUPPORTED = "[N/A]"


def _smi_health(gpu: FakeGpu) -> dict[str, str]:
    """The GPU's health and sample fields as nvidia-smi names them (nounits)."""
    def yes(flag: bool) -> str:
        return "Yes" if flag else "No"

    rows = gpu.remapped_rows
    fields = {"name": gpu.name, "temperature.gpu": str(gpu.temperature),
              "clocks_event_reasons.active": f"0x{gpu.clocks_event_reasons:016X}",
              "retired_pages.pending": yes(gpu.retired_pages_pending),
              "remapped_rows.correctable": str(rows[0]),
              "remapped_rows.uncorrectable": str(rows[1]),
              "remapped_rows.pending": yes(rows[2]), "remapped_rows.failure": yes(rows[3]),
              "clocks.sm": "2430", "clocks.mem": "14001", "clocks.max.sm": "2430",
              "clocks.max.mem": "14001", "power.draw": "85.00",
              "pcie.link.gen.gpucurrent": "5", "pcie.link.width.current": "16"}
    for count in ECC_COUNTS:
        kind, _, counter = count.partition("_")
        fields[f"ecc.errors.{kind}.{counter}.total"] = str(gpu.ecc_errors.get(count, 0))
    unsupported = {"name": ("name",), "temperature": ("temperature.gpu",),
                   "clocks_event_reasons": ("clocks_event_reasons.active",),
                   "retired_pages_pending": ("retired_pages.pending",),
                   "remapped_rows": tuple(f for f in fields if f.startswith("remapped_rows.")),
                   "ecc_errors": tuple(f for f in fields if f.startswith("ecc.errors."))}
    for fact in gpu.unsupported:
        fields.update(dict.fromkeys(unsupported[fact], SMI_UNSUPPORTED))
    return fields
