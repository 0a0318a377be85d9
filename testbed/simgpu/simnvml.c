/*
 * simnvml.c - a simulated NVML (libnvidia-ml.so.1).  TEST INFRASTRUCTURE, never shipped.
 *
 * Compiled against NVIDIA's nvml.h (the nvidia-nvml-dev package), so every type and constant is the real one.
 * The GPUs, their memory, processes and utilisation are those of the simulated node (gpusim.h).  Also:
 *   - Xid events: nvmlEventSetWait delivers the Xids injected with simgpu_fault("xid"), per registered GPU;
 *   - lost GPUs: after simgpu_fault("lost") every query of that GPU answers NVML_ERROR_GPU_IS_LOST until
 *     simgpu_fault("recover");
 *   - MIG mode, NUMA node and PCI bus number from SIMGPU_DEVICES flags; devices are enumerated by PCI bus number
 *     (gpusim.h), and nvmlDeviceGetPciInfo* / nvmlDeviceGetHandleByPciBusId* report and find that bus;
 *   - topology (nvml.h "Topology Queries" and "NvLink Methods"): NVLink peers and the PCIe root complex from
 *     SIMGPU_DEVICES flags, read through nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2 and
 *     nvmlDeviceGetTopologyCommonAncestor;
 *   - per-cgroup memory limits (nvmlDeviceSetMemoryLimits_v1): kept in the node state, enforced by the
 *     simulated libcuda.so.1 on every allocation of a process in that cgroup or below it.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include "gpusim.h"
#include <nvml.h>

#define API __attribute__((visibility("default")))

struct nvmlDevice_st { int index; };
static struct nvmlDevice_st nv_dev[GS_NDEV];
static int nv_up;

static nvmlReturn_t start(void) {
    if (gs_attach_gpus()) return NVML_ERROR_UNKNOWN;
    for (int i = 0; i < GS_NDEV; i++) nv_dev[i].index = i;
    nv_up = 1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlInit_v2(void) { return start(); }
API nvmlReturn_t nvmlInit(void) { return start(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return start(); }
API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }
API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    default: return "Simulated NVML error";
    }
}
API nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int n) { snprintf(out, n, "580.95.05"); return NVML_SUCCESS; }
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *out, unsigned int n) { snprintf(out, n, "13.580.95.05"); return NVML_SUCCESS; }
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = (int)gs_env_num("SIMGPU_DRIVER_VERSION", 13000);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* index of a handle, checked; the GPU must answer unless `even_lost` */
static nvmlReturn_t which(nvmlDevice_t h, int even_lost, int *out) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!h || h->index < 0 || h->index >= gs_nview) return NVML_ERROR_INVALID_ARGUMENT;
    if (!even_lost && __atomic_load_n(&gs_st->gpu[gs_view[h->index].slot].lost, __ATOMIC_RELAXED))
        return NVML_ERROR_GPU_IS_LOST;
    *out = h->index;
    return NVML_SUCCESS;
}
#define DEV(h, i) int i = 0; do { nvmlReturn_t r_ = which((h), 0, &i); if (r_ != NVML_SUCCESS) return r_; } while (0)
#define GPU(i) (&gs_st->gpu[gs_view[i].slot])

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)gs_nview;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }
API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!h || i >= (unsigned)gs_nview) return NVML_ERROR_INVALID_ARGUMENT;
    *h = &nv_dev[i];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *h) { return nvmlDeviceGetHandleByIndex_v2(i, h); }
API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !h) return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gs_nview; i++) {
        if (strcmp(uuid, gs_view[i].uuid)) continue;
        if (__atomic_load_n(&GPU(i)->lost, __ATOMIC_RELAXED)) return NVML_ERROR_GPU_IS_LOST;
        *h = &nv_dev[i];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t h, unsigned int *out) { DEV(h, i); *out = (unsigned)i; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t h, unsigned int *out) { DEV(h, i); *out = (unsigned)i; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *out, unsigned int n) {
    DEV(h, i);
    snprintf(out, n, "%s", gs_view[i].name);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *out, unsigned int n) {
    int i = 0;
    nvmlReturn_t r = which(h, 1, &i);
    if (r != NVML_SUCCESS) return r;
    if (!out || n <= strlen(gs_view[i].uuid)) return NVML_ERROR_INSUFFICIENT_SIZE;
    snprintf(out, n, "%s", gs_view[i].uuid);
    return NVML_SUCCESS;
}
/* PCI of the GPU on `bus`: domain 0, device 0, function 0; the vendor is NVIDIA (0x10de) */
static void pci_fill_bus(int bus, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = (unsigned)bus;
    pci->device = 0;
    pci->pciDeviceId = 0x20b010deu;
    snprintf(pci->busId, sizeof pci->busId, NVML_DEVICE_PCI_BUS_ID_FMT, NVML_DEVICE_PCI_BUS_ID_FMT_ARGS(pci));
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
             NVML_DEVICE_PCI_BUS_ID_FMT_ARGS(pci));
}
static void pci_fill(int i, nvmlPciInfo_t *pci) { pci_fill_bus(gs_view[i].bus, pci); }
API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t h, nvmlPciInfo_t *pci) {
    DEV(h, i);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    pci_fill(i, pci);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t h, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(h, pci); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t h, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(h, pci); }
/* accepts domain:bus:device.function, domain:bus:device and bus:device.function (hexadecimal) */
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *h) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    unsigned a = 0, b = 0, c = 0, d = 0, bus;
    if (!id || !h) return NVML_ERROR_INVALID_ARGUMENT;
    if (sscanf(id, "%x:%x:%x.%x", &a, &b, &c, &d) == 4 || sscanf(id, "%x:%x:%x", &a, &b, &c) == 3) bus = b;
    else if (sscanf(id, "%x:%x.%x", &a, &b, &c) == 3) bus = a;
    else return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < gs_nview; i++) {
        if ((unsigned)gs_view[i].bus != bus) continue;
        if (__atomic_load_n(&GPU(i)->lost, __ATOMIC_RELAXED)) return NVML_ERROR_GPU_IS_LOST;
        *h = &nv_dev[i];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *h) {
    return nvmlDeviceGetHandleByPciBusId_v2(id, h);
}
API nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t h, unsigned int *node) {
    DEV(h, i);
    if (!node) return NVML_ERROR_INVALID_ARGUMENT;
    if (gs_view[i].numa < 0) return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)gs_view[i].numa;
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ topology */
/*
 * NVLink (nvml.h nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2): a GPU with `nvl` peers has
 * GS_NVLINKS links, shared out in equal runs, peer by peer (links 0..k-1 to the first peer, and so on); the
 * links left over are inactive.  A GPU without peers has no NVLink: NVML_ERROR_NOT_SUPPORTED.  A link number at
 * or past NVML_NVLINK_MAX_LINKS, or past the GPU's own links, is NVML_ERROR_INVALID_ARGUMENT.
 * Returns the peer's bus on an active link, -1 on an inactive one.
 */
static nvmlReturn_t nvlink(int i, unsigned int link, int *peer_bus) {
    if (link >= NVML_NVLINK_MAX_LINKS) return NVML_ERROR_INVALID_ARGUMENT;
    int n = gs_view[i].npeer;
    if (n == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= GS_NVLINKS) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned run = GS_NVLINKS / (unsigned)n;
    *peer_bus = link < run * (unsigned)n ? gs_view[i].peer[link / run] : -1;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t h, unsigned int link, nvmlEnableState_t *isActive) {
    DEV(h, i);
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    int bus = -1;
    nvmlReturn_t r = nvlink(i, link, &bus);
    if (r != NVML_SUCCESS) return r;
    *isActive = bus >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}
/* an inactive link has no remote end: NVML_ERROR_NOT_SUPPORTED (nvml.h does not say; our choice) */
API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t h, unsigned int link, nvmlPciInfo_t *pci) {
    DEV(h, i);
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    int bus = -1;
    nvmlReturn_t r = nvlink(i, link, &bus);
    if (r != NVML_SUCCESS) return r;
    if (bus < 0) return NVML_ERROR_NOT_SUPPORTED;
    pci_fill_bus(bus, pci);
    return NVML_SUCCESS;
}
/*
 * nvml.h nvmlDeviceGetTopologyCommonAncestor over nvmlGpuTopologyLevel_t: two GPUs on one root complex meet at
 * NVML_TOPOLOGY_HOSTBRIDGE, on two root complexes of one NUMA node at NVML_TOPOLOGY_NODE, else at
 * NVML_TOPOLOGY_SYSTEM (the simulated node has no PCIe switches); a GPU with itself: NVML_TOPOLOGY_INTERNAL.
 */
API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t h1, nvmlDevice_t h2, nvmlGpuTopologyLevel_t *path) {
    DEV(h1, a);
    DEV(h2, b);
    if (!path) return NVML_ERROR_INVALID_ARGUMENT;
    if (a == b) *path = NVML_TOPOLOGY_INTERNAL;
    else if (gs_view[a].root == gs_view[b].root) *path = NVML_TOPOLOGY_HOSTBRIDGE;
    else if (gs_view[a].numa >= 0 && gs_view[a].numa == gs_view[b].numa) *path = NVML_TOPOLOGY_NODE;
    else *path = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t h, unsigned int *current, unsigned int *pending) {
    DEV(h, i);
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    *current = *pending = gs_view[i].mig ? NVML_DEVICE_MIG_ENABLE : NVML_DEVICE_MIG_DISABLE;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t h, int *major, int *minor) {
    DEV(h, i);
    (void)i;
    *major = 8;
    *minor = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t h, unsigned int *n) { DEV(h, i); *n = (unsigned)gs_view[i].sms * 64; return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    DEV(h, i);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t used = __atomic_load_n(&GPU(i)->used, __ATOMIC_RELAXED);
    m->total = gs_view[i].total;
    m->used = used;
    m->free = used < m->total ? m->total - used : 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    DEV(h, i);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlMemory_t v1;
    nvmlDeviceGetMemoryInfo(h, &v1);
    m->total = v1.total;
    m->reserved = 0;
    m->used = v1.used;
    m->free = v1.free;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t h, nvmlUtilization_t *u) {
    DEV(h, i);
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    gs_ts_catch_up(GPU(i));
    uint64_t now = gs_clock();
    uint64_t busy = gs_tl_sum(GPU(i)->tl, GS_DEV_BINS, GS_DEV_TICK, now - 1000000000ULL, now);
    u->gpu = (unsigned)(busy / 10000000ULL);
    if (u->gpu > 100) u->gpu = 100;
    u->memory = 0;
    return NVML_SUCCESS;
}
static uint64_t wall_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (uint64_t)t.tv_sec * 1000000ULL + (uint64_t)t.tv_nsec / 1000ULL;
}
API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t h, nvmlProcessUtilizationSample_t *out,
                                                 unsigned int *count, unsigned long long lastSeen) {
    DEV(h, i);
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    gs_ts_catch_up(GPU(i));
    uint64_t now = gs_clock(), wall = wall_us(), window = 1000000000ULL;
    if (lastSeen && lastSeen < wall && (wall - lastSeen) * 1000ULL < window) window = (wall - lastSeen) * 1000ULL;
    if (window < GS_PROC_TICK) window = GS_PROC_TICK;
    unsigned n = 0;
    int slot = gs_view[i].slot;
    for (int p = 0; p < GS_NPROC; p++) {
        gs_proc_t *pr = &gs_st->proc[p];
        if (!pr->pid) continue;
        uint64_t busy = gs_tl_sum(pr->tl[slot], GS_PROC_BINS, GS_PROC_TICK, now - window, now);
        if (!busy) continue;
        if (out && n < *count) {
            memset(&out[n], 0, sizeof out[n]);
            out[n].pid = (unsigned)pr->pid;
            out[n].timeStamp = wall;
            out[n].smUtil = (unsigned)(busy * 100 / window);
        }
        n++;
    }
    nvmlReturn_t r = !out ? (n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_ERROR_NOT_FOUND)
                          : n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    *count = n;
    return r;
}

/* the processes holding memory on GPU i, written as `size`-byte records that begin like nvmlProcessInfo_v1_t */
static nvmlReturn_t holders(int i, unsigned int *count, void *out, size_t size) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = 0;
    int slot = gs_view[i].slot;
    for (int p = 0; p < GS_NPROC; p++) {
        gs_proc_t *pr = &gs_st->proc[p];
        if (!pr->pid || !pr->mem[slot] || gs_proc_gone(pr)) continue;
        if (out && n < *count) {
            nvmlProcessInfo_v2_t rec;
            memset(&rec, 0, sizeof rec);
            rec.pid = (unsigned)pr->pid;
            rec.usedGpuMemory = pr->mem[slot];
            rec.gpuInstanceId = rec.computeInstanceId = 0xFFFFFFFFu;
            memset((char *)out + (size_t)n * size, 0, size);
            memcpy((char *)out + (size_t)n * size, &rec, size < sizeof rec ? size : sizeof rec);
        }
        n++;
    }
    nvmlReturn_t r = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return r;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_t *infos) {
    DEV(h, i);
    return holders(i, c, infos, sizeof *infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_v2_t *infos) {
    DEV(h, i);
    return holders(i, c, infos, sizeof *infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int *c, nvmlProcessInfo_v1_t *infos) {
    DEV(h, i);
    return holders(i, c, infos, sizeof *infos);
}

/* ------------------------------------------------------------------------------------------------ events */
struct nvmlEventSet_st {
    unsigned long long mask[GS_NDEV];
    uint32_t seen[GS_NDEV];       /* Xids of each GPU already delivered */
};

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_MEMORY;
}
API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { free(set); return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t h, unsigned long long *types) {
    DEV(h, i);
    (void)i;
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = nvmlEventTypeXidCriticalError | nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t h, unsigned long long types, nvmlEventSet_t set) {
    DEV(h, i);
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    set->mask[i] |= types;
    set->seen[i] = __atomic_load_n(&GPU(i)->xid_count, __ATOMIC_ACQUIRE);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!nv_up) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t until = gs_clock() + (uint64_t)timeoutms * 1000000ULL;
    for (;;) {
        for (int i = 0; i < gs_nview; i++) {
            if (!(set->mask[i] & nvmlEventTypeXidCriticalError)) continue;
            uint32_t have = __atomic_load_n(&GPU(i)->xid_count, __ATOMIC_ACQUIRE);
            if (have == set->seen[i]) continue;
            if (have - set->seen[i] > GS_XID_RING) set->seen[i] = have - GS_XID_RING;
            memset(data, 0, sizeof *data);
            data->device = &nv_dev[i];
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = GPU(i)->xid_code[set->seen[i] % GS_XID_RING];
            data->gpuInstanceId = data->computeInstanceId = 0xFFFFFFFFu;
            set->seen[i]++;
            return NVML_SUCCESS;
        }
        uint64_t now = gs_clock();
        if (now >= until) return NVML_ERROR_TIMEOUT;
        gs_nap(until - now < 20000000ULL ? until - now : 20000000ULL);
    }
}
API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

/* ------------------------------------------------------------------------------------------------ cgroup limits */
API nvmlReturn_t nvmlDeviceSetMemoryLimits_v1(nvmlDevice_t h, nvmlSetMemoryLimits_v1_t *lim) {
    DEV(h, i);
    if (!lim || !lim->nameSpace || lim->softLimit > lim->hardLimit) return NVML_ERROR_INVALID_ARGUMENT;
    int clear = lim->softLimit == 0 && lim->hardLimit == NVML_DEVICE_MEMORY_LIMIT_MAX;
    if (!clear && lim->hardLimit > gs_view[i].total) return NVML_ERROR_INVALID_ARGUMENT;
    if (geteuid() != 0) return NVML_ERROR_NO_PERMISSION;
    struct stat sb;
    if (stat(lim->nameSpace, &sb) || !S_ISDIR(sb.st_mode) || strlen(lim->nameSpace) >= GS_CGROUP_LEN)
        return NVML_ERROR_OPERATING_SYSTEM;
    nvmlReturn_t r = clear ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_RESOURCES;
    const char *uuid = gs_view[i].uuid;
    gs_lock(&gs_st->mu);
    int spot = -1;
    for (int l = 0; l < GS_NLIMIT; l++) {
        gs_limit_t *x = &gs_st->limit[l];
        if (x->path[0] && (stat(x->path, &sb) != 0)) x->path[0] = 0;   /* its cgroup was removed */
        if (x->path[0] && !strcmp(x->path, lim->nameSpace) && !strcmp(x->uuid, uuid)) spot = l;
        else if (!x->path[0] && spot < 0 && !clear) spot = l;
    }
    if (spot >= 0) {
        gs_limit_t *x = &gs_st->limit[spot];
        if (clear) {
            x->path[0] = 0;
        } else {
            snprintf(x->path, sizeof x->path, "%s", lim->nameSpace);
            snprintf(x->uuid, sizeof x->uuid, "%s", uuid);
            x->soft = lim->softLimit;
            x->hard = lim->hardLimit;
            r = NVML_SUCCESS;
        }
    }
    gs_unlock(&gs_st->mu);
    return r;
}
API nvmlReturn_t nvmlDeviceGetMemoryLimits_v1(nvmlDevice_t h, nvmlGetMemoryLimits_v1_t *lim) {
    DEV(h, i);
    if (!lim || !lim->nameSpace) return NVML_ERROR_INVALID_ARGUMENT;
    struct stat sb;
    if (stat(lim->nameSpace, &sb)) return NVML_ERROR_OPERATING_SYSTEM;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    gs_lock(&gs_st->mu);
    for (int l = 0; l < GS_NLIMIT; l++) {
        gs_limit_t *x = &gs_st->limit[l];
        if (!x->path[0] || strcmp(x->path, lim->nameSpace) || strcmp(x->uuid, gs_view[i].uuid)) continue;
        lim->softLimit = x->soft;
        lim->hardLimit = x->hard;
        lim->currentUsed = 0;
        for (int p = 0; p < GS_NPROC; p++)
            if (gs_st->proc[p].pid && gs_cgroup_covers(x->path, gs_st->proc[p].cgroup))
                lim->currentUsed += gs_st->proc[p].mem[gs_view[i].slot];
        r = NVML_SUCCESS;
    }
    gs_unlock(&gs_st->mu);
    return r;
}

/* ------------------------------------------------------------------------------------------------ test helpers */
/*
 * Injects a fault into GPU `uuid` of the node state SIMGPU_STATE names (attached on first use):
 * "xid" (an Xid with `code`), "lost" (stops answering), "recover" (answers again).  0 on success.
 */
API int simgpu_fault(const char *uuid, const char *what, unsigned int code) {
    if (!nv_up) gs_follow_state();
    if (gs_map() || !uuid || !what) return -1;
    gs_lock(&gs_st->mu);
    int slot = -1;
    for (int d = 0; d < GS_NDEV; d++)
        if (!strcmp(gs_st->gpu[d].uuid, uuid)) slot = d;
    gs_unlock(&gs_st->mu);
    if (slot < 0) return -1;
    gs_gpu_t *g = &gs_st->gpu[slot];
    gs_lock(&g->mu);
    int rc = 0;
    if (!strcmp(what, "xid")) {
        g->xid_code[g->xid_count % GS_XID_RING] = code;
        __atomic_add_fetch(&g->xid_count, 1, __ATOMIC_RELEASE);
    } else if (!strcmp(what, "lost")) {
        g->lost = 1;
    } else if (!strcmp(what, "recover")) {
        g->lost = 0;
    } else {
        rc = -1;
    }
    gs_unlock(&g->mu);
    return rc;
}
