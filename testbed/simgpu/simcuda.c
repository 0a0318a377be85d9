/*
 * simcuda.c - a simulated CUDA driver (libcuda.so.1).  TEST INFRASTRUCTURE, never shipped.
 *
 * Device memory is bookkeeping only: addresses come from a private range per GPU and cannot be dereferenced.
 * Allocations fail with CUDA_ERROR_OUT_OF_MEMORY past the GPU's memory and past the hard limit NVML set for the
 * calling process's cgroup (nvmlDeviceSetMemoryLimits_v1, see simnvml.c).
 * Kernels run on the GPU's engine (gpusim.h) for a duration drawn at launch (kerneltime.h).  Launches are
 * asynchronous; a stream with SIMGPU_QUEUE_DEPTH launches in flight makes the next launch wait.  An event gets
 * the time at which the engine reaches it, and then holds the engine for SIMGPU_EVENT_NS (default 0; a real GPU
 * spends about 1.3 us of device time per event pair, bench/results/gpu/h100-run2/event_timing.txt).  Graphs run their nodes one after another, in the order they were
 * added (a topological order), each launch drawing every kernel's duration anew.
 *
 * Stream capture (cuStreamBeginCapture ... cuStreamEndCapture) records work submitted to a capturing stream into
 * a graph instead of running it, with the capture-mode rules, invalidation and error codes of cuda.h and the CUDA
 * Programming Guide; graph memory nodes take device memory at launch into a per-device graph pool that
 * cuDeviceGraphMemTrim gives back.  Events belong to the context current at their creation and die with it; a
 * later use is refused and counted (simgpu_dead_event_uses).  Every exported cu* entry point counts its calls
 * (simgpu_calls); with SIMGPU_CALLS_DUMP=<file> the counts of a process are appended to that file when it exits.
 * docs/testbed-fidelity.md says, behaviour by behaviour, what is modelled, from which NVIDIA source, and what is
 * simplified.
 */
#define GS_ORDER_CUDA 1
#include "gpusim.h"
#include "kerneltime.h"
#include "objtable.h"
#define CUDA_ENABLE_DEPRECATED 1   /* the simulator implements the deprecated entry points too */
#include <cuda.h>
#include <sys/mman.h>

/* cuda.h maps these names to their newest versions; the simulator also exports the old symbols, whose ABIs
 * cudaTypedefs.h gives (PFN_<name>_v<since>). */
#undef cuGetProcAddress
#undef cuEventElapsedTime
#undef cuDeviceGetUuid
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuCtxCreate
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuMemGetAddressRange
#undef cuStreamBeginCapture
#undef cuStreamGetCaptureInfo
#undef cuStreamUpdateCaptureDependencies
#undef cuIpcOpenMemHandle
#undef cuDevicePrimaryCtxReset
#undef cuDevicePrimaryCtxRelease
#undef cuGraphInstantiate

typedef unsigned int sc_dptr32_t;     /* CUdeviceptr_v1 */
typedef struct {                      /* CUDA_ARRAY_DESCRIPTOR_v1 */
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
} sc_array_desc_v1_t;
typedef struct {                      /* CUDA_ARRAY3D_DESCRIPTOR_v1 */
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
} sc_array3d_desc_v1_t;

CUresult cuGetProcAddress(const char *name, void **fn, int version, cuuint64_t opts);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
CUresult cuMemAlloc(sc_dptr32_t *p, unsigned int bytes);
CUresult cuMemAllocPitch(sc_dptr32_t *p, unsigned int *pitch, unsigned int width, unsigned int height,
                         unsigned int elem);
CUresult cuMemFree(sc_dptr32_t p);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult cuArrayCreate(CUarray *arr, const sc_array_desc_v1_t *desc);
CUresult cuArray3DCreate(CUarray *arr, const sc_array3d_desc_v1_t *desc);
CUresult cuMemGetAddressRange(sc_dptr32_t *base, unsigned int *size, sc_dptr32_t p);
CUresult cuStreamBeginCapture(CUstream s);
CUresult cuStreamBeginCapture_ptsz(CUstream s);
CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id);
CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id);
CUresult cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode *deps, size_t n, unsigned int flags);
CUresult cuStreamUpdateCaptureDependencies_ptsz(CUstream s, CUgraphNode *deps, size_t n, unsigned int flags);
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size);
CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size);

#define API __attribute__((visibility("default")))

/* ------------------------------------------------------------------------------------------------ call counters */
/* Each exported entry point owns one counter in the section sgcalls and counts every call: one relaxed atomic add.
 * The simulator never calls its own exported entry points (they all call static helpers), so a count is the
 * number of calls made from outside: the application, a library over it, or a cuGetProcAddress pointer. */
typedef struct { const char *name; uint64_t n; } sc_count_t;
extern sc_count_t __start_sgcalls[] __attribute__((visibility("hidden")));
extern sc_count_t __stop_sgcalls[] __attribute__((visibility("hidden")));
#define CALLED() \
    static sc_count_t sc_count_ __attribute__((section("sgcalls"), used, aligned(16))) = {__func__, 0}; \
    __atomic_fetch_add(&sc_count_.n, 1, __ATOMIC_RELAXED)

/* ------------------------------------------------------------------------------------------------ objects */
typedef struct sc_ctx sc_ctx_t;
typedef struct sc_stream sc_stream_t;
typedef struct sc_graph sc_graph_t;
typedef struct sc_node sc_node_t;
typedef struct sc_capture sc_capture_t;
typedef struct sc_event sc_event_t;

enum { SK_USER, SK_LEGACY, SK_PER_THREAD };

struct sc_stream {
    int gpu;                  /* index into gs_view (the CUDA ordinal) */
    sc_ctx_t *ctx;
    unsigned flags;           /* CU_STREAM_NON_BLOCKING */
    int kind;
    uint64_t done_at;         /* end of the last work submitted to it */
    uint64_t not_before;      /* its next work starts no earlier (a wait on another GPU's event) */
    uint32_t depth, issued;
    uint64_t *ends;           /* end times of the last `depth` launches */
    /* stream capture: the capture sequence this stream is part of, and the nodes its next node depends on */
    sc_capture_t *cap;
    int ndeps, capdeps;
    sc_node_t **deps;
    CUgraphNode *deps_out;    /* handed out by cuStreamGetCaptureInfo */
    CUgraphEdgeData *edges_out;
};

struct sc_ctx {
    int gpu;
    int primary, retained;
    int green;                /* converted from a green context (cuCtxFromGreenCtx) */
    sc_ctx_t *parent;         /* the primary context a green context belongs to */
    uint64_t overhead;        /* bytes the context itself takes (SIMGPU_CTX_BYTES) */
    sc_stream_t null_stream;  /* the legacy default stream */
    sc_event_t *events;       /* live events created in it (a green context's are kept by its primary context) */
};

/* An event belongs to the context current at its creation and dies with it (cuCtxDestroy, the last primary
 * release, a primary reset, cuGreenCtxDestroy).  A dead event's record is never freed: its handle cannot be reused
 * by a later event, so every later use finds `dead` set and is refused without touching freed memory, whatever
 * context has taken the old context's address since. */
struct sc_event {
    uint64_t at;              /* when the engine reaches it */
    int valid, gpu;
    unsigned flags;
    int dead;                 /* its context was destroyed (read with an acquire load: the hot paths' one check) */
    uint64_t cap_id;          /* != 0: last recorded inside that capture sequence */
    int ndeps;
    sc_node_t **deps;         /* the capture's nodes it stands for */
    sc_ctx_t *ctx;            /* the context it was created in; NULL with none current or once dead */
    sc_ctx_t *home;           /* the context whose list holds it: ctx, or ctx's primary context for a green one */
    sc_event_t *prev, *next;  /* in home->events, under sc_ev_mu */
};

typedef struct { char *image; } sc_module_t;

#define SC_PARAM_BYTES 4096
typedef struct {
    kt_func_t kt;             /* the duration model */
    unsigned char params[SC_PARAM_BYTES];   /* the old launch API's parameter space (cuParamSet*) */
    unsigned psize;
    int bx, by, bz;
    unsigned shared;
} sc_func_t;

/* a graph allocation (memory alloc node): a fixed address; memory while `live` */
typedef struct {
    uint64_t addr, bytes;
    int gpu;
    int live;                 /* a launch allocated it and nothing freed it yet */
    int freed_in_owner;       /* the owning graph frees it */
    int freed_elsewhere;      /* another graph has a free node for it */
    int refs;                 /* graphs and instantiations whose nodes name it */
    sc_graph_t *owner;        /* NULL once the owning graph is destroyed */
} sc_galloc_t;

enum { SN_KERNEL = 1, SN_EMPTY, SN_EVENT_RECORD, SN_EVENT_WAIT, SN_MEM_ALLOC, SN_MEM_FREE };
struct sc_node {
    int type, index;
    sc_graph_t *graph;
    kt_func_t fn;
    uint64_t blocks, param;
    sc_event_t *event;
    sc_galloc_t *alloc;
    CUDA_MEM_ALLOC_NODE_PARAMS alloc_params;
    int ndeps;
    sc_node_t **deps;
};

struct sc_graph {
    int count, cap;
    sc_node_t **node;
    int execs;                /* live instantiations (counted for graphs with memory nodes) */
    int destroyed;            /* cuGraphDestroy'd while instantiations live: only the shell is left */
    int capturing;            /* a capture sequence is adding to it */
};

typedef struct {
    int type;
    kt_func_t fn;
    uint64_t blocks, param;
    sc_event_t *event;
    sc_galloc_t *alloc;
} sc_enode_t;

typedef struct {
    int count;
    sc_enode_t *node;
    sc_graph_t *graph;
    unsigned long long flags;
    int has_mem;
} sc_exec_t;

struct sc_capture {
    uint64_t id;
    int mode;                 /* CUstreamCaptureMode given at begin */
    int invalid;
    pthread_t thread;         /* the thread that began it */
    sc_stream_t *origin;
    sc_graph_t *graph;
    int own_graph;            /* made by cuStreamBeginCapture (not ...ToGraph) */
    int nstreams, capstreams;
    sc_stream_t **streams;
    sc_capture_t *next;
};

typedef struct { int gpu; } sc_pool_t;
typedef struct {
    int gpu;
    uint64_t bytes;
    int refs;
    int imported;             /* maps another process's allocation: holds no memory of its own */
    uint64_t serial;          /* export serial (0: never exported) */
    uint64_t handle_types;    /* CUmemAllocationProp.requestedHandleTypes */
} sc_phys_t;
typedef struct { int gpu; uint64_t bytes; sc_ctx_t *ctx; } sc_array_t;
typedef struct { int gpu; uint64_t bytes; int counted; } sc_extmem_t;
typedef struct { int gpu; unsigned sms; } sc_desc_t;
typedef struct { int gpu; unsigned sms; sc_ctx_t ctx; } sc_green_t;

/* the graph memory pool of one GPU: physical memory graphs keep for their allocations until trimmed */
typedef struct {
    uint64_t reserved;        /* taken from the GPU for graphs */
    uint64_t used;            /* of which live graph allocations hold */
    uint64_t busy, busy_until;   /* footprint of graph launches still executing, and when they end */
    uint64_t used_high, reserved_high;
} sc_gpool_t;

enum { TAG_PTR = 11, TAG_MAP = 12, TAG_ARRAY = 13, TAG_GALLOC = 14, TAG_IPC = 15, TAG_IPC_SERIAL = 16,
       TAG_EXTMAP = 17, TAG_PHYS_SERIAL = 18 };
enum { BUF_ALLOC = 1, BUF_ASYNC, BUF_MANAGED };

static pthread_mutex_t sc_mu = PTHREAD_MUTEX_INITIALIZER;       /* objects, address space, contexts */
static pthread_mutex_t sc_cap_mu = PTHREAD_MUTEX_INITIALIZER;   /* capture sequences, their streams and graphs */
static pthread_mutex_t sc_ev_mu = PTHREAD_MUTEX_INITIALIZER;    /* contexts' event lists (taken before sc_cap_mu) */
static ot_table_t sc_objs;
static int sc_up;
static uint64_t sc_next_va[GS_NDEV];
static uint64_t sc_next_va32 = 0x00200000ULL;   /* the 32-bit window of the v1 (CUdeviceptr_v1) API */
static sc_ctx_t sc_primary[GS_NDEV];
static sc_pool_t sc_pools[GS_NDEV];
static sc_gpool_t sc_gpool[GS_NDEV];
static uint32_t sc_depth = 1024;
static uint64_t sc_event_ns;        /* device time an event record holds the engine (SIMGPU_EVENT_NS) */
static uint64_t sc_ctx_bytes;
static __thread sc_ctx_t *sc_cur[16];
static __thread int sc_ncur;
static __thread struct { sc_ctx_t *ctx; sc_stream_t *s; } sc_pts[16];   /* per-thread default streams */
static __thread int sc_npts;
static __thread int sc_tmode = CU_STREAM_CAPTURE_MODE_GLOBAL;       /* cuThreadExchangeStreamCaptureMode */
static sc_capture_t *sc_caps;             /* capture sequences in progress */
static int sc_ncaps;                      /* how many (read without the lock: the fast path) */
static uint64_t sc_next_cap_id;
static uint64_t sc_invalidations;         /* captures invalidated in this process */
static uint64_t sc_dead_event_uses;       /* calls that used an event whose context was destroyed */

static sc_ctx_t *current(void) { return sc_ncur ? sc_cur[sc_ncur - 1] : NULL; }

static void stream_setup(sc_stream_t *s, int gpu, sc_ctx_t *ctx, int kind, unsigned flags) {
    memset(s, 0, sizeof *s);
    s->gpu = gpu;
    s->ctx = ctx;
    s->kind = kind;
    s->flags = flags;
    s->depth = sc_depth;
    s->ends = calloc(sc_depth, sizeof *s->ends);
}

static gs_gpu_t *hw(int gpu) { return &gs_st->gpu[gs_view[gpu].slot]; }

#define UP() do { if (!sc_up) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define GPU_OK(g) do { if ((g) < 0 || (g) >= gs_nview) return CUDA_ERROR_INVALID_DEVICE; } while (0)
#define CTX_GPU(var) int var; do { UP(); sc_ctx_t *c_ = current(); if (!c_) return CUDA_ERROR_INVALID_CONTEXT; \
    var = c_->gpu; } while (0)
#define SC_CAPTURED ((CUresult)-1)   /* a gate's answer: the operation goes into the capture (sc_cap_mu held) */

API CUresult cuInit(unsigned int flags) {
    CALLED();
    (void)flags;
    pthread_mutex_lock(&sc_mu);
    int bad = gs_join() || gs_nview == 0;
    if (!bad && !sc_up) {
        sc_depth = (uint32_t)gs_env_num("SIMGPU_QUEUE_DEPTH", 1024);
        if (!sc_depth) sc_depth = 1;
        sc_ctx_bytes = gs_env_num("SIMGPU_CTX_BYTES", 0);
        sc_event_ns = gs_env_num("SIMGPU_EVENT_NS", 0);
        for (int g = 0; g < GS_NDEV; g++) {
            sc_next_va[g] = 0x7f0000000000ULL - (uint64_t)(g + 1) * 0x40000000000ULL;
            sc_primary[g].gpu = g;
            sc_primary[g].primary = 1;
            stream_setup(&sc_primary[g].null_stream, g, &sc_primary[g], SK_LEGACY, 0);
            sc_pools[g].gpu = g;
        }
        sc_up = 1;
    }
    pthread_mutex_unlock(&sc_mu);
    return bad ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int *version) {
    CALLED();
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = (int)gs_env_num("SIMGPU_DRIVER_VERSION", 13000);
    return CUDA_SUCCESS;
}

static const struct { CUresult code; const char *name, *text; } sc_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_MERGE, "CUDA_ERROR_STREAM_CAPTURE_MERGE",
     "operation would result in a merge of separate capture sequences"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED", "capturing stream has unjoined work"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "dependency created on uncaptured work in another stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_INVALID_RESOURCE_TYPE, "CUDA_ERROR_INVALID_RESOURCE_TYPE", "invalid resource type"},
    {CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION",
     "invalid resource configuration"},
};

API CUresult cuGetErrorString(CUresult code, const char **text) {
    CALLED();
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    *text = "sim error";
    for (size_t i = 0; i < sizeof sc_errors / sizeof sc_errors[0]; i++)
        if (sc_errors[i].code == code) *text = sc_errors[i].text;
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult code, const char **text) {
    CALLED();
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    *text = "CUDA_ERROR_UNKNOWN";
    for (size_t i = 0; i < sizeof sc_errors / sizeof sc_errors[0]; i++)
        if (sc_errors[i].code == code) *text = sc_errors[i].name;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ devices */
/* CUDA ordinals are gs_view indices: CUDA_DEVICE_ORDER, then CUDA_VISIBLE_DEVICES (gpusim.h). */
API CUresult cuDeviceGetCount(int *count) {
    CALLED();
    UP();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = gs_nview;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    CALLED();
    UP();
    GPU_OK(ordinal);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!name || len < 1) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", gs_view[dev].name);
    return CUDA_SUCCESS;
}

static CUresult device_uuid(CUuuid *out, CUdevice dev) {
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
API CUresult cuDeviceGetUuid_v2(CUuuid *out, CUdevice dev) { CALLED(); return device_uuid(out, dev); }
API CUresult cuDeviceGetUuid(CUuuid *out, CUdevice dev) { CALLED(); return device_uuid(out, dev); }

API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = gs_view[dev].total;
    return CUDA_SUCCESS;
}

/* the v1 (32-bit) size: saturated at UINT_MAX rather than wrapped */
static unsigned int u32_sat(uint64_t v) { return v > 0xffffffffULL ? 0xffffffffU : (unsigned int)v; }

API CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = u32_sat(gs_view[dev].total);
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attr, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    if (attr == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) v = gs_view[dev].sms;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR) v = 2048;
    else if (attr == CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) v = 1024;
    else if (attr == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) v = 8;
    else if (attr == CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT) v = 512;
    else if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) v = gs_view[dev].bus;
    else if (attr == CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID || attr == CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) v = 0;
    else if (attr == CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED ||
             attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ||
             attr == CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH || attr == CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING ||
             attr == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED ||
             attr == CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED)
        v = 1;
    *value = v;
    return CUDA_SUCCESS;
}

/* "domain:bus:device.function" (hex), as cuDeviceGetPCIBusId writes it */
API CUresult cuDeviceGetPCIBusId(char *out, int len, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!out || len < 1) return CUDA_ERROR_INVALID_VALUE;
    snprintf(out, (size_t)len, "%04x:%02x:%02x.0", 0u, (unsigned)gs_view[dev].bus, 0u);
    return CUDA_SUCCESS;
}

/* accepts [domain]:[bus]:[device].[function], [domain]:[bus]:[device] and [bus]:[device].[function] */
static int parse_bus_id(const char *s, unsigned *bus) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (sscanf(s, "%x:%x:%x.%x", &a, &b, &c, &d) == 4 || sscanf(s, "%x:%x:%x", &a, &b, &c) == 3) { *bus = b; return 0; }
    if (sscanf(s, "%x:%x.%x", &a, &b, &c) == 3) { *bus = a; return 0; }
    return -1;
}

API CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *id) {
    CALLED();
    UP();
    unsigned bus = 0;
    if (!dev || !id || parse_bus_id(id, &bus)) return CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < gs_nview; i++)
        if ((unsigned)gs_view[i].bus == bus) { *dev = i; return CUDA_SUCCESS; }
    return CUDA_ERROR_INVALID_DEVICE;
}

/* ------------------------------------------------------------------------------------------------ streams */
static sc_stream_t *per_thread_stream(sc_ctx_t *c) {
    for (int i = 0; i < sc_npts; i++)
        if (sc_pts[i].ctx == c) return sc_pts[i].s;
    sc_stream_t *s = malloc(sizeof *s);
    if (!s) return NULL;
    stream_setup(s, c->gpu, c, SK_PER_THREAD, 0);
    int i = sc_npts < 16 ? sc_npts++ : 15;
    sc_pts[i].ctx = c;
    sc_pts[i].s = s;
    return s;
}

/* The stream a handle names.  NULL is the legacy stream, or the per-thread stream for a _ptsz entry point (pt). */
static sc_stream_t *stream_of(CUstream s, int pt) {
    if (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) return (sc_stream_t *)s;
    sc_ctx_t *c = current();
    if (!c) return NULL;
    if (s == CU_STREAM_LEGACY || (!s && !pt)) return &c->null_stream;
    return per_thread_stream(c);
}

static void sleep_until(uint64_t when) {
    uint64_t now = gs_clock();
    if (when > now) gs_nap(when - now);
}

/* ---- time slicing (timeslice.h): with SIMGPU_TIMESLICE_NS, the times below are tickets until the schedule
 * reaches them */
static int ts_on(void) { return gs_ts_slice_env() != 0; }

/* The time `v` (a time, or a ticket of GPU `gpu`) stands for; GS_NEVER while the schedule has not got there. */
static uint64_t when(int gpu, uint64_t v) {
    if (!(v & GS_TICKET)) return v;
    gs_gpu_t *g = hw(gpu);
    gs_lock(&g->mu);
    gs_ts_advance_locked(g, gs_clock());
    uint64_t t = gs_ts_lookup_locked(g, v);
    gs_unlock(&g->mu);
    return t;
}

/* Sleeps until the time `v` (a time, or a ticket of GPU `gpu`) stands for. */
static void wait_for(int gpu, uint64_t v) {
    while (v & GS_TICKET) {
        gs_gpu_t *g = hw(gpu);
        gs_lock(&g->mu);
        uint64_t now = gs_clock();
        gs_ts_advance_locked(g, now);
        uint64_t t = gs_ts_lookup_locked(g, v), until = t == GS_NEVER ? gs_ts_project_locked(g, v) : t;
        gs_unlock(&g->mu);
        if (t != GS_NEVER) {
            v = t;
            break;
        }
        gs_nap(until > now + 20000 ? until - now : 20000);   /* the earliest it can be done; then look again */
    }
    sleep_until(v);
}

/* Appends items of the given device ns (0: an event's mark) to this process's run queue on `gpu`, waiting while
 * every queue there is taken or ours is full; their sequence numbers go to `seq`.  Returns the queue. */
static int ts_push(int gpu, const uint64_t *left, int n, int kernels, uint64_t *seq) {
    gs_gpu_t *g = hw(gpu);
    int q = -1;
    for (int done = 0; done < n;) {
        int chunk = n - done < GS_TSRING / 4 ? n - done : GS_TSRING / 4;
        gs_lock(&g->mu);
        g->ts_switch = gs_ts_switch_env();
        __atomic_store_n(&g->ts_slice, gs_ts_slice_env(), __ATOMIC_RELEASE);
        gs_ts_advance_locked(g, gs_clock());
        q = gs_ts_queue_locked(g);
        int room = q >= 0 && g->rq[q].next - g->rq[q].head + (uint64_t)chunk <= GS_TSRING;
        for (int i = 0; room && i < chunk; i++) seq[done + i] = gs_ts_push_locked(g, q, left[done + i]);
        gs_unlock(&g->mu);
        if (room) done += chunk;
        else gs_nap(100000);
    }
    gs_lock(&g->mu);
    g->launches += (uint64_t)kernels;
    gs_unlock(&g->mu);
    return q;
}

/* A ticket for the end of all work this process has submitted to `gpu` so far (0 when it has none). */
static uint64_t ts_all_submitted(int gpu) {
    gs_gpu_t *g = hw(gpu);
    uint64_t ticket = 0;
    gs_lock(&g->mu);
    for (int q = 0; q < GS_TSQ; q++) {
        gs_runq_t *r = &g->rq[q];
        if (r->gen && r->proc == gs_me && r->gen == gs_st->proc[gs_me].gen && r->next > r->head)
            ticket = gs_ticket(q, r->next - 1, 0);
    }
    gs_unlock(&g->mu);
    return ticket;
}

/* Time slicing: queues kernels of the given durations and marks (mark[i]: an event's mark of dur[i] ns) on
 * stream s; the tickets of each item's end go to `fin`.  Returns the ticket of the first item's start. */
static uint64_t submit_ts(sc_stream_t *s, const uint64_t *dur, int n, int kernels, uint64_t *fin) {
    uint64_t stack[64], *seq = n > 64 ? malloc(sizeof *seq * (size_t)n) : stack;
    if (!seq) return 0;
    sleep_until(s->not_before);
    int q = ts_push(s->gpu, dur, n, kernels, seq);
    for (int i = 0; fin && i < n; i++) fin[i] = gs_ticket(q, seq[i], 0);
    uint64_t first = gs_ticket(q, seq[0], 1), last = gs_ticket(q, seq[n - 1], 0);
    if (seq != stack) free(seq);
    __atomic_store_n(&s->done_at, last, __ATOMIC_RELEASE);
    return first;
}

/* Puts kernels of the given durations on the engine, back to back, after everything submitted before; returns
 * the time the first starts (with time slicing: a ticket for it). */
static uint64_t submit(sc_stream_t *s, const uint64_t *dur, int n) {
    uint32_t at = s->issued % s->depth;
    wait_for(s->gpu, s->ends[at]);   /* the queue of this stream is full until that launch is done */
    if (ts_on()) {
        uint64_t first = submit_ts(s, dur, n, n, NULL);
        s->ends[at] = __atomic_load_n(&s->done_at, __ATOMIC_ACQUIRE);
        s->issued++;
        return first;
    }
    gs_gpu_t *g = hw(s->gpu);
    int slot = gs_view[s->gpu].slot;
    gs_proc_t *me = &gs_st->proc[gs_me];
    gs_lock(&g->mu);
    uint64_t now = gs_clock(), t = g->tail > now ? g->tail : now;
    if (s->not_before > t) t = s->not_before;
    uint64_t start = t;
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
    return start;
}

/* when the engine of stream s reaches work submitted now */
static uint64_t engine_reach(const sc_stream_t *s) {
    uint64_t now = gs_clock(), tail = __atomic_load_n(&hw(s->gpu)->tail, __ATOMIC_ACQUIRE);
    uint64_t t = tail > now ? tail : now;
    return s->not_before > t ? s->not_before : t;
}

/* ------------------------------------------------------------------------------------------------ capture core */
static void cap_lock(void) { pthread_mutex_lock(&sc_cap_mu); }
static void cap_unlock(void) { pthread_mutex_unlock(&sc_cap_mu); }
static int any_capture(void) { return __atomic_load_n(&sc_ncaps, __ATOMIC_ACQUIRE) != 0; }

static void cap_invalidate(sc_capture_t *c) {
    if (c && !c->invalid) {
        c->invalid = 1;
        __atomic_add_fetch(&sc_invalidations, 1, __ATOMIC_RELAXED);
    }
}

static sc_capture_t *cap_by_id(uint64_t id) {
    for (sc_capture_t *c = sc_caps; c; c = c->next)
        if (c->id == id) return c;
    return NULL;
}

/* Caller holds sc_cap_mu.  Does a blocking stream of ctx capture (so that the legacy stream of ctx may not be
 * used)?  With `invalidate`, those captures are invalidated. */
static int legacy_conflict(sc_ctx_t *ctx, int invalidate) {
    int hit = 0;
    for (sc_capture_t *c = sc_caps; c; c = c->next)
        for (int i = 0; i < c->nstreams; i++) {
            sc_stream_t *s = c->streams[i];
            if (s->ctx != ctx || (s->flags & CU_STREAM_NON_BLOCKING)) continue;
            hit = 1;
            if (invalidate) cap_invalidate(c);
            break;
        }
    return hit;
}

/* Caller holds sc_cap_mu.  Is the calling thread prohibited from potentially unsafe calls?  Its own captures not
 * begun RELAXED prohibit them unless its mode is RELAXED; other threads' GLOBAL captures prohibit them when its mode
 * is GLOBAL.  The captures it conflicts with are invalidated. */
static int unsafe_conflict(void) {
    if (sc_tmode == CU_STREAM_CAPTURE_MODE_RELAXED) return 0;
    pthread_t me = pthread_self();
    int hit = 0;
    for (sc_capture_t *c = sc_caps; c; c = c->next) {
        int mine = pthread_equal(c->thread, me);
        if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
            (!mine && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL && sc_tmode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
            cap_invalidate(c);
            hit = 1;
        }
    }
    return hit;
}

/* a potentially unsafe call (synchronous allocation, a synchronizing query): may the calling thread make it? */
static CUresult unsafe_gate(void) {
    if (!any_capture()) return CUDA_SUCCESS;
    cap_lock();
    int hit = unsafe_conflict();
    cap_unlock();
    return hit ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

/* Where does work submitted to stream x go?  CUDA_SUCCESS: run it.  SC_CAPTURED: into x's capture, with sc_cap_mu
 * held (the caller adds its node, then cap_unlock()).  Anything else: the error to return. */
static CUresult enqueue_gate(sc_stream_t *x) {
    if (!any_capture()) return CUDA_SUCCESS;
    cap_lock();
    if (x->kind == SK_LEGACY && legacy_conflict(x->ctx, 1)) {
        cap_unlock();
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (x->cap) {
        if (!x->cap->invalid) return SC_CAPTURED;
        cap_unlock();
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    }
    cap_unlock();
    return CUDA_SUCCESS;
}

/* cuStreamSynchronize / cuStreamQuery of x */
static CUresult stream_sync_gate(sc_stream_t *x) {
    if (!any_capture()) return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    cap_lock();
    if (x->kind == SK_LEGACY && legacy_conflict(x->ctx, 1)) {
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (x->cap) {
        rc = x->cap->invalid ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        cap_invalidate(x->cap);
    } else if (unsafe_conflict()) {
        rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    cap_unlock();
    return rc;
}

/* cuEventQuery / cuEventSynchronize of ev: an event last recorded inside a capture is never queryable */
static CUresult event_gate(sc_event_t *ev) {
    uint64_t id = __atomic_load_n(&ev->cap_id, __ATOMIC_ACQUIRE);
    if (id) {
        cap_lock();
        cap_invalidate(cap_by_id(id));
        cap_unlock();
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    return unsafe_gate();
}

/* cuCtxSynchronize of ctx: a context with a capturing stream cannot be synchronized */
static CUresult ctx_sync_gate(sc_ctx_t *ctx) {
    if (!any_capture()) return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    cap_lock();
    for (sc_capture_t *c = sc_caps; c; c = c->next)
        for (int i = 0; i < c->nstreams; i++)
            if (c->streams[i]->ctx == ctx || c->streams[i]->ctx->parent == ctx) {
                cap_invalidate(c);
                rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
                break;
            }
    if (rc == CUDA_SUCCESS && unsafe_conflict()) rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    cap_unlock();
    return rc;
}

/* a synchronous call that enqueues to the legacy stream of the current context and waits (cuMemcpyHtoD ...) */
static CUresult legacy_sync_gate(void) {
    if (!any_capture()) return CUDA_SUCCESS;
    sc_ctx_t *c = current();
    CUresult rc = CUDA_SUCCESS;
    cap_lock();
    if (c && legacy_conflict(c, 1)) rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    else if (unsafe_conflict()) rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    cap_unlock();
    return rc;
}

/* ------------------------------------------------------------------------------------------------ graphs (core) */
static int grow(void **arr, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int n = *cap ? *cap * 2 : 8;
    while (n < need) n *= 2;
    void *p = realloc(*arr, (size_t)n * size);
    if (!p) return -1;
    *arr = p;
    *cap = n;
    return 0;
}

static sc_node_t *graph_add(sc_graph_t *g, int type, sc_node_t *const *deps, int ndeps) {
    sc_node_t *n = calloc(1, sizeof *n);
    if (!n || grow((void **)&g->node, &g->cap, g->count + 1, sizeof *g->node)) { free(n); return NULL; }
    n->type = type;
    n->graph = g;
    n->index = g->count;
    if (ndeps) {
        n->deps = malloc(sizeof *n->deps * (size_t)ndeps);
        if (!n->deps) { free(n); return NULL; }
        memcpy(n->deps, deps, sizeof *n->deps * (size_t)ndeps);
        n->ndeps = ndeps;
    }
    g->node[g->count++] = n;
    return n;
}

static void stream_set_deps(sc_stream_t *x, sc_node_t *const *deps, int n) {
    if (grow((void **)&x->deps, &x->capdeps, n, sizeof *x->deps)) return;
    if (n) memcpy(x->deps, deps, sizeof *deps * (size_t)n);
    x->ndeps = n;
}

static void stream_add_deps(sc_stream_t *x, sc_node_t *const *deps, int n) {
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int k = 0; k < x->ndeps && !seen; k++) seen = x->deps[k] == deps[i];
        if (seen || grow((void **)&x->deps, &x->capdeps, x->ndeps + 1, sizeof *x->deps)) continue;
        x->deps[x->ndeps++] = deps[i];
    }
}

/* Caller holds sc_cap_mu; x captures.  Adds a node after x's dependencies; x then depends on it. */
static sc_node_t *cap_add(sc_stream_t *x, int type) {
    sc_node_t *n = graph_add(x->cap->graph, type, x->deps, x->ndeps);
    if (n) stream_set_deps(x, &n, 1);
    return n;
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
#define VA32_END 0xffe00000ULL

/* Caller holds sc_mu.  A fresh address range of GPU gpu (low32: below 4 GiB, for the v1 API); 0 when none is left. */
static uint64_t take_va(int gpu, uint64_t bytes, int low32) {
    uint64_t span = (bytes / VA_STEP + (bytes % VA_STEP != 0)) * VA_STEP;
    if (!span) span = VA_STEP;
    uint64_t *next = low32 ? &sc_next_va32 : &sc_next_va[gpu];
    if (low32 && *next + span > VA32_END) return 0;
    uint64_t addr = *next;
    *next += span;
    return addr;
}

/* contexts that own allocations: a green context's allocations are its primary context's */
static sc_ctx_t *owner_of(sc_ctx_t *c) { return c && c->green ? c->parent : c; }

static CUresult new_buffer(int gpu, uint64_t n, uint64_t *out, sc_ctx_t *owner, int kind, int low32) {
    if (!out || !n) return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = page_round(n);
    CUresult rc = take_memory(gpu, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&sc_mu);
    uint64_t addr = take_va(gpu, bytes, low32);
    ot_node_t *rec = addr ? ot_add(&sc_objs, TAG_PTR, addr) : NULL;
    if (rec) {
        rec->gpu = gpu;
        rec->bytes = bytes;
        rec->asked = n;
        rec->aux = kind;
        rec->obj = owner;
    }
    pthread_mutex_unlock(&sc_mu);
    if (!rec) {
        give_memory(gpu, bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = addr;
    return CUDA_SUCCESS;
}

/* ---- exports: allocations other processes may map (gpusim.h gs_export_t) */
static uint64_t export_add(int gpu, uint64_t addr, uint64_t bytes) {
    uint64_t serial = 0;
    gs_lock(&gs_st->mu);
    for (int e = 0; e < GS_NEXPORT && !serial; e++) {
        gs_export_t *x = &gs_st->exports[e];
        if (x->serial) continue;
        x->serial = serial = ++gs_st->next_serial;
        x->proc = gs_me;
        x->gen = gs_st->proc[gs_me].gen;
        x->gpu = (uint32_t)gs_view[gpu].slot;
        x->addr = addr;
        x->bytes = bytes;
    }
    gs_unlock(&gs_st->mu);
    return serial;
}

static void export_drop(uint64_t serial) {
    if (!serial) return;
    gs_lock(&gs_st->mu);
    for (int e = 0; e < GS_NEXPORT; e++)
        if (gs_st->exports[e].serial == serial) gs_st->exports[e].serial = 0;
    gs_unlock(&gs_st->mu);
}

/* The live export `serial` (its exporter still running); 0 when there is none. */
static int export_find(uint64_t serial, gs_export_t *out) {
    int found = 0;
    if (!serial) return 0;
    gs_lock(&gs_st->mu);
    for (int e = 0; e < GS_NEXPORT && !found; e++) {
        gs_export_t *x = &gs_st->exports[e];
        if (x->serial != serial) continue;
        gs_proc_t *pr = &gs_st->proc[x->proc];
        if (pr->pid && pr->gen == x->gen && !gs_proc_gone(pr)) {
            *out = *x;
            found = 1;
        }
    }
    gs_unlock(&gs_st->mu);
    return found;
}

/* the CUDA ordinal of state GPU slot `slot` in this process, -1 when it does not see it */
static int gpu_of_slot(uint32_t slot) {
    for (int i = 0; i < gs_nview; i++)
        if ((uint32_t)gs_view[i].slot == slot) return i;
    return -1;
}

/* ---- the graph memory pool (graph allocations: memory alloc / free nodes) */
/* Caller holds sc_mu.  A graph allocation goes once nothing names it and it holds no memory. */
static void galloc_check(sc_galloc_t *ga) {
    if (ga->refs > 0 || ga->live) return;
    free(ot_remove(&sc_objs, TAG_GALLOC, ga->addr));
    free(ga);
}
static void galloc_put(sc_galloc_t *ga) {
    ga->refs--;
    galloc_check(ga);
}
/* Caller holds sc_mu.  A graph allocation stops holding memory. */
static void galloc_release(sc_galloc_t *ga) {
    if (!ga->live) return;
    ga->live = 0;
    sc_gpool[ga->gpu].used -= ga->bytes;
    galloc_check(ga);
}

static CUresult drop_buffer(uint64_t p) {
    if (!p) return CUDA_SUCCESS;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_remove(&sc_objs, TAG_PTR, p);
    if (rec) {
        pthread_mutex_unlock(&sc_mu);
        export_drop(rec->serial);
        give_memory(rec->gpu, rec->bytes);
        free(rec);
        return CUDA_SUCCESS;
    }
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if ((rec = ot_get(&sc_objs, TAG_GALLOC, p))) {
        sc_galloc_t *ga = rec->obj;
        if (ga->live && !ga->freed_in_owner) {   /* a graph that frees it owns its freeing */
            galloc_release(ga);
            rc = CUDA_SUCCESS;
        }
    } else if ((rec = ot_remove(&sc_objs, TAG_EXTMAP, p))) {
        free(rec);   /* a mapped buffer of external memory: the mapping goes, the memory stays with the object */
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&sc_mu);
    return rc;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    CALLED();
    CTX_GPU(g);
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    return new_buffer(g, n, (uint64_t *)p, owner_of(current()), BUF_ALLOC, 0);
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
    CALLED();
    UP();
    CUresult rc = unsafe_gate();
    return rc ? rc : drop_buffer(p);
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
    CALLED();
    (void)flags;
    CTX_GPU(g);
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    return new_buffer(g, n, (uint64_t *)p, owner_of(current()), BUF_MANAGED, 0);
}
static CUresult alloc_pitch(uint64_t *p, uint64_t *pitch, uint64_t width, uint64_t height, unsigned elem, int low32) {
    CTX_GPU(g);
    if (!pitch || !(elem == 4 || elem == 8 || elem == 16)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    uint64_t row = (width + 511) / 512 * 512;
    rc = new_buffer(g, row * height, p, owner_of(current()), BUF_ALLOC, low32);
    if (rc == CUDA_SUCCESS) *pitch = row;
    return rc;
}
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height, unsigned int elem) {
    CALLED();
    uint64_t addr = 0, row = 0;
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = alloc_pitch(&addr, &row, width, height, elem, 0);
    if (rc == CUDA_SUCCESS) { *p = addr; *pitch = row; }
    return rc;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CALLED();
    CTX_GPU(g);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t used = __atomic_load_n(&hw(g)->used, __ATOMIC_RELAXED);
    *total_bytes = gs_view[g].total;
    *free_bytes = used < gs_view[g].total ? gs_view[g].total - used : 0;
    return CUDA_SUCCESS;
}
API CUresult cuMemAllocHost_v2(void **pp, size_t n) {
    CALLED();
    UP();
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    *pp = malloc(n ? n : 1);
    return *pp ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
API CUresult cuMemFreeHost(void *p) {
    CALLED();
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    free(p);
    return CUDA_SUCCESS;
}
/* synchronous copies and sets: work on the legacy stream that the caller waits for */
API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
    CALLED();
    (void)dst; (void)src; (void)n;
    UP();
    return legacy_sync_gate();
}
API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
    CALLED();
    (void)src;
    UP();
    CUresult rc = legacy_sync_gate();
    if (rc == CUDA_SUCCESS && dst) memset(dst, 0, n);
    return rc;
}
API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
    CALLED();
    (void)dst; (void)v; (void)n;
    UP();
    return legacy_sync_gate();
}

/* ---- the v1 API (CUDA 2.x ABI): 32-bit device pointers and sizes */
API CUresult cuMemAlloc(sc_dptr32_t *p, unsigned int bytes) {
    CALLED();
    CTX_GPU(g);
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    uint64_t addr = 0;
    rc = new_buffer(g, bytes, &addr, owner_of(current()), BUF_ALLOC, 1);
    if (rc == CUDA_SUCCESS) *p = (sc_dptr32_t)addr;
    return rc;
}
API CUresult cuMemAllocPitch(sc_dptr32_t *p, unsigned int *pitch, unsigned int width, unsigned int height,
                             unsigned int elem) {
    CALLED();
    uint64_t addr = 0, row = 0;
    if (!p || !pitch) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = alloc_pitch(&addr, &row, width, height, elem, 1);
    if (rc == CUDA_SUCCESS) { *p = (sc_dptr32_t)addr; *pitch = (unsigned int)row; }
    return rc;
}
API CUresult cuMemFree(sc_dptr32_t p) {
    CALLED();
    UP();
    CUresult rc = unsafe_gate();
    return rc ? rc : drop_buffer(p);
}
API CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    CALLED();
    CTX_GPU(g);
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    uint64_t used = __atomic_load_n(&hw(g)->used, __ATOMIC_RELAXED);
    *total_bytes = u32_sat(gs_view[g].total);
    *free_bytes = u32_sat(used < gs_view[g].total ? gs_view[g].total - used : 0);
    return CUDA_SUCCESS;
}

/* ---- address ranges */
static int range_has(ot_node_t *n, void *arg) {
    uint64_t p = *(uint64_t *)arg;
    return p >= n->addr && p < n->addr + (n->asked ? n->asked : n->bytes);
}
static CUresult address_range(uint64_t *base, uint64_t *size, uint64_t p) {
    UP();
    static const int tags[] = {TAG_PTR, TAG_GALLOC, TAG_IPC, TAG_EXTMAP};
    ot_node_t *hit = NULL;
    pthread_mutex_lock(&sc_mu);
    for (size_t t = 0; t < sizeof tags / sizeof tags[0] && !hit; t++) {
        hit = ot_get(&sc_objs, tags[t], p);   /* a base address: no walk */
        if (!hit) hit = ot_each(&sc_objs, tags[t], range_has, &p);
    }
    if (hit) {
        if (base) *base = hit->addr;
        if (size) *size = hit->asked ? hit->asked : hit->bytes;
    }
    pthread_mutex_unlock(&sc_mu);
    return hit ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
    CALLED();
    uint64_t b = 0, n = 0;
    CUresult rc = address_range(&b, &n, p);
    if (rc == CUDA_SUCCESS) {
        if (base) *base = b;
        if (size) *size = n;
    }
    return rc;
}
API CUresult cuMemGetAddressRange(sc_dptr32_t *base, unsigned int *size, sc_dptr32_t p) {
    CALLED();
    uint64_t b = 0, n = 0;
    CUresult rc = address_range(&b, &n, p);
    if (rc == CUDA_SUCCESS) {
        if (base) *base = (sc_dptr32_t)b;
        if (size) *size = u32_sat(n);
    }
    return rc;
}

/* ---- stream-ordered allocation: pools hand memory to the GPU as it is allocated (no caching); inside a capture
 * cuMemAllocAsync / cuMemFreeAsync make memory alloc / free nodes (graph allocations) instead */
API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&sc_pools[dev];
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = (CUmemoryPool)&sc_pools[dev];
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CALLED();
    UP();
    if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
    GPU_OK(props->location.id);
    sc_pool_t *made = calloc(1, sizeof *made);
    if (!made) return CUDA_ERROR_OUT_OF_MEMORY;
    made->gpu = props->location.id;
    *pool = (CUmemoryPool)made;
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CALLED();
    sc_pool_t *x = (sc_pool_t *)pool;
    if (!x || (x >= sc_pools && x < sc_pools + GS_NDEV)) return CUDA_ERROR_INVALID_VALUE;
    free(x);
    return CUDA_SUCCESS;
}
API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { CALLED(); (void)pool; (void)keep; return 0; }
API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    CALLED();
    (void)pool; (void)a; (void)v;
    return 0;
}
API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute a, void *v) {
    CALLED();
    (void)pool; (void)a;
    if (v) *(cuuint64_t *)v = 0;
    return 0;
}

/* Caller holds sc_cap_mu; x captures.  A memory alloc node of `bytes` on GPU gpu: an address, no memory yet. */
static CUresult galloc_node(sc_stream_t *x, int gpu, uint64_t bytes, uint64_t *out) {
    sc_galloc_t *ga = calloc(1, sizeof *ga);
    if (!ga) return CUDA_ERROR_OUT_OF_MEMORY;
    ga->bytes = page_round(bytes);
    ga->gpu = gpu;
    ga->refs = 1;
    ga->owner = x->cap->graph;
    pthread_mutex_lock(&sc_mu);
    ga->addr = take_va(gpu, ga->bytes, 0);
    ot_node_t *rec = ot_add(&sc_objs, TAG_GALLOC, ga->addr);
    if (rec) { rec->obj = ga; rec->gpu = gpu; rec->bytes = ga->bytes; rec->asked = bytes; }
    pthread_mutex_unlock(&sc_mu);
    sc_node_t *n = rec ? cap_add(x, SN_MEM_ALLOC) : NULL;
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->alloc = ga;
    n->alloc_params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    n->alloc_params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    n->alloc_params.poolProps.location.id = gpu;
    n->alloc_params.bytesize = bytes;
    n->alloc_params.dptr = ga->addr;
    *out = ga->addr;
    return CUDA_SUCCESS;
}

/* May graph g free graph allocation ga (one free per allocation, in its own graph or in one other)? */
static int galloc_freeable(sc_galloc_t *ga, sc_graph_t *g) {
    if (ga->freed_in_owner) return 0;
    return ga->owner == g ? !ga->freed_elsewhere : 1;
}

/* Caller holds sc_cap_mu; x captures.  A memory free node; the address must be a graph allocation. */
static CUresult gfree_node(sc_stream_t *x, uint64_t p) {
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_get(&sc_objs, TAG_GALLOC, p);
    sc_galloc_t *ga = rec ? rec->obj : NULL;
    int ok = ga && galloc_freeable(ga, x->cap->graph);
    if (ok && ga->owner == x->cap->graph) ga->freed_in_owner = 1;
    else if (ok) ga->freed_elsewhere = 1;
    if (ok) ga->refs++;
    pthread_mutex_unlock(&sc_mu);
    if (!ok) {
        cap_invalidate(x->cap);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sc_node_t *n = cap_add(x, SN_MEM_FREE);
    if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
    n->alloc = ga;
    return CUDA_SUCCESS;
}

static CUresult alloc_async(CUdeviceptr *p, size_t n, int pool_gpu, CUstream hs, int pt) {
    UP();
    sc_stream_t *x = stream_of(hs, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!p || !n) return CUDA_ERROR_INVALID_VALUE;
    int gpu = pool_gpu >= 0 ? pool_gpu : x->gpu;
    CUresult rc = enqueue_gate(x);
    if (rc == SC_CAPTURED) {
        uint64_t addr = 0;
        rc = galloc_node(x, gpu, n, &addr);
        cap_unlock();
        if (rc == CUDA_SUCCESS) *p = addr;
        return rc;
    }
    if (rc) return rc;
    return new_buffer(gpu, n, (uint64_t *)p, NULL, BUF_ASYNC, 0);
}
static CUresult free_async(CUdeviceptr p, CUstream hs, int pt) {
    UP();
    sc_stream_t *x = stream_of(hs, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = enqueue_gate(x);
    if (rc == SC_CAPTURED) {
        rc = gfree_node(x, p);
        cap_unlock();
        return rc;
    }
    return rc ? rc : drop_buffer(p);
}
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    CALLED();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, n, ((sc_pool_t *)pool)->gpu, s, 0);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    CALLED();
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    return alloc_async(p, n, ((sc_pool_t *)pool)->gpu, s, 1);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { CALLED(); return alloc_async(p, n, -1, s, 0); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) {
    CALLED();
    return alloc_async(p, n, -1, s, 1);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { CALLED(); return free_async(p, s, 0); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { CALLED(); return free_async(p, s, 1); }

/* ---- virtual memory management: physical memory lives while its handle, a retain or a mapping refers to it */
#define VMM_PAGE (2ULL << 20)
API CUresult cuMemGetAllocationGranularity(size_t *gran, const CUmemAllocationProp *prop,
                                           CUmemAllocationGranularity_flags opt) {
    CALLED();
    (void)prop; (void)opt;
    UP();
    if (!gran) return CUDA_ERROR_INVALID_VALUE;
    *gran = VMM_PAGE;
    return CUDA_SUCCESS;
}
API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    CALLED();
    (void)flags;
    UP();
    if (!handle || !prop || !size || size % VMM_PAGE) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_NOT_SUPPORTED;
    GPU_OK(prop->location.id);
    CUresult rc = take_memory(prop->location.id, size);
    if (rc != CUDA_SUCCESS) return rc;
    sc_phys_t *ph = calloc(1, sizeof *ph);
    if (!ph) { give_memory(prop->location.id, size); return CUDA_ERROR_OUT_OF_MEMORY; }
    ph->gpu = prop->location.id;
    ph->bytes = size;
    ph->refs = 1;
    ph->handle_types = (uint64_t)prop->requestedHandleTypes;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}
static void phys_put(sc_phys_t *ph) {
    if (__atomic_sub_fetch(&ph->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    if (!ph->imported) {
        give_memory(ph->gpu, ph->bytes);
        if (ph->serial) {
            export_drop(ph->serial);
            pthread_mutex_lock(&sc_mu);
            free(ot_remove(&sc_objs, TAG_PHYS_SERIAL, ph->serial));
            pthread_mutex_unlock(&sc_mu);
        }
    }
    free(ph);
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CALLED();
    UP();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    phys_put((sc_phys_t *)(uintptr_t)handle);
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr, unsigned long long f) {
    CALLED();
    (void)align; (void)addr; (void)f;
    UP();
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    *p = (CUdeviceptr)sc_next_va[GS_NDEV - 1];
    sc_next_va[GS_NDEV - 1] += (size / VMM_PAGE + (size % VMM_PAGE != 0)) * VMM_PAGE;
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { CALLED(); (void)p; (void)size; return CUDA_SUCCESS; }
API CUresult cuMemMap(CUdeviceptr p, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags) {
    CALLED();
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
    CALLED();
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
    CALLED();
    (void)p; (void)size; (void)desc; (void)count;
    return CUDA_SUCCESS;
}
API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    CALLED();
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

/* ---- shareable handles (POSIX file descriptors): a memfd that names the export */
typedef struct { char magic[8]; uint64_t serial, bytes; } sc_wire_t;
static const char SC_VMM_MAGIC[8] = {'S', 'G', 'V', 'M', 'M', '0', '0', '1'};
static const char SC_IPC_MAGIC[8] = {'S', 'G', 'I', 'P', 'C', '0', '0', '1'};

API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle,
                                          CUmemAllocationHandleType type, unsigned long long flags) {
    CALLED();
    UP();
    sc_phys_t *ph = (sc_phys_t *)(uintptr_t)handle;
    if (!out || !ph || flags) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    if (!(ph->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) return CUDA_ERROR_INVALID_VALUE;
    if (!ph->serial) {
        ph->serial = export_add(ph->gpu, 0, ph->bytes);
        if (!ph->serial) return CUDA_ERROR_OUT_OF_MEMORY;
        pthread_mutex_lock(&sc_mu);
        ot_node_t *rec = ot_add(&sc_objs, TAG_PHYS_SERIAL, ph->serial);
        if (rec) rec->obj = ph;
        pthread_mutex_unlock(&sc_mu);
    }
    int fd = memfd_create("simgpu-shareable", MFD_CLOEXEC);
    sc_wire_t w;
    memset(&w, 0, sizeof w);
    memcpy(w.magic, SC_VMM_MAGIC, sizeof w.magic);
    w.serial = ph->serial;
    w.bytes = ph->bytes;
    if (fd < 0 || pwrite(fd, &w, sizeof w, 0) != (ssize_t)sizeof w) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

/* the export a simulator file descriptor names (0 when it names none) */
static uint64_t fd_export(int fd, gs_export_t *x) {
    sc_wire_t w;
    if (fd < 0 || pread(fd, &w, sizeof w, 0) != (ssize_t)sizeof w || memcmp(w.magic, SC_VMM_MAGIC, sizeof w.magic))
        return 0;
    return export_find(w.serial, x) ? w.serial : 0;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                            CUmemAllocationHandleType type) {
    CALLED();
    UP();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    gs_export_t x;
    uint64_t serial = fd_export((int)(intptr_t)os_handle, &x);
    if (!serial) return CUDA_ERROR_INVALID_VALUE;
    if (x.proc == gs_me && x.gen == gs_st->proc[gs_me].gen) {   /* our own allocation: another reference */
        pthread_mutex_lock(&sc_mu);
        ot_node_t *rec = ot_get(&sc_objs, TAG_PHYS_SERIAL, serial);
        sc_phys_t *ph = rec ? rec->obj : NULL;
        if (ph) __atomic_add_fetch(&ph->refs, 1, __ATOMIC_ACQ_REL);
        pthread_mutex_unlock(&sc_mu);
        if (!ph) return CUDA_ERROR_INVALID_VALUE;
        *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
        return CUDA_SUCCESS;
    }
    int gpu = gpu_of_slot(x.gpu);
    if (gpu < 0) return CUDA_ERROR_INVALID_DEVICE;
    sc_phys_t *ph = calloc(1, sizeof *ph);
    if (!ph) return CUDA_ERROR_OUT_OF_MEMORY;
    ph->gpu = gpu;
    ph->bytes = x.bytes;
    ph->refs = 1;
    ph->imported = 1;
    ph->serial = serial;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)ph;
    return CUDA_SUCCESS;
}

/* ---- legacy IPC: another process of the node maps a cuMemAlloc buffer; no new device memory */
API CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr p) {
    CALLED();
    UP();
    if (!handle) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_get(&sc_objs, TAG_PTR, p);
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    if (rec && rec->aux == BUF_ALLOC) {
        if (!rec->serial) rec->serial = export_add(rec->gpu, rec->addr, rec->asked);
        if (rec->serial) {
            sc_wire_t w;
            memset(handle, 0, sizeof *handle);
            memset(&w, 0, sizeof w);
            memcpy(w.magic, SC_IPC_MAGIC, sizeof w.magic);
            w.serial = rec->serial;
            w.bytes = rec->asked;
            memcpy(handle->reserved, &w, sizeof w);
            rc = CUDA_SUCCESS;
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sc_mu);
    return rc;
}

static CUresult ipc_open(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    CTX_GPU(cur);
    (void)cur;
    if (!p || flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) return CUDA_ERROR_INVALID_VALUE;
    sc_wire_t w;
    memcpy(&w, handle.reserved, sizeof w);
    gs_export_t x;
    if (memcmp(w.magic, SC_IPC_MAGIC, sizeof w.magic) || !export_find(w.serial, &x)) return CUDA_ERROR_INVALID_VALUE;
    if (x.proc == gs_me && x.gen == gs_st->proc[gs_me].gen) return CUDA_ERROR_INVALID_CONTEXT;   /* our own */
    int gpu = gpu_of_slot(x.gpu);
    if (gpu < 0) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *by_serial = ot_get(&sc_objs, TAG_IPC_SERIAL, w.serial);
    if (by_serial) {   /* opened before: one more reference, the same address */
        ot_node_t *map = by_serial->obj;
        map->aux++;
        *p = map->addr;
    } else {
        uint64_t addr = take_va(gpu, x.bytes, 0);
        ot_node_t *map = ot_add(&sc_objs, TAG_IPC, addr);
        by_serial = map ? ot_add(&sc_objs, TAG_IPC_SERIAL, w.serial) : NULL;
        if (map && by_serial) {
            map->gpu = gpu;
            map->bytes = map->asked = x.bytes;
            map->serial = w.serial;
            map->aux = 1;
            by_serial->obj = map;
            *p = addr;
        } else {
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&sc_mu);
    return rc;
}
API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    CALLED();
    return ipc_open(p, handle, flags);
}
API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle handle, unsigned int flags) {
    CALLED();
    return ipc_open(p, handle, flags);
}
API CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    CALLED();
    UP();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *map = ot_get(&sc_objs, TAG_IPC, p);
    if (map) {
        rc = CUDA_SUCCESS;
        if (--map->aux == 0) {
            free(ot_remove(&sc_objs, TAG_IPC_SERIAL, map->serial));
            free(ot_remove(&sc_objs, TAG_IPC, p));
        }
    }
    pthread_mutex_unlock(&sc_mu);
    return rc;
}

/* ---- external memory (memory another API allocated, e.g. Vulkan, handed over as an opaque fd).  The simulator
 * has no other API, so an imported object stands for memory on the GPU the importing process holds: its size is
 * taken from the GPU at import and given back when it is destroyed.  A file descriptor this simulator exported
 * (cuMemExportToShareableHandle) maps that allocation instead, which is already on the GPU: no new memory. */
API CUresult cuImportExternalMemory(CUexternalMemory *out, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc) {
    CALLED();
    CTX_GPU(g);
    if (!out || !desc || !desc->size) return CUDA_ERROR_INVALID_VALUE;
    if (desc->type != CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD) return CUDA_ERROR_NOT_SUPPORTED;
    int fd = desc->handle.fd;
    if (fd < 0 || fcntl(fd, F_GETFD) < 0) return CUDA_ERROR_INVALID_VALUE;
    sc_extmem_t *ext = calloc(1, sizeof *ext);
    if (!ext) return CUDA_ERROR_OUT_OF_MEMORY;
    gs_export_t x;
    if (fd_export(fd, &x)) {
        int gpu = gpu_of_slot(x.gpu);
        if (gpu < 0) { free(ext); return CUDA_ERROR_INVALID_DEVICE; }
        ext->gpu = gpu;
        ext->bytes = desc->size;
    } else {
        ext->gpu = g;
        ext->bytes = page_round(desc->size);
        CUresult rc = take_memory(g, ext->bytes);
        if (rc != CUDA_SUCCESS) { free(ext); return rc; }
        ext->counted = 1;
    }
    close(fd);   /* the driver owns the descriptor after a successful import */
    *out = (CUexternalMemory)ext;
    return CUDA_SUCCESS;
}
API CUresult cuExternalMemoryGetMappedBuffer(CUdeviceptr *p, CUexternalMemory extmem,
                                             const CUDA_EXTERNAL_MEMORY_BUFFER_DESC *desc) {
    CALLED();
    UP();
    sc_extmem_t *ext = (sc_extmem_t *)extmem;
    if (!p || !ext || !desc || desc->flags || !desc->size || desc->offset + desc->size > ext->bytes)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    uint64_t addr = take_va(ext->gpu, desc->size, 0);
    ot_node_t *rec = ot_add(&sc_objs, TAG_EXTMAP, addr);
    if (rec) { rec->gpu = ext->gpu; rec->bytes = rec->asked = desc->size; rec->obj = ext; }
    pthread_mutex_unlock(&sc_mu);
    if (!rec) return CUDA_ERROR_OUT_OF_MEMORY;
    *p = addr;
    return CUDA_SUCCESS;
}
API CUresult cuDestroyExternalMemory(CUexternalMemory extmem) {
    CALLED();
    UP();
    sc_extmem_t *ext = (sc_extmem_t *)extmem;
    if (!ext) return CUDA_ERROR_INVALID_HANDLE;
    if (ext->counted) give_memory(ext->gpu, ext->bytes);
    free(ext);
    return CUDA_SUCCESS;
}

/* ---- arrays: rows are laid out in 512-byte units */
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
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    rc = take_memory(gpu, bytes);
    if (rc != CUDA_SUCCESS) return rc;
    sc_array_t *a = calloc(1, sizeof *a);
    if (!a) { give_memory(gpu, bytes); return CUDA_ERROR_OUT_OF_MEMORY; }
    a->gpu = gpu;
    a->bytes = bytes;
    a->ctx = owner_of(current());
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_add(&sc_objs, TAG_ARRAY, (uint64_t)(uintptr_t)a);
    if (rec) rec->obj = a;
    pthread_mutex_unlock(&sc_mu);
    *out = a;
    return CUDA_SUCCESS;
}
API CUresult cuArrayCreate_v2(CUarray *arr, const CUDA_ARRAY_DESCRIPTOR *desc) {
    CALLED();
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), (void **)arr);
}
API CUresult cuArray3DCreate_v2(CUarray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CALLED();
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
                     (void **)arr);
}
API CUresult cuArrayCreate(CUarray *arr, const sc_array_desc_v1_t *desc) {
    CALLED();
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), (void **)arr);
}
API CUresult cuArray3DCreate(CUarray *arr, const sc_array3d_desc_v1_t *desc) {
    CALLED();
    CTX_GPU(g);
    if (!desc) return CUDA_ERROR_INVALID_VALUE;
    return new_array(g, layout_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels),
                     (void **)arr);
}
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *arr, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels) {
    CALLED();
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
    CUresult rc = unsafe_gate();
    if (rc) return rc;
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_remove(&sc_objs, TAG_ARRAY, (uint64_t)(uintptr_t)a);
    pthread_mutex_unlock(&sc_mu);
    if (!rec) return CUDA_ERROR_INVALID_VALUE;
    free(rec);
    give_memory(a->gpu, a->bytes);
    free(a);
    return CUDA_SUCCESS;
}
API CUresult cuArrayDestroy(CUarray arr) { CALLED(); UP(); return drop_array(arr); }
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray arr) { CALLED(); UP(); return drop_array(arr); }
static CUresult array_requirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, void *arr) {
    if (!req || !arr) return CUDA_ERROR_INVALID_VALUE;
    memset(req, 0, sizeof *req);
    req->size = ((sc_array_t *)arr)->bytes;
    req->alignment = 512;
    return CUDA_SUCCESS;
}
API CUresult cuArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUarray arr, CUdevice dev) {
    CALLED();
    (void)dev;
    return array_requirements(req, arr);
}
API CUresult cuMipmappedArrayGetMemoryRequirements(CUDA_ARRAY_MEMORY_REQUIREMENTS *req, CUmipmappedArray arr,
                                                   CUdevice dev) {
    CALLED();
    (void)dev;
    return array_requirements(req, arr);
}

/* ------------------------------------------------------------------------------------------------ contexts */
/* ---- events die with their context */
static inline int event_dead(const sc_event_t *ev) { return __atomic_load_n(&ev->dead, __ATOMIC_ACQUIRE); }

/* When the engine reached the event's last record (GS_NEVER: not yet); a ticket, once known, is kept as a time. */
static uint64_t event_time(sc_event_t *ev) {
    uint64_t v = __atomic_load_n(&ev->at, __ATOMIC_ACQUIRE);
    if (!(v & GS_TICKET)) return v;
    uint64_t t = when(ev->gpu, v);
    if (t != GS_NEVER) __atomic_compare_exchange_n(&ev->at, &v, t, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return t;
}

/* A call used an event whose context was destroyed: counted (simgpu_dead_event_uses) and refused with `rc`. */
static CUresult dead_event_use(CUresult rc) {
    __atomic_add_fetch(&sc_dead_event_uses, 1, __ATOMIC_RELAXED);
    return rc;
}

/* Context `home` (or, with `only`, the green context `only` whose events home keeps) is destroyed: its events die
 * and leave its list; returned chained through `next`, for events_bury.  Takes sc_ev_mu only, so a caller may hold
 * sc_mu (lock order sc_mu -> sc_ev_mu; sc_cap_mu is never held with sc_ev_mu). */
static sc_event_t *events_die(sc_ctx_t *home, const sc_ctx_t *only) {
    sc_event_t *dead = NULL;
    pthread_mutex_lock(&sc_ev_mu);
    for (sc_event_t *ev = home->events, *next; ev; ev = next) {
        next = ev->next;
        if (only && ev->ctx != only) continue;
        if (ev->prev) ev->prev->next = ev->next;
        else home->events = ev->next;
        if (ev->next) ev->next->prev = ev->prev;
        ev->prev = NULL;
        ev->ctx = ev->home = NULL;
        __atomic_store_n(&ev->dead, 1, __ATOMIC_RELEASE);
        ev->next = dead;
        dead = ev;
    }
    pthread_mutex_unlock(&sc_ev_mu);
    return dead;
}
/* The dead events' capture dependencies go; their records stay (see sc_event_t).  Takes sc_cap_mu. */
static void events_bury(sc_event_t *dead) {
    if (!dead) return;
    cap_lock();
    for (sc_event_t *ev = dead, *next; ev; ev = next) {
        next = ev->next;
        ev->next = NULL;
        free(ev->deps);
        ev->deps = NULL;
        ev->ndeps = 0;
    }
    cap_unlock();
}

static CUresult ctx_take(sc_ctx_t *c) {
    if (!sc_ctx_bytes) return CUDA_SUCCESS;
    CUresult rc = take_memory(c->gpu, sc_ctx_bytes);
    if (rc == CUDA_SUCCESS) c->overhead = sc_ctx_bytes;
    return rc;
}

/* Frees the buffers (cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged) and arrays context c owns, as cuCtxDestroy
 * and cuDevicePrimaryCtxReset do.  Stream-ordered, VMM and graph allocations belong to no context. */
typedef struct { sc_ctx_t *owner; ot_node_t *out; } sc_sweep_t;
static int sweep_one(ot_node_t *n, void *arg) {
    sc_sweep_t *sw = arg;
    void *owner = n->tag == TAG_ARRAY ? (void *)((sc_array_t *)n->obj)->ctx : n->obj;
    if (owner != (void *)sw->owner) return 0;
    ot_remove(&sc_objs, n->tag, n->addr);
    n->next = sw->out;
    sw->out = n;
    return 0;
}
static void release_owned(sc_ctx_t *c) {
    sc_sweep_t sw = {c, NULL};
    pthread_mutex_lock(&sc_mu);
    ot_each(&sc_objs, TAG_PTR, sweep_one, &sw);
    ot_each(&sc_objs, TAG_ARRAY, sweep_one, &sw);
    pthread_mutex_unlock(&sc_mu);
    for (ot_node_t *n = sw.out, *next; n; n = next) {
        next = n->next;
        if (n->tag == TAG_ARRAY) {
            sc_array_t *a = n->obj;
            give_memory(a->gpu, a->bytes);
            free(a);
        } else {
            export_drop(n->serial);
            give_memory(n->gpu, n->bytes);
        }
        free(n);
    }
}

static CUresult primary_retain(CUcontext *pctx, CUdevice dev) {
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
static CUresult primary_release(CUdevice dev) {
    UP();
    GPU_OK(dev);
    pthread_mutex_lock(&sc_mu);
    sc_ctx_t *c = &sc_primary[dev];
    sc_event_t *dead = NULL;
    if (c->retained > 0 && --c->retained == 0) {   /* "automatically reset once the last reference ... is released" */
        dead = events_die(c, NULL);   /* under sc_mu: a retain racing this release starts with no old events */
        if (c->overhead) give_memory(dev, c->overhead);
        c->overhead = 0;
    }
    pthread_mutex_unlock(&sc_mu);
    events_bury(dead);
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { CALLED(); return primary_retain(pctx, dev); }
API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { CALLED(); return primary_release(dev); }
API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { CALLED(); return primary_release(dev); }
API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (flags) *flags = 0;
    if (active) *active = sc_primary[dev].retained > 0;
    return CUDA_SUCCESS;
}
/* "Destroy all allocations and reset all state on the primary context": its (and its green contexts')
 * allocations are freed; it stays retained */
static CUresult primary_reset(CUdevice dev) {
    UP();
    GPU_OK(dev);
    release_owned(&sc_primary[dev]);
    events_bury(events_die(&sc_primary[dev], NULL));   /* its green contexts' events too: the primary keeps them */
    return CUDA_SUCCESS;
}
API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) { CALLED(); return primary_reset(dev); }
API CUresult cuDevicePrimaryCtxReset(CUdevice dev) { CALLED(); return primary_reset(dev); }

/* Destroyed contexts' memory, handed to the next cuCtxCreate (newest first): a new context takes a destroyed one's
 * handle, as drivers reuse handles, so a stale handle or a resource of the old context meets a live context.  A spare
 * stays readable (its legacy stream's buffer too) until reused: a thread it is still current to touches no freed
 * memory.  Chained through `parent` (unused in a context not made from a green one). */
static sc_ctx_t *sc_ctx_spare;

static CUresult ctx_make(CUcontext *pctx, CUdevice dev) {
    UP();
    GPU_OK(dev);
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sc_mu);
    sc_ctx_t *c = sc_ctx_spare;
    if (c) sc_ctx_spare = c->parent;
    pthread_mutex_unlock(&sc_mu);
    if (c) {
        events_bury(events_die(c, NULL));   /* any a thread it stayed current to made after its destruction */
        free(c->null_stream.ends);
        memset(c, 0, sizeof *c);
    } else if (!(c = calloc(1, sizeof *c))) return CUDA_ERROR_OUT_OF_MEMORY;
    c->gpu = dev;
    c->retained = 1;
    CUresult rc = ctx_take(c);
    if (rc != CUDA_SUCCESS) { free(c); return rc; }
    stream_setup(&c->null_stream, dev, c, SK_LEGACY, 0);
    if (sc_ncur < 16) sc_cur[sc_ncur++] = c;
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}
API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CALLED();
    (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CALLED();
    (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    CALLED();
    (void)p; (void)n; (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    CALLED();
    (void)p; (void)flags;
    return ctx_make(pctx, dev);
}
API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CALLED();
    UP();
    sc_ctx_t *c = (sc_ctx_t *)ctx;
    if (!c || c->primary || c->green || !c->retained) return CUDA_ERROR_INVALID_CONTEXT;   /* !retained: a spare */
    int keep = 0;
    for (int i = 0; i < sc_ncur; i++)
        if (sc_cur[i] != c) sc_cur[keep++] = sc_cur[i];
    sc_ncur = keep;
    keep = 0;
    for (int i = 0; i < sc_npts; i++)
        if (sc_pts[i].ctx != c) sc_pts[keep++] = sc_pts[i];
    sc_npts = keep;
    release_owned(c);
    events_bury(events_die(c, NULL));
    if (c->overhead) give_memory(c->gpu, c->overhead);
    c->overhead = 0;
    c->retained = 0;
    pthread_mutex_lock(&sc_mu);
    c->parent = sc_ctx_spare;   /* kept for the next context (see sc_ctx_spare) */
    sc_ctx_spare = c;
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuCtxSetCurrent(CUcontext ctx) {
    CALLED();
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
    CALLED();
    UP();
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = (CUcontext)current();
    return CUDA_SUCCESS;
}
API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CALLED();
    UP();
    if (!ctx || sc_ncur >= 16) return CUDA_ERROR_INVALID_VALUE;
    sc_cur[sc_ncur++] = (sc_ctx_t *)ctx;
    return CUDA_SUCCESS;
}
API CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
    CALLED();
    UP();
    if (!sc_ncur) return CUDA_ERROR_INVALID_CONTEXT;
    sc_ncur--;
    if (ctx) *ctx = (CUcontext)sc_cur[sc_ncur];
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *dev) {
    CALLED();
    CTX_GPU(g);
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    *dev = g;
    return CUDA_SUCCESS;
}
API CUresult cuCtxSynchronize(void) {
    CALLED();
    CTX_GPU(g);
    CUresult rc = ctx_sync_gate(current());
    if (rc) return rc;
    if (ts_on()) wait_for(g, ts_all_submitted(g));
    else sleep_until(__atomic_load_n(&hw(g)->tail, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ green contexts */
/* CUdevResource keeps, in its _internal_padding, which device and which split it came from */
typedef struct { uint32_t magic; int32_t dev; uint64_t split; } sc_res_tag_t;
#define SC_RES_MAGIC 0x53475245u
static uint64_t sc_next_split;

static void sm_resource(CUdevResource *r, int dev, unsigned sms, uint64_t split) {
    sc_res_tag_t tag = {SC_RES_MAGIC, dev, split};
    memset(r, 0, sizeof *r);
    r->type = CU_DEV_RESOURCE_TYPE_SM;
    memcpy(r->_internal_padding, &tag, sizeof tag);
    r->sm.smCount = sms;
    r->sm.minSmPartitionSize = 4;      /* compute capability 8.x: at least 4 SMs ... */
    r->sm.smCoscheduledAlignment = 2;  /* ... in multiples of 2 */
}
static int res_tag(const CUdevResource *r, sc_res_tag_t *tag) {
    memcpy(tag, r->_internal_padding, sizeof *tag);
    return tag->magic == SC_RES_MAGIC && tag->dev >= 0 && tag->dev < gs_nview ? 0 : -1;
}

API CUresult cuDeviceGetDevResource(CUdevice dev, CUdevResource *res, CUdevResourceType type) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!res) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(res, dev, (unsigned)gs_view[dev].sms, 0);
    return CUDA_SUCCESS;
}

API CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nb_groups, const CUdevResource *input,
                                         CUdevResource *remaining, unsigned int flags, unsigned int min_count) {
    CALLED();
    UP();
    sc_res_tag_t tag;
    if (!nb_groups || !input || (flags & ~3u)) return CUDA_ERROR_INVALID_VALUE;
    if (input->type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    if (res_tag(input, &tag)) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
    unsigned total = input->sm.smCount;
    if (min_count > total) return CUDA_ERROR_INVALID_VALUE;
    int fine = (flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) != 0;
    unsigned least = fine ? 1 : 4, align = fine ? 1 : 2;
    unsigned size = min_count < least ? least : min_count;
    size = (size + align - 1) / align * align;
    unsigned groups = size && size <= total ? total / size : 0;
    if (result && *nb_groups < groups) groups = *nb_groups;
    uint64_t split = ++sc_next_split;
    if (result)
        for (unsigned i = 0; i < groups; i++) sm_resource(&result[i], tag.dev, size, split);
    if (remaining) sm_resource(remaining, tag.dev, total - groups * size, split);
    *nb_groups = groups;
    return CUDA_SUCCESS;
}

API CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *desc, CUdevResource *res, unsigned int n) {
    CALLED();
    UP();
    if (!desc || !res || !n) return CUDA_ERROR_INVALID_VALUE;
    sc_res_tag_t first = {0, 0, 0}, tag;
    unsigned sms = 0;
    for (unsigned i = 0; i < n; i++) {
        if (res[i].type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
        if (res_tag(&res[i], &tag)) return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
        if (i == 0) first = tag;
        else if (tag.dev != first.dev || tag.split != first.split || !tag.split)
            return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;   /* one device, one split */
        sms += res[i].sm.smCount;
    }
    sc_desc_t *d = calloc(1, sizeof *d);
    if (!d) return CUDA_ERROR_OUT_OF_MEMORY;
    d->gpu = first.dev;
    d->sms = sms;
    *desc = (CUdevResourceDesc)d;
    return CUDA_SUCCESS;
}

API CUresult cuGreenCtxCreate(CUgreenCtx *out, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
    CALLED();
    UP();
    GPU_OK(dev);
    sc_desc_t *d = (sc_desc_t *)desc;
    if (!out || !d || d->gpu != dev || !(flags & CU_GREEN_CTX_DEFAULT_STREAM)) return CUDA_ERROR_INVALID_VALUE;
    CUcontext primary;
    CUresult rc = primary_retain(&primary, dev);   /* "This API will retain the primary context on device dev" */
    if (rc != CUDA_SUCCESS) return rc;
    sc_green_t *g = calloc(1, sizeof *g);
    if (!g) { primary_release(dev); return CUDA_ERROR_OUT_OF_MEMORY; }
    g->gpu = dev;
    g->sms = d->sms;
    g->ctx.gpu = dev;
    g->ctx.green = 1;
    g->ctx.parent = &sc_primary[dev];
    g->ctx.retained = 1;
    stream_setup(&g->ctx.null_stream, dev, &g->ctx, SK_LEGACY, 0);
    *out = (CUgreenCtx)g;
    return CUDA_SUCCESS;
}
API CUresult cuGreenCtxDestroy(CUgreenCtx green) {
    CALLED();
    UP();
    sc_green_t *g = (sc_green_t *)green;
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    int keep = 0;
    for (int i = 0; i < sc_ncur; i++)
        if (sc_cur[i] != &g->ctx) sc_cur[keep++] = sc_cur[i];
    sc_ncur = keep;
    keep = 0;
    for (int i = 0; i < sc_npts; i++)
        if (sc_pts[i].ctx != &g->ctx) sc_pts[keep++] = sc_pts[i];
    sc_npts = keep;
    events_bury(events_die(&sc_primary[g->gpu], &g->ctx));
    primary_release(g->gpu);
    free(g->ctx.null_stream.ends);
    free(g);
    return CUDA_SUCCESS;
}
API CUresult cuCtxFromGreenCtx(CUcontext *pctx, CUgreenCtx green) {
    CALLED();
    UP();
    if (!pctx || !green) return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)&((sc_green_t *)green)->ctx;
    return CUDA_SUCCESS;
}
API CUresult cuGreenCtxGetDevResource(CUgreenCtx green, CUdevResource *res, CUdevResourceType type) {
    CALLED();
    UP();
    sc_green_t *g = (sc_green_t *)green;
    if (!g || !res) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_DEV_RESOURCE_TYPE_SM) return CUDA_ERROR_INVALID_RESOURCE_TYPE;
    sm_resource(res, g->gpu, g->sms, 0);
    return CUDA_SUCCESS;
}
API CUresult cuGreenCtxStreamCreate(CUstream *s, CUgreenCtx green, unsigned int flags, int priority) {
    CALLED();
    (void)priority;
    UP();
    sc_green_t *g = (sc_green_t *)green;
    if (!s || !g || !(flags & CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    sc_stream_t *x = malloc(sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    stream_setup(x, g->gpu, &g->ctx, SK_USER, flags);
    *s = (CUstream)x;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ streams, events */
static void cap_detach(sc_capture_t *c, sc_stream_t *x);
static void cap_finish(sc_capture_t *c);

static CUresult stream_create(CUstream *s, unsigned int flags) {
    CTX_GPU(g);
    if (!s || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    sc_stream_t *x = malloc(sizeof *x);
    if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
    stream_setup(x, g, current(), SK_USER, flags);
    *s = (CUstream)x;
    return CUDA_SUCCESS;
}
API CUresult cuStreamCreate(CUstream *s, unsigned int flags) { CALLED(); return stream_create(s, flags); }
API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
    CALLED();
    (void)priority;
    return stream_create(s, flags);
}
API CUresult cuStreamGetFlags(CUstream s, unsigned int *flags) {
    CALLED();
    UP();
    sc_stream_t *x = stream_of(s, 0);
    if (!x || !flags) return CUDA_ERROR_INVALID_VALUE;
    *flags = x->flags;
    return CUDA_SUCCESS;
}
API CUresult cuStreamDestroy_v2(CUstream s) {
    CALLED();
    if (!s) return CUDA_SUCCESS;
    if (s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
    sc_stream_t *x = (sc_stream_t *)s;
    if (x->cap) {   /* a capturing stream goes away: its capture is invalid (and over, if it began there) */
        cap_lock();
        sc_capture_t *c = x->cap;
        if (c) {
            cap_invalidate(c);
            if (c->origin == x) cap_finish(c);
            else cap_detach(c, x);
        }
        cap_unlock();
    }
    free(x->ends);
    free(x->deps);
    free(x->deps_out);
    free(x->edges_out);
    free(x);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream s, int pt) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = stream_sync_gate(x);
    if (rc) return rc;
    wait_for(x->gpu, __atomic_load_n(&x->done_at, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream s) { CALLED(); return stream_sync(s, 0); }
API CUresult cuStreamSynchronize_ptsz(CUstream s) { CALLED(); return stream_sync(s, 1); }

static CUresult stream_query(CUstream s, int pt) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = stream_sync_gate(x);
    if (rc) return rc;
    uint64_t done = when(x->gpu, __atomic_load_n(&x->done_at, __ATOMIC_ACQUIRE));
    return done != GS_NEVER && gs_clock() >= done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuStreamQuery(CUstream s) { CALLED(); return stream_query(s, 0); }
API CUresult cuStreamQuery_ptsz(CUstream s) { CALLED(); return stream_query(s, 1); }

/* Caller holds sc_cap_mu.  Stream x joins capture c, its next node depending on deps. */
static void cap_join(sc_capture_t *c, sc_stream_t *x, sc_node_t *const *deps, int n) {
    if (grow((void **)&c->streams, &c->capstreams, c->nstreams + 1, sizeof *c->streams)) return;
    c->streams[c->nstreams++] = x;
    x->cap = c;
    stream_set_deps(x, deps, n);
}

#define SC_NOT_CAPTURE ((CUresult)-2)
/* Caller holds sc_cap_mu.  cuStreamWaitEvent where a capture is concerned (x captures, or ev was recorded inside
 * one); SC_NOT_CAPTURE when neither. */
static CUresult wait_in_capture(sc_stream_t *x, sc_event_t *ev, unsigned flags) {
    if (x->kind == SK_LEGACY && legacy_conflict(x->ctx, 1)) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    if (ev->cap_id) {
        sc_capture_t *c = cap_by_id(ev->cap_id);
        if (!c) {   /* the capture it was recorded in is over: there is nothing to wait for or join */
            if (x->cap) cap_invalidate(x->cap);
            return CUDA_ERROR_CAPTURED_EVENT;
        }
        if (x->kind == SK_LEGACY) {   /* the legacy stream cannot take part in a capture */
            cap_invalidate(c);
            return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
        }
        if (x->cap && x->cap != c) {   /* two capture sequences would merge */
            cap_invalidate(x->cap);
            cap_invalidate(c);
            return CUDA_ERROR_STREAM_CAPTURE_MERGE;
        }
        if (c->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        if (!x->cap) cap_join(c, x, ev->deps, ev->ndeps);   /* a fork: x is captured into c from now on */
        else stream_add_deps(x, ev->deps, ev->ndeps);       /* a join within c */
        return CUDA_SUCCESS;
    }
    if (!x->cap) return SC_NOT_CAPTURE;
    if (x->cap->invalid) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!ev->valid) return CUDA_SUCCESS;   /* never recorded: it stands for no work */
    if (flags & CU_EVENT_WAIT_EXTERNAL) {
        sc_node_t *n = cap_add(x, SN_EVENT_WAIT);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        n->event = ev;
        return CUDA_SUCCESS;
    }
    cap_invalidate(x->cap);   /* a dependency on work outside the capture */
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
}

static CUresult stream_wait_event(CUstream s, CUevent e, unsigned int flags, int pt) {
    UP();
    sc_event_t *ev = (sc_event_t *)e;
    if (ev && event_dead(ev)) return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ev) return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
    if (any_capture() || __atomic_load_n(&ev->cap_id, __ATOMIC_ACQUIRE)) {
        cap_lock();
        CUresult rc = wait_in_capture(x, ev, flags);
        cap_unlock();
        if (rc != SC_NOT_CAPTURE) return rc;
    }
    if (flags & CU_EVENT_WAIT_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;   /* only meaningful in a capture */
    /* one engine per GPU runs work in submission order: only an event of another GPU can hold x back */
    if (ev->valid && ev->gpu != x->gpu) {
        wait_for(ev->gpu, ev->at);   /* with time slicing the host waits for it (docs/testbed-fidelity.md) */
        uint64_t at = event_time(ev);
        if (at > x->not_before) x->not_before = at;
    }
    return CUDA_SUCCESS;
}
API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
    CALLED();
    return stream_wait_event(s, e, flags, 0);
}
API CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int flags) {
    CALLED();
    return stream_wait_event(s, e, flags, 1);
}

API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    CALLED();
    UP();
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    sc_ctx_t *c = current();   /* "for the current context"; with none current, for none (see the fidelity doc) */
    if (c && !c->primary && !c->green && !c->retained)   /* another thread destroyed it (a spare: see ctx_make) */
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    sc_event_t *ev = calloc(1, sizeof *ev);
    if (!ev) return CUDA_ERROR_OUT_OF_MEMORY;
    ev->flags = flags;
    ev->ctx = c;
    ev->home = owner_of(ev->ctx);
    if (ev->home) {
        pthread_mutex_lock(&sc_ev_mu);
        ev->next = ev->home->events;
        if (ev->next) ev->next->prev = ev;
        ev->home->events = ev;
        pthread_mutex_unlock(&sc_ev_mu);
    }
    *e = (CUevent)ev;
    return CUDA_SUCCESS;
}
API CUresult cuEventDestroy_v2(CUevent e) {
    CALLED();
    sc_event_t *ev = (sc_event_t *)e;
    if (!ev) return CUDA_SUCCESS;
    pthread_mutex_lock(&sc_ev_mu);
    if (event_dead(ev)) {   /* destroyed with its context already: the record stays, the handle stays refused */
        pthread_mutex_unlock(&sc_ev_mu);
        return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    }
    if (ev->home) {
        if (ev->prev) ev->prev->next = ev->next;
        else ev->home->events = ev->next;
        if (ev->next) ev->next->prev = ev->prev;
    }
    pthread_mutex_unlock(&sc_ev_mu);
    cap_lock();
    free(ev->deps);
    cap_unlock();
    free(ev);
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent e, CUstream s, unsigned int flags, int pt) {
    UP();
    sc_event_t *ev = (sc_event_t *)e;
    if (ev && event_dead(ev)) return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    sc_stream_t *x = stream_of(s, pt);
    if (!x || !ev || (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = enqueue_gate(x);
    if (rc == SC_CAPTURED) {
        rc = CUDA_SUCCESS;
        if (flags & CU_EVENT_RECORD_EXTERNAL) {   /* an event record node: recorded when the graph runs */
            sc_node_t *n = cap_add(x, SN_EVENT_RECORD);
            if (n) n->event = ev;
            else rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else {   /* a captured event: it stands for x's current nodes of the capture */
            sc_node_t **deps = x->ndeps ? malloc(sizeof *deps * (size_t)x->ndeps) : NULL;
            if (x->ndeps && !deps) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                if (x->ndeps) memcpy(deps, x->deps, sizeof *deps * (size_t)x->ndeps);
                free(ev->deps);
                ev->deps = deps;
                ev->ndeps = x->ndeps;
                __atomic_store_n(&ev->cap_id, x->cap->id, __ATOMIC_RELEASE);
            }
        }
        cap_unlock();
        return rc;
    }
    if (rc) return rc;
    if (flags & CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;   /* only meaningful in a capture */
    ev->gpu = x->gpu;
    if (ts_on()) {   /* a mark in the run queue: its time is known when the engine gets there */
        __atomic_store_n(&ev->at, submit_ts(x, &sc_event_ns, 1, 0, NULL), __ATOMIC_RELEASE);
        ev->valid = 1;
        __atomic_store_n(&ev->cap_id, 0, __ATOMIC_RELEASE);
        return CUDA_SUCCESS;
    }
    ev->at = engine_reach(x);   /* the engine reaches it after all work submitted before */
    if (sc_event_ns) {          /* ... and the record holds the engine a while */
        gs_gpu_t *g = hw(x->gpu);
        gs_lock(&g->mu);
        uint64_t tail = __atomic_load_n(&g->tail, __ATOMIC_ACQUIRE), t = (tail > ev->at ? tail : ev->at) + sc_event_ns;
        __atomic_store_n(&g->tail, t, __ATOMIC_RELEASE);
        gs_unlock(&g->mu);
        __atomic_store_n(&x->done_at, t, __ATOMIC_RELEASE);
    }
    ev->gpu = x->gpu;
    ev->valid = 1;
    __atomic_store_n(&ev->cap_id, 0, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}
API CUresult cuEventRecord(CUevent e, CUstream s) { CALLED(); return event_record(e, s, 0, 0); }
API CUresult cuEventRecord_ptsz(CUevent e, CUstream s) { CALLED(); return event_record(e, s, 0, 1); }
API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
    CALLED();
    return event_record(e, s, flags, 0);
}
API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int flags) {
    CALLED();
    return event_record(e, s, flags, 1);
}
API CUresult cuEventQuery(CUevent e) {
    CALLED();
    sc_event_t *ev = (sc_event_t *)e;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    if (event_dead(ev)) return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    CUresult rc = event_gate(ev);
    if (rc) return rc;
    uint64_t at = event_time(ev);
    return at != GS_NEVER && gs_clock() >= at ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
API CUresult cuEventSynchronize(CUevent e) {
    CALLED();
    sc_event_t *ev = (sc_event_t *)e;
    if (!ev) return CUDA_ERROR_INVALID_VALUE;
    if (event_dead(ev)) return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    CUresult rc = event_gate(ev);
    if (rc) return rc;
    wait_for(ev->gpu, __atomic_load_n(&ev->at, __ATOMIC_ACQUIRE));
    return CUDA_SUCCESS;
}
static CUresult elapsed(float *ms, CUevent start, CUevent end) {
    sc_event_t *a = (sc_event_t *)start, *b = (sc_event_t *)end;
    if ((a && event_dead(a)) || (b && event_dead(b))) return dead_event_use(CUDA_ERROR_INVALID_HANDLE);
    if (!ms || !a || !b) return CUDA_ERROR_INVALID_HANDLE;
    if (a->cap_id || b->cap_id) return CUDA_ERROR_CAPTURED_EVENT;
    if (!a->valid || !b->valid) return CUDA_ERROR_INVALID_HANDLE;
    uint64_t at_a = event_time(a), at_b = event_time(b), now = gs_clock();
    if (at_a == GS_NEVER || at_b == GS_NEVER || now < at_a || now < at_b) return CUDA_ERROR_NOT_READY;
    *ms = (float)(((double)at_b - (double)at_a) / 1e6);
    return CUDA_SUCCESS;
}
API CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end) { CALLED(); return elapsed(ms, start, end); }
API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) { CALLED(); return elapsed(ms, start, end); }

/* ------------------------------------------------------------------------------------------------ modules */
API CUresult cuModuleLoadData(CUmodule *m, const void *image) {
    CALLED();
    UP();
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    sc_module_t *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    mod->image = image ? strdup((const char *)image) : NULL;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}
API CUresult cuModuleLoad(CUmodule *m, const char *path) {
    CALLED();
    (void)path;
    UP();
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    sc_module_t *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}
API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v) {
    CALLED();
    (void)n; (void)o; (void)v;
    UP();
    if (!m) return CUDA_ERROR_INVALID_VALUE;
    sc_module_t *mod = calloc(1, sizeof *mod);
    if (!mod) return CUDA_ERROR_OUT_OF_MEMORY;
    mod->image = image ? strdup((const char *)image) : NULL;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}
API CUresult cuModuleUnload(CUmodule m) {
    CALLED();
    sc_module_t *mod = (sc_module_t *)m;
    if (mod) { free(mod->image); free(mod); }
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name) {
    CALLED();
    UP();
    if (!f || !m || !name) return CUDA_ERROR_INVALID_VALUE;
    sc_func_t *fn = calloc(1, sizeof *fn);
    if (!fn) return CUDA_ERROR_OUT_OF_MEMORY;
    if (kt_from_image(((sc_module_t *)m)->image, name, &fn->kt)) kt_default(name, &fn->kt);
    fn->bx = fn->by = fn->bz = 1;
    *f = (CUfunction)fn;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ launches */
/* the first 8 bytes of a launch's parameters (what the "sleep" kernel model reads): kernelParams[0], else the
 * CU_LAUNCH_PARAM_BUFFER_POINTER buffer of `extra` */
static uint64_t first_param(void **params, void **extra) {
    uint64_t v = 0;
    if (params && params[0]) {
        memcpy(&v, params[0], sizeof v);
        return v;
    }
    void *buf = NULL;
    size_t size = sizeof v;
    for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END && i < 64; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) size = *(size_t *)extra[i + 1];
    }
    if (buf) memcpy(&v, buf, size < sizeof v ? size : sizeof v);
    return v;
}

/* Runs (or, in a capture, records) one kernel of `blocks` blocks on stream x. */
static CUresult launch_on(sc_func_t *f, uint64_t blocks, sc_stream_t *x, uint64_t param) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = enqueue_gate(x);
    if (rc == SC_CAPTURED) {
        sc_node_t *n = cap_add(x, SN_KERNEL);
        if (n) {
            n->fn = f->kt;
            n->blocks = blocks;
            n->param = param;
        }
        cap_unlock();
        return n ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc) return rc;
    uint64_t d = kt_draw(&f->kt, blocks, gs_clock(), param);
    submit(x, &d, 1);
    return CUDA_SUCCESS;
}

static CUresult run_kernel(CUfunction f, uint64_t blocks, CUstream s, int pt, void **params, void **extra) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    return launch_on((sc_func_t *)f, blocks, x, first_param(params, extra));
}

API CUresult cuLaunchKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                            unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s, void **params,
                            void **extra) {
    CALLED();
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, 0, params, extra);
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                                 unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s, void **params,
                                 void **extra) {
    CALLED();
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, 1, params, extra);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    CALLED();
    if (!cfg) return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(f, (uint64_t)cfg->gridDimX * cfg->gridDimY * cfg->gridDimZ, cfg->hStream, 0, params, extra);
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *cfg, CUfunction f, void **params, void **extra) {
    CALLED();
    if (!cfg) return CUDA_ERROR_INVALID_VALUE;
    return run_kernel(f, (uint64_t)cfg->gridDimX * cfg->gridDimY * cfg->gridDimZ, cfg->hStream, 1, params, extra);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                                       unsigned blockY, unsigned blockZ, unsigned sharedBytes, CUstream s,
                                       void **params) {
    CALLED();
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, 0, params, NULL);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gridX, unsigned gridY, unsigned gridZ,
                                            unsigned blockX, unsigned blockY, unsigned blockZ, unsigned sharedBytes,
                                            CUstream s, void **params) {
    CALLED();
    (void)blockX; (void)blockY; (void)blockZ; (void)sharedBytes;
    return run_kernel(f, (uint64_t)gridX * gridY * gridZ, s, 1, params, NULL);
}

/* one cooperative kernel per device, each on its own (created) stream; grid, block and shared size must match */
API CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n, unsigned int flags) {
    CALLED();
    (void)flags;
    UP();
    if (!list || !n) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < n; i++) {
        CUDA_LAUNCH_PARAMS *p = &list[i];
        if (!p->function) return CUDA_ERROR_INVALID_HANDLE;
        if (!p->hStream || p->hStream == CU_STREAM_LEGACY || p->hStream == CU_STREAM_PER_THREAD)
            return CUDA_ERROR_INVALID_VALUE;
        if (p->gridDimX != list[0].gridDimX || p->gridDimY != list[0].gridDimY || p->gridDimZ != list[0].gridDimZ ||
            p->blockDimX != list[0].blockDimX || p->blockDimY != list[0].blockDimY ||
            p->blockDimZ != list[0].blockDimZ || p->sharedMemBytes != list[0].sharedMemBytes)
            return CUDA_ERROR_INVALID_VALUE;
        for (unsigned k = 0; k < i; k++)
            if (((sc_stream_t *)list[k].hStream)->gpu == ((sc_stream_t *)p->hStream)->gpu)
                return CUDA_ERROR_INVALID_DEVICE;   /* one launch per device */
    }
    for (unsigned i = 0; i < n; i++) {
        CUDA_LAUNCH_PARAMS *p = &list[i];
        CUresult rc = launch_on((sc_func_t *)p->function, (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ,
                                (sc_stream_t *)p->hStream, first_param(p->kernelParams, NULL));
        if (rc) return rc;
    }
    return CUDA_SUCCESS;
}

/* ---- the old (CUDA 2.x) launch API: block shape and parameters set on the function, then cuLaunch* */
static sc_func_t *func_of(CUfunction f) { return (sc_func_t *)f; }
API CUresult cuFuncSetBlockShape(CUfunction f, int x, int y, int z) {
    CALLED();
    UP();
    sc_func_t *fn = func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (x <= 0 || y <= 0 || z <= 0) return CUDA_ERROR_INVALID_VALUE;
    fn->bx = x;
    fn->by = y;
    fn->bz = z;
    return CUDA_SUCCESS;
}
API CUresult cuFuncSetSharedSize(CUfunction f, unsigned int bytes) {
    CALLED();
    UP();
    sc_func_t *fn = func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    fn->shared = bytes;
    return CUDA_SUCCESS;
}
API CUresult cuParamSetSize(CUfunction f, unsigned int n) {
    CALLED();
    UP();
    sc_func_t *fn = func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (n > SC_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    fn->psize = n;
    return CUDA_SUCCESS;
}
static CUresult param_put(CUfunction f, int offset, const void *src, unsigned int n) {
    UP();
    sc_func_t *fn = func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (offset < 0 || (!src && n) || (uint64_t)offset + n > SC_PARAM_BYTES) return CUDA_ERROR_INVALID_VALUE;
    if (n) memcpy(fn->params + offset, src, n);
    return CUDA_SUCCESS;
}
API CUresult cuParamSeti(CUfunction f, int offset, unsigned int value) {
    CALLED();
    return param_put(f, offset, &value, sizeof value);
}
API CUresult cuParamSetf(CUfunction f, int offset, float value) {
    CALLED();
    return param_put(f, offset, &value, sizeof value);
}
API CUresult cuParamSetv(CUfunction f, int offset, void *ptr, unsigned int n) {
    CALLED();
    return param_put(f, offset, ptr, n);
}
static CUresult launch_old(CUfunction f, int w, int h, CUstream s) {
    UP();
    sc_func_t *fn = func_of(f);
    if (!fn) return CUDA_ERROR_INVALID_HANDLE;
    if (w <= 0 || h <= 0) return CUDA_ERROR_INVALID_VALUE;
    uint64_t param = 0;
    memcpy(&param, fn->params, sizeof param);   /* the first 8 bytes of the parameter space */
    return launch_on(fn, (uint64_t)w * (uint64_t)h, stream_of(s, 0), param);
}
API CUresult cuLaunch(CUfunction f) { CALLED(); return launch_old(f, 1, 1, NULL); }
API CUresult cuLaunchGrid(CUfunction f, int w, int h) { CALLED(); return launch_old(f, w, h, NULL); }
API CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) { CALLED(); return launch_old(f, w, h, s); }

/* ------------------------------------------------------------------------------------------------ graphs */
API CUresult cuGraphCreate(CUgraph *g, unsigned int flags) {
    CALLED();
    (void)flags;
    UP();
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    sc_graph_t *gr = calloc(1, sizeof *gr);
    if (!gr) return CUDA_ERROR_OUT_OF_MEMORY;
    *g = (CUgraph)gr;
    return CUDA_SUCCESS;
}

/* Frees a graph's nodes.  Its graph allocations keep their addresses while live; the rest go. */
static void graph_free(sc_graph_t *gr) {
    pthread_mutex_lock(&sc_mu);
    for (int i = 0; i < gr->count; i++) {
        sc_node_t *n = gr->node[i];
        if (n->alloc) {
            if (n->alloc->owner == gr) n->alloc->owner = NULL;
            galloc_put(n->alloc);
        }
        free(n->deps);
        free(n);
    }
    pthread_mutex_unlock(&sc_mu);
    free(gr->node);
    gr->node = NULL;
    gr->count = gr->cap = 0;
    if (gr->execs) gr->destroyed = 1;   /* its instantiations still point here */
    else free(gr);
}

API CUresult cuGraphDestroy(CUgraph g) {
    CALLED();
    sc_graph_t *gr = (sc_graph_t *)g;
    if (!gr) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    int busy = gr->capturing;
    if (!busy) graph_free(gr);
    cap_unlock();
    return busy ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult check_deps(sc_graph_t *g, const CUgraphNode *deps, size_t n) {
    if (n && !deps) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < n; i++) {
        sc_node_t *d = (sc_node_t *)deps[i];
        if (!d || d->graph != g) return CUDA_ERROR_INVALID_VALUE;
        for (size_t k = 0; k < i; k++)
            if (deps[k] == deps[i]) return CUDA_ERROR_INVALID_VALUE;   /* no duplicate entries */
    }
    return CUDA_SUCCESS;
}

/* adds a node of `type` to g after deps; NULL (and *rc set) on failure */
static sc_node_t *add_node(CUgraph g, const CUgraphNode *deps, size_t ndeps, int type, CUresult *rc) {
    sc_graph_t *gr = (sc_graph_t *)g;
    *rc = gr ? check_deps(gr, deps, ndeps) : CUDA_ERROR_INVALID_VALUE;
    if (*rc) return NULL;
    sc_node_t *n = graph_add(gr, type, (sc_node_t *const *)deps, (int)ndeps);
    if (!n) *rc = CUDA_ERROR_OUT_OF_MEMORY;
    return n;
}

API CUresult cuGraphAddKernelNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                     const CUDA_KERNEL_NODE_PARAMS *p) {
    CALLED();
    UP();
    if (!g || !p || !p->func) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc;
    cap_lock();
    sc_node_t *n = add_node(g, deps, ndeps, SN_KERNEL, &rc);
    if (n) {
        n->fn = ((sc_func_t *)p->func)->kt;
        n->blocks = (uint64_t)p->gridDimX * p->gridDimY * p->gridDimZ;
        n->param = first_param(p->kernelParams, p->extra);
        if (node) *node = (CUgraphNode)n;
    }
    cap_unlock();
    return rc;
}
API CUresult cuGraphAddEmptyNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps) {
    CALLED();
    UP();
    CUresult rc;
    cap_lock();
    sc_node_t *n = add_node(g, deps, ndeps, SN_EMPTY, &rc);
    if (n && node) *node = (CUgraphNode)n;
    cap_unlock();
    return rc;
}
static CUresult add_event_node(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e,
                               int type) {
    UP();
    if (!e) return CUDA_ERROR_INVALID_VALUE;
    if (event_dead((sc_event_t *)e)) return dead_event_use(CUDA_ERROR_INVALID_VALUE);
    CUresult rc;
    cap_lock();
    sc_node_t *n = add_node(g, deps, ndeps, type, &rc);
    if (n) {
        n->event = (sc_event_t *)e;
        if (node) *node = (CUgraphNode)n;
    }
    cap_unlock();
    return rc;
}
API CUresult cuGraphAddEventRecordNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e) {
    CALLED();
    return add_event_node(node, g, deps, ndeps, e, SN_EVENT_RECORD);
}
API CUresult cuGraphAddEventWaitNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUevent e) {
    CALLED();
    return add_event_node(node, g, deps, ndeps, e, SN_EVENT_WAIT);
}

/* memory alloc node: the address is fixed now; memory is taken when a launch reaches it */
API CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                    CUDA_MEM_ALLOC_NODE_PARAMS *p) {
    CALLED();
    UP();
    if (!g || !p || !p->bytesize || p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
        p->poolProps.handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_INVALID_VALUE;
    GPU_OK(p->poolProps.location.id);
    int gpu = p->poolProps.location.id;
    CUresult rc;
    cap_lock();
    sc_node_t *n = add_node(g, deps, ndeps, SN_MEM_ALLOC, &rc);
    sc_galloc_t *ga = n ? calloc(1, sizeof *ga) : NULL;
    if (n && !ga) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (ga) {
        ga->bytes = page_round(p->bytesize);
        ga->gpu = gpu;
        ga->refs = 1;
        ga->owner = (sc_graph_t *)g;
        pthread_mutex_lock(&sc_mu);
        ga->addr = take_va(gpu, ga->bytes, 0);
        ot_node_t *rec = ot_add(&sc_objs, TAG_GALLOC, ga->addr);
        if (rec) { rec->obj = ga; rec->gpu = gpu; rec->bytes = ga->bytes; rec->asked = p->bytesize; }
        pthread_mutex_unlock(&sc_mu);
        n->alloc = ga;
        p->dptr = ga->addr;
        n->alloc_params = *p;
        n->alloc_params.accessDescs = NULL;
        n->alloc_params.accessDescCount = 0;
        if (node) *node = (CUgraphNode)n;
    }
    cap_unlock();
    return rc;
}
API CUresult cuGraphAddMemFreeNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                   CUdeviceptr p) {
    CALLED();
    UP();
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    pthread_mutex_lock(&sc_mu);
    ot_node_t *rec = ot_get(&sc_objs, TAG_GALLOC, p);
    sc_galloc_t *ga = rec ? rec->obj : NULL;
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    sc_node_t *n = ga && galloc_freeable(ga, (sc_graph_t *)g) ? add_node(g, deps, ndeps, SN_MEM_FREE, &rc) : NULL;
    if (n) {
        n->alloc = ga;
        ga->refs++;
        if (ga->owner == (sc_graph_t *)g) ga->freed_in_owner = 1;
        else ga->freed_elsewhere = 1;
        if (node) *node = (CUgraphNode)n;
    }
    pthread_mutex_unlock(&sc_mu);
    cap_unlock();
    return rc;
}
API CUresult cuGraphMemAllocNodeGetParams(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *out) {
    CALLED();
    sc_node_t *n = (sc_node_t *)node;
    if (!n || !out || n->type != SN_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
    *out = n->alloc_params;
    return CUDA_SUCCESS;
}
API CUresult cuGraphMemFreeNodeGetParams(CUgraphNode node, CUdeviceptr *out) {
    CALLED();
    sc_node_t *n = (sc_node_t *)node;
    if (!n || !out || n->type != SN_MEM_FREE) return CUDA_ERROR_INVALID_VALUE;
    *out = n->alloc->addr;
    return CUDA_SUCCESS;
}
API CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *count) {
    CALLED();
    sc_graph_t *gr = (sc_graph_t *)g;
    if (!gr || !count) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    if (!nodes) {
        *count = (size_t)gr->count;
    } else {
        size_t i = 0;
        for (; i < *count && i < (size_t)gr->count; i++) nodes[i] = (CUgraphNode)gr->node[i];
        for (size_t k = i; k < *count; k++) nodes[k] = NULL;
        *count = i;
    }
    cap_unlock();
    return CUDA_SUCCESS;
}
API CUresult cuGraphNodeGetType(CUgraphNode node, CUgraphNodeType *type) {
    CALLED();
    sc_node_t *n = (sc_node_t *)node;
    if (!n || !type) return CUDA_ERROR_INVALID_VALUE;
    switch (n->type) {
    case SN_KERNEL: *type = CU_GRAPH_NODE_TYPE_KERNEL; break;
    case SN_EVENT_RECORD: *type = CU_GRAPH_NODE_TYPE_EVENT_RECORD; break;
    case SN_EVENT_WAIT: *type = CU_GRAPH_NODE_TYPE_WAIT_EVENT; break;
    case SN_MEM_ALLOC: *type = CU_GRAPH_NODE_TYPE_MEM_ALLOC; break;
    case SN_MEM_FREE: *type = CU_GRAPH_NODE_TYPE_MEM_FREE; break;
    default: *type = CU_GRAPH_NODE_TYPE_EMPTY; break;
    }
    return CUDA_SUCCESS;
}

/* ---- instantiation and launch */
static CUresult instantiate(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
    UP();
    sc_graph_t *gr = (sc_graph_t *)g;
    if (!exec || !gr) return CUDA_ERROR_INVALID_VALUE;
    sc_exec_t *ex = calloc(1, sizeof *ex);
    if (!ex) return CUDA_ERROR_OUT_OF_MEMORY;
    cap_lock();
    int has_mem = 0;
    for (int i = 0; i < gr->count; i++)
        has_mem |= gr->node[i]->type == SN_MEM_ALLOC || gr->node[i]->type == SN_MEM_FREE;
    /* not while a capture still adds to it; a graph with memory nodes has at most one instantiation */
    if (gr->capturing || (has_mem && gr->execs)) {
        cap_unlock();
        free(ex);
        return CUDA_ERROR_INVALID_VALUE;
    }
    ex->node = calloc((size_t)gr->count + 1, sizeof *ex->node);
    if (!ex->node) {
        cap_unlock();
        free(ex);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&sc_mu);
    for (int i = 0; i < gr->count; i++) {
        sc_node_t *n = gr->node[i];
        if (n->type == SN_EMPTY || n->type == SN_EVENT_WAIT) continue;   /* ordering only: the engine is serial */
        sc_enode_t *e = &ex->node[ex->count++];
        e->type = n->type;
        e->fn = n->fn;
        e->blocks = n->blocks;
        e->param = n->param;
        e->event = n->event;
        e->alloc = n->alloc;
        if (e->alloc) e->alloc->refs++;
    }
    pthread_mutex_unlock(&sc_mu);
    ex->graph = has_mem ? gr : NULL;
    ex->has_mem = has_mem;
    ex->flags = flags;
    if (has_mem) gr->execs++;
    cap_unlock();
    *exec = (CUgraphExec)ex;
    return CUDA_SUCCESS;
}
API CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph g, unsigned long long flags) {
    CALLED();
    return instantiate(exec, g, flags);
}
static CUresult instantiate_old(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size) {
    CUresult rc = instantiate(exec, g, 0);
    if (err_node) *err_node = NULL;
    if (log && log_size) log[0] = 0;
    return rc;
}
API CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size) {
    CALLED();
    return instantiate_old(exec, g, err_node, log, log_size);
}
API CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph g, CUgraphNode *err_node, char *log, size_t log_size) {
    CALLED();
    return instantiate_old(exec, g, err_node, log, log_size);
}
API CUresult cuGraphExecDestroy(CUgraphExec exec) {
    CALLED();
    sc_exec_t *ex = (sc_exec_t *)exec;
    if (!ex) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    if (ex->graph && --ex->graph->execs == 0 && ex->graph->destroyed) free(ex->graph);
    cap_unlock();
    pthread_mutex_lock(&sc_mu);
    for (int i = 0; i < ex->count; i++)
        if (ex->node[i].alloc) galloc_put(ex->node[i].alloc);
    pthread_mutex_unlock(&sc_mu);
    free(ex->node);
    free(ex);
    return CUDA_SUCCESS;
}

/* Caller holds sc_mu.  Makes sure the graph pool of each GPU has the physical memory ex's allocations need. */
static CUresult gpool_reserve(sc_exec_t *ex, uint64_t *need) {
    memset(need, 0, sizeof *need * GS_NDEV);
    for (int i = 0; i < ex->count; i++)
        if (ex->node[i].type == SN_MEM_ALLOC) need[ex->node[i].alloc->gpu] += ex->node[i].alloc->bytes;
    for (int g = 0; g < gs_nview; g++) {
        sc_gpool_t *p = &sc_gpool[g];
        if (!need[g] || p->used + need[g] <= p->reserved) continue;
        uint64_t more = p->used + need[g] - p->reserved;
        CUresult rc = take_memory(g, more);
        if (rc != CUDA_SUCCESS) return rc;
        p->reserved += more;
        if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
    }
    return CUDA_SUCCESS;
}

/* Caller holds sc_mu.  A launch of ex reaches its memory nodes: allocations become live, frees release. */
static CUresult gpool_launch(sc_exec_t *ex, uint64_t *need) {
    for (int i = 0; i < ex->count; i++) {
        sc_galloc_t *ga = ex->node[i].alloc;
        if (ex->node[i].type != SN_MEM_ALLOC || !ga->live) continue;
        /* still allocated from the last launch: freed automatically, or the launch is refused */
        if (!(ex->flags & CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)) return CUDA_ERROR_INVALID_VALUE;
        galloc_release(ga);
    }
    CUresult rc = gpool_reserve(ex, need);
    if (rc != CUDA_SUCCESS) return rc;
    for (int i = 0; i < ex->count; i++) {
        sc_galloc_t *ga = ex->node[i].alloc;
        if (ex->node[i].type == SN_MEM_ALLOC) {
            ga->live = 1;
            sc_gpool_t *p = &sc_gpool[ga->gpu];
            p->used += ga->bytes;
            if (p->used > p->used_high) p->used_high = p->used;
        } else if (ex->node[i].type == SN_MEM_FREE) {
            galloc_release(ga);
        }
    }
    return CUDA_SUCCESS;
}

/* Caller holds sc_cap_mu; x captures.  A launched graph's work becomes part of the capture, one node after another. */
static CUresult capture_exec(sc_exec_t *ex, sc_stream_t *x) {
    if (ex->has_mem) {   /* its allocations belong to its own graph: not recorded into another (see fidelity doc) */
        cap_invalidate(x->cap);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    for (int i = 0; i < ex->count; i++) {
        sc_enode_t *e = &ex->node[i];
        sc_node_t *n = cap_add(x, e->type);
        if (!n) return CUDA_ERROR_OUT_OF_MEMORY;
        n->fn = e->fn;
        n->blocks = e->blocks;
        n->param = e->param;
        n->event = e->event;
    }
    return CUDA_SUCCESS;
}

/* Time slicing: queues a graph launch's kernels (durations d, k of them) and its event records' marks on x in node
 * order.  *end: the earliest the launch can end; *dead: an event record node's event had died. */
static CUresult graph_queue_ts(sc_exec_t *ex, sc_stream_t *x, const uint64_t *d, int k, uint64_t *end, int *dead) {
    uint64_t stack[128], *item = ex->count > 64 ? malloc(2 * sizeof *item * (size_t)ex->count) : stack;
    if (!item) return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t *fin = item + (ex->count > 64 ? ex->count : 64), sum = 0;
    int n = 0;
    for (int i = 0, j = 0; i < ex->count; i++) {
        sc_enode_t *e = &ex->node[i];
        if (e->type == SN_KERNEL) sum += item[n++] = d[j++];
        else if (e->type == SN_EVENT_RECORD && e->event && event_dead(e->event)) *dead = 1;
        else if (e->type == SN_EVENT_RECORD && e->event) item[n++] = 0;
    }
    if (n) {
        uint32_t at = x->issued % x->depth;
        wait_for(x->gpu, x->ends[at]);
        submit_ts(x, item, n, k, fin);
        x->ends[at] = __atomic_load_n(&x->done_at, __ATOMIC_ACQUIRE);
        x->issued++;
    }
    for (int i = 0, m = 0; i < ex->count; i++) {
        sc_enode_t *e = &ex->node[i];
        if (e->type == SN_KERNEL) m++;
        else if (e->type == SN_EVENT_RECORD && e->event && !event_dead(e->event)) {
            e->event->gpu = x->gpu;
            __atomic_store_n(&e->event->at, fin[m++] | GS_TICKET_REACH, __ATOMIC_RELEASE);
            e->event->valid = 1;
            __atomic_store_n(&e->event->cap_id, 0, __ATOMIC_RELEASE);
        }
    }
    if (item != stack) free(item);
    *end = gs_clock() + sum;
    return CUDA_SUCCESS;
}

static CUresult graph_launch(CUgraphExec exec, CUstream s, int pt) {
    UP();
    sc_exec_t *ex = (sc_exec_t *)exec;
    sc_stream_t *x = stream_of(s, pt);
    if (!ex) return CUDA_ERROR_INVALID_HANDLE;
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    CUresult rc = enqueue_gate(x);
    if (rc == SC_CAPTURED) {
        rc = capture_exec(ex, x);
        cap_unlock();
        return rc;
    }
    if (rc) return rc;
    uint64_t need[GS_NDEV];
    if (ex->has_mem) {
        pthread_mutex_lock(&sc_mu);
        rc = gpool_launch(ex, need);
        pthread_mutex_unlock(&sc_mu);
        if (rc) return rc;
    }
    uint64_t stack[64], *d = stack, now = gs_clock();
    int k = 0;
    if (ex->count > 64 && !(d = malloc(sizeof *d * (size_t)ex->count))) return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < ex->count; i++)
        if (ex->node[i].type == SN_KERNEL) {
            d[k] = kt_draw(&ex->node[i].fn, ex->node[i].blocks, now, ex->node[i].param);
            k++;
        }
    uint64_t t = 0;
    int dead = 0;
    if (ts_on()) {
        rc = graph_queue_ts(ex, x, d, k, &t, &dead);
        if (rc) {
            if (d != stack) free(d);
            return rc;
        }
    } else {
        t = k ? submit(x, d, k) : engine_reach(x);
        for (int i = 0, j = 0; i < ex->count; i++) {   /* event record nodes: when the engine gets there */
            sc_enode_t *e = &ex->node[i];
            if (e->type == SN_KERNEL) t += d[j++];
            else if (e->type == SN_EVENT_RECORD && e->event && event_dead(e->event)) dead = 1;   /* nothing to record */
            else if (e->type == SN_EVENT_RECORD && e->event) {
                e->event->at = t;
                e->event->gpu = x->gpu;
                e->event->valid = 1;
                __atomic_store_n(&e->event->cap_id, 0, __ATOMIC_RELEASE);
            }
        }
    }
    if (ex->has_mem) {   /* the pool keeps what this launch needs until it has run */
        pthread_mutex_lock(&sc_mu);
        for (int g = 0; g < gs_nview; g++) {
            sc_gpool_t *p = &sc_gpool[g];
            if (!need[g]) continue;
            if (now >= p->busy_until) p->busy = 0;
            if (need[g] > p->busy) p->busy = need[g];
            if (t > p->busy_until) p->busy_until = t;
        }
        pthread_mutex_unlock(&sc_mu);
    }
    if (d != stack) free(d);
    if (dead) dead_event_use(CUDA_SUCCESS);   /* counted; the launch itself goes on (see the fidelity doc) */
    return CUDA_SUCCESS;
}
API CUresult cuGraphLaunch(CUgraphExec exec, CUstream s) { CALLED(); return graph_launch(exec, s, 0); }
API CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream s) { CALLED(); return graph_launch(exec, s, 1); }

/* "uploads" a graph: its graph allocations' physical memory is mapped now rather than at the first launch */
static CUresult graph_upload(CUgraphExec exec, CUstream s, int pt) {
    UP();
    sc_exec_t *ex = (sc_exec_t *)exec;
    if (!ex) return CUDA_ERROR_INVALID_HANDLE;
    if (!stream_of(s, pt)) return CUDA_ERROR_INVALID_CONTEXT;
    if (!ex->has_mem) return CUDA_SUCCESS;
    uint64_t need[GS_NDEV];
    pthread_mutex_lock(&sc_mu);
    CUresult rc = gpool_reserve(ex, need);
    pthread_mutex_unlock(&sc_mu);
    return rc;
}
API CUresult cuGraphUpload(CUgraphExec exec, CUstream s) { CALLED(); return graph_upload(exec, s, 0); }
API CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream s) { CALLED(); return graph_upload(exec, s, 1); }

static CUresult instantiate_params(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p, int pt) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = instantiate(exec, g, p->flags);
    p->hErrNode_out = NULL;
    p->result_out = rc == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    if (rc == CUDA_SUCCESS && (p->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD))
        rc = graph_upload(*exec, p->hUploadStream, pt);
    return rc;
}
API CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CALLED();
    return instantiate_params(exec, g, p, 0);
}
API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p) {
    CALLED();
    return instantiate_params(exec, g, p, 1);
}

/* gives back the graph pool's memory that neither a live graph allocation nor an executing launch needs */
API CUresult cuDeviceGraphMemTrim(CUdevice dev) {
    CALLED();
    UP();
    GPU_OK(dev);
    pthread_mutex_lock(&sc_mu);
    sc_gpool_t *p = &sc_gpool[dev];
    uint64_t keep = p->used;
    if (gs_clock() < p->busy_until && p->busy > keep) keep = p->busy;
    if (p->reserved > keep) {
        give_memory(dev, p->reserved - keep);
        p->reserved = keep;
    }
    pthread_mutex_unlock(&sc_mu);
    return CUDA_SUCCESS;
}
API CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    sc_gpool_t *p = &sc_gpool[dev];
    cuuint64_t v;
    switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: v = p->used; break;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: v = p->used_high; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: v = p->reserved; break;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: v = p->reserved_high; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    *(cuuint64_t *)value = v;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceSetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void *value) {
    CALLED();
    UP();
    GPU_OK(dev);
    if (!value || *(cuuint64_t *)value) return CUDA_ERROR_INVALID_VALUE;   /* high watermarks reset to 0 only */
    if (attr == CU_GRAPH_MEM_ATTR_USED_MEM_HIGH) sc_gpool[dev].used_high = 0;
    else if (attr == CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH) sc_gpool[dev].reserved_high = 0;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------------------------------------ stream capture */
/* Caller holds sc_cap_mu.  Stream x leaves capture c. */
static void cap_detach(sc_capture_t *c, sc_stream_t *x) {
    int keep = 0;
    for (int i = 0; i < c->nstreams; i++)
        if (c->streams[i] != x) c->streams[keep++] = c->streams[i];
    c->nstreams = keep;
    x->cap = NULL;
    x->ndeps = 0;
}

/* Caller holds sc_cap_mu.  Ends capture c: its streams leave capture mode; an invalidated capture's own graph goes. */
static void cap_finish(sc_capture_t *c) {
    for (int i = 0; i < c->nstreams; i++) {
        c->streams[i]->cap = NULL;
        c->streams[i]->ndeps = 0;
    }
    for (sc_capture_t **link = &sc_caps; *link; link = &(*link)->next)
        if (*link == c) {
            *link = c->next;
            break;
        }
    __atomic_sub_fetch(&sc_ncaps, 1, __ATOMIC_RELEASE);
    c->graph->capturing = 0;
    if (c->invalid && c->own_graph) graph_free(c->graph);
    free(c->streams);
    free(c);
}

/* Caller holds sc_cap_mu.  Is every stream's work joined back into the origin stream?  True when each other
 * stream's current nodes are among the origin's current nodes or their ancestors. */
static int cap_joined(sc_capture_t *c) {
    sc_graph_t *g = c->graph;
    char *seen = calloc((size_t)g->count + 1, 1);
    sc_node_t **stack = malloc(sizeof *stack * ((size_t)g->count + 1));
    int top = 0, ok = 1;
    if (!seen || !stack) { free(seen); free(stack); return 1; }
    for (int i = 0; i < c->origin->ndeps; i++) {
        sc_node_t *n = c->origin->deps[i];
        if (!seen[n->index]) { seen[n->index] = 1; stack[top++] = n; }
    }
    while (top) {
        sc_node_t *n = stack[--top];
        for (int i = 0; i < n->ndeps; i++)
            if (!seen[n->deps[i]->index]) {
                seen[n->deps[i]->index] = 1;
                stack[top++] = n->deps[i];
            }
    }
    for (int s = 0; s < c->nstreams && ok; s++)
        for (int i = 0; i < c->streams[s]->ndeps && ok; i++) ok = seen[c->streams[s]->deps[i]->index];
    free(seen);
    free(stack);
    return ok;
}

static CUresult capture_begin(CUstream s, int pt, int mode, CUgraph into, const CUgraphNode *deps, size_t ndeps) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (x->kind == SK_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;   /* the legacy stream is never captured */
    if (mode < CU_STREAM_CAPTURE_MODE_GLOBAL || mode > CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_ERROR_INVALID_VALUE;
    sc_graph_t *g = (sc_graph_t *)into;
    cap_lock();
    CUresult rc = CUDA_SUCCESS;
    if (x->cap) rc = CUDA_ERROR_ILLEGAL_STATE;   /* already capturing */
    else if (g && (g->capturing || check_deps(g, deps, ndeps))) rc = CUDA_ERROR_INVALID_VALUE;
    sc_capture_t *c = rc ? NULL : calloc(1, sizeof *c);
    if (!rc && !c) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (c && !g && !(g = calloc(1, sizeof *g))) rc = CUDA_ERROR_OUT_OF_MEMORY;
    if (rc) {
        free(c);
        cap_unlock();
        return rc;
    }
    c->id = ++sc_next_cap_id;
    c->mode = mode;
    c->thread = pthread_self();
    c->origin = x;
    c->graph = g;
    c->own_graph = !into;
    g->capturing = 1;
    cap_join(c, x, (sc_node_t *const *)deps, into ? (int)ndeps : 0);
    c->next = sc_caps;
    sc_caps = c;
    __atomic_add_fetch(&sc_ncaps, 1, __ATOMIC_RELEASE);
    cap_unlock();
    return CUDA_SUCCESS;
}
API CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    CALLED();
    return capture_begin(s, 0, mode, NULL, NULL, 0);
}
API CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    CALLED();
    return capture_begin(s, 1, mode, NULL, NULL, 0);
}
/* the CUDA 10.0 ABI (PFN_cuStreamBeginCapture_v10000): no mode argument; the default mode, GLOBAL */
API CUresult cuStreamBeginCapture(CUstream s) {
    CALLED();
    return capture_begin(s, 0, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL, NULL, 0);
}
API CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    CALLED();
    return capture_begin(s, 1, CU_STREAM_CAPTURE_MODE_GLOBAL, NULL, NULL, 0);
}
API CUresult cuStreamBeginCaptureToGraph(CUstream hs, CUgraph into, const CUgraphNode *after,
                                         const CUgraphEdgeData *edge_info, size_t nafter, CUstreamCaptureMode mode) {
    CALLED();
    (void)edge_info;
    if (!into) return CUDA_ERROR_INVALID_VALUE;
    return capture_begin(hs, 0, mode, into, after, nafter);
}
API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream hs, CUgraph into, const CUgraphNode *after,
                                              const CUgraphEdgeData *edge_info, size_t nafter,
                                              CUstreamCaptureMode mode) {
    CALLED();
    (void)edge_info;
    if (!into) return CUDA_ERROR_INVALID_VALUE;
    return capture_begin(hs, 1, mode, into, after, nafter);
}

static CUresult capture_end(CUstream s, int pt, CUgraph *out) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    sc_capture_t *c = x->cap;
    CUresult rc = CUDA_SUCCESS;
    if (!c) {
        rc = CUDA_ERROR_ILLEGAL_STATE;   /* not capturing */
    } else if (c->origin != x) {
        cap_invalidate(c);
        rc = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;   /* ended in another stream than it began */
    } else if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->thread, pthread_self())) {
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    } else {
        sc_graph_t *g = c->graph;
        if (c->invalid) rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        else if (!cap_joined(c)) rc = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
        if (rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED) c->invalid = 1;   /* its own graph goes with it (not counted) */
        cap_finish(c);
        *out = rc ? NULL : (CUgraph)g;
    }
    cap_unlock();
    return rc;
}
API CUresult cuStreamEndCapture(CUstream s, CUgraph *g) { CALLED(); return capture_end(s, 0, g); }
API CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) { CALLED(); return capture_end(s, 1, g); }

static CUresult capture_status(CUstream s, int pt, CUstreamCaptureStatus *status) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    *status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!any_capture()) return CUDA_SUCCESS;
    CUresult rc = CUDA_SUCCESS;
    cap_lock();
    if (x->kind == SK_LEGACY && legacy_conflict(x->ctx, 0))
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;   /* and the capture is not invalidated */
    else if (x->cap) *status = x->cap->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    cap_unlock();
    return rc;
}
API CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus *status) {
    CALLED();
    return capture_status(s, 0, status);
}
API CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *status) {
    CALLED();
    return capture_status(s, 1, status);
}

static CUresult capture_info(CUstream s, int pt, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                             const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (!status || (edges && !deps)) return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = CUDA_SUCCESS;
    cap_lock();
    if (x->kind == SK_LEGACY && legacy_conflict(x->ctx, 0)) {
        rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    } else if (!x->cap) {
        *status = CU_STREAM_CAPTURE_STATUS_NONE;
        if (n) *n = 0;
    } else {
        sc_capture_t *c = x->cap;
        *status = c->invalid ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
        if (id) *id = c->id;
        if (graph) *graph = (CUgraph)c->graph;
        if (deps || n) {   /* driver-owned arrays, valid until the next call on the stream */
            free(x->deps_out);
            free(x->edges_out);
            size_t k = (size_t)x->ndeps;
            x->deps_out = malloc(sizeof *x->deps_out * (k + 1));
            x->edges_out = calloc(k + 1, sizeof *x->edges_out);
            if (!x->deps_out || !x->edges_out) {
                rc = CUDA_ERROR_OUT_OF_MEMORY;
            } else {
                for (size_t i = 0; i < k; i++) x->deps_out[i] = (CUgraphNode)x->deps[i];
                if (deps) *deps = x->deps_out;
                if (edges) *edges = x->edges_out;
                if (n) *n = k;
            }
        }
    }
    cap_unlock();
    return rc;
}
API CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id) {
    CALLED();
    return capture_info(s, 0, status, id, NULL, NULL, NULL, NULL);
}
API CUresult cuStreamGetCaptureInfo_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id) {
    CALLED();
    return capture_info(s, 1, status, id, NULL, NULL, NULL, NULL);
}
API CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                       const CUgraphNode **deps, size_t *n) {
    CALLED();
    return capture_info(s, 0, status, id, graph, deps, NULL, n);
}
API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                            const CUgraphNode **deps, size_t *n) {
    CALLED();
    return capture_info(s, 1, status, id, graph, deps, NULL, n);
}
API CUresult cuStreamGetCaptureInfo_v3(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                       const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
    CALLED();
    return capture_info(s, 0, status, id, graph, deps, edges, n);
}
API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream s, CUstreamCaptureStatus *status, cuuint64_t *id, CUgraph *graph,
                                            const CUgraphNode **deps, const CUgraphEdgeData **edges, size_t *n) {
    CALLED();
    return capture_info(s, 1, status, id, graph, deps, edges, n);
}

static CUresult update_deps(CUstream s, int pt, CUgraphNode *deps, size_t n, unsigned int flags) {
    UP();
    sc_stream_t *x = stream_of(s, pt);
    if (!x) return CUDA_ERROR_INVALID_CONTEXT;
    if (flags & ~(unsigned)CU_STREAM_SET_CAPTURE_DEPENDENCIES) return CUDA_ERROR_INVALID_VALUE;
    cap_lock();
    CUresult rc = CUDA_SUCCESS;
    if (!x->cap) rc = CUDA_ERROR_ILLEGAL_STATE;
    else if (x->cap->invalid) rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if ((rc = check_deps(x->cap->graph, deps, n)) == CUDA_SUCCESS) {
        if (flags & CU_STREAM_SET_CAPTURE_DEPENDENCIES) stream_set_deps(x, (sc_node_t *const *)deps, (int)n);
        else stream_add_deps(x, (sc_node_t *const *)deps, (int)n);
    }
    cap_unlock();
    return rc;
}
API CUresult cuStreamUpdateCaptureDependencies(CUstream s, CUgraphNode *deps, size_t n, unsigned int flags) {
    CALLED();
    return update_deps(s, 0, deps, n, flags);
}
API CUresult cuStreamUpdateCaptureDependencies_ptsz(CUstream s, CUgraphNode *deps, size_t n, unsigned int flags) {
    CALLED();
    return update_deps(s, 1, deps, n, flags);
}
API CUresult cuStreamUpdateCaptureDependencies_v2(CUstream s, CUgraphNode *deps, const CUgraphEdgeData *edges,
                                                  size_t n, unsigned int flags) {
    CALLED();
    (void)edges;
    return update_deps(s, 0, deps, n, flags);
}
API CUresult cuStreamUpdateCaptureDependencies_v2_ptsz(CUstream s, CUgraphNode *deps, const CUgraphEdgeData *edges,
                                                       size_t n, unsigned int flags) {
    CALLED();
    (void)edges;
    return update_deps(s, 1, deps, n, flags);
}

API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    CALLED();
    if (!mode || (int)*mode < CU_STREAM_CAPTURE_MODE_GLOBAL || *mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    int old = sc_tmode;
    sc_tmode = *mode;
    *mode = (CUstreamCaptureMode)old;
    return CUDA_SUCCESS;
}

API CUresult cuGetExportTable(const void **table, const CUuuid *id) {
    CALLED();
    (void)table; (void)id;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* ------------------------------------------------------------------------------------------------ lookup */
/* cuGetProcAddress: `since` is the CUDA version of each ABI (cudaTypedefs.h PFN_<name>_v<since>); a request for
 * version v gets the newest ABI not newer than v, and the _ptsz one when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * asks for it. */
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
    E("cuDeviceTotalMem", cuDeviceTotalMem, 2000), E("cuDeviceTotalMem", cuDeviceTotalMem_v2, 3020),
    E("cuDeviceGetAttribute", cuDeviceGetAttribute, 2000), E("cuDeviceGetPCIBusId", cuDeviceGetPCIBusId, 4010),
    E("cuDeviceGetByPCIBusId", cuDeviceGetByPCIBusId, 4010),
    E("cuMemAlloc", cuMemAlloc, 2000), E("cuMemAlloc", cuMemAlloc_v2, 3020),
    E("cuMemFree", cuMemFree, 2000), E("cuMemFree", cuMemFree_v2, 3020),
    E("cuMemAllocPitch", cuMemAllocPitch, 2000), E("cuMemAllocPitch", cuMemAllocPitch_v2, 3020),
    E("cuMemAllocManaged", cuMemAllocManaged, 6000),
    E("cuMemGetInfo", cuMemGetInfo, 2000), E("cuMemGetInfo", cuMemGetInfo_v2, 3020),
    E("cuMemGetAddressRange", cuMemGetAddressRange, 2000), E("cuMemGetAddressRange", cuMemGetAddressRange_v2, 3020),
    E("cuMemAllocHost", cuMemAllocHost_v2, 3020), E("cuMemFreeHost", cuMemFreeHost, 2000),
    E("cuMemcpyHtoD", cuMemcpyHtoD_v2, 3020), E("cuMemcpyDtoH", cuMemcpyDtoH_v2, 3020),
    E("cuMemsetD8", cuMemsetD8_v2, 3020),
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
    E("cuMemExportToShareableHandle", cuMemExportToShareableHandle, 10020),
    E("cuMemImportFromShareableHandle", cuMemImportFromShareableHandle, 10020),
    E("cuIpcGetMemHandle", cuIpcGetMemHandle, 4010), E("cuIpcOpenMemHandle", cuIpcOpenMemHandle, 4010),
    E("cuIpcOpenMemHandle", cuIpcOpenMemHandle_v2, 11000), E("cuIpcCloseMemHandle", cuIpcCloseMemHandle, 4010),
    E("cuImportExternalMemory", cuImportExternalMemory, 10000),
    E("cuExternalMemoryGetMappedBuffer", cuExternalMemoryGetMappedBuffer, 10000),
    E("cuDestroyExternalMemory", cuDestroyExternalMemory, 10000),
    E("cuArrayCreate", cuArrayCreate, 2000), E("cuArrayCreate", cuArrayCreate_v2, 3020),
    E("cuArray3DCreate", cuArray3DCreate, 2000), E("cuArray3DCreate", cuArray3DCreate_v2, 3020),
    E("cuArrayDestroy", cuArrayDestroy, 2000), E("cuMipmappedArrayCreate", cuMipmappedArrayCreate, 5000),
    E("cuMipmappedArrayDestroy", cuMipmappedArrayDestroy, 5000),
    E("cuArrayGetMemoryRequirements", cuArrayGetMemoryRequirements, 11060),
    E("cuMipmappedArrayGetMemoryRequirements", cuMipmappedArrayGetMemoryRequirements, 11060),
    E("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain, 7000),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease, 7000),
    E("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2, 11000),
    E("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset, 7000),
    E("cuDevicePrimaryCtxReset", cuDevicePrimaryCtxReset_v2, 11000),
    E("cuDevicePrimaryCtxGetState", cuDevicePrimaryCtxGetState, 7000), E("cuCtxCreate", cuCtxCreate, 2000),
    E("cuCtxCreate", cuCtxCreate_v2, 3020), E("cuCtxCreate", cuCtxCreate_v3, 11040),
    E("cuCtxCreate", cuCtxCreate_v4, 12050),
    E("cuCtxDestroy", cuCtxDestroy_v2, 4000), E("cuCtxSetCurrent", cuCtxSetCurrent, 4000),
    E("cuCtxGetCurrent", cuCtxGetCurrent, 4000), E("cuCtxPushCurrent", cuCtxPushCurrent_v2, 4000),
    E("cuCtxPopCurrent", cuCtxPopCurrent_v2, 4000), E("cuCtxGetDevice", cuCtxGetDevice, 2000),
    E("cuCtxSynchronize", cuCtxSynchronize, 2000),
    E("cuDeviceGetDevResource", cuDeviceGetDevResource, 12040),
    E("cuDevSmResourceSplitByCount", cuDevSmResourceSplitByCount, 12040),
    E("cuDevResourceGenerateDesc", cuDevResourceGenerateDesc, 12040), E("cuGreenCtxCreate", cuGreenCtxCreate, 12040),
    E("cuGreenCtxDestroy", cuGreenCtxDestroy, 12040), E("cuCtxFromGreenCtx", cuCtxFromGreenCtx, 12040),
    E("cuGreenCtxGetDevResource", cuGreenCtxGetDevResource, 12040),
    E("cuGreenCtxStreamCreate", cuGreenCtxStreamCreate, 12050),
    E("cuStreamCreate", cuStreamCreate, 2000), E("cuStreamCreateWithPriority", cuStreamCreateWithPriority, 5050),
    E("cuStreamGetFlags", cuStreamGetFlags, 5050), E("cuStreamDestroy", cuStreamDestroy_v2, 4000),
    E("cuStreamSynchronize", cuStreamSynchronize, 2000), EPT("cuStreamSynchronize", cuStreamSynchronize_ptsz, 7000),
    E("cuStreamQuery", cuStreamQuery, 2000), EPT("cuStreamQuery", cuStreamQuery_ptsz, 7000),
    E("cuStreamWaitEvent", cuStreamWaitEvent, 3020), EPT("cuStreamWaitEvent", cuStreamWaitEvent_ptsz, 7000),
    E("cuStreamBeginCapture", cuStreamBeginCapture, 10000),
    EPT("cuStreamBeginCapture", cuStreamBeginCapture_ptsz, 10000),
    E("cuStreamBeginCapture", cuStreamBeginCapture_v2, 10010),
    EPT("cuStreamBeginCapture", cuStreamBeginCapture_v2_ptsz, 10010),
    E("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph, 12030),
    EPT("cuStreamBeginCaptureToGraph", cuStreamBeginCaptureToGraph_ptsz, 12030),
    E("cuStreamEndCapture", cuStreamEndCapture, 10000), EPT("cuStreamEndCapture", cuStreamEndCapture_ptsz, 10000),
    E("cuStreamIsCapturing", cuStreamIsCapturing, 10000), EPT("cuStreamIsCapturing", cuStreamIsCapturing_ptsz, 10000),
    E("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo, 10010),
    EPT("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_ptsz, 10010),
    E("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2, 11030),
    EPT("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2_ptsz, 11030),
    E("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v3, 12030),
    EPT("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v3_ptsz, 12030),
    E("cuStreamUpdateCaptureDependencies", cuStreamUpdateCaptureDependencies, 11030),
    EPT("cuStreamUpdateCaptureDependencies", cuStreamUpdateCaptureDependencies_ptsz, 11030),
    E("cuStreamUpdateCaptureDependencies", cuStreamUpdateCaptureDependencies_v2, 12030),
    EPT("cuStreamUpdateCaptureDependencies", cuStreamUpdateCaptureDependencies_v2_ptsz, 12030),
    E("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode, 10010),
    E("cuEventCreate", cuEventCreate, 2000), E("cuEventDestroy", cuEventDestroy_v2, 4000),
    E("cuEventRecord", cuEventRecord, 2000), EPT("cuEventRecord", cuEventRecord_ptsz, 7000),
    E("cuEventRecordWithFlags", cuEventRecordWithFlags, 11010),
    EPT("cuEventRecordWithFlags", cuEventRecordWithFlags_ptsz, 11010),
    E("cuEventQuery", cuEventQuery, 2000), E("cuEventSynchronize", cuEventSynchronize, 2000),
    E("cuEventElapsedTime", cuEventElapsedTime, 2000), E("cuEventElapsedTime", cuEventElapsedTime_v2, 12080),
    E("cuModuleLoad", cuModuleLoad, 2000), E("cuModuleLoadData", cuModuleLoadData, 2000),
    E("cuModuleLoadDataEx", cuModuleLoadDataEx, 2010), E("cuModuleUnload", cuModuleUnload, 2000),
    E("cuModuleGetFunction", cuModuleGetFunction, 2000), E("cuLaunchKernel", cuLaunchKernel, 4000),
    EPT("cuLaunchKernel", cuLaunchKernel_ptsz, 7000), E("cuLaunchKernelEx", cuLaunchKernelEx, 11060),
    EPT("cuLaunchKernelEx", cuLaunchKernelEx_ptsz, 11060),
    E("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel, 9000),
    EPT("cuLaunchCooperativeKernel", cuLaunchCooperativeKernel_ptsz, 9000),
    E("cuLaunchCooperativeKernelMultiDevice", cuLaunchCooperativeKernelMultiDevice, 9000),
    E("cuFuncSetBlockShape", cuFuncSetBlockShape, 2000), E("cuFuncSetSharedSize", cuFuncSetSharedSize, 2000),
    E("cuParamSetSize", cuParamSetSize, 2000), E("cuParamSeti", cuParamSeti, 2000), E("cuParamSetf", cuParamSetf, 2000),
    E("cuParamSetv", cuParamSetv, 2000), E("cuLaunch", cuLaunch, 2000), E("cuLaunchGrid", cuLaunchGrid, 2000),
    E("cuLaunchGridAsync", cuLaunchGridAsync, 2000),
    E("cuGraphCreate", cuGraphCreate, 10000), E("cuGraphDestroy", cuGraphDestroy, 10000),
    E("cuGraphAddKernelNode", cuGraphAddKernelNode_v2, 12000), E("cuGraphAddEmptyNode", cuGraphAddEmptyNode, 10000),
    E("cuGraphAddEventRecordNode", cuGraphAddEventRecordNode, 11010),
    E("cuGraphAddEventWaitNode", cuGraphAddEventWaitNode, 11010),
    E("cuGraphAddMemAllocNode", cuGraphAddMemAllocNode, 11040),
    E("cuGraphAddMemFreeNode", cuGraphAddMemFreeNode, 11040),
    E("cuGraphMemAllocNodeGetParams", cuGraphMemAllocNodeGetParams, 11040),
    E("cuGraphMemFreeNodeGetParams", cuGraphMemFreeNodeGetParams, 11040),
    E("cuDeviceGraphMemTrim", cuDeviceGraphMemTrim, 11040),
    E("cuDeviceGetGraphMemAttribute", cuDeviceGetGraphMemAttribute, 11040),
    E("cuDeviceSetGraphMemAttribute", cuDeviceSetGraphMemAttribute, 11040),
    E("cuGraphGetNodes", cuGraphGetNodes, 10000), E("cuGraphNodeGetType", cuGraphNodeGetType, 10000),
    E("cuGraphInstantiate", cuGraphInstantiate, 10000), E("cuGraphInstantiate", cuGraphInstantiate_v2, 11000),
    E("cuGraphInstantiate", cuGraphInstantiateWithFlags, 12000),
    E("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags, 11040),
    E("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams, 12000),
    EPT("cuGraphInstantiateWithParams", cuGraphInstantiateWithParams_ptsz, 12000),
    E("cuGraphExecDestroy", cuGraphExecDestroy, 10000),
    E("cuGraphLaunch", cuGraphLaunch, 10000), EPT("cuGraphLaunch", cuGraphLaunch_ptsz, 10000),
    E("cuGraphUpload", cuGraphUpload, 11010), EPT("cuGraphUpload", cuGraphUpload_ptsz, 11010),
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
    CALLED();
    return lookup(symbol, pfn, version, flags, status);
}
API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    CALLED();
    return lookup(symbol, pfn, version, flags, NULL);
}

/* ------------------------------------------------------------------------------------------------ test helpers */
/* The state named by SIMGPU_STATE / SIMGPU_DEVICES now: a test process may switch both between calls. */
static int helper_attach(void) {
    if (!sc_up) {
        gs_follow_state();
        gs_nview = gs_nall = -1;
    }
    return gs_attach_gpus();
}
/* GPU `dev` as listed in SIMGPU_DEVICES (whatever CUDA's order and CUDA_VISIBLE_DEVICES make of it) */
static gs_gpu_t *helper_gpu(int dev) {
    if (helper_attach() || dev < 0 || dev >= gs_nall || gs_all[dev].slot < 0) return NULL;
    return &gs_st->gpu[gs_all[dev].slot];
}
API uint64_t simgpu_now_ns(void) { return gs_clock(); }
/* Busy ns of GPU `dev` (index in SIMGPU_DEVICES) over [t0, t1): all work (pid 0) or the work of one process. */
API uint64_t simgpu_busy_ns(int dev, int pid, uint64_t t0, uint64_t t1) {
    gs_gpu_t *g = helper_gpu(dev);
    if (!g) return 0;
    gs_ts_catch_up(g);
    if (!pid) return gs_tl_sum(g->tl, GS_DEV_BINS, GS_DEV_TICK, t0, t1);
    uint64_t sum = 0;
    for (int i = 0; i < GS_NPROC; i++)
        if (gs_st->proc[i].owner == pid)
            sum += gs_tl_sum(gs_st->proc[i].tl[gs_all[dev].slot], GS_PROC_BINS, GS_PROC_TICK, t0, t1);
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
/* Capture sequences invalidated in this process so far. */
API uint64_t simgpu_capture_invalidations(void) { return __atomic_load_n(&sc_invalidations, __ATOMIC_RELAXED); }
/* calls in this process that used an event whose context was destroyed (each refused, see events_die) */
API uint64_t simgpu_dead_event_uses(void) { return __atomic_load_n(&sc_dead_event_uses, __ATOMIC_RELAXED); }
/* Calls of exported entry point `name` (its symbol name, e.g. "cuMemAlloc_v2") in this process so far; calls the
 * simulator makes to itself do not count, calls through a cuGetProcAddress pointer do. */
API uint64_t simgpu_calls(const char *name) {
    uint64_t n = 0;
    for (sc_count_t *c = __start_sgcalls; name && c < __stop_sgcalls; c++)
        if (!strcmp(c->name, name)) n += __atomic_load_n(&c->n, __ATOMIC_RELAXED);
    return n;
}
API uint64_t simgpu_calls_total(void) {
    uint64_t n = 0;
    for (sc_count_t *c = __start_sgcalls; c < __stop_sgcalls; c++) n += __atomic_load_n(&c->n, __ATOMIC_RELAXED);
    return n;
}
/* Sets every call counter back to 0. */
API void simgpu_calls_reset(void) {
    for (sc_count_t *c = __start_sgcalls; c < __stop_sgcalls; c++) __atomic_store_n(&c->n, 0, __ATOMIC_RELAXED);
}

/* SIMGPU_CALLS_DUMP=<file>: at exit, append "<pid> <entry point> <calls>" for every entry point called */
static void calls_dump(void) {
    const char *path = getenv("SIMGPU_CALLS_DUMP");
    FILE *f = path && *path ? fopen(path, "ae") : NULL;
    if (!f) return;
    for (sc_count_t *c = __start_sgcalls; c < __stop_sgcalls; c++) {
        uint64_t n = __atomic_load_n(&c->n, __ATOMIC_RELAXED);
        if (n) fprintf(f, "%d %s %llu\n", (int)getpid(), c->name, (unsigned long long)n);
    }
    fclose(f);
}
__attribute__((constructor)) static void calls_dump_at_exit(void) {
    if (getenv("SIMGPU_CALLS_DUMP")) atexit(calls_dump);
}
