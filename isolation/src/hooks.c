/*
 * hooks.c - the interposed CUDA driver and NVML entry points of libvgpu.so: how we are reached, how we reach the
 * driver, devices, contexts and NVML.  Memory entry points are in memory_impl.h, stream capture in capture_impl.h,
 * the compute limiter in limiter_impl.h (all part of this translation unit, so the hot paths inline).
 *
 * How we are reached
 *   - LD_PRELOAD / /etc/ld.so.preload: our exported cu* / nvml* definitions come first in the global scope.
 *   - dlsym(): we export dlsym.  A tiny assembly entry tail-jumps to glibc's dlsym for RTLD_NEXT, so glibc still
 *     sees the caller's return address and "next" keeps its meaning; for every other handle we do the real
 *     lookup with the caller's handle and, only if the name is one we wrap and the lookup yielded the real
 *     driver's implementation, return our wrapper instead.  Other names never load or initialise anything.
 *   - cuGetProcAddress / _v2: the real driver resolves the symbol (it knows versions and the per-thread-stream
 *     flag); we substitute our wrapper when the returned pointer is the real driver's entry point we wrap.
 * How we reach the driver
 *   dlopen("libcuda.so.1") / dlopen("libnvidia-ml.so.1") and glibc's real dlsym on those handles, which only
 *   searches the driver's own scope, so we can never resolve to ourselves.  libvgpu.so has no DT_NEEDED on the
 *   driver: programs without CUDA (shells under ld.so.preload) never load it.  The loader is never called while
 *   one of our locks is held: another thread may hold the loader's lock (running a constructor) and wait for ours.
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
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

vgpu_state_t g_vgpu = {.slot = -1};

/* ------------------------------------------------------------------------------------------ hook tables */
/* X(function, base name for cuGetProcAddress, CUDA version it appeared in, per-thread-stream variant) */
#define CUDA_HOOKS(X)                                                                                           \
    X(cuInit, "cuInit", 2000, 0)                                                                                \
    X(cuGetProcAddress, "cuGetProcAddress", 11030, 0)                                                           \
    X(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0)                                                        \
    X(cuMemAlloc, "cuMemAlloc", 2000, 0)                                                                        \
    X(cuMemAlloc_v2, "cuMemAlloc", 3020, 0)                                                                     \
    X(cuMemFree, "cuMemFree", 2000, 0)                                                                          \
    X(cuMemFree_v2, "cuMemFree", 3020, 0)                                                                       \
    X(cuMemAllocPitch, "cuMemAllocPitch", 2000, 0)                                                              \
    X(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0)                                                           \
    X(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0)                                                          \
    X(cuMemGetInfo, "cuMemGetInfo", 2000, 0)                                                                    \
    X(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0)                                                                 \
    X(cuDeviceTotalMem, "cuDeviceTotalMem", 2000, 0)                                                            \
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
    X(cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020, 0)                                   \
    X(cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020, 0)                               \
    X(cuIpcGetMemHandle, "cuIpcGetMemHandle", 4010, 0)                                                          \
    X(cuIpcOpenMemHandle, "cuIpcOpenMemHandle", 4010, 0)                                                        \
    X(cuIpcOpenMemHandle_v2, "cuIpcOpenMemHandle", 11000, 0)                                                    \
    X(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", 4010, 0)                                                      \
    X(cuImportExternalMemory, "cuImportExternalMemory", 10000, 0)                                               \
    X(cuDestroyExternalMemory, "cuDestroyExternalMemory", 10000, 0)                                             \
    X(cuArrayCreate, "cuArrayCreate", 2000, 0)                                                                  \
    X(cuArrayCreate_v2, "cuArrayCreate", 3020, 0)                                                               \
    X(cuArray3DCreate, "cuArray3DCreate", 2000, 0)                                                              \
    X(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0)                                                           \
    X(cuArrayDestroy, "cuArrayDestroy", 2000, 0)                                                                \
    X(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0)                                                \
    X(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0)                                              \
    X(cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode", 11040, 0)                                               \
    X(cuGraphAddNode, "cuGraphAddNode", 12020, 0)                                                               \
    X(cuGraphAddNode_v2, "cuGraphAddNode", 12030, 0)                                                            \
    X(cuGraphDestroy, "cuGraphDestroy", 10000, 0)                                                               \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, 0)                                            \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 7000, 0)                                          \
    X(cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease", 11000, 0)                                      \
    X(cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", 7000, 0)                                              \
    X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset", 11000, 0)                                          \
    X(cuCtxCreate, "cuCtxCreate", 2000, 0)                                                                      \
    X(cuCtxCreate_v2, "cuCtxCreate", 3020, 0)                                                                   \
    X(cuCtxCreate_v3, "cuCtxCreate", 11040, 0)                                                                  \
    X(cuCtxCreate_v4, "cuCtxCreate", 12050, 0)                                                                  \
    X(cuCtxDestroy, "cuCtxDestroy", 2000, 0)                                                                    \
    X(cuCtxDestroy_v2, "cuCtxDestroy", 4000, 0)                                                                 \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, 0)                                                              \
    X(cuCtxPushCurrent, "cuCtxPushCurrent", 2000, 0)                                                            \
    X(cuCtxPushCurrent_v2, "cuCtxPushCurrent", 4000, 0)                                                         \
    X(cuCtxPopCurrent, "cuCtxPopCurrent", 2000, 0)                                                              \
    X(cuCtxPopCurrent_v2, "cuCtxPopCurrent", 4000, 0)                                                           \
    X(cuGreenCtxCreate, "cuGreenCtxCreate", 12040, 0)                                                           \
    X(cuGreenCtxDestroy, "cuGreenCtxDestroy", 12040, 0)                                                         \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", 10000, 0)                                                   \
    X(cuStreamBeginCapture_ptsz, "cuStreamBeginCapture", 10000, 1)                                              \
    X(cuStreamBeginCapture_v2, "cuStreamBeginCapture", 10010, 0)                                                \
    X(cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture", 10010, 1)                                           \
    X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph", 12030, 0)                                     \
    X(cuStreamBeginCaptureToGraph_ptsz, "cuStreamBeginCaptureToGraph", 12030, 1)                                \
    X(cuStreamEndCapture, "cuStreamEndCapture", 10000, 0)                                                       \
    X(cuStreamEndCapture_ptsz, "cuStreamEndCapture", 10000, 1)                                                  \
    X(cuLaunchKernel, "cuLaunchKernel", 4000, 0)                                                                \
    X(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1)                                                           \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0)                                                           \
    X(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1)                                                      \
    X(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0)                                          \
    X(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1)                                     \
    X(cuLaunchCooperativeKernelMultiDevice, "cuLaunchCooperativeKernelMultiDevice", 9000, 0)                    \
    X(cuLaunch, "cuLaunch", 2000, 0)                                                                            \
    X(cuLaunchGrid, "cuLaunchGrid", 2000, 0)                                                                    \
    X(cuLaunchGridAsync, "cuLaunchGridAsync", 2000, 0)                                                          \
    X(cuGraphLaunch, "cuGraphLaunch", 10000, 0)                                                                 \
    X(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1)

#define NVML_HOOKS(X)                                                                                           \
    X(nvmlInit, "nvmlInit", 0, 0)                                                                               \
    X(nvmlInit_v2, "nvmlInit_v2", 0, 0)                                                                         \
    X(nvmlInitWithFlags, "nvmlInitWithFlags", 0, 0)                                                             \
    X(nvmlDeviceGetMemoryInfo, "nvmlDeviceGetMemoryInfo", 0, 0)                                                 \
    X(nvmlDeviceGetMemoryInfo_v2, "nvmlDeviceGetMemoryInfo_v2", 0, 0)

/* the declarations cuda.h does not give under these names (old ABIs, per-thread forms of old entry points) */
CUresult cuStreamBeginCapture(CUstream hStream);
CUresult cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph, const CUgraphNode *deps,
                                          const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
CUresult cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *deps,
                           const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *nodeParams);
nvmlReturn_t nvmlInit(void);
nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);

#define DECL_REAL(fn, base, since, ptsz) static __typeof__(&fn) real_##fn;
CUDA_HOOKS(DECL_REAL)
NVML_HOOKS(DECL_REAL)

/* driver functions we call but do not wrap */
static CUresult (*real_cuCtxGetDevice)(CUdevice *);
static CUresult (*real_cuCtxGetCurrent)(CUcontext *);
static CUresult (*real_cuDeviceGetCount)(int *);
static CUresult (*real_cuDeviceGetUuid_v2)(CUuuid *, CUdevice);
static CUresult (*real_cuEventCreate)(CUevent *, unsigned int);
static CUresult (*real_cuEventDestroy_v2)(CUevent);
static CUresult (*real_cuEventRecord)(CUevent, CUstream);
static CUresult (*real_cuEventQuery)(CUevent);
static CUresult (*real_cuEventElapsedTime)(float *, CUevent, CUevent);
static CUresult (*real_cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
static CUresult (*real_cuMemGetAddressRange_v2)(CUdeviceptr *, size_t *, CUdeviceptr);
static CUresult (*real_cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
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
    if (__atomic_load_n(&vgpu_real_dlsym, __ATOMIC_ACQUIRE)) return;
    static const char *versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", NULL};
    void *(*found)(void *, const char *) = NULL;
    for (int i = 0; versions[i] && !found; i++)
        found = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    __atomic_store_n(&vgpu_real_dlsym, found, __ATOMIC_RELEASE);
}

HIDDEN void *vgpu_dlsym_hook(void *handle, const char *name);

/*
 * dlsym entry: RTLD_NEXT ((void *)-1) goes straight to glibc by a tail jump (the return address is still the
 * caller's, so "next" is relative to the caller); everything else goes to vgpu_dlsym_hook.
 */
#if defined(__x86_64__)
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
#elif defined(__aarch64__)
__asm__(".text\n"
        ".globl dlsym\n"
        ".type dlsym, %function\n"
        "dlsym:\n"
        "    cmn x0, #1\n"
        "    b.ne 1f\n"
        "    adrp x16, vgpu_real_dlsym\n"
        "    ldr x16, [x16, #:lo12:vgpu_real_dlsym]\n"
        "    cbz x16, 1f\n"
        "    br x16\n"
        "1:\n"
        "    b vgpu_dlsym_hook\n"
        ".size dlsym, .-dlsym\n");
#else
#error "libvgpu.so's dlsym entry is written for x86-64 and aarch64 only"
#endif

static void *g_libcuda, *g_libnvml;
static volatile int g_ready;
static THREAD_LOCAL int t_in_init;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

static void load_nvml(void);

static hook_t *find_hook(hook_t *tab, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(tab[i].name, name)) return &tab[i];
    return NULL;
}

void *vgpu_wrapper_for(const char *name, void *real) {
    hook_t *h = NULL;
    if (name[0] == 'c' && name[1] == 'u') {
        h = find_hook(g_cuda_hooks, NCUDA, name);
        if (h) vgpu_ensure_init();
    } else if (!strncmp(name, "nvml", 4)) {
        h = find_hook(g_nvml_hooks, NNVML, name);
        if (h) { load_nvml(); vgpu_ensure_init(); }
    }
    if (h && real && __atomic_load_n(h->real, __ATOMIC_ACQUIRE) == real) return h->wrapper;
    return NULL;
}

void *vgpu_wrapper_for_real(void *real) {
    for (size_t i = 0; i < NCUDA; i++)
        if (__atomic_load_n(g_cuda_hooks[i].real, __ATOMIC_ACQUIRE) == real) return g_cuda_hooks[i].wrapper;
    return NULL;
}

void *vgpu_dlsym_hook(void *handle, const char *name) {
    resolve_real_dlsym();
    if (!vgpu_real_dlsym) return NULL;
    void *r = vgpu_real_dlsym(handle, name);
    if (!r || !name || t_in_init) return r;
    void *w = vgpu_wrapper_for(name, r);
    return w ? w : r;
}

/* ------------------------------------------------------------------------------------------ init */
static pthread_mutex_t g_map_mu = PTHREAD_MUTEX_INITIALIZER;
static vmap_t g_map;
enum { K_PTR = 1, K_HANDLE, K_MAPPING, K_ARRAY, K_CTX, K_POOL, K_FUNC, K_IMPORT, K_IPC, K_EXTMEM, K_GRAPHMEM };
/* K_GRAPHMEM + device: graph memory nodes charged to that device, by graph */
static unsigned g_ctx_gen;   /* bumped when a context is destroyed: invalidates per-thread context caches */

static void *sym(void *lib, const char *name) { return lib ? vgpu_real_dlsym(lib, name) : NULL; }

static void load_nvml(void) {
    if (__atomic_load_n(&g_libnvml, __ATOMIC_ACQUIRE)) return;
    resolve_real_dlsym();
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);   /* no lock held: dlopen takes the loader's */
    if (!lib) return;
    for (size_t i = 0; i < NNVML; i++)
        __atomic_store_n(g_nvml_hooks[i].real, sym(lib, g_nvml_hooks[i].name), __ATOMIC_RELEASE);
    __atomic_store_n(&real_nvmlDeviceGetUUID,
                     (nvmlReturn_t(*)(nvmlDevice_t, char *, unsigned))sym(lib, "nvmlDeviceGetUUID"), __ATOMIC_RELEASE);
    void *prev = NULL;
    if (!__atomic_compare_exchange_n(&g_libnvml, &prev, lib, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        dlclose(lib);   /* another thread got there first: the same handle, one reference too many */
}

/* The driver's entry points.  Runs without any lock of ours (the loader takes its own); idempotent, so threads
 * that race here store the same values. */
static void resolve_driver(void) {
    resolve_real_dlsym();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        VLOG(VLOG_DEBUG, "libcuda.so.1 not loadable: %s", dlerror());
        return;
    }
    for (size_t i = 0; i < NCUDA; i++)
        __atomic_store_n(g_cuda_hooks[i].real, sym(lib, g_cuda_hooks[i].name), __ATOMIC_RELEASE);
#define LOAD(fn) __atomic_store_n(&fn, (__typeof__(fn))sym(lib, #fn + 5), __ATOMIC_RELEASE)
    LOAD(real_cuCtxGetDevice);
    LOAD(real_cuCtxGetCurrent);
    LOAD(real_cuDeviceGetCount);
    LOAD(real_cuDeviceGetUuid_v2);
    LOAD(real_cuEventCreate);
    LOAD(real_cuEventDestroy_v2);
    LOAD(real_cuEventRecord);
    LOAD(real_cuEventQuery);
    LOAD(real_cuStreamIsCapturing);
    LOAD(real_cuMemGetAddressRange_v2);
    LOAD(real_cuMemGetAllocationPropertiesFromHandle);
    LOAD(real_cuArrayGetMemoryRequirements);
    LOAD(real_cuMipmappedArrayGetMemoryRequirements);
#undef LOAD
    void *elapsed = sym(lib, "cuEventElapsedTime_v2");
    if (!elapsed) elapsed = sym(lib, "cuEventElapsedTime");
    __atomic_store_n(&real_cuEventElapsedTime, (CUresult(*)(float *, CUevent, CUevent))elapsed, __ATOMIC_RELEASE);
    void *prev = NULL;
    if (!__atomic_compare_exchange_n(&g_libcuda, &prev, lib, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) dlclose(lib);
}

/* Our own state: the environment and the accounting file.  Calls nothing of the loader. */
static void init_state(void) {
    vgpu_read_env();
    char why[320];
    int attach = g_vgpu.active ? vgpu_region_attach(why, sizeof why) : 0;
    if (attach) {
        g_vgpu.active = 0;
        if (g_vgpu.fail_open && attach == -1) {  /* a tampered file (-2) is never a reason to run without limits */
            VLOG(VLOG_ERROR, "%s; running WITHOUT limits (VGPU_ISOLATION_FAIL_OPEN=1)", why);
        } else {
            g_vgpu.config_error = 1;
            VLOG(VLOG_ERROR, "%s; limits are configured but cannot be enforced, so CUDA and NVML initialisation "
                             "are refused", why);
        }
    }
    VLOG(VLOG_INFO, "libvgpu initialised: active=%d sm=%d policy=%d", g_vgpu.active, g_vgpu.sm_configured, g_vgpu.policy);
}

void vgpu_ensure_init(void) {
    if (LIKELY(g_ready) || t_in_init) return;
    t_in_init = 1;
    resolve_driver();
    pthread_mutex_lock(&g_init_mu);
    if (!g_ready) {
        init_state();
        __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_init_mu);
    t_in_init = 0;
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

#define MAX_ORDINALS 64
static int g_ord2r[MAX_ORDINALS];   /* CUDA ordinal -> region row (-1: none); valid once g_ndev >= 0 */
static int g_ndev = -1;             /* CUDA devices this process sees, once mapped */
static pthread_mutex_t g_dev_mu = PTHREAD_MUTEX_INITIALIZER;

/* The row of a device as the accounting file gives it, checked: a granted UUID has the row of its position in the
 * grant (the process that made the file wrote them so), and with limits every device has a row.  Otherwise the
 * file was changed: every charge is then refused (row 0 stands in, so that the charge is made and refused). */
static int checked_row(const char *uuid, int row) {
    if (!g_vgpu.active) return row;
    if (row < 0) {
        vgpu_mark_tampered("%s has no row in the accounting file, whose device table is full", uuid);
        return 0;
    }
    for (int p = 0; p < g_vgpu.grant_count; p++) {
        if (strcasecmp(g_vgpu.grant_uuid[p], uuid)) continue;
        if (p != row) {
            vgpu_mark_tampered("%s is granted at position %d but has row %d in the accounting file", uuid, p, row);
            return 0;
        }
        break;
    }
    return row;
}

/* Maps every CUDA ordinal to its region row by UUID, once (after cuInit; before it nothing can be allocated). */
static void map_devices(void) {
    pthread_mutex_lock(&g_dev_mu);
    int n = 0;
    if (g_ndev < 0 && real_cuDeviceGetCount && real_cuDeviceGetCount(&n) == CUDA_SUCCESS) {
        for (int i = 0; i < MAX_ORDINALS; i++) g_ord2r[i] = -1;
        for (int i = 0; i < n && i < MAX_ORDINALS; i++) {
            CUuuid u;
            char s[VGPU_UUID_LEN];
            if (real_cuDeviceGetUuid_v2 && real_cuDeviceGetUuid_v2(&u, i) == CUDA_SUCCESS) {
                uuid_string(&u, s, sizeof s);
                g_ord2r[i] = checked_row(s, vgpu_row_for_uuid(s));
            }
        }
        __atomic_store_n(&g_ndev, n, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&g_dev_mu);
}

/* Region row of CUDA ordinal `ord`, -1 when it has none. */
static int ord2row(int ord) {
    if (ord < 0 || ord >= MAX_ORDINALS) return -1;
    if (UNLIKELY(__atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE) < 0)) map_devices();
    return __atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE) > ord ? g_ord2r[ord] : -1;
}

static int cur_row(void) {
    CUdevice d;
    if (!real_cuCtxGetDevice || real_cuCtxGetDevice(&d) != CUDA_SUCCESS) return -1;
    return ord2row(d);
}

/* ------------------------------------------------------------------------------------------ records */
static void rec_put(int kind, uint64_t key, int row, uint64_t size, uint64_t aux) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, (uint32_t)kind, key);
    if (e) { e->dev = row; e->size = size; e->aux = aux; }
    pthread_mutex_unlock(&g_map_mu);
}
/* Removes the record; returns 1 and its contents if it existed. */
static int rec_take(int kind, uint64_t key, int *row, uint64_t *size, uint64_t *aux) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, (uint32_t)kind, key);
    if (e) {
        if (row) *row = e->dev;
        if (size) *size = e->size;
        if (aux) *aux = e->aux;
        vmap_del(&g_map, e);
    }
    pthread_mutex_unlock(&g_map_mu);
    return e != NULL;
}
/* Gives back what a record charged, if it exists. */
static void rec_release(int kind, uint64_t key, int acct) {
    int r;
    uint64_t sz;
    if (rec_take(kind, key, &r, &sz, NULL)) vgpu_release(r, sz, acct);
}

#define OOM CUDA_ERROR_OUT_OF_MEMORY

/* A refused allocation hands back a null handle: a caller that frees it anyway passes 0, not garbage. */
#define refuse(out) ({ if (out) memset((out), 0, sizeof *(out)); OOM; })

/* ------------------------------------------------------------------------------------------ init and config */
EXPORT CUresult cuInit(unsigned int flags) {
    vgpu_ensure_init();
    if (g_vgpu.config_error) return CUDA_ERROR_INVALID_VALUE;
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

/* ------------------------------------------------------------------------------------------ the rest */
#include "capture_impl.h"
#include "limiter_impl.h"
#include "memory_impl.h"
#include "context_impl.h"
#include "nvml_impl.h"
