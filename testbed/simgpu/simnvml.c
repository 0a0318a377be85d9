/*
 * simnvml.c - a simulated NVML (libnvidia-ml.so.1) for tests.  TEST INFRASTRUCTURE, never shipped.
 *
 * Devices, memory and utilisation come from the same configuration and shared state file as the simulated
 * libcuda.so.1 (simcommon.h): utilisation is the busy share of the device timeline over the last second,
 * per-process utilisation the busy share of each process over the requested window.
 */
#include "simcommon.h"
#include "vgpu_nvml.h"

#define EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st { int index; };
static struct nvmlDevice_st g_handles[SIM_MAX_DEV];
static int g_nvml_up;

static nvmlReturn_t do_init(void) {
    sim_common_init();
    if (sim_attach_state()) return NVML_ERROR_UNKNOWN;
    for (int i = 0; i < SIM_MAX_DEV; i++) g_handles[i].index = i;
    g_nvml_up = 1;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
EXPORT const char *nvmlErrorString(nvmlReturn_t r) { return r == NVML_SUCCESS ? "Success" : "Simulated NVML error"; }
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int n) { snprintf(v, n, "580.00.00-sim"); return 0; }
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int n) { snprintf(v, n, "13.580.00-sim"); return 0; }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { *v = (int)sim_env_u64("SIMGPU_DRIVER_VERSION", 13000); return 0; }
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

#define NEED_UP() do { if (!g_nvml_up) return NVML_ERROR_UNINITIALIZED; } while (0)
#define DEVIDX(h, i) int i; do { NEED_UP(); if (!(h)) return NVML_ERROR_INVALID_ARGUMENT; i = (h)->index; \
    if (i < 0 || i >= g_ndev) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { NEED_UP(); *n = (unsigned)g_ndev; return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    NEED_UP(); if (i >= (unsigned)g_ndev || !h) return NVML_ERROR_INVALID_ARGUMENT; *h = &g_handles[i]; return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    NEED_UP();
    for (int i = 0; i < g_ndev; i++) if (uuid && !strcmp(uuid, g_cfg[i].uuid)) { *h = &g_handles[i]; return 0; }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *idx) { DEVIDX(h, i); *idx = (unsigned)i; return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *m) { DEVIDX(h, i); *m = (unsigned)i; return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *name, unsigned int n) {
    DEVIDX(h, i); snprintf(name, n, "%s", g_cfg[i].name); return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *uuid, unsigned int n) {
    DEVIDX(h, i); if ((size_t)n <= strlen(g_cfg[i].uuid)) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(uuid, n, "%s", g_cfg[i].uuid); return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) {
    DEVIDX(h, i); (void)i; *major = 8; *minor = 0; return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t h, unsigned int *n) { DEVIDX(h, i); *n = (unsigned)g_cfg[i].sms * 64; return 0; }
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    DEVIDX(h, i); if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t used = __atomic_load_n(&g_st->dev[i].used, __ATOMIC_RELAXED);
    m->total = g_cfg[i].total; m->used = used; m->free = used > m->total ? 0 : m->total - used;
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    DEVIDX(h, i); (void)i;
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(h, &v1);
    m->total = v1.total; m->reserved = 0; m->used = v1.used; m->free = v1.free;
    return 0;
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    DEVIDX(h, i); if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now();
    uint64_t busy = sim_bucket_sum(g_st->dev[i].util, now - 1000000000ULL, now);
    u->gpu = (unsigned)((busy + 5000000ULL) / 10000000ULL);
    if (u->gpu > 100) u->gpu = 100;
    u->memory = 0;
    return 0;
}
static uint64_t realtime_us(void) {
    struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}
EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *s, unsigned int *count,
                                                    unsigned long long lastSeen) {
    DEVIDX(h, i); if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t now = sim_now(), rt = realtime_us();
    uint64_t win = 1000000000ULL;
    if (lastSeen && lastSeen < rt && (rt - lastSeen) * 1000ULL < win) win = (rt - lastSeen) * 1000ULL;
    if (win < SIM_BUCKET_NS) win = SIM_BUCKET_NS;
    unsigned n = 0;
    for (int p = 0; p < SIM_MAX_PROC; p++) {
        sim_proc_t *pr = &g_st->proc[p];
        if (!pr->pid || !sim_proc_alive(pr->pid, pr->starttime)) continue;
        uint64_t busy = sim_bucket_sum(pr->util[i], now - win, now);
        if (!busy) continue;
        if (s && n < *count) {
            s[n].pid = (unsigned)pr->pid; s[n].timeStamp = rt;
            s[n].smUtil = (unsigned)(busy * 100 / win); s[n].memUtil = s[n].encUtil = s[n].decUtil = 0;
        }
        n++;
    }
    if (!s || n > *count) { *count = n; return s ? NVML_ERROR_INSUFFICIENT_SIZE : (n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_NOT_FOUND); }
    *count = n;
    return n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
}
static nvmlReturn_t procs(int dev, void *out, unsigned int *count, size_t stride) {
    unsigned n = 0;
    for (int p = 0; p < SIM_MAX_PROC; p++) {
        sim_proc_t *pr = &g_st->proc[p];
        if (!pr->pid || !pr->used[dev] || !sim_proc_alive(pr->pid, pr->starttime)) continue;
        if (out && n < *count) {
            nvmlProcessInfo_v2_t *e = (nvmlProcessInfo_v2_t *)((char *)out + (size_t)n * stride);
            memset(e, 0, stride);
            e->pid = (unsigned)pr->pid; e->usedGpuMemory = pr->used[dev];
        }
        n++;
    }
    nvmlReturn_t r = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return r;
}
/* v3 adds a trailing 8-byte field (usedGpuCcProtectedMemory) after the v2 layout */
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, void *infos) {
    DEVIDX(h, i); return procs(i, infos, c, 32);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_v2_t *infos) {
    DEVIDX(h, i); return procs(i, infos, c, sizeof(nvmlProcessInfo_v2_t));
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_v1_t *infos) {
    DEVIDX(h, i);
    unsigned want = *c, n = 0;
    nvmlProcessInfo_v2_t tmp[SIM_MAX_PROC];
    unsigned cap = SIM_MAX_PROC;
    procs(i, tmp, &cap, sizeof tmp[0]);
    for (n = 0; n < cap && n < want && infos; n++) { infos[n].pid = tmp[n].pid; infos[n].usedGpuMemory = tmp[n].usedGpuMemory; }
    *c = cap;
    return cap > want ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
}
