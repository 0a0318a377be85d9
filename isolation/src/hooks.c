/*
 * hooks.c - the interposed CUDA driver and NVML entry points of libvgpu.so.
 *
 * How we are reached
 *   - LD_PRELOAD / /etc/ld.so.preload: our exported cu* / nvml* definitions come first in the global scope.
 *   - dlsym(): we export dlsym.  A tiny assembly entry tail-jumps to glibc's dlsym for RTLD_NEXT, so glibc still
 *     sees the caller's return address and "next" keeps its meaning; for every other handle we do the real
 *     lookup with the caller's handle and, only if it yielded the real driver's implementation of a function we
 *     wrap, return our wrapper instead.  Unknown names and other libraries' symbols pass through untouched.
 *   - cuGetProcAddress / _v2: the real driver resolves the symbol (it knows versions and the per-thread-stream
 *     flag); we substitute our wrapper when the returned pointer is the real driver's entry point we wrap.
 * How we reach the driver
 *   dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") and glibc's real dlsym on those handles, which only
 *   searches the driver's own scope, so we can never resolve to ourselves.  libvgpu.so has no DT_NEEDED on the
 *   driver: programs without CUDA (shells under ld.so.preload) never load it.
 * Hot path
 *   With no limit configured every wrapper is one predictable branch plus the call to the driver: no syscall,
 *   no shared-memory write, no logging.
 */
#include "vgpu_internal.h"
#include "vgpu_map.h"
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#undef cuGetProcAddress
#undef cuEventElapsedTime
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                             void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                        CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuCtxCreate_v2(CUcontext *, unsigned int, CUdevice);
CUresult cuCtxCreate_v3(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

vgpu_state_t vg = {.slot = -1};

/* ------------------------------------------------------------------------------------------ hook tables */
/* X(function, base name for cuGetProcAddress, CUDA version it appeared in, per-thread-stream variant) */
#define CUDA_HOOKS(X)                                                                                           \
    X(cuInit, "cuInit", 2000, 0)                                                                                \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                                           \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                                        \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                                                     \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                                                       \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                                           \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                                                          \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                                                 \
    X(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0)                                                         \
    X(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0)                                                             \
    X(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1)                                                        \
    X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0)                                             \
    X(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1)                                        \
    X(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0)                                                               \
    X(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1)                                                          \
    X(cuMemPoolCreate, "cuMemPoolCreate", 11020, 0)                                                             \
    X(cuMemCreate, "cuMemCreate", 10020, 0)                                                                     \
    X(cuMemRelease, "cuMemRelease", 10020, 0)                                                                   \
    X(cuMemMap, "cuMemMap", 10020, 0)                                                                           \
    X(cuMemUnmap, "cuMemUnmap", 10020, 0)                                                                       \
    X(cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000, 0)                                     \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                                               \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                                           \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                                                                \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)                                                \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)                                              \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                                            \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                                      \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                                   \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                                  \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                                                  \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                                                 \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                                                                \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                                                           \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                                                           \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                                      \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)                                          \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)                                     \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                                                                 \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)

#define NVML_HOOKS(X)                                                                                           \
    X(nvmlInit, "nvmlInit", 0, 0)                                                                               \
    X(nvmlInit_v2, "nvmlInit_v2", 0, 0)                                                                         \
    X(nvmlInitWithFlags, "nvmlInitWithFlags", 0, 0)                                                             \
    X(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", 0, 0)                                                 \
    X(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2", 0, 0)

#define DECL_REAL(fn, base, since, ptsz) static __typeof__(&fn) real_##fn;
CUDA_HOOKS(DECL_REAL)
NVML_HOOKS(DECL_REAL)

/* driver functions we call but do not wrap */
static CUresult (*real_cuCtxGetDevice)(CUdevice *);
static CUresult (*real_cuCtxGetCurrent)(CUcontext *);
static CUresult (*real_cuDeviceGetCount)(int *);
static CUresult (*real_cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
static CUresult (*real_cuEventCreate)(CUevent *, unsigned int);
static CUresult (*real_cuEventRecord)(CUevent, CUstream);
static CUresult (*real_cuEventQuery)(CUevent);
static CUresult (*real_cuEventSynchronize)(CUevent);
static CUresult (*real_cuEventElapsedTime)(float *, CUevent, CUevent);
static CUresult (*real_cuArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUarray, CUdevice);
static CUresult (*real_cuMipmappedArrayGetMemoryRequirements)(CUDA_ARRAY_MEMORY_REQUIREMENTS *, CUmipmappedArray,
                                                             CUdevice);
static nvmlReturn_t (*real_nvmlDeviceGetUUID)(nvmlDevice_t, char *, unsigned int);

typedef struct { const char *name; const char *base; int since; int ptsz; void *wrapper; void **real; } hook_t;
#define HOOK_ENTRY(fn, b, s, p) {#fn, b, s, p, (void *)fn, (void **)&real_##fn},
static hook_t g_cuda_hooks[] = {CUDA_HOOKS(HOOK_ENTRY)};
static hook_t g_nvml_hooks[] = {NVML_HOOKS(HOOK_ENTRY)};
#define NCUDA (sizeof g_cuda_hooks / sizeof g_cuda_hooks[0])
#define NNVML (sizeof g_nvml_hooks / sizeof g_nvml_hooks[0])

/* ------------------------------------------------------------------------------------------ dlsym */
void *(*vgpu_real_dlsym)(void *, const char *) HIDDEN;

static void resolve_real_dlsym(void) {
    if (vgpu_real_dlsym) return;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    for (int i = 0; versions[i] && !vgpu_real_dlsym; i++)
        vgpu_real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

HIDDEN void *vgpu_dlsym_hook(void *handle, const char *name);

/*
 * dlsym entry: RTLD_NEXT goes straight to glibc by a tail jump (the return address on the stack is still the
 * caller's, so "next" is relative to the caller); everything else goes to vgpu_dlsym_hook.
 */
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, @function\n"
        "dlsym:\n"
        "    cmpq $-1, %rdi\n"
        "    jne 1f\n"
        "    movq vgpu_real_dlsym(%rip), %rax\n"
        "    testq %rax, %rax\n"
        "    jz 1f\n"
        "    jmp *%rax\n"
        "1:\n"
        "    jmp vgpu_dlsym_hook\n"
        ".size dlsym, .-dlsym\n");

static void *g_libcuda, *g_libnvml;
static volatile int g_ready;
static __thread int t_in_init;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

static void load_nvml(void);

static hook_t *find_hook(hook_t *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) return &tab[i];
    return NULL;
}

void *vgpu_wrapper_for(const char *name, void *real) {
    hook_t *h = NULL;
    if (name[0] == 'c' && name[1] == 'u') h = find_hook(g_cuda_hooks, NCUDA, name);
    else if (!strncmp(name, "nvml", 4)) { load_nvml(); h = find_hook(g_nvml_hooks, NNVML, name); }
    if (h && real && *h->real == real) return h->wrapper;
    return NULL;
}

void *vgpu_wrapper_for_real(void *real) {
    for (size_t i = 0; i < NCUDA; i++)
        if (*g_cuda_hooks[i].real == real) return g_cuda_hooks[i].wrapper;
    return NULL;
}

void *vgpu_dlsym_hook(void *handle, const char *name) {
    resolve_real_dlsym();
    if (!vgpu_real_dlsym) return NULL;
    void *r = vgpu_real_dlsym(handle, name);
    if (!r || !name || t_in_init) return r;
    if ((name[0] == 'c' && name[1] == 'u') || !strncmp(name, "nvml", 4)) {
        vgpu_ensure_init();
        void *w = vgpu_wrapper_for(name, r);
        if (w) return w;
    }
    return r;
}

/* ------------------------------------------------------------------------------------------ init */
static int g_ord2r[64];
static int g_prim_refs[64];
static pthread_mutex_t g_map_mu = PTHREAD_MUTEX_INITIALIZER;
static vmap_t g_map;
enum { K_PTR = 1, K_HANDLE, K_MAPPING, K_ARRAY, K_CTX, K_POOL, K_FUNC };
static unsigned g_ctx_gen;   /* bumped when a context is destroyed: invalidates per-thread context caches */

static void *sym(void *lib, const char *name) { return lib ? vgpu_real_dlsym(lib, name) : NULL; }

static void load_nvml(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    if (__atomic_load_n(&g_libnvml, __ATOMIC_ACQUIRE)) return;
    resolve_real_dlsym();
    pthread_mutex_lock(&mu);
    if (!g_libnvml) {
        void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
        if (lib) {
            for (size_t i = 0; i < NNVML; i++) *g_nvml_hooks[i].real = sym(lib, g_nvml_hooks[i].name);
            real_nvmlDeviceGetUUID = (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))sym(lib, "nvmlDeviceGetUUID");
            __atomic_store_n(&g_libnvml, lib, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&mu);
}

static void do_init(void) {
    resolve_real_dlsym();
    vgpu_read_env();
    for (int i = 0; i < 64; i++) g_ord2r[i] = -2;
    g_libcuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!g_libcuda) VLOG(VLOG_DEBUG, "libcuda.so.1 not loadable: %s", dlerror());
    for (size_t i = 0; i < NCUDA; i++) *g_cuda_hooks[i].real = sym(g_libcuda, g_cuda_hooks[i].name);
#define LOAD(fn) fn = (__typeof__(fn))sym(g_libcuda, #fn + 5)
    LOAD(real_cuCtxGetDevice);
    LOAD(real_cuCtxGetCurrent);
    LOAD(real_cuDeviceGetCount);
    LOAD(real_cuDeviceGetUuid_v2);
    LOAD(real_cuEventCreate);
    LOAD(real_cuEventRecord);
    LOAD(real_cuEventQuery);
    LOAD(real_cuEventSynchronize);
    LOAD(real_cuArrayGetMemoryRequirements);
    LOAD(real_cuMipmappedArrayGetMemoryRequirements);
#undef LOAD
    real_cuEventElapsedTime = (CUresult(*)(float *, CUevent, CUevent))sym(g_libcuda, "cuEventElapsedTime_v2");
    if (!real_cuEventElapsedTime)
        real_cuEventElapsedTime = (CUresult(*)(float *, CUevent, CUevent))sym(g_libcuda, "cuEventElapsedTime");
    char why[320];
    if (vg.active && vgpu_region_attach(why, sizeof why)) {
        vg.active = 0;
        if (vg.fail_open) {
            VLOG(VLOG_ERROR, "%s; running WITHOUT limits (VGPU_ISOLATION_FAIL_OPEN=1)", why);
        } else {
            vg.config_error = 1;
            VLOG(VLOG_ERROR, "%s; limits are configured but cannot be enforced, so CUDA and NVML initialisation "
                             "are refused", why);
        }
    }
    VLOG(VLOG_INFO, "libvgpu initialised: active=%d sm=%d policy=%d", vg.active, vg.sm_configured, vg.policy);
}

void vgpu_ensure_init(void) {
    if (LIKELY(g_ready) || t_in_init) return;
    pthread_mutex_lock(&g_init_mu);
    if (!g_ready) {
        t_in_init = 1;
        do_init();
        t_in_init = 0;
        __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_init_mu);
}

__attribute__((constructor)) static void vgpu_ctor(void) { resolve_real_dlsym(); }

#define REAL(fn) (LIKELY(g_ready) ? real_##fn : (vgpu_ensure_init(), real_##fn))
#define CALL(fn, ...) ({ __typeof__(real_##fn) _f = REAL(fn); _f ? _f(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND; })

/* ------------------------------------------------------------------------------------------ devices */
static void uuid_string(const CUuuid *u, char *out, size_t n) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, n, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* Region index of CUDA ordinal `ord` (UUID keyed); registers every device in ordinal order on first use. */
static int ord2ridx(int ord) {
    if (ord < 0 || ord >= 64) return -1;
    int r = g_ord2r[ord];
    if (LIKELY(r != -2)) return r;
    int n = 0;
    if (!real_cuDeviceGetCount || real_cuDeviceGetCount(&n) != CUDA_SUCCESS) return ord < VGPU_MAX_DEVICES ? ord : -1;
    for (int i = 0; i < n && i < 64; i++) {
        CUuuid u;
        char s[VGPU_UUID_LEN];
        int x = -1;
        if (real_cuDeviceGetUuid_v2 && real_cuDeviceGetUuid_v2(&u, i) == CUDA_SUCCESS) {
            uuid_string(&u, s, sizeof s);
            x = vgpu_ridx_for_uuid(s);
        }
        g_ord2r[i] = x;
    }
    return g_ord2r[ord];
}

static int cur_ridx(void) {
    CUdevice d;
    if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS) return -1;
    return ord2ridx(d);
}

/* ------------------------------------------------------------------------------------------ pointer map */
static void rec_put(int kind, uint64_t key, int ridx, uint64_t size, uint64_t aux) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, (uint32_t)kind, key);
    if (e) { e->dev = ridx; e->size = size; e->aux = aux; }
    pthread_mutex_unlock(&g_map_mu);
}
/* Removes the record; returns 1 and its contents if it existed. */
static int rec_take(int kind, uint64_t key, int *ridx, uint64_t *size, uint64_t *aux) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, (uint32_t)kind, key);
    if (e) {
        if (ridx) *ridx = e->dev;
        if (size) *size = e->size;
        if (aux) *aux = e->aux;
        vmap_del(&g_map, e);
    }
    pthread_mutex_unlock(&g_map_mu);
    return e != NULL;
}

static uint64_t alloc_granule(uint64_t size) {
    /* the driver maps large allocations in 2 MiB pages and sub-allocates small ones */
    if (size > (1ULL << 20)) return (size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);
    return (size + 511) & ~511ULL;
}

#define OOM CUDA_ERROR_OUT_OF_MEMORY

/* A refused allocation hands back a null handle: a caller that frees it anyway passes 0, not garbage. */
#define refuse(out) ({ if (out) memset((out), 0, sizeof *(out)); OOM; })

/* ------------------------------------------------------------------------------------------ init and config */
EXPORT CUresult cuInit(unsigned int flags) {
    vgpu_ensure_init();
    if (vg.config_error) return CUDA_ERROR_INVALID_VALUE;
    return CALL(cuInit, flags);
}

/* Our wrapper for a symbol the driver resolved through cuGetProcAddress. */
static void gpa_substitute(const char *symbol, void **pfn, int ver, cuuint64_t flags) {
    if (!pfn || !*pfn) return;
    void *w = vgpu_wrapper_for_real(*pfn);
    if (!w && symbol) {
        /* the driver handed out a pointer that is not its exported entry point: choose by name and version */
        hook_t *best = NULL;
        int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        for (size_t i = 0; i < NCUDA; i++) {
            hook_t *h = &g_cuda_hooks[i];
            if (strcmp(h->base, symbol) || h->since > ver || (h->ptsz && !want_ptsz)) continue;
            if (!best || h->ptsz > best->ptsz || (h->ptsz == best->ptsz && h->since > best->since)) best = h;
        }
        if (best && *best->real) w = best->wrapper;
    }
    if (w) *pfn = w;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    CUresult r = CALL(cuGetProcAddress_v2, symbol, pfn, ver, flags, status);
    if (r == CUDA_SUCCESS) gpa_substitute(symbol, pfn, ver, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags) {
    CUresult r = CALL(cuGetProcAddress, symbol, pfn, ver, flags);
    if (r == CUDA_SUCCESS) gpa_substitute(symbol, pfn, ver, flags);
    return r;
}

/* ------------------------------------------------------------------------------------------ allocations */
static CUresult charged_alloc(int ridx, uint64_t charge, CUresult r_call, CUdeviceptr *p, int kind) {
    if (r_call != CUDA_SUCCESS) { vgpu_release(ridx, charge, ACCT_DATA); return r_call; }
    rec_put(kind, (uint64_t)*p, ridx, charge, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    __typeof__(real_cuMemAlloc_v2) f = REAL(cuMemAlloc_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !p || !n) return f(p, n);
    int r = cur_ridx();
    if (r < 0) { VLOG(VLOG_DEBUG, "alloc: no current device, not accounted"); return f(p, n); }
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    return charged_alloc(r, c, f(p, n), p, K_PTR);
}

static CUresult free_common(CUresult res, CUdeviceptr p) {
    if (res == CUDA_SUCCESS) {
        int r; uint64_t sz;
        if (rec_take(K_PTR, (uint64_t)p, &r, &sz, NULL)) vgpu_release(r, sz, ACCT_DATA);
    }
    return res;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    __typeof__(real_cuMemFree_v2) f = REAL(cuMemFree_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active)) return f(p);
    return free_common(f(p), p);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    __typeof__(real_cuMemAllocPitch_v2) f = REAL(cuMemAllocPitch_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !p || !pitch) return f(p, pitch, w, h, elem);
    int r = cur_ridx();
    if (r < 0) return f(p, pitch, w, h, elem);
    /* reserve with the widest pitch the driver uses (512-byte rows), then settle on the returned pitch */
    uint64_t est = alloc_granule((uint64_t)((w + 511) & ~(size_t)511) * h);
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, pitch, w, h, elem);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    uint64_t real_sz = alloc_granule((uint64_t)*pitch * h);
    if (real_sz > est) {
        if (vgpu_reserve(r, real_sz - est, ACCT_DATA)) {
            real_cuMemFree_v2(*p);
            vgpu_release(r, est, ACCT_DATA);
            return refuse(p);
        }
    } else if (real_sz < est) {
        vgpu_release(r, est - real_sz, ACCT_DATA);
    }
    rec_put(K_PTR, (uint64_t)*p, r, real_sz, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
    __typeof__(real_cuMemAllocManaged) f = REAL(cuMemAllocManaged);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !vg.count_managed || !p || !n) return f(p, n, flags);
    int r = cur_ridx();
    if (r < 0) return f(p, n, flags);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    return charged_alloc(r, c, f(p, n, flags), p, K_PTR);
}

static int pool_ridx(CUmemoryPool pool) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_POOL, (uint64_t)(uintptr_t)pool);
    int r = e ? e->dev : -1;
    pthread_mutex_unlock(&g_map_mu);
    return r >= 0 ? r : cur_ridx();
}

static CUresult alloc_async(int ptsz, CUdeviceptr *p, size_t n, CUstream s) {
    __typeof__(real_cuMemAllocAsync) f = ptsz ? REAL(cuMemAllocAsync_ptsz) : REAL(cuMemAllocAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !p || !n) return f(p, n, s);
    int r = cur_ridx();
    if (r < 0) return f(p, n, s);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    return charged_alloc(r, c, f(p, n, s), p, K_PTR);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(0, p, n, s); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(1, p, n, s); }

static CUresult alloc_pool(int ptsz, CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    __typeof__(real_cuMemAllocFromPoolAsync) f =
        ptsz ? REAL(cuMemAllocFromPoolAsync_ptsz) : REAL(cuMemAllocFromPoolAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !p || !n) return f(p, n, pool, s);
    int r = pool_ridx(pool);
    if (r < 0) return f(p, n, pool, s);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    return charged_alloc(r, c, f(p, n, pool, s), p, K_PTR);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return alloc_pool(0, p, n, pool, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return alloc_pool(1, p, n, pool, s);
}

static CUresult free_async(int ptsz, CUdeviceptr p, CUstream s) {
    __typeof__(real_cuMemFreeAsync) f = ptsz ? REAL(cuMemFreeAsync_ptsz) : REAL(cuMemFreeAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active)) return f(p, s);
    return free_common(f(p, s), p);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(0, p, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(1, p, s); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult res = CALL(cuMemPoolCreate, pool, props);
    if (res == CUDA_SUCCESS && vg.active && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        rec_put(K_POOL, (uint64_t)(uintptr_t)*pool, ord2ridx(props->location.id), 0, 0);
    return res;
}

/* VMM: a physical handle is charged once at cuMemCreate and given back when its last reference (the handle
 * itself, retains, mappings) is gone, which is when the driver frees it too. */
static void handle_unref(uint64_t h) {
    int r = -1;
    uint64_t size = 0, drop = 0;
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_HANDLE, h);
    if (e && --e->aux == 0) { r = e->dev; size = e->size; drop = 1; vmap_del(&g_map, e); }
    pthread_mutex_unlock(&g_map_mu);
    if (drop) vgpu_release(r, size, ACCT_DATA);
}
static void handle_ref(uint64_t h) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_HANDLE, h);
    if (e) e->aux++;
    pthread_mutex_unlock(&g_map_mu);
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    __typeof__(real_cuMemCreate) f = REAL(cuMemCreate);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !h || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return f(h, size, prop, flags);
    int r = ord2ridx(prop->location.id);
    if (r < 0) return f(h, size, prop, flags);
    if (vgpu_reserve(r, size, ACCT_DATA)) return refuse(h);
    CUresult res = f(h, size, prop, flags);
    if (res != CUDA_SUCCESS) { vgpu_release(r, size, ACCT_DATA); return res; }
    rec_put(K_HANDLE, (uint64_t)*h, r, size, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    CUresult res = CALL(cuMemRelease, h);
    if (res == CUDA_SUCCESS && vg.active) handle_unref((uint64_t)h);
    return res;
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    CUresult res = CALL(cuMemMap, p, size, off, h, flags);
    if (res == CUDA_SUCCESS && vg.active) {
        handle_ref((uint64_t)h);
        rec_put(K_MAPPING, (uint64_t)p, -1, size, (uint64_t)h);
    }
    return res;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    CUresult res = CALL(cuMemUnmap, p, size);
    uint64_t h;
    if (res == CUDA_SUCCESS && vg.active && rec_take(K_MAPPING, (uint64_t)p, NULL, NULL, &h)) handle_unref(h);
    return res;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    CUresult res = CALL(cuMemRetainAllocationHandle, h, addr);
    if (res == CUDA_SUCCESS && vg.active && h) handle_ref((uint64_t)*h);
    return res;
}

/* arrays: reserve an estimate from the descriptor, then settle on the driver's memory requirements */
static uint64_t fmt_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 4;
    }
}
static uint64_t array_est(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    return w * fmt_bytes(f) * (ch ? ch : 1) * (h ? h : 1) * (d ? d : 1);
}

static CUresult settle_array(int r, uint64_t est, void *handle, int mip) {
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    uint64_t real_sz = est;
    CUdevice dev = 0;
    if (real_cuCtxGetDevice) real_cuCtxGetDevice(&dev);
    CUresult q = mip ? (real_cuMipmappedArrayGetMemoryRequirements
                            ? real_cuMipmappedArrayGetMemoryRequirements(&req, (CUmipmappedArray)handle, dev)
                            : CUDA_ERROR_NOT_FOUND)
                     : (real_cuArrayGetMemoryRequirements
                            ? real_cuArrayGetMemoryRequirements(&req, (CUarray)handle, dev)
                            : CUDA_ERROR_NOT_FOUND);
    if (q == CUDA_SUCCESS && req.size) real_sz = req.size;
    if (real_sz > est && vgpu_reserve(r, real_sz - est, ACCT_DATA)) {
        vgpu_release(r, est, ACCT_DATA);
        return OOM;
    }
    if (real_sz < est) vgpu_release(r, est - real_sz, ACCT_DATA);
    rec_put(K_ARRAY, (uint64_t)(uintptr_t)handle, r, real_sz, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    __typeof__(real_cuArrayCreate_v2) f = REAL(cuArrayCreate_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !a || !d) return f(a, d);
    int r = cur_ridx();
    if (r < 0) return f(a, d);
    uint64_t est = array_est(d->Width, d->Height, 1, d->Format, d->NumChannels);
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(a);
    CUresult res = f(a, d);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    res = settle_array(r, est, *a, 0);
    if (res != CUDA_SUCCESS) { real_cuArrayDestroy(*a); *a = NULL; }
    return res;
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    __typeof__(real_cuArray3DCreate_v2) f = REAL(cuArray3DCreate_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !a || !d) return f(a, d);
    int r = cur_ridx();
    if (r < 0) return f(a, d);
    uint64_t est = array_est(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(a);
    CUresult res = f(a, d);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    res = settle_array(r, est, *a, 0);
    if (res != CUDA_SUCCESS) { real_cuArrayDestroy(*a); *a = NULL; }
    return res;
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    __typeof__(real_cuMipmappedArrayCreate) f = REAL(cuMipmappedArrayCreate);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !a || !d) return f(a, d, levels);
    int r = cur_ridx();
    if (r < 0) return f(a, d, levels);
    uint64_t est = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < levels; l++) {
        est += array_est(w ? w : 1, h, z, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; z = z > 1 ? z / 2 : z;
    }
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(a);
    CUresult res = f(a, d, levels);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    res = settle_array(r, est, *a, 1);
    if (res != CUDA_SUCCESS) { real_cuMipmappedArrayDestroy(*a); *a = NULL; }
    return res;
}

static CUresult destroy_array(CUresult res, void *a) {
    int r; uint64_t sz;
    if (res == CUDA_SUCCESS && vg.active && rec_take(K_ARRAY, (uint64_t)(uintptr_t)a, &r, &sz, NULL))
        vgpu_release(r, sz, ACCT_DATA);
    return res;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return destroy_array(CALL(cuArrayDestroy, a), a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { return destroy_array(CALL(cuMipmappedArrayDestroy, a), a); }

/* ------------------------------------------------------------------------------------------ contexts */
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice dev) {
    __typeof__(real_cuDevicePrimaryCtxRetain) f = REAL(cuDevicePrimaryCtxRetain);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !vg.context_overhead || dev < 0 || dev >= 64) return f(pc, dev);
    int r = ord2ridx(dev);
    int first = __atomic_fetch_add(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL) == 0;
    if (first && r >= 0 && vgpu_reserve(r, vg.context_overhead, ACCT_CONTEXT)) {
        __atomic_fetch_sub(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL);
        return refuse(pc);
    }
    CUresult res = f(pc, dev);
    if (res != CUDA_SUCCESS && __atomic_sub_fetch(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL) == 0 && r >= 0)
        vgpu_release(r, vg.context_overhead, ACCT_CONTEXT);
    return res;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CUresult res = CALL(cuDevicePrimaryCtxRelease_v2, dev);
    if (res == CUDA_SUCCESS && vg.active && vg.context_overhead && dev >= 0 && dev < 64) {
        int left = __atomic_sub_fetch(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL);
        if (left == 0) vgpu_release(ord2ridx(dev), vg.context_overhead, ACCT_CONTEXT);
        else if (left < 0) __atomic_store_n(&g_prim_refs[dev], 0, __ATOMIC_RELEASE);
    }
    return res;
}

static int ctx_pre(CUdevice dev) {
    if (!vg.active || !vg.context_overhead) return -1;
    int r = ord2ridx(dev);
    if (r < 0) return -1;
    return vgpu_reserve(r, vg.context_overhead, ACCT_CONTEXT) ? -2 : r;
}
static CUresult ctx_post(int r, CUresult res, CUcontext *pc) {
    if (r < 0) return res;
    if (res != CUDA_SUCCESS) { vgpu_release(r, vg.context_overhead, ACCT_CONTEXT); return res; }
    rec_put(K_CTX, (uint64_t)(uintptr_t)*pc, r, vg.context_overhead, 0);
    return res;
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice dev) {
    vgpu_ensure_init();
    int r = ctx_pre(dev);
    if (r == -2) return refuse(pc);
    return ctx_post(r, CALL(cuCtxCreate_v2, pc, flags, dev), pc);
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *pc, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    vgpu_ensure_init();
    int r = ctx_pre(dev);
    if (r == -2) return refuse(pc);
    return ctx_post(r, CALL(cuCtxCreate_v3, pc, p, n, flags, dev), pc);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pc, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    vgpu_ensure_init();
    int r = ctx_pre(dev);
    if (r == -2) return refuse(pc);
    return ctx_post(r, CALL(cuCtxCreate_v4, pc, p, flags, dev), pc);
}
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
    CUresult res = CALL(cuCtxDestroy_v2, c);
    __atomic_add_fetch(&g_ctx_gen, 1, __ATOMIC_RELAXED);
    int r; uint64_t sz;
    if (res == CUDA_SUCCESS && vg.active && rec_take(K_CTX, (uint64_t)(uintptr_t)c, &r, &sz, NULL))
        vgpu_release(r, sz, ACCT_CONTEXT);
    return res;
}

/* ------------------------------------------------------------------------------------------ memory queries */
static void clamp_info(int r, size_t *fr, size_t *tot) {
    uint64_t lim = vgpu_limit(r);
    if (!lim) return;
    uint64_t phys_total = *tot, phys_free = *fr;
    uint64_t total = lim < phys_total ? lim : phys_total;
    uint64_t used = vgpu_used(r);
    uint64_t f = total > used ? total - used : 0;
    if (f > phys_free) f = phys_free;
    *tot = total;
    *fr = f;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot) {
    CUresult res = CALL(cuMemGetInfo_v2, fr, tot);
    if (res != CUDA_SUCCESS || !vg.active || !fr || !tot) return res;
    int r = cur_ridx();
    if (r >= 0) clamp_info(r, fr, tot);
    return res;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult res = CALL(cuDeviceTotalMem_v2, bytes, dev);
    if (res != CUDA_SUCCESS || !vg.active || !bytes) return res;
    uint64_t lim = vgpu_limit(ord2ridx(dev));
    if (lim && lim < *bytes) *bytes = lim;
    return res;
}

/* NVML */
#define NVML_REAL(fn) (load_nvml(), vgpu_ensure_init(), real_##fn)

EXPORT nvmlReturn_t nvmlInit(void) {
    __typeof__(real_nvmlInit) f = NVML_REAL(nvmlInit);
    if (vg.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f() : NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) {
    __typeof__(real_nvmlInit_v2) f = NVML_REAL(nvmlInit_v2);
    if (vg.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f() : NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    __typeof__(real_nvmlInitWithFlags) f = NVML_REAL(nvmlInitWithFlags);
    if (vg.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f(flags) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

static int nvml_ridx(nvmlDevice_t h) {
    char uuid[VGPU_UUID_LEN];
    if (!real_nvmlDeviceGetUUID || real_nvmlDeviceGetUUID(h, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    return vgpu_ridx_for_uuid(uuid);
}

static void nvml_clamp(nvmlDevice_t h, unsigned long long *total, unsigned long long *fr, unsigned long long *used) {
    int r = nvml_ridx(h);
    uint64_t lim = vgpu_limit(r);
    if (r < 0 || !lim) return;
    uint64_t u = vgpu_used(r);
    uint64_t t = lim < *total ? lim : *total;
    uint64_t f = t > u ? t - u : 0;
    if (f > *fr) f = *fr;
    *total = t;
    *fr = f;
    *used = u;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    __typeof__(real_nvmlDeviceGetMemoryInfo) f = NVML_REAL(nvmlDeviceGetMemoryInfo);
    if (!f) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t res = f(h, m);
    if (res == NVML_SUCCESS && vg.active && m) nvml_clamp(h, &m->total, &m->free, &m->used);
    return res;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    __typeof__(real_nvmlDeviceGetMemoryInfo_v2) f = NVML_REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!f) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t res = f(h, m);
    if (res == NVML_SUCCESS && vg.active && m) nvml_clamp(h, &m->total, &m->free, &m->used);
    return res;
}

/* ------------------------------------------------------------------------------------------ compute limiter */
#include "limiter_impl.h"
