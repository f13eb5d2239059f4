"""A machine's own NVIDIA driver, faked under a host root: a ``libnvidia-ml.so.1`` built from C
with the system's compiler (what the agent loads with ctypes on a target), and an
``nvidia-smi`` script (what it runs where no library loads). Both keep the GPUs' state in a
file of the tree, so a fix made through one connection is read back by the next, as a driver
keeps it.

- ``nvml_library(host, gpus)``: ROOT/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1; its state in
  ``nvml-fake.state`` beside it (one GPU a line). ``refuse=True``: every setter answers
  NVML_ERROR_NO_PERMISSION, as the driver does without root.
- ``nvidia_smi(host, gpus)``: ROOT/usr/bin/nvidia-smi answering ``--query-gpu`` in CSV and
  ``-i ADDR -pm|-pl|-e VALUE``; its state in ROOT/var/lib/fake-nvidia-smi.json.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from collections.abc import Mapping
from pathlib import Path

from ..gpu.nvml import FakeGpu
from .faketools import FAKE_TOOL_START
from .hosttree import FakeHost

LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"
STATE = "nvml-fake.state"
SMI_STATE = "var/lib/fake-nvidia-smi.json"

SOURCE = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char busIdLegacy[16]; unsigned domain, bus, device, pciDeviceId,
                 pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned long long total, free, used; } nvmlBAR1Memory_t;
struct gpu { char bus[32]; int pm, ecc, eccp; unsigned gen, power, pmin, pmax;
             unsigned long long bar1; };
static struct gpu gpus[16];
static int count, refuse;
static char driver[64], path[4096];

static int load(void) {
    Dl_info info;
    char line[512];
    FILE *file;
    if (!dladdr((void *)load, &info) || !info.dli_fname) return 0;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof path - (slash ? slash + 1 - path : 0), "%s",
             "nvml-fake.state");
    file = fopen(path, "r");
    if (!file) return 0;
    count = 0;
    while (fgets(line, sizeof line, file)) {
        struct gpu *g = &gpus[count];
        if (sscanf(line, "driver %63s", driver) == 1) continue;
        if (sscanf(line, "refuse %d", &refuse) == 1) continue;
        if (count < 16 && sscanf(line, "gpu %31s %d %u %u %u %u %d %d %llu", g->bus, &g->pm,
                                 &g->gen, &g->power, &g->pmin, &g->pmax, &g->ecc, &g->eccp,
                                 &g->bar1) == 9) count++;
    }
    fclose(file);
    return 1;
}

static int save(void) {
    FILE *file = fopen(path, "w");
    if (!file) return 999;
    fprintf(file, "driver %s\nrefuse %d\n", driver, refuse);
    for (int i = 0; i < count; i++)
        fprintf(file, "gpu %s %d %u %u %u %u %d %d %llu\n", gpus[i].bus, gpus[i].pm,
                gpus[i].gen, gpus[i].power, gpus[i].pmin, gpus[i].pmax, gpus[i].ecc,
                gpus[i].eccp, gpus[i].bar1);
    fclose(file);
    return 0;
}

static struct gpu *of(void *handle) {
    intptr_t index = (intptr_t)handle - 1;
    if (!load() || index < 0 || index >= count) return NULL;
    return &gpus[index];
}

const char *nvmlErrorString(int code) {
    switch (code) {
    case 2: return "Invalid Argument";
    case 4: return "Insufficient Permissions";
    case 9: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}
int nvmlInit_v2(void) { return load() ? 0 : 9; }
int nvmlSystemGetDriverVersion(char *out, unsigned size) {
    if (!load()) return 9;
    snprintf(out, size, "%s", driver);
    return 0;
}
int nvmlSystemGetNVMLVersion(char *out, unsigned size) {
    if (!load()) return 9;
    snprintf(out, size, "13.%s", driver);
    return 0;
}
int nvmlDeviceGetCount_v2(unsigned *out) { if (!load()) return 9; *out = count; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **out) {
    if (!load() || index >= (unsigned)count) return 2;
    *out = (void *)(intptr_t)(index + 1);
    return 0;
}
int nvmlDeviceGetPciInfo_v3(void *handle, nvmlPciInfo_t *out) {
    struct gpu *g = of(handle);
    if (!g) return 2;
    memset(out, 0, sizeof *out);
    snprintf(out->busId, sizeof out->busId, "0000%s", g->bus);
    for (char *c = out->busId; *c; c++) if (*c >= 'a' && *c <= 'f') *c -= 32;
    return 0;
}
int nvmlDeviceGetPersistenceMode(void *h, int *out) {
    struct gpu *g = of(h); if (!g) return 2; *out = g->pm; return 0;
}
int nvmlDeviceGetMaxPcieLinkGeneration(void *h, unsigned *out) {
    struct gpu *g = of(h); if (!g) return 2; *out = g->gen; return 0;
}
int nvmlDeviceGetEnforcedPowerLimit(void *h, unsigned *out) {
    struct gpu *g = of(h); if (!g) return 2; *out = g->power; return 0;
}
int nvmlDeviceGetPowerManagementLimitConstraints(void *h, unsigned *low, unsigned *high) {
    struct gpu *g = of(h); if (!g) return 2; *low = g->pmin; *high = g->pmax; return 0;
}
int nvmlDeviceGetEccMode(void *h, int *current, int *pending) {
    struct gpu *g = of(h); if (!g) return 2; *current = g->ecc; *pending = g->eccp; return 0;
}
int nvmlDeviceGetBAR1MemoryInfo(void *h, nvmlBAR1Memory_t *out) {
    struct gpu *g = of(h);
    if (!g) return 2;
    out->total = g->bar1; out->free = g->bar1; out->used = 0;
    return 0;
}
int nvmlDeviceGetP2PStatus(void *a, void *b, int index, int *out) {
    if (!of(a) || !of(b)) return 2; *out = 0; return 0;
}
int nvmlDeviceGetTopologyCommonAncestor(void *a, void *b, int *out) {
    if (!of(a) || !of(b)) return 2; *out = 40; return 0;
}
int nvmlDeviceSetPersistenceMode(void *h, int mode) {
    struct gpu *g = of(h); if (!g) return 2; if (refuse) return 4;
    g->pm = mode; return save();
}
int nvmlDeviceSetPowerManagementLimit(void *h, unsigned milliwatts) {
    struct gpu *g = of(h); if (!g) return 2; if (refuse) return 4;
    if (milliwatts < g->pmin || milliwatts > g->pmax) return 2;
    g->power = milliwatts; return save();
}
int nvmlDeviceSetEccMode(void *h, int mode) {
    struct gpu *g = of(h); if (!g) return 2; if (refuse) return 4;
    g->eccp = mode; return save();
}
"""

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
    if any(arg.startswith("--query-gpu=") for arg in argv):
        fields = next(a for a in argv if a.startswith("--query-gpu=")).split("=", 1)[1]
        for address, gpu in state["gpus"].items():
            row = dict(gpu, **{"pci.bus_id": "0000" + address.upper(),
                               "driver_version": state["driver"]})
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


def compiler() -> str | None:
    """The system's C compiler, or None where it has none."""
    return shutil.which("cc") or shutil.which("gcc")


def nvml_library(host: FakeHost, gpus: Mapping[str, FakeGpu], *, driver: str = "580.95.05",
                 refuse: bool = False) -> Path:
    """Build ROOT/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 (RuntimeError without a compiler)
    holding ``gpus``' state; returns the state file."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build the fake libnvidia-ml.so.1 with")
    directory = host.root / LIBRARY_DIR
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "fake-nvml.c"
    source.write_text(SOURCE)
    library = directory / f"libnvidia-ml.so.{driver}"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True, capture_output=True)
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

    state = {"driver": driver, "refuse": refuse, "gpus": {
        address: {"persistence_mode": mode(g.persistence_mode),
                  "pcie.link.gen.max": str(g.max_link_generation),
                  "enforced.power.limit": f"{g.power_limit / 1000:.2f}",
                  "power.min_limit": f"{g.power_limit_range[0] / 1000:.2f}",
                  "power.max_limit": f"{g.power_limit_range[1] / 1000:.2f}",
                  "ecc.mode.current": mode(g.ecc_current),
                  "ecc.mode.pending": mode(g.ecc_pending)}
        for address, g in gpus.items()}}
    path = host.file(SMI_STATE, json.dumps(state, indent=1))
    tool = host.file("usr/bin/nvidia-smi", NVIDIA_SMI)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
