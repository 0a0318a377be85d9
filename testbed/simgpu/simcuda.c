/*
 * simcuda.c - a simulated CUDA driver (libcuda.so.1) for tests.  TEST INFRASTRUCTURE, never shipped.
 *
 * Device memory is pure accounting: pointers come from a per-device address range and are never dereferenceable.
 * Kernels "run" on a per-device timeline kept in the shared state file (see simcommon.h): a launch is placed at
 * max(now, device busy_until) and lasts
 *   - *(uint64_t *)kernelParams[0] ns for a function named "sleep" (explicit per-launch duration), or
 *   - gridX*gridY*gridZ * N ns for a function whose name ends in "_N" (e.g. "work_2000"), or
 *   - gridX*gridY*gridZ * SIMGPU_NS_PER_BLOCK ns otherwise.
 * Launches are asynchronous; a launch blocks only while the device timeline is more than SIMGPU_MAX_QUEUE_US
 * ahead of now (the driver's queue is full).  Events, stream and context synchronisation follow the timeline.
 */
#include "simcommon.h"
#include "vgpu_map.h"
#include <cuda.h>
#include <ctype.h>

#undef cuGetProcAddress
#undef cuEventElapsedTime
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b);

#define EXPORT __attribute__((visibility("default")))

typedef struct sim_stream { int dev; uint64_t last_end; } sim_stream_t;
typedef struct sim_ctx { int dev; int primary; int refs; sim_stream_t dflt; uint64_t charge; } sim_ctx_t;
typedef struct sim_event { uint64_t ts; int recorded; } sim_event_t;
typedef struct sim_func { char name[64]; uint64_t ns_per_block; int sleep_param; } sim_func_t;
typedef struct { sim_func_t *f; uint64_t blocks; uint64_t fixed_ns; } sim_node_t;
typedef struct sim_graph { int n; sim_node_t nodes[64]; } sim_graph_t;
typedef struct sim_pool { int dev; } sim_pool_t;
typedef struct sim_handle { int dev; uint64_t size; int refs; } sim_handle_t;
typedef struct sim_array { int dev; uint64_t size; int mip; } sim_array_t;

enum { K_PTR = 1, K_VA = 2, K_MAPPING = 3 };

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static vmap_t g_map;
static int g_inited;
static uint64_t g_next_addr[SIM_MAX_DEV];
static sim_ctx_t g_primary[SIM_MAX_DEV];
static sim_pool_t g_default_pool[SIM_MAX_DEV];
static __thread sim_ctx_t *t_stack[16];
static __thread int t_depth;
static uint64_t g_ns_per_block = 1000, g_max_queue_ns = 20000000ULL, g_ctx_bytes;

static sim_ctx_t *cur_ctx(void) { return t_depth > 0 ? t_stack[t_depth - 1] : NULL; }

static int sim_ready(void) { return g_inited && g_st; }

EXPORT CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&g_mu);
    sim_common_init();
    if (g_ndev == 0 || sim_register()) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_NO_DEVICE; }
    if (!g_inited) {
        g_ns_per_block = sim_env_u64("SIMGPU_NS_PER_BLOCK", 1000);
        g_max_queue_ns = sim_env_u64("SIMGPU_MAX_QUEUE_US", 20000) * 1000ULL;
        g_ctx_bytes = sim_env_u64("SIMGPU_CTX_BYTES", 0);
        for (int d = 0; d < SIM_MAX_DEV; d++) {
            g_next_addr[d] = 0x200000000000ULL + (uint64_t)d * 0x10000000000ULL;
            g_primary[d].dev = d;
            g_primary[d].primary = 1;
            g_primary[d].dflt.dev = d;
            g_default_pool[d].dev = d;
        }
        g_inited = 1;
    }
    pthread_mutex_unlock(&g_mu);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
    if (!v) return CUDA_ERROR_INVALID_VALUE;
    *v = (int)sim_env_u64("SIMGPU_DRIVER_VERSION", 13000);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult e, const char **s) {
    static const char *oom = "out of memory", *other = "simulated error", *ok = "no error";
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = e == CUDA_SUCCESS ? ok : e == CUDA_ERROR_OUT_OF_MEMORY ? oom : other;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuGetErrorName(CUresult e, const char **s) {
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    *s = e == CUDA_SUCCESS ? "CUDA_SUCCESS" : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR";
    return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- devices */
#define NEED_INIT() do { if (!sim_ready()) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define CHECK_DEV(d) do { if ((d) < 0 || (d) >= g_ndev) return CUDA_ERROR_INVALID_DEVICE; } while (0)

EXPORT CUresult cuDeviceGetCount(int *n) { NEED_INIT(); if (!n) return CUDA_ERROR_INVALID_VALUE; *n = g_ndev; return 0; }
EXPORT CUresult cuDeviceGet(CUdevice *d, int ord) {
    NEED_INIT(); CHECK_DEV(ord); if (!d) return CUDA_ERROR_INVALID_VALUE; *d = ord; return 0;
}
EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", g_cfg[d].name);
    return 0;
}
static void uuid_bytes(int d, unsigned char out[16]) {
    const char *s = g_cfg[d].uuid + 4;
    int i = 0;
    while (*s && i < 16) {
        if (*s == '-') { s++; continue; }
        unsigned v; sscanf(s, "%2x", &v); out[i++] = (unsigned char)v; s += 2;
    }
}
EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!u) return CUDA_ERROR_INVALID_VALUE;
    uuid_bytes(d, (unsigned char *)u->bytes);
    return 0;
}
#undef cuDeviceGetUuid
EXPORT CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return cuDeviceGetUuid_v2(u, d); }
EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!bytes) return CUDA_ERROR_INVALID_VALUE; *bytes = g_cfg[d].total; return 0;
}
EXPORT CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!v) return CUDA_ERROR_INVALID_VALUE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = g_cfg[d].sms; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 8; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: *v = 512; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = d + 1; break;
    default: *v = 0; break;
    }
    return 0;
}

/* ---------------------------------------------------------------- memory accounting */
static CUresult charge(int dev, uint64_t size) {
    for (int attempt = 0; attempt < 2; attempt++) {
        sim_dev_t *sd = &g_st->dev[dev];
        sim_lock(&sd->lock);
        if (sd->used + size <= g_cfg[dev].total) {
            sd->used += size;
            g_st->proc[g_myslot].used[dev] += size;
            sim_unlock(&sd->lock);
            return CUDA_SUCCESS;
        }
        sim_unlock(&sd->lock);
        sim_lock(&g_st->plock);
        sim_reap_nolock();
        sim_unlock(&g_st->plock);
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}
static void uncharge(int dev, uint64_t size) {
    sim_dev_t *sd = &g_st->dev[dev];
    sim_lock(&sd->lock);
    sd->used -= size;
    g_st->proc[g_myslot].used[dev] -= size;
    sim_unlock(&sd->lock);
}
static uint64_t round_alloc(uint64_t size) {
    if (size > (1ULL << 20)) return (size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);
    return (size + 511) & ~511ULL;
}
static uint64_t new_va(int dev, uint64_t size) {
    uint64_t a = __atomic_fetch_add(&g_next_addr[dev], (size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1),
                                    __ATOMIC_RELAXED);
    return a;
}
/* charge + record a device pointer */
static CUresult sim_alloc(int dev, uint64_t bytes, CUdeviceptr *out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t sz = round_alloc(bytes);
    CUresult r = charge(dev, sz);
    if (r) return r;
    uint64_t a = new_va(dev, sz);
    pthread_mutex_lock(&g_mu);
    vmap_entry_t *e = vmap_put(&g_map, K_PTR, a);
    if (e) { e->dev = dev; e->size = sz; }
    pthread_mutex_unlock(&g_mu);
    *out = (CUdeviceptr)a;
    return 0;
}
static CUresult sim_free(CUdeviceptr p) {
    if (p == 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_PTR, p);
    if (!e) { pthread_mutex_unlock(&g_mu); return CUDA_ERROR_INVALID_VALUE; }
    int dev = e->dev; uint64_t sz = e->size;
    vmap_del(&g_map, e);
    pthread_mutex_unlock(&g_mu);
    uncharge(dev, sz);
    return 0;
}
static int cur_dev(void) { sim_ctx_t *c = cur_ctx(); return c ? c->dev : -1; }
#define NEED_CTX(dev) int dev = cur_dev(); do { NEED_INIT(); if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT; } while (0)

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { NEED_CTX(dev); return sim_alloc(dev, n, p); }
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { NEED_INIT(); return sim_free(p); }
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    NEED_CTX(dev);
    if (!pitch || (elem != 4 && elem != 8 && elem != 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t pp = (w + 511) & ~(size_t)511;
    CUresult r = sim_alloc(dev, (uint64_t)pp * h, p);
    if (!r) *pitch = pp;
    return r;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
    (void)flags; NEED_CTX(dev); return sim_alloc(dev, n, p);
}
EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot) {
    NEED_CTX(dev);
    if (!fr || !tot) return CUDA_ERROR_INVALID_VALUE;
    uint64_t used = __atomic_load_n(&g_st->dev[dev].used, __ATOMIC_RELAXED);
    *tot = g_cfg[dev].total;
    *fr = used > g_cfg[dev].total ? 0 : g_cfg[dev].total - used;
    return 0;
}
EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t n) { NEED_INIT(); *pp = malloc(n ? n : 1); return *pp ? 0 : CUDA_ERROR_OUT_OF_MEMORY; }
EXPORT CUresult cuMemFreeHost(void *p) { free(p); return 0; }
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) { (void)d; (void)s; (void)n; NEED_INIT(); return 0; }
EXPORT CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) { (void)s; NEED_INIT(); memset(d, 0, n); return 0; }
EXPORT CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) { (void)d; (void)v; (void)n; NEED_INIT(); return 0; }

/* pools (no caching: pool memory is charged as allocated) */
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); *pool = (CUmemoryPool)&g_default_pool[d]; return 0;
}
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice d) { return cuDeviceGetDefaultMemPool(pool, d); }
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    NEED_INIT();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(props->location.id);
    sim_pool_t *p = calloc(1, sizeof *p);
    p->dev = props->location.id;
    *pool = (CUmemoryPool)p;
    return 0;
}
EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    sim_pool_t *p = (sim_pool_t *)pool;
    if (p >= g_default_pool && p < g_default_pool + SIM_MAX_DEV) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return 0;
}
EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { (void)pool; (void)keep; return 0; }
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) { (void)pool; (void)a; (void)v; return 0; }
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    (void)pool; (void)a; if (v) *(cuuint64_t *)v = 0; return 0;
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s; NEED_INIT();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc(((sim_pool_t *)pool)->dev, n, p);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) {
    (void)s; NEED_CTX(dev); return sim_alloc(dev, n, p);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; NEED_INIT(); return sim_free(p); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

/* virtual memory management: a physical handle lives while created, retained or mapped */
#define VMM_GRAN (2ULL << 20)
EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags o) {
    (void)prop; (void)o; NEED_INIT(); if (!g) return CUDA_ERROR_INVALID_VALUE; *g = VMM_GRAN; return 0;
}
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags; NEED_INIT();
    if (!h || !prop || size == 0 || size % VMM_GRAN) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
    CHECK_DEV(prop->location.id);
    CUresult r = charge(prop->location.id, size);
    if (r) return r;
    sim_handle_t *x = calloc(1, sizeof *x);
    x->dev = prop->location.id; x->size = size; x->refs = 1;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
    return 0;
}
static void handle_unref(sim_handle_t *x) {
    if (__atomic_sub_fetch(&x->refs, 1, __ATOMIC_ACQ_REL) == 0) { uncharge(x->dev, x->size); free(x); }
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    NEED_INIT(); if (!h) return CUDA_ERROR_INVALID_VALUE; handle_unref((sim_handle_t *)(uintptr_t)h); return 0;
}
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align; (void)addr; (void)flags; NEED_INIT();
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    *p = new_va(SIM_MAX_DEV - 1, size) + 0x8000000000ULL;
    return 0;
}
EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return 0; }
EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h, unsigned long long flags) {
    (void)size; (void)off; (void)flags; NEED_INIT();
    if (!h || !p) return CUDA_ERROR_INVALID_VALUE;
    sim_handle_t *x = (sim_handle_t *)(uintptr_t)h;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&g_mu);
    vmap_entry_t *e = vmap_put(&g_map, K_MAPPING, p);
    if (e) e->aux = (uint64_t)(uintptr_t)x;
    pthread_mutex_unlock(&g_mu);
    return 0;
}
EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    (void)size; NEED_INIT();
    pthread_mutex_lock(&g_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_MAPPING, p);
    sim_handle_t *x = e ? (sim_handle_t *)(uintptr_t)e->aux : NULL;
    if (e) vmap_del(&g_map, e);
    pthread_mutex_unlock(&g_mu);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    handle_unref(x);
    return 0;
}
EXPORT CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *d, size_t n) {
    (void)p; (void)size; (void)d; (void)n; return 0;
}
EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    NEED_INIT();
    pthread_mutex_lock(&g_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_MAPPING, (uint64_t)(uintptr_t)addr);
    sim_handle_t *x = e ? (sim_handle_t *)(uintptr_t)e->aux : NULL;
    pthread_mutex_unlock(&g_mu);
    if (!x) return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&x->refs, 1, __ATOMIC_ACQ_REL);
    *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
    return 0;
}

/* arrays */
static uint64_t fmt_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    default: return 4;
    }
}
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    uint64_t row = (w * fmt_bytes(f) * (ch ? ch : 1) + 511) & ~511ULL;  /* rows are padded to 512 bytes */
    return row * (h ? h : 1) * (d ? d : 1);
}
static CUresult new_array(int dev, uint64_t bytes, int mip, void **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = charge(dev, bytes);
    if (r) return r;
    sim_array_t *a = calloc(1, sizeof *a);
    a->dev = dev; a->size = bytes; a->mip = mip;
    *out = a;
    return 0;
}
EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    NEED_CTX(dev); if (!d) return CUDA_ERROR_INVALID_VALUE;
    return new_array(dev, array_bytes(d->Width, d->Height, 1, d->Format, d->NumChannels), 0, (void **)a);
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    NEED_CTX(dev); if (!d) return CUDA_ERROR_INVALID_VALUE;
    return new_array(dev, array_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels), 0, (void **)a);
}
static uint64_t mip_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t total = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < levels; l++) {
        total += array_bytes(w ? w : 1, h, z, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; z = z > 1 ? z / 2 : z;
    }
    return total;
}
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    NEED_CTX(dev); if (!d || levels == 0) return CUDA_ERROR_INVALID_VALUE;
    return new_array(dev, mip_bytes(d, levels), 1, (void **)a);
}
static CUresult free_array(void *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    sim_array_t *a = p; uncharge(a->dev, a->size); free(a); return 0;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { NEED_INIT(); return free_array(a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { NEED_INIT(); return free_array(a); }
EXPORT CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray a, CUdevice d) {
    (void)d; if (!req || !a) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req); req->size = ((sim_array_t *)a)->size; req->alignment = 512; return 0;
}
EXPORT CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray a, CUdevice d) {
    return cuArrayGetMemoryRequirements(req, (CUarray)a, d);
}

/* ---------------------------------------------------------------- contexts */
static CUresult ctx_charge(sim_ctx_t *c) {
    if (!g_ctx_bytes) return 0;
    CUresult r = charge(c->dev, g_ctx_bytes);
    if (!r) c->charge = g_ctx_bytes;
    return r;
}
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!pc) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mu);
    CUresult r = 0;
    if (g_primary[d].refs == 0) r = ctx_charge(&g_primary[d]);
    if (!r) g_primary[d].refs++;
    pthread_mutex_unlock(&g_mu);
    if (!r) *pc = (CUcontext)&g_primary[d];
    return r;
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
    NEED_INIT(); CHECK_DEV(d);
    pthread_mutex_lock(&g_mu);
    if (g_primary[d].refs > 0 && --g_primary[d].refs == 0 && g_primary[d].charge) {
        uncharge(d, g_primary[d].charge); g_primary[d].charge = 0;
    }
    pthread_mutex_unlock(&g_mu);
    return 0;
}
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice d, unsigned int *flags, int *active) {
    NEED_INIT(); CHECK_DEV(d); if (flags) *flags = 0; if (active) *active = g_primary[d].refs > 0; return 0;
}
static CUresult ctx_new(CUcontext *pc, CUdevice d) {
    NEED_INIT(); CHECK_DEV(d); if (!pc) return CUDA_ERROR_INVALID_VALUE;
    sim_ctx_t *c = calloc(1, sizeof *c);
    c->dev = d; c->refs = 1; c->dflt.dev = d;
    CUresult r = ctx_charge(c);
    if (r) { free(c); return r; }
    if (t_depth < 16) t_stack[t_depth++] = c;
    *pc = (CUcontext)c;
    return 0;
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pc, CUctxCreateParams *p, unsigned int flags, CUdevice d) {
    (void)p; (void)flags; return ctx_new(pc, d);
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice d) { (void)flags; return ctx_new(pc, d); }
EXPORT CUresult cuCtxCreate_v3(CUcontext *pc, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice d) {
    (void)p; (void)n; (void)flags; return ctx_new(pc, d);
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    NEED_INIT(); sim_ctx_t *x = (sim_ctx_t *)c;
    if (!x || x->primary) return CUDA_ERROR_INVALID_CONTEXT;
    for (int i = 0; i < t_depth; i++) if (t_stack[i] == x) { memmove(&t_stack[i], &t_stack[i + 1], (size_t)(t_depth - i - 1) * sizeof(void *)); t_depth--; i--; }
    if (x->charge) uncharge(x->dev, x->charge);
    free(x);
    return 0;
}
EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    NEED_INIT();
    if (!c) { if (t_depth) t_depth--; return 0; }
    if (t_depth == 0) t_depth = 1;
    t_stack[t_depth - 1] = (sim_ctx_t *)c;
    return 0;
}
EXPORT CUresult cuCtxGetCurrent(CUcontext *c) { NEED_INIT(); if (!c) return CUDA_ERROR_INVALID_VALUE; *c = (CUcontext)cur_ctx(); return 0; }
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) { NEED_INIT(); if (!c || t_depth >= 16) return CUDA_ERROR_INVALID_VALUE; t_stack[t_depth++] = (sim_ctx_t *)c; return 0; }
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    NEED_INIT(); if (!t_depth) return CUDA_ERROR_INVALID_CONTEXT;
    sim_ctx_t *x = t_stack[--t_depth]; if (c) *c = (CUcontext)x; return 0;
}
EXPORT CUresult cuCtxGetDevice(CUdevice *d) { NEED_CTX(dev); if (!d) return CUDA_ERROR_INVALID_VALUE; *d = dev; return 0; }

/* ---------------------------------------------------------------- streams, events, timeline */
static sim_stream_t *stream_of(CUstream s) {
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) return (sim_stream_t *)s;
    sim_ctx_t *c = cur_ctx();
    return c ? &c->dflt : NULL;
}
static void wait_until(uint64_t t) {
    uint64_t now = sim_now();
    if (t > now) sim_sleep_ns(t - now);
}
EXPORT CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags; NEED_CTX(dev);
    sim_stream_t *x = calloc(1, sizeof *x); x->dev = dev; *s = (CUstream)x; return 0;
}
EXPORT CUresult cuStreamDestroy_v2(CUstream s) { if (s) free(s); return 0; }
EXPORT CUresult cuStreamSynchronize(CUstream s) {
    NEED_INIT(); sim_stream_t *x = stream_of(s); if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    wait_until(__atomic_load_n(&x->last_end, __ATOMIC_ACQUIRE)); return 0;
}
EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
EXPORT CUresult cuStreamQuery(CUstream s) {
    NEED_INIT(); sim_stream_t *x = stream_of(s); if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    return sim_now() >= x->last_end ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuCtxSynchronize(void) {
    NEED_INIT(); if (g_myslot < 0) return 0;
    /* the device timeline's end bounds every stream of this process */
    sim_ctx_t *c = cur_ctx(); if (!c) return CUDA_ERROR_INVALID_CONTEXT;
    wait_until(__atomic_load_n(&g_st->dev[c->dev].busy_until, __ATOMIC_ACQUIRE));
    return 0;
}
EXPORT CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags; NEED_INIT(); if (!e) return CUDA_ERROR_INVALID_VALUE; *e = (CUevent)calloc(1, sizeof(sim_event_t)); return 0;
}
EXPORT CUresult cuEventDestroy_v2(CUevent e) { free(e); return 0; }
EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
    NEED_INIT(); sim_stream_t *x = stream_of(s); sim_event_t *ev = (sim_event_t *)e;
    if (!x || !ev) return CUDA_ERROR_INVALID_VALUE;
    uint64_t now = sim_now(), le = __atomic_load_n(&x->last_end, __ATOMIC_ACQUIRE);
    ev->ts = le > now ? le : now; ev->recorded = 1;
    return 0;
}
EXPORT CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
EXPORT CUresult cuEventQuery(CUevent e) {
    sim_event_t *ev = (sim_event_t *)e; if (!ev) return CUDA_ERROR_INVALID_VALUE;
    return sim_now() >= ev->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
EXPORT CUresult cuEventSynchronize(CUevent e) {
    sim_event_t *ev = (sim_event_t *)e; if (!ev) return CUDA_ERROR_INVALID_VALUE; wait_until(ev->ts); return 0;
}
EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b) {
    sim_event_t *x = (sim_event_t *)a, *y = (sim_event_t *)b;
    if (!ms || !x || !y || !x->recorded || !y->recorded) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now();
    if (now < x->ts || now < y->ts) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)y->ts - (double)x->ts) / 1e6);
    return 0;
}
EXPORT CUresult cuEventElapsedTime(float *ms, CUevent a, CUevent b) { return cuEventElapsedTime_v2(ms, a, b); }

/* Places `dur` ns of work on the device timeline for stream x. */
static void enqueue(int dev, sim_stream_t *x, uint64_t dur) {
    sim_dev_t *sd = &g_st->dev[dev];
    for (;;) {
        sim_lock(&sd->lock);
        uint64_t now = sim_now();
        uint64_t start = sd->busy_until > now ? sd->busy_until : now;
        if (start - now > g_max_queue_ns) {
            sim_unlock(&sd->lock);
            sim_sleep_ns(start - now - g_max_queue_ns);
            continue;
        }
        uint64_t end = start + dur;
        __atomic_store_n(&sd->busy_until, end, __ATOMIC_RELEASE);
        sd->busy_total += dur;
        sd->launches++;
        sim_bucket_add(sd->util, start, end);
        sim_proc_t *p = &g_st->proc[g_myslot];
        p->busy_total[dev] += dur;
        sim_bucket_add(p->util[dev], start, end);
        sim_unlock(&sd->lock);
        __atomic_store_n(&x->last_end, end, __ATOMIC_RELEASE);
        return;
    }
}
static uint64_t kernel_ns(sim_func_t *f, uint64_t blocks, void **params) {
    if (f->sleep_param) return (params && params[0]) ? *(uint64_t *)params[0] : 0;
    return blocks * (f->ns_per_block ? f->ns_per_block : g_ns_per_block);
}
static CUresult launch(CUfunction fn, uint64_t blocks, CUstream s, void **params) {
    NEED_INIT();
    sim_stream_t *x = stream_of(s);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    enqueue(x->dev, x, kernel_ns((sim_func_t *)fn, blocks, params));
    return 0;
}

/* ---------------------------------------------------------------- modules and launches */
EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    (void)image; NEED_INIT(); if (!m) return CUDA_ERROR_INVALID_VALUE; *m = (CUmodule)calloc(1, 16); return 0;
}
EXPORT CUresult cuModuleLoad(CUmodule *m, const char *fname) { (void)fname; return cuModuleLoadData(m, NULL); }
EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v; return cuModuleLoadData(m, image);
}
EXPORT CUresult cuModuleUnload(CUmodule m) { free(m); return 0; }
EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    NEED_INIT(); if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    sim_func_t *x = calloc(1, sizeof *x);
    snprintf(x->name, sizeof x->name, "%s", name);
    if (!strcmp(name, "sleep")) x->sleep_param = 1;
    const char *u = strrchr(name, '_');
    if (u && isdigit((unsigned char)u[1])) x->ns_per_block = strtoull(u + 1, NULL, 10);
    *f = (CUfunction)x;
    return 0;
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                               unsigned shm, CUstream s, void **params, void **extra) {
    (void)bx; (void)by; (void)bz; (void)shm; (void)extra;
    return launch(f, (uint64_t)gx * gy * gz, s, params);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                    unsigned shm, CUstream s, void **params, void **extra) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)extra; if (!c) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, (uint64_t)c->gridDimX * c->gridDimY * c->gridDimZ, c->hStream, params);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(c, f, params, extra);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                          unsigned bz, unsigned shm, CUstream s, void **params) {
    (void)bx; (void)by; (void)bz; (void)shm;
    return launch(f, (uint64_t)gx * gy * gz, s, params);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shm, s, params);
}

/* graphs: a linear list of kernel nodes, run back to back as one unit of work */
EXPORT CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    (void)flags; NEED_INIT(); if (!g) return CUDA_ERROR_INVALID_VALUE; *g = (CUgraph)calloc(1, sizeof(sim_graph_t)); return 0;
}
EXPORT CUresult cuGraphDestroy(CUgraph g) { free(g); return 0; }
EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t nd,
                                        const CUDA_KERNEL_NODE_PARAMS *p) {
    (void)deps; (void)nd; NEED_INIT();
    sim_graph_t *x = (sim_graph_t *)g;
    if (!x || !p || x->n >= 64) return CUDA_ERROR_INVALID_VALUE;
    sim_node_t *n = &x->nodes[x->n++];
    n->f = (sim_func_t *)p->func;
    n->blocks = (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ;
    n->fixed_ns = kernel_ns(n->f, n->blocks, p->kernelParams);
    if (node) *node = (CUgraphNode)n;
    return 0;
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *e, CUgraph g, unsigned long long flags) {
    (void)flags; NEED_INIT(); if (!e || !g) return CUDA_ERROR_INVALID_VALUE;
    sim_graph_t *c = malloc(sizeof *c); memcpy(c, g, sizeof *c); *e = (CUgraphExec)c; return 0;
}
EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) { free(e); return 0; }
EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
    NEED_INIT(); sim_graph_t *x = (sim_graph_t *)e; sim_stream_t *st = stream_of(s);
    if (!x) return CUDA_ERROR_INVALID_HANDLE;
    if (!st) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t dur = 0;
    for (int i = 0; i < x->n; i++) dur += x->nodes[i].fixed_ns;
    enqueue(st->dev, st, dur);
    return 0;
}
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) { return cuGraphLaunch(e, s); }

EXPORT CUresult cuGetExportTable(const void **t, const CUuuid *id) { (void)t; (void)id; return CUDA_ERROR_NOT_SUPPORTED; }

/* ---------------------------------------------------------------- cuGetProcAddress */
typedef struct { const char *base; const char *name; int since; int ptsz; void *fn; } proc_t;
#define P(base, fn, since) {base, #fn, since, 0, (void *)fn}
#define PZ(base, fn, since) {base, #fn, since, 1, (void *)fn}
static const proc_t g_procs[] = {
    P("cuInit", cuInit, 2000), P("cuDriverGetVersion", cuDriverGetVersion, 2020),
    P("cuGetErrorString", cuGetErrorString, 6000), P("cuGetErrorName", cuGetErrorName, 6000),
    P("cuGetProcAddress", cuGetProcAddress, 11030), P("cuGetProcAddress", cuGetProcAddress_v2, 12000),
    P("cuGetExportTable", cuGetExportTable, 3000),
    P("cuDeviceGetCount", cuDeviceGetCount, 2000), P("cuDeviceGet", cuDeviceGet, 2000),
    P("cuDeviceGetName", cuDeviceGetName, 2000), P("cuDeviceGetUuid", cuDeviceGetUuid, 9020),
    P("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040), P("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    P("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000),
    P("cuMemAlloc", cuMemAlloc_v2, 3020), P("cuMemFree", cuMemFree_v2, 3020),
    P("cuMemAllocPitch", cuMemAllocPitch_v2, 3020), P("cuMemAllocManaged", cuMemAllocManaged, 6000),
    P("cuMemGetInfo", cuMemGetInfo_v2, 3020), P("cuMemAllocHost", cuMemAllocHost_v2, 3020),
    P("cuMemFreeHost", cuMemFreeHost, 2000), P("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020),
    P("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020), P("cuMemsetD8", cuMemsetD8_v2, 3020),
    P("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020),
    P("cuDeviceGetMemPool", cuDeviceGetMemPool, 11020), P("cuMemPoolCreate", cuMemPoolCreate, 11020),
    P("cuMemPoolDestroy", cuMemPoolDestroy, 11020), P("cuMemPoolTrimTo", cuMemPoolTrimTo, 11020),
    P("cuMemPoolSetAttribute", cuMemPoolSetAttribute, 11020), P("cuMemPoolGetAttribute", cuMemPoolGetAttribute, 11020),
    P("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    PZ("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020),
    P("cuMemAllocAsync", cuMemAllocAsync, 11020), PZ("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020),
    P("cuMemFreeAsync", cuMemFreeAsync, 11020), PZ("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020),
    P("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020),
    P("cuMemCreate", cuMemCreate, 10020), P("cuMemRelease", cuMemRelease, 10020),
    P("cuMemAddressReserve", cuMemAddressReserve, 10020), P("cuMemAddressFree", cuMemAddressFree, 10020),
    P("cuMemMap", cuMemMap, 10020), P("cuMemUnmap", cuMemUnmap, 10020), P("cuMemSetAccess", cuMemSetAccess, 10020),
    P("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000),
    P("cuArrayCreate", cuArrayCreate_v2, 3020), P("cuArray3DCreate", cuArray3DCreate_v2, 3020),
    P("cuArrayDestroy", cuArrayDestroy, 2000), P("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000),
    P("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000),
    P("cuArrayGetMemoryRequirements", cuArrayGetMemoryRequirements, 11060),
    P("cuMipmappedArrayGetMemoryRequirements", cuMipmappedArrayGetMemoryRequirements, 11060),
    P("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    P("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    P("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000),
    P("cuCtxCreate", cuCtxCreate_v2, 3020), P("cuCtxCreate", cuCtxCreate_v3, 11040), P("cuCtxCreate", cuCtxCreate_v4, 12050),
    P("cuCtxDestroy", cuCtxDestroy_v2, 4000), P("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    P("cuCtxGetCurrent", cuCtxGetCurrent, 4000), P("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000),
    P("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000), P("cuCtxGetDevice", cuCtxGetDevice, 2000),
    P("cuCtxSynchronize", cuCtxSynchronize, 2000),
    P("cuStreamCreate", cuStreamCreate, 2000), P("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    P("cuStreamSynchronize", cuStreamSynchronize, 2000), PZ("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000),
    P("cuStreamQuery", cuStreamQuery, 2000),
    P("cuEventCreate", cuEventCreate, 2000), P("cuEventDestroy", cuEventDestroy_v2, 4000),
    P("cuEventRecord", cuEventRecord, 2000), PZ("cuEventRecord", cuEventRecord_ptsz, 7000),
    P("cuEventQuery", cuEventQuery, 2000), P("cuEventSynchronize", cuEventSynchronize, 2000),
    P("cuEventElapsedTime", cuEventElapsedTime, 2000), P("cuEventElapsedTime", cuEventElapsedTime_v2, 12080),
    P("cuModuleLoad", cuModuleLoad, 2000), P("cuModuleLoadData", cuModuleLoadData, 2000),
    P("cuModuleLoadDataEx", cuModuleLoadDataEx, 2010), P("cuModuleUnload", cuModuleUnload, 2000),
    P("cuModuleGetFunction", cuModuleGetFunction, 2000),
    P("cuLaunchKernel", cuLaunchKernel, 4000), PZ("cuLaunchKernel", cuLaunchKernel_ptsz, 7000),
    P("cuLaunchKernelEx", cuLaunchKernelEx, 11060), PZ("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060),
    P("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000),
    PZ("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000),
    P("cuGraphCreate", cuGraphCreate, 10000), P("cuGraphDestroy", cuGraphDestroy, 10000),
    P("cuGraphAddKernelNode", cuGraphAddKernelNode_v2, 12000),
    P("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    P("cuGraphInstantiate", cuGraphInstantiateWithFlags, 12000),
    P("cuGraphExecDestroy", cuGraphExecDestroy, 10000),
    P("cuGraphLaunch", cuGraphLaunch, 10000), PZ("cuGraphLaunch", cuGraphLaunch_ptsz, 10000),
};

static CUresult proc_lookup(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
    if (!sym || !pfn) return CUDA_ERROR_INVALID_VALUE;
    const proc_t *best = NULL;
    int known = 0, want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    for (size_t i = 0; i < sizeof g_procs / sizeof g_procs[0]; i++) {
        const proc_t *p = &g_procs[i];
        if (strcmp(p->base, sym)) continue;
        known = 1;
        if (p->since > ver) continue;
        if (p->ptsz && !want_ptsz) continue;
        if (!best || p->ptsz > best->ptsz || (p->ptsz == best->ptsz && p->since > best->since)) best = p;
    }
    *pfn = best ? best->fn : NULL;
    if (st) *st = best ? CU_GET_PROC_ADDRESS_SUCCESS : known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                          : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return best ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, cuuint64_t flags, CUdriverProcAddressQueryResult *st) {
    return proc_lookup(sym, pfn, ver, flags, st);
}
EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, cuuint64_t flags) {
    return proc_lookup(sym, pfn, ver, flags, NULL);
}

/* ---------------------------------------------------------------- test helpers (not part of the CUDA API) */
/* A test process that never calls cuInit may point SIMGPU_STATE at another file between calls. */
static int helper_state(void) {
    char path[512];
    sim_common_init();
    sim_state_path(path, sizeof path);
    if (g_st && !g_inited && strcmp(path, g_st_path)) {
        munmap(g_st, sizeof *g_st);
        g_st = NULL;
    }
    return sim_attach_state();
}
EXPORT uint64_t simgpu_now_ns(void) { return sim_now(); }
/* Busy ns of device `dev` in [t0, t1) (CLOCK_MONOTONIC ns), of every process (pid 0) or of one pid. */
EXPORT uint64_t simgpu_busy_ns(int dev, int pid, uint64_t t0, uint64_t t1) {
    if (helper_state() || dev < 0 || dev >= SIM_MAX_DEV) return 0;
    if (!pid) return sim_bucket_sum(g_st->dev[dev].util, t0, t1);
    uint64_t total = 0;
    for (int i = 0; i < SIM_MAX_PROC; i++)
        if (g_st->proc[i].pid == pid) total += sim_bucket_sum(g_st->proc[i].util[dev], t0, t1);
    return total;
}
EXPORT uint64_t simgpu_used_bytes(int dev) {
    if (helper_state() || dev < 0 || dev >= SIM_MAX_DEV) return 0;
    return __atomic_load_n(&g_st->dev[dev].used, __ATOMIC_RELAXED);
}
EXPORT uint64_t simgpu_launches(int dev) {
    if (helper_state() || dev < 0 || dev >= SIM_MAX_DEV) return 0;
    return __atomic_load_n(&g_st->dev[dev].launches, __ATOMIC_RELAXED);
}
