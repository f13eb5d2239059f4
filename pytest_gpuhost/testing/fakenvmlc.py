"""The fake libnvidia-ml.so.1's C source (``fakenvml`` builds it with the system's compiler):
NVML's calls pytest-gpuhost makes, each answered from a state file beside the library that it
re-reads at every call (a test moves it between two reads, ``fakenvml.NvmlCounters``)."""

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
#define KEYS 24
static const char *keys[KEYS] = {
    "ecc.corrected_volatile", "ecc.corrected_aggregate", "ecc.uncorrected_volatile",
    "ecc.uncorrected_aggregate", "remapped.corrected", "remapped.uncorrected",
    "remapped.pending", "remapped.failure", "retired_pending", "temperature", "reasons",
    "clock.sm", "clock.mem", "max_clock.sm", "max_clock.mem", "power_usage", "replays",
    "link_gen", "link_width", "reference_time", "violation.power", "violation.thermal",
    "violation.sync_boost", "violation.board_limit"};
static const unsigned long long defaults[KEYS] = {
    0, 0, 0, 0, 0, 0, 0, 0, 0, 40, 1, 2430, 14001, 2430, 14001, 85000, 0, 5, 16, 0, 0, 0, 0, 0};
#define MORE_VIOLATIONS 3 /* reliability, total_app_clocks, total_base_clocks */
static const char *more_violations[MORE_VIOLATIONS] = {
    "violation.reliability", "violation.total_app_clocks", "violation.total_base_clocks"};
struct process { unsigned pid; unsigned long long used; };
struct gpu { char bus[32]; int pm, ecc, eccp; unsigned gen, power, pmin, pmax;
             unsigned long long bar1; char name[96];
             unsigned long long kv[KEYS], more[MORE_VIOLATIONS];
             struct process procs[32]; unsigned nprocs; char unsupported[1024]; };
static struct gpu gpus[16];
static int count, refuse;
static char driver[64], path[4096], extra[65536];

static struct gpu *by_bus(const char *bus) {
    for (int i = 0; i < count; i++) if (!strcmp(gpus[i].bus, bus)) return &gpus[i];
    return NULL;
}

static void extra_line(const char *line) {
    char bus[32], key[64], text[96];
    unsigned long long value;
    unsigned pid;
    struct gpu *g;
    if (strlen(extra) + strlen(line) + 1 < sizeof extra) strcat(extra, line);
    if (sscanf(line, "set %31s %63s %llu", bus, key, &value) == 3 && (g = by_bus(bus))) {
        for (int k = 0; k < KEYS; k++) if (!strcmp(keys[k], key)) g->kv[k] = value;
        for (int k = 0; k < MORE_VIOLATIONS; k++)
            if (!strcmp(more_violations[k], key)) g->more[k] = value;
    } else if (sscanf(line, "process %31s %u %llu", bus, &pid, &value) == 3
               && (g = by_bus(bus)) && g->nprocs < 32) {
        g->procs[g->nprocs].pid = pid; g->procs[g->nprocs++].used = value;
    } else if (sscanf(line, "name %31s %95[^\n]", bus, text) == 2 && (g = by_bus(bus))) {
        snprintf(g->name, sizeof g->name, "%s", text);
    } else if (sscanf(line, "unsupported %31s %63s", bus, key) == 2 && (g = by_bus(bus))) {
        if (strlen(g->unsupported) + strlen(key) + 2 < sizeof g->unsupported) {
            strcat(g->unsupported, " "); strcat(g->unsupported, key);
        }
    }
}

/* NVML_ERROR_NOT_SUPPORTED where the state file says "unsupported BUS CALL" */
static int unsupported(struct gpu *g, const char *call) {
    char word[72];
    snprintf(word, sizeof word, " %s", call);
    const char *at = strstr(g->unsupported, word);
    return at && (at[strlen(word)] == 0 || at[strlen(word)] == ' ');
}

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
    extra[0] = 0;
    long others = -1;
    while (fgets(line, sizeof line, file)) {
        struct gpu *g = &gpus[count];
        if (sscanf(line, "driver %63s", driver) == 1) continue;
        if (sscanf(line, "refuse %d", &refuse) == 1) continue;
        if (count < 16 && sscanf(line, "gpu %31s %d %u %u %u %u %d %d %llu", g->bus, &g->pm,
                                 &g->gen, &g->power, &g->pmin, &g->pmax, &g->ecc, &g->eccp,
                                 &g->bar1) == 9) {
            snprintf(g->name, sizeof g->name, "%s",
                     "NVIDIA RTX PRO 6000 Blackwell Server Edition");
            memcpy(g->kv, defaults, sizeof g->kv);
            memset(g->more, 0, sizeof g->more);
            g->nprocs = 0; g->unsupported[0] = 0;
            count++;
            continue;
        }
        if (others < 0) others = ftell(file) - (long)strlen(line);
    }
    /* every GPU is known now: the lines that name one are read in a second pass */
    if (others >= 0 && fseek(file, others, SEEK_SET) == 0)
        while (fgets(line, sizeof line, file))
            if (strncmp(line, "gpu ", 4) && strncmp(line, "driver ", 7)
                && strncmp(line, "refuse ", 7)) extra_line(line);
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
    fputs(extra, file);
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
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 7: return "Insufficient Size";
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

/* The health facts and a sample's reads: each answers NVML_ERROR_NOT_SUPPORTED (3) where the
   state file says "unsupported BUS CALL"; a call named OMIT_<CALL> at build time is absent. */
#define CHECKED(call) struct gpu *g = of(h); if (!g) return 2; \
    if (unsupported(g, call)) return 3;
#define KV(name) g->kv[key_of(name)]
static int key_of(const char *name) {
    for (int k = 0; k < KEYS; k++) if (!strcmp(keys[k], name)) return k;
    return 0;
}
#ifndef OMIT_nvmlDeviceGetName
int nvmlDeviceGetName(void *h, char *out, unsigned size) {
    CHECKED("nvmlDeviceGetName") snprintf(out, size, "%s", g->name); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetTotalEccErrors
int nvmlDeviceGetTotalEccErrors(void *h, int type, int counter, unsigned long long *out) {
    CHECKED("nvmlDeviceGetTotalEccErrors")
    if (type < 0 || type > 1 || counter < 0 || counter > 1) return 2;
    *out = g->kv[type * 2 + counter]; return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetRemappedRows
int nvmlDeviceGetRemappedRows(void *h, unsigned *corr, unsigned *unc, unsigned *pending,
                              unsigned *failure) {
    CHECKED("nvmlDeviceGetRemappedRows")
    *corr = KV("remapped.corrected"); *unc = KV("remapped.uncorrected");
    *pending = KV("remapped.pending"); *failure = KV("remapped.failure"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetRetiredPagesPendingStatus
int nvmlDeviceGetRetiredPagesPendingStatus(void *h, int *out) {
    CHECKED("nvmlDeviceGetRetiredPagesPendingStatus") *out = KV("retired_pending") ? 1 : 0;
    return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetTemperature
int nvmlDeviceGetTemperature(void *h, int sensor, unsigned *out) {
    CHECKED("nvmlDeviceGetTemperature") if (sensor != 0) return 2;
    *out = KV("temperature"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetCurrentClocksEventReasons
int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *out) {
    CHECKED("nvmlDeviceGetCurrentClocksEventReasons") *out = KV("reasons"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetCurrentClocksThrottleReasons
int nvmlDeviceGetCurrentClocksThrottleReasons(void *h, unsigned long long *out) {
    CHECKED("nvmlDeviceGetCurrentClocksThrottleReasons") *out = KV("reasons"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetViolationStatus
typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;
int nvmlDeviceGetViolationStatus(void *h, int policy, nvmlViolationTime_t *out) {
    CHECKED("nvmlDeviceGetViolationStatus")
    out->referenceTime = KV("reference_time");
    if (policy >= 0 && policy <= 3) out->violationTime = g->kv[key_of("violation.power")
                                                                + policy];
    else if (policy == 5) out->violationTime = g->more[0];
    else if (policy == 10) out->violationTime = g->more[1];
    else if (policy == 11) out->violationTime = g->more[2];
    else return 2;
    return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetClockInfo
int nvmlDeviceGetClockInfo(void *h, int type, unsigned *out) {
    CHECKED("nvmlDeviceGetClockInfo")
    if (type == 1) *out = KV("clock.sm"); else if (type == 2) *out = KV("clock.mem");
    else return 2;
    return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetMaxClockInfo
int nvmlDeviceGetMaxClockInfo(void *h, int type, unsigned *out) {
    CHECKED("nvmlDeviceGetMaxClockInfo")
    if (type == 1) *out = KV("max_clock.sm"); else if (type == 2) *out = KV("max_clock.mem");
    else return 2;
    return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetPowerUsage
int nvmlDeviceGetPowerUsage(void *h, unsigned *out) {
    CHECKED("nvmlDeviceGetPowerUsage") *out = KV("power_usage"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetPcieReplayCounter
int nvmlDeviceGetPcieReplayCounter(void *h, unsigned *out) {
    CHECKED("nvmlDeviceGetPcieReplayCounter") *out = KV("replays"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetCurrPcieLinkGeneration
int nvmlDeviceGetCurrPcieLinkGeneration(void *h, unsigned *out) {
    CHECKED("nvmlDeviceGetCurrPcieLinkGeneration") *out = KV("link_gen"); return 0;
}
#endif
#ifndef OMIT_nvmlDeviceGetCurrPcieLinkWidth
int nvmlDeviceGetCurrPcieLinkWidth(void *h, unsigned *out) {
    CHECKED("nvmlDeviceGetCurrPcieLinkWidth") *out = KV("link_width"); return 0;
}
#endif
typedef struct { unsigned pid; unsigned long long used; } nvmlProcessInfo_v1_t;
typedef struct { unsigned pid; unsigned long long used; unsigned gi, ci; } nvmlProcessInfo_v2_t;
#define PROCESSES(call, type) int call(void *h, unsigned *n, type *out) { \
    CHECKED(#call) \
    if (*n < g->nprocs) { *n = g->nprocs; return 7; } \
    for (unsigned i = 0; i < g->nprocs; i++) { \
        memset(&out[i], 0, sizeof out[i]); \
        out[i].pid = g->procs[i].pid; out[i].used = g->procs[i].used; } \
    *n = g->nprocs; return 0; }
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v3
PROCESSES(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_v2_t)
#endif
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses_v2
PROCESSES(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
#endif
#ifndef OMIT_nvmlDeviceGetComputeRunningProcesses
PROCESSES(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
#endif
"""
