/*
 * simcuda.c - a simulated CUDA driver (libcuda.so.1).  TEST INFRASTRUCTURE, never shipped.
 *
 * Device memory is bookkeeping only: addresses come from a private range per GPU and cannot be dereferenced.
 * Allocations fail with CUDA_ERROR_OUT_OF_MEMORY past the GPU's memory and past the hard limit NVML set for the
 * calling process's cgroup (nvmlDeviceSetMemoryLimits_v1, see simnvml.c).
 * Kernels run on the GPU's engine (gpusim.h) for a duration drawn at launch (kerneltime.h).  Launches are
 * asynchronous; a stream with SIMGPU_QUEUE_DEPTH launches in flight makes the next launch wait.  An event gets
 * the time at which the engine reaches it.  Graphs run their kernel nodes one after another.
 */
#include "gpusim.h"
#include "kerneltime.h"
#include "objtable.h"
#include <cuda.h>

#undef cuGetProcAddress
#undef cuEventElapsedTime
#undef cuDeviceGetUuid
CUresult cuGetProcAddress(const char *name, void **fn, int version, cuuint64_t opts);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);

#define API __attribute__((visibility("default")))

typedef struct {
    int gpu;                  /* index into gs_view */
    uint64_t done_at;         /* end of the last work submitted to it */
    uint32_t depth, issued;
    uint64_t *ends;           /* end times of the last `depth` launches */
} sc_stream_t;

typedef struct {
    int gpu;
    int primary, retained;
    uint64_t overhead;        /* bytes the context itself takes (SIMGPU_CTX_BYTES) */
    sc_stream_t null_stream;
} sc_ctx_t;

typedef struct { uint64_t at; int valid; } sc_event_t;
typedef struct { char *image; } sc_module_t;
typedef struct { kt_func_t fn; uint64_t blocks; uint64_t param; } sc_node_t;
typedef struct { int count; sc_node_t node[64]; } sc_graph_t;
typedef struct { int gpu; } sc_pool_t;
typedef struct { int gpu; uint64_t bytes; int refs; } sc_phys_t;
typedef struct { int gpu; uint64_t bytes; } sc_array_t;

enum { TAG_PTR = 11, TAG_MAP = 12 };

static pthread_mutex_t sc_mu = PTHREAD_MUTEX_INITIALIZER;
static ot_table_t sc_objs;
static int sc_up;
static uint64_t sc_next_va[GS_NDEV];
static sc_ctx_t sc_primary[GS_NDEV];
static sc_pool_t sc_pools[GS_NDEV];
static uint32_t sc_depth = 1024;
static uint64_t sc_ctx_bytes;
static __thread sc_ctx_t *sc_cur[16];
static __thread int sc_ncur;

static sc_ctx_t *current(void) { return sc_ncur ? sc_cur[sc_ncur - 1] : NULL; }

static void stream_setup(sc_stream_t *s, int gpu) {
    s->gpu = gpu;
    s->depth = sc_depth;
    s->ends = calloc(sc_depth, sizeof *s->ends);
}

API CUresult cuInit(unsigned int flags) {
    (void)flags;
    pthread_mutex_lock(&sc_mu);
    int bad = gs_join() || gs_nview == 0;
    if (!bad && !sc_up) {
        sc_depth = (uint32_t)gs_env_num("SIMGPU_QUEUE_DEPTH", 1024);
        if (!sc_depth) sc_depth = 1;
        sc_ctx_bytes = gs_env_num("SIMGPU_CTX_BYTES", 0);
        for (int g = 0; g < GS_NDEV; g++) {
            sc_next_va[g] = 0x7f0000000000ULL - (uint64_t)(g + 1) * 0x40000000000ULL;
            sc_primary[g].gpu = g;
            sc_primary[g].primary = 1;
            stream_setup(&sc_primary[g].null_stream, g);
            sc_pools[g].gpu = g;
        }
        sc_up = 1;
    }
    pthread_mutex_unlock(&sc_mu);
    return bad ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

#define UP() do { if (!sc_up) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define GPU_OK(g) do { if ((g) < 0 || (g) >= gs_nview) return CUDA_ERROR_INVALID_DEVICE; } while (0)
#define CTX_GPU(var) int var; do { UP(); sc_ctx_t *c_ = current(); if (!c_) return CUDA_ERROR_INVALID_CONTEXT; \
    var = c_->gpu; } while (0)

static gs_gpu_t *hw(int gpu) { return &gs_st->gpu[gs_view[gpu].slot]; }

API CUresult cuDriverGetVersion(int *version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = (int)gs_env_num("SIMGPU_DRIVER_VERSION", 13000);
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult code, const char **text) {
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    *text = code == CUDA_SUCCESS ? "no error" : code == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "sim error";
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult code, const char **text) {
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    *text = code == CUDA_SUCCESS ? "CUDA_SUCCESS" : code == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
                                                                                    : "CUDA_ERROR_UNKNOWN";
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ devices */
API CUresult cuDeviceGetCount(int *count) {
    UP();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = gs_nview;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    UP();
    GPU_OK(ordinal);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!name || len < 1) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", gs_view[dev].name);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *out, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    const char *hex = gs_view[dev].uuid + 4;
    for (int i = 0; i < 16 && *hex;) {
        if (*hex == '-') { hex++; continue; }
        char pair[3] = {hex[0], hex[1], 0};
        out->bytes[i++] = (char)strtoul(pair, NULL, 16);
        hex += 2;
    }
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetUuid(CUuuid *out, CUdevice dev) { return cuDeviceGetUuid_v2(out, dev); }

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = gs_view[dev].total;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) v = gs_view[dev].sms;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) v = 2048;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) v = 1024;
    else if (attr == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) v = 8;
    else if (attr == CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT) v = 512;
    else if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) v = dev + 1;
    else if (attr == CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED ||
             attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ||
             attr == CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)
        v = 1;
    *value = v;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ memory */
/* Bytes the processes of cgroup subtree `dir` hold on state GPU `slot`.  Caller holds gs_st->mu. */
static uint64_t cgroup_usage(const char *dir, int slot) {
    uint64_t sum = 0;
    for (int i = 0; i < GS_NPROC; i++)
        if (gs_st->proc[i].pid && gs_cgroup_covers(dir, gs_st->proc[i].cgroup)) sum += gs_st->proc[i].mem[slot];
    return sum;
}

/* Takes `bytes` of GPU `gpu` for this process; OOM past the GPU or past a cgroup hard limit. */
static CUresult take_memory(int gpu, uint64_t bytes) {
    gs_gpu_t *g = hw(gpu);
    int slot = gs_view[gpu].slot;
    CUresult rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int tries = 0; tries < 2 && rc != CUDA_SUCCESS; tries++) {
        gs_lock(&gs_st->mu);
        if (tries) gs_reap_locked();
        int within = 1;
        const char *mine = gs_st->proc[gs_me].cgroup;
        for (int l = 0; l < GS_NLIMIT && within; l++) {
            gs_limit_t *lim = &gs_st->limit[l];
            if (lim->path[0] && !strcmp(lim->uuid, g->uuid) && gs_cgroup_covers(lim->path, mine))
                within = cgroup_usage(lim->path, slot) + bytes <= lim->hard;
        }
        gs_lock(&g->mu);
        if (within && g->used + bytes <= g->total) {
            g->used += bytes;
            gs_st->proc[gs_me].mem[slot] += bytes;
            rc = CUDA_SUCCESS;
        }
        gs_unlock(&g->mu);
        gs_unlock(&gs_st->mu);
        if (!within) break;
    }
    return rc;
}

static void give_memory(int gpu, uint64_t bytes) {
    gs_gpu_t *g = hw(gpu);
    gs_lock(&g->mu);
    g->used -= bytes;
    gs_st->proc[gs_me].mem[gs_view[gpu].slot] -= bytes;
    gs_unlock(&g->mu);
}

/* the driver hands out 2 MiB pages for large buffers and 512-byte pieces of shared pages for small ones */
static uint64_t page_round(uint64_t n) {
    const uint64_t big = 2ULL << 20;
    return n > (big >> 1) ? (n + big - 1) / big * big : (n + 511) / 512 * 512;
}

#define VA_STEP 0x200000ULL   /* each buffer starts on its own 2 MiB boundary */
static CUresult new_buffer(int gpu, uint64_t n, CUdeviceptr *out) {
    if (!out || !n) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = page_round(n);
    CUresult rc = take_memory(gpu, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&sc_mu);
    uint64_t addr = sc_next_va[gpu];
    sc_next_va[gpu] += (bytes / VA_STEP + (bytes % VA_STEP != 0)) * VA_STEP;
    ot_node_t *rec = ot_add(&sc_objs, TAG_PTR, addr);
    if (rec) { rec->gpu = gpu; rec->bytes = bytes; }
    pthread_mutex_unlock(&sc_mu);
    *out = (CUdeviceptr)addr;
    return CUDA_SUCCESS;
}

static CUresult drop_buffer(CUdeviceptr p) {
    if (!p) return CUDA_SUCCESS;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_remove(&sc_objs, TAG_PTR, (uint64_t)p);
    pthread_mutex_unlock(&sc_mu);
    if (!rec) return CUDA_ERROR_INVALID_VALUE;
    give_memory(rec->gpu, rec->bytes);
    free(rec);
    return CUDA_SUCCESS;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { CTX_GPU(g); return new_buffer(g, n, p); }
API CUresult cuMemFree_v2(CUdeviceptr p) { UP(); return drop_buffer(p); }
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
    (void)flags;
    CTX_GPU(g);
    return new_buffer(g, n, p);
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    CTX_GPU(g);
    if (!pitch || !(elem == 4 || elem == 8 || elem == 16)) return CUDA_ERROR_INVALID_VALUE;
    size_t row = (width + 511) / 512 * 512;
    CUresult rc = new_buffer(g, (uint64_t)row * height, p);
    if (rc == CUDA_SUCCESS) *pitch = row;
    return rc;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CTX_GPU(g);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t used = __atomic_load_n(&hw(g)->used, __ATOMIC_RELAXED);
    *total_bytes = gs_view[g].total;
    *free_bytes = used < gs_view[g].total ? gs_view[g].total - used : 0;
    return CUDA_SUCCESS;
}
API CUresult cuMemAllocHost_v2(void **pp, size_t n) {
    UP();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    *pp = malloc(n ? n : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) { (void)dst; (void)src; (void)n; UP(); return 0; }
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { (void)src; UP(); memset(dst, 0, n); return 0; }
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) { (void)dst; (void)v; (void)n; UP(); return 0; }

/* stream-ordered allocation: pools hand memory to the GPU as it is allocated (no caching) */
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&sc_pools[dev];
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) { return cuDeviceGetDefaultMemPool(pool, dev); }
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    UP();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    GPU_OK(props->location.id);
    sc_pool_t *made = calloc(1, sizeof *made);
    made->gpu = props->location.id;
    *pool = (CUmemoryPool)made;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    sc_pool_t *x = (sc_pool_t *)pool;
    if (!x || (x >= sc_pools && x < sc_pools + GS_NDEV)) return CUDA_ERROR_INVALID_VALUE;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { (void)pool; (void)keep; return 0; }
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) { (void)pool; (void)a; (void)v; return 0; }
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    (void)pool; (void)a;
    if (v) *(cuuint64_t *)v = 0;
    return 0;
}
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)s;
    UP();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return new_buffer(((sc_pool_t *)pool)->gpu, n, p);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return cuMemAllocFromPoolAsync(p, n, pool, s);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; CTX_GPU(g); return new_buffer(g, n, p); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return cuMemAllocAsync(p, n, s); }
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; UP(); return drop_buffer(p); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return cuMemFreeAsync(p, s); }

/* virtual memory management: physical memory lives while its handle, a retain or a mapping refers to it */
#define VMM_PAGE (2ULL << 20)
API CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags opt) {
    (void)prop; (void)opt;
    UP();
    if (!gran) return CUDA_ERROR_INVALID_VALUE;
    *gran = VMM_PAGE;
    return CUDA_SUCCESS;
}
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    (void)flags;
    UP();
    if (!handle || !prop || !size || size % VMM_PAGE) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
    GPU_OK(prop->location.id);
    CUresult rc = take_memory(prop->location.id, size);
    if (rc != CUDA_SUCCESS) return rc;
    sc_phys_t *ph = calloc(1, sizeof *ph);
    ph->gpu = prop->location.id;
    ph->bytes = size;
    ph->refs = 1;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}
static void phys_put(sc_phys_t *ph) {
    if (__atomic_sub_fetch(&ph->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        give_memory(ph->gpu, ph->bytes);
        free(ph);
    }
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    UP();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    phys_put((sc_phys_t *)(uintptr_t)handle);
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
    (void)align; (void)addr; (void)f;
    UP();
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    *p = (CUdeviceptr)sc_next_va[GS_NDEV - 1];
    sc_next_va[GS_NDEV - 1] += (size / VMM_PAGE + (size % VMM_PAGE != 0)) * VMM_PAGE;
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { (void)p; (void)size; return CUDA_SUCCESS; }
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags) {
    (void)size; (void)offset; (void)flags;
    UP();
    if (!p || !handle) return CUDA_ERROR_INVALID_VALUE;
    sc_phys_t *ph = (sc_phys_t *)(uintptr_t)handle;
    __atomic_add_fetch(&ph->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_add(&sc_objs, TAG_MAP, (uint64_t)p);
    if (rec) rec->obj = ph;
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    (void)size;
    UP();
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_remove(&sc_objs, TAG_MAP, (uint64_t)p);
    pthread_mutex_unlock(&sc_mu);
    if (!rec) return CUDA_ERROR_INVALID_VALUE;
    phys_put(rec->obj);
    free(rec);
    return CUDA_SUCCESS;
}
API CUresult cuMemSetAccess(CUdeviceptr p, size_t size, const CUmemAccessDesc *desc, size_t count) {
    (void)p; (void)size; (void)desc; (void)count;
    return CUDA_SUCCESS;
}
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    UP();
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_get(&sc_objs, TAG_MAP, (uint64_t)(uintptr_t)addr);
    sc_phys_t *ph = rec ? rec->obj : NULL;
    if (ph) __atomic_add_fetch(&ph->refs, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_unlock(&sc_mu);
    if (!ph || !handle) return CUDA_ERROR_INVALID_VALUE;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

/* arrays: rows are laid out in 512-byte units */
static uint64_t texel_bytes(CUarray_format fmt) {
    if (fmt == CU_AD_FORMAT_UNSIGNED_INT8 || fmt == CU_AD_FORMAT_SIGNED_INT8) return 1;
    if (fmt == CU_AD_FORMAT_UNSIGNED_INT16 || fmt == CU_AD_FORMAT_SIGNED_INT16 || fmt == CU_AD_FORMAT_HALF) return 2;
    return 4;
}
static uint64_t layout_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format fmt, unsigned channels) {
    uint64_t rows = h > 1 ? h : 1, slices = d > 1 ? d : 1;
    uint64_t row = w * texel_bytes(fmt) * (channels > 1 ? channels : 1);
    return (row + 511) / 512 * 512 * rows * slices;
}
static CUresult new_array(int gpu, uint64_t bytes, void **out) {
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = take_memory(gpu, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    sc_array_t *a = calloc(1, sizeof *a);
    a->gpu = gpu;
    a->bytes = bytes;
    *out = a;
    return CUDA_SUCCESS;
}
API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), (void **)arr);
}
API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
                     (void **)arr);
}
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    CTX_GPU(g);
    if (!desc || !levels) return CUDA_ERROR_INVALID_VALUE;
    uint64_t sum = 0;
    for (unsigned level = 0; level < levels; level++) {
        uint64_t wl = desc->Width >> level, hl = desc->Height >> level, dl = desc->Depth >> level;
        sum += layout_bytes(wl > 1 ? wl : 1, hl ? hl : (desc->Height > 0), dl ? dl : (desc->Depth > 0), desc->Format,
                            desc->NumChannels);
    }
    return new_array(g, sum, (void **)arr);
}
static CUresult drop_array(void *p) {
    sc_array_t *a = p;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    give_memory(a->gpu, a->bytes);
    free(a);
    return CUDA_SUCCESS;
}
API CUresult cuArrayDestroy(CUarray arr) { UP(); return drop_array(arr); }
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) { UP(); return drop_array(arr); }
API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray arr, CUdevice dev) {
    (void)dev;
    if (!req || !arr) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req);
    req->size = ((sc_array_t *)arr)->bytes;
    req->alignment = 512;
    return CUDA_SUCCESS;
}
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray arr,
                                                   CUdevice dev) {
    return cuArrayGetMemoryRequirements(req, (CUarray)arr, dev);
}

/* ------------------------------------------------------------------------------------------------ contexts */
static CUresult ctx_take(sc_ctx_t *c) {
    if (!sc_ctx_bytes) return CUDA_SUCCESS;
    CUresult rc = take_memory(c->gpu, sc_ctx_bytes);
    if (rc == CUDA_SUCCESS) c->overhead = sc_ctx_bytes;
    return rc;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sc_mu);
    if (!sc_primary[dev].retained) rc = ctx_take(&sc_primary[dev]);
    if (rc == CUDA_SUCCESS) sc_primary[dev].retained++;
    pthread_mutex_unlock(&sc_mu);
    if (rc == CUDA_SUCCESS) *pctx = (CUcontext)&sc_primary[dev];
    return rc;
}
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    UP();
    GPU_OK(dev);
    pthread_mutex_lock(&sc_mu);
    sc_ctx_t *c = &sc_primary[dev];
    if (c->retained > 0 && --c->retained == 0 && c->overhead) {
        give_memory(dev, c->overhead);
        c->overhead = 0;
    }
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    UP();
    GPU_OK(dev);
    if (flags) *flags = 0;
    if (active) *active = sc_primary[dev].retained > 0;
    return CUDA_SUCCESS;
}
static CUresult ctx_make(CUcontext *pctx, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    sc_ctx_t *c = calloc(1, sizeof *c);
    c->gpu = dev;
    c->retained = 1;
    CUresult rc = ctx_take(c);
    if (rc != CUDA_SUCCESS) { free(c); return rc; }
    stream_setup(&c->null_stream, dev);
    if (sc_ncur < 16) sc_cur[sc_ncur++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) { (void)flags; return ctx_make(pctx, dev); }
API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    (void)p; (void)n; (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    (void)p; (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    UP();
    sc_ctx_t *c = (sc_ctx_t *)ctx;
    if (!c || c->primary) return CUDA_ERROR_INVALID_CONTEXT;
    int keep = 0;
    for (int i = 0; i < sc_ncur; i++)
        if (sc_cur[i] != c) sc_cur[keep++] = sc_cur[i];
    sc_ncur = keep;
    if (c->overhead) give_memory(c->gpu, c->overhead);
    free(c->null_stream.ends);
    free(c);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext ctx) {
    UP();
    if (!ctx) {
        if (sc_ncur) sc_ncur--;
        return CUDA_SUCCESS;
    }
    if (!sc_ncur) sc_ncur = 1;
    sc_cur[sc_ncur - 1] = (sc_ctx_t *)ctx;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetCurrent(CUcontext *ctx) {
    UP();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)current();
    return CUDA_SUCCESS;
}
API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    UP();
    if (!ctx || sc_ncur >= 16) return CUDA_ERROR_INVALID_VALUE;
    sc_cur[sc_ncur++] = (sc_ctx_t *)ctx;
    return CUDA_SUCCESS;
}
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    UP();
    if (!sc_ncur) return CUDA_ERROR_INVALID_CONTEXT;
    sc_ncur--;
    if (ctx) *ctx = (CUcontext)sc_cur[sc_ncur];
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *dev) {
    CTX_GPU(g);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = g;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ the engine */
static sc_stream_t *stream_for(CUstream s) {
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) return (sc_stream_t *)s;
    sc_ctx_t *c = current();
    return c ? &c->null_stream : NULL;
}

static void sleep_until(uint64_t when) {
    uint64_t now = gs_clock();
    if (when > now) gs_nap(when - now);
}

/* Puts kernels of the given durations on the engine, back to back, after everything submitted before. */
static void submit(sc_stream_t *s, const uint64_t *dur, int n) {
    uint32_t at = s->issued % s->depth;
    sleep_until(s->ends[at]);   /* the queue of this stream is full until that launch is done */
    gs_gpu_t *g = hw(s->gpu);
    int slot = gs_view[s->gpu].slot;
    gs_proc_t *me = &gs_st->proc[gs_me];
    gs_lock(&g->mu);
    uint64_t now = gs_clock(), t = g->tail > now ? g->tail : now;
    for (int i = 0; i < n; i++) {
        gs_tl_add(g->tl, GS_DEV_BINS, GS_DEV_TICK, t, t + dur[i]);
        gs_tl_add(me->tl[slot], GS_PROC_BINS, GS_PROC_TICK, t, t + dur[i]);
        g->busy_ns += dur[i];
        me->busy_ns[slot] += dur[i];
        t += dur[i];
    }
    g->launches += (uint64_t)n;
    __atomic_store_n(&g->tail, t, __ATOMIC_RELEASE);
    gs_unlock(&g->mu);
    s->ends[at] = t;
    s->issued++;
    __atomic_store_n(&s->done_at, t, __ATOMIC_RELEASE);
}

API CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    CTX_GPU(g);
    if (!s) return CUDA_ERROR_INVALID_VALUE;
    sc_stream_t *x = calloc(1, sizeof *x);
    stream_setup(x, g);
    *s = (CUstream)x;
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream s) {
    sc_stream_t *x = (sc_stream_t *)s;
    if (x) { free(x->ends); free(x); }
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream s) {
    UP();
    sc_stream_t *x = stream_for(s);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    sleep_until(__atomic_load_n(&x->done_at, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize_ptsz(CUstream s) { return cuStreamSynchronize(s); }
API CUresult cuStreamQuery(CUstream s) {
    UP();
    sc_stream_t *x = stream_for(s);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    return gs_clock() >= __atomic_load_n(&x->done_at, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuCtxSynchronize(void) {
    CTX_GPU(g);
    sleep_until(__atomic_load_n(&hw(g)->tail, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    UP();
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    *e = (CUevent)calloc(1, sizeof(sc_event_t));
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent e) { free(e); return CUDA_SUCCESS; }
API CUresult cuEventRecord(CUevent e, CUstream s) {
    UP();
    sc_stream_t *x = stream_for(s);
    sc_event_t *ev = (sc_event_t *)e;
    if (!x || !ev) return CUDA_ERROR_INVALID_VALUE;
    uint64_t now = gs_clock(), tail = __atomic_load_n(&hw(x->gpu)->tail, __ATOMIC_ACQUIRE);
    ev->at = tail > now ? tail : now;   /* the engine reaches it after all work submitted before */
    ev->valid = 1;
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { return cuEventRecord(e, s); }
API CUresult cuEventQuery(CUevent e) {
    sc_event_t *ev = (sc_event_t *)e;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    return gs_clock() >= ev->at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent e) {
    sc_event_t *ev = (sc_event_t *)e;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    sleep_until(ev->at);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) {
    sc_event_t *a = (sc_event_t *)start, *b = (sc_event_t *)end;
    if (!ms || !a || !b || !a->valid || !b->valid) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = gs_clock();
    if (now < a->at || now < b->at) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)b->at - (double)a->at) / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) { return cuEventElapsedTime_v2(ms, start, end); }

/* ------------------------------------------------------------------------------------------------ modules */
API CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    UP();
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    sc_module_t *mod = calloc(1, sizeof *mod);
    mod->image = image ? strdup((const char *)image) : NULL;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}
API CUresult cuModuleLoad(CUmodule *m, const char *path) { (void)path; return cuModuleLoadData(m, NULL); }
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    (void)n; (void)o; (void)v;
    return cuModuleLoadData(m, image);
}
API CUresult cuModuleUnload(CUmodule m) {
    sc_module_t *mod = (sc_module_t *)m;
    if (mod) { free(mod->image); free(mod); }
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    UP();
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    kt_func_t *fn = calloc(1, sizeof *fn);
    if (kt_from_image(((sc_module_t *)m)->image, name, fn)) kt_default(name, fn);
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

static uint64_t first_param(void **params) { return params && params[0] ? *(uint64_t *)params[0] : 0; }

static CUresult run_kernel(CUfunction f, uint64_t blocks, CUstream s, void **params) {
    UP();
    sc_stream_t *x = stream_for(s);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t d = kt_draw((kt_func_t *)f, blocks, gs_clock(), first_param(params));
    submit(x, &d, 1);
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                            unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s, void **params,
                            void **extra) {
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes; (void)extra;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, params);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                                 unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s, void **params,
                                 void **extra) {
    return cuLaunchKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes, s, params, extra);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    (void)extra;
    if (!cfg) return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(f, (uint64_t)cfg->gridDimX * cfg->gridDimY * cfg->gridDimZ, cfg->hStream, params);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    return cuLaunchKernelEx(cfg, f, params, extra);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                                       unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s,
                                       void **params) {
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, params);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                            unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedBytes,
                                            CUstream s, void **params) {
    return cuLaunchCooperativeKernel(f, gridX, gridY, gridZ, blockX, blockY, blockZ, sharedBytes, s, params);
}

/* graphs: kernel nodes, run one after another; every launch draws each node's duration anew */
API CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    (void)flags;
    UP();
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    *g = (CUgraph)calloc(1, sizeof(sc_graph_t));
    return CUDA_SUCCESS;
}
API CUresult cuGraphDestroy(CUgraph g) { free(g); return CUDA_SUCCESS; }
API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    (void)deps; (void)ndeps;
    UP();
    sc_graph_t *gr = (sc_graph_t *)g;
    if (!gr || !p || !p->func || gr->count >= 64) return CUDA_ERROR_INVALID_VALUE;
    sc_node_t *n = &gr->node[gr->count++];
    n->fn = *(kt_func_t *)p->func;
    n->blocks = (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ;
    n->param = first_param(p->kernelParams);
    if (node) *node = (CUgraphNode)n;
    return CUDA_SUCCESS;
}
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
    (void)flags;
    UP();
    if (!exec || !g) return CUDA_ERROR_INVALID_VALUE;
    sc_graph_t *copy = malloc(sizeof *copy);
    memcpy(copy, g, sizeof *copy);
    *exec = (CUgraphExec)copy;
    return CUDA_SUCCESS;
}
API CUresult cuGraphExecDestroy(CUgraphExec exec) { free(exec); return CUDA_SUCCESS; }
API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) {
    UP();
    sc_graph_t *gr = (sc_graph_t *)exec;
    sc_stream_t *x = stream_for(s);
    if (!gr) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t d[64], now = gs_clock();
    for (int i = 0; i < gr->count; i++) d[i] = kt_draw(&gr->node[i].fn, gr->node[i].blocks, now, gr->node[i].param);
    if (gr->count) submit(x, d, gr->count);
    return CUDA_SUCCESS;
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) { return cuGraphLaunch(exec, s); }

API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    (void)table; (void)id;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------------------------------------ lookup */
typedef struct { const char *symbol; void *fn; int since; int per_thread; } sc_entry_t;
#define E(sym, fn, since) {sym, (void *)fn, since, 0}
#define EPT(sym, fn, since) {sym, (void *)fn, since, 1}
static const sc_entry_t sc_entries[] = {
    E("cuInit", cuInit, 2000), E("cuDriverGetVersion", cuDriverGetVersion, 2020),
    E("cuGetErrorString", cuGetErrorString, 6000), E("cuGetErrorName", cuGetErrorName, 6000),
    E("cuGetProcAddress", cuGetProcAddress, 11030), E("cuGetProcAddress", cuGetProcAddress_v2, 12000),
    E("cuGetExportTable", cuGetExportTable, 3000), E("cuDeviceGetCount", cuDeviceGetCount, 2000),
    E("cuDeviceGet", cuDeviceGet, 2000), E("cuDeviceGetName", cuDeviceGetName, 2000),
    E("cuDeviceGetUuid", cuDeviceGetUuid, 9020), E("cuDeviceGetUuid", cuDeviceGetUuid_v2, 11040),
    E("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020), E("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000),
    E("cuMemAlloc", cuMemAlloc_v2, 3020), E("cuMemFree", cuMemFree_v2, 3020),
    E("cuMemAllocPitch", cuMemAllocPitch_v2, 3020), E("cuMemAllocManaged", cuMemAllocManaged, 6000),
    E("cuMemGetInfo", cuMemGetInfo_v2, 3020), E("cuMemAllocHost", cuMemAllocHost_v2, 3020),
    E("cuMemFreeHost", cuMemFreeHost, 2000), E("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020),
    E("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020), E("cuMemsetD8", cuMemsetD8_v2, 3020),
    E("cuDeviceGetDefaultMemPool", cuDeviceGetDefaultMemPool, 11020), E("cuDeviceGetMemPool", cuDeviceGetMemPool, 11020),
    E("cuMemPoolCreate", cuMemPoolCreate, 11020), E("cuMemPoolDestroy", cuMemPoolDestroy, 11020),
    E("cuMemPoolTrimTo", cuMemPoolTrimTo, 11020), E("cuMemPoolSetAttribute", cuMemPoolSetAttribute, 11020),
    E("cuMemPoolGetAttribute", cuMemPoolGetAttribute, 11020),
    E("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync, 11020),
    EPT("cuMemAllocFromPoolAsync", cuMemAllocFromPoolAsync_ptsz, 11020),
    E("cuMemAllocAsync", cuMemAllocAsync, 11020), EPT("cuMemAllocAsync", cuMemAllocAsync_ptsz, 11020),
    E("cuMemFreeAsync", cuMemFreeAsync, 11020), EPT("cuMemFreeAsync", cuMemFreeAsync_ptsz, 11020),
    E("cuMemGetAllocationGranularity", cuMemGetAllocationGranularity, 10020), E("cuMemCreate", cuMemCreate, 10020),
    E("cuMemRelease", cuMemRelease, 10020), E("cuMemAddressReserve", cuMemAddressReserve, 10020),
    E("cuMemAddressFree", cuMemAddressFree, 10020), E("cuMemMap", cuMemMap, 10020), E("cuMemUnmap", cuMemUnmap, 10020),
    E("cuMemSetAccess", cuMemSetAccess, 10020), E("cuMemRetainAllocationHandle", cuMemRetainAllocationHandle, 11000),
    E("cuArrayCreate", cuArrayCreate_v2, 3020), E("cuArray3DCreate", cuArray3DCreate_v2, 3020),
    E("cuArrayDestroy", cuArrayDestroy, 2000), E("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000),
    E("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000),
    E("cuArrayGetMemoryRequirements", cuArrayGetMemoryRequirements, 11060),
    E("cuMipmappedArrayGetMemoryRequirements", cuMipmappedArrayGetMemoryRequirements, 11060),
    E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    E("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000), E("cuCtxCreate", cuCtxCreate_v2, 3020),
    E("cuCtxCreate", cuCtxCreate_v3, 11040), E("cuCtxCreate", cuCtxCreate_v4, 12050),
    E("cuCtxDestroy", cuCtxDestroy_v2, 4000), E("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    E("cuCtxGetCurrent", cuCtxGetCurrent, 4000), E("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000),
    E("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000), E("cuCtxGetDevice", cuCtxGetDevice, 2000),
    E("cuCtxSynchronize", cuCtxSynchronize, 2000), E("cuStreamCreate", cuStreamCreate, 2000),
    E("cuStreamDestroy", cuStreamDestroy_v2, 4000), E("cuStreamSynchronize", cuStreamSynchronize, 2000),
    EPT("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000), E("cuStreamQuery", cuStreamQuery, 2000),
    E("cuEventCreate", cuEventCreate, 2000), E("cuEventDestroy", cuEventDestroy_v2, 4000),
    E("cuEventRecord", cuEventRecord, 2000), EPT("cuEventRecord", cuEventRecord_ptsz, 7000),
    E("cuEventQuery", cuEventQuery, 2000), E("cuEventSynchronize", cuEventSynchronize, 2000),
    E("cuEventElapsedTime", cuEventElapsedTime, 2000), E("cuEventElapsedTime", cuEventElapsedTime_v2, 12080),
    E("cuModuleLoad", cuModuleLoad, 2000), E("cuModuleLoadData", cuModuleLoadData, 2000),
    E("cuModuleLoadDataEx", cuModuleLoadDataEx, 2010), E("cuModuleUnload", cuModuleUnload, 2000),
    E("cuModuleGetFunction", cuModuleGetFunction, 2000), E("cuLaunchKernel", cuLaunchKernel, 4000),
    EPT("cuLaunchKernel", cuLaunchKernel_ptsz, 7000), E("cuLaunchKernelEx", cuLaunchKernelEx, 11060),
    EPT("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060),
    E("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000),
    EPT("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000), E("cuGraphCreate", cuGraphCreate, 10000),
    E("cuGraphDestroy", cuGraphDestroy, 10000), E("cuGraphAddKernelNode", cuGraphAddKernelNode_v2, 12000),
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    E("cuGraphInstantiate", cuGraphInstantiateWithFlags, 12000), E("cuGraphExecDestroy", cuGraphExecDestroy, 10000),
    E("cuGraphLaunch", cuGraphLaunch, 10000), EPT("cuGraphLaunch", cuGraphLaunch_ptsz, 10000),
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
                       CUdriverProcAddressQueryResult *status) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, seen = 0;
    const sc_entry_t *pick = NULL;
    for (size_t i = 0; i < sizeof sc_entries / sizeof sc_entries[0]; i++) {
        const sc_entry_t *e = &sc_entries[i];
        if (strcmp(e->symbol, symbol)) continue;
        seen = 1;
        if (e->since > version || (e->per_thread && !per_thread)) continue;
        if (!pick || e->per_thread > pick->per_thread || (e->per_thread == pick->per_thread && e->since > pick->since))
            pick = e;
    }
    *pfn = pick ? pick->fn : NULL;
    if (status)
        *status = pick ? CU_GET_PROC_ADDRESS_SUCCESS
                       : seen ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return pick ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    return lookup(symbol, pfn, version, flags, status);
}
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return lookup(symbol, pfn, version, flags, NULL);
}

/* ------------------------------------------------------------------------------------------------ test helpers */
/* The state named by SIMGPU_STATE / SIMGPU_DEVICES now: a test process may switch both between calls. */
static int helper_attach(void) {
    if (!sc_up) {
        gs_follow_state();
        gs_nview = -1;
    }
    return gs_attach_gpus();
}
static gs_gpu_t *helper_gpu(int dev) {
    if (helper_attach() || dev < 0 || dev >= gs_nview || gs_view[dev].slot < 0) return NULL;
    return hw(dev);
}
API uint64_t simgpu_now_ns(void) { return gs_clock(); }
/* Busy ns of GPU `dev` (index in SIMGPU_DEVICES) over [t0, t1): all work (pid 0) or the work of one process. */
API uint64_t simgpu_busy_ns(int dev, int pid, uint64_t t0, uint64_t t1) {
    gs_gpu_t *g = helper_gpu(dev);
    if (!g) return 0;
    if (!pid) return gs_tl_sum(g->tl, GS_DEV_BINS, GS_DEV_TICK, t0, t1);
    uint64_t sum = 0;
    for (int i = 0; i < GS_NPROC; i++)
        if (gs_st->proc[i].owner == pid)
            sum += gs_tl_sum(gs_st->proc[i].tl[gs_view[dev].slot], GS_PROC_BINS, GS_PROC_TICK, t0, t1);
    return sum;
}
API uint64_t simgpu_used_bytes(int dev) {
    gs_gpu_t *g = helper_gpu(dev);
    return g ? __atomic_load_n(&g->used, __ATOMIC_RELAXED) : 0;
}
API uint64_t simgpu_launches(int dev) {
    gs_gpu_t *g = helper_gpu(dev);
    return g ? __atomic_load_n(&g->launches, __ATOMIC_RELAXED) : 0;
}
