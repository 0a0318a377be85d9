/*
 * sim_entry.c - drives the simulated libcuda's old and less common entry points directly (no libvgpu.so): the v1
 * (CUDA 2.x) memory API, the old launch API, multi-device cooperative launches, graph memory nodes, IPC, shareable
 * handles, external memory, green contexts, primary context reset, address ranges and cuGetProcAddress versions.
 * Each sub-command prints key=value lines for tests/isolation/test_sim_entry_points.py.
 */
#define _GNU_SOURCE
#define CUDA_ENABLE_DEPRECATED 1
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* the v1 ABIs (cudaTypedefs.h PFN_*_v2000): 32-bit device pointers and sizes */
#undef cuMemAlloc
#undef cuMemAllocPitch
#undef cuMemFree
#undef cuMemGetInfo
#undef cuDeviceTotalMem
#undef cuCtxCreate
#undef cuArrayCreate
#undef cuArray3DCreate
#undef cuMemGetAddressRange
#undef cuGetProcAddress
#undef cuIpcOpenMemHandle
#undef cuDevicePrimaryCtxReset
typedef unsigned int dptr32;
typedef struct { unsigned int Width, Height; CUarray_format Format; unsigned int NumChannels; } desc1_t;
typedef struct { unsigned int Width, Height, Depth; CUarray_format Format; unsigned int NumChannels, Flags; } desc3_t;
CUresult cuMemAlloc(dptr32 *p, unsigned int bytes);
CUresult cuMemAllocPitch(dptr32 *p, unsigned int *pitch, unsigned int w, unsigned int h, unsigned int elem);
CUresult cuMemFree(dptr32 p);
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total);
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev);
CUresult cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev);
CUresult cuArrayCreate(CUarray *a, const desc1_t *d);
CUresult cuArray3DCreate(CUarray *a, const desc3_t *d);
CUresult cuMemGetAddressRange(dptr32 *base, unsigned int *size, dptr32 p);
CUresult cuGetProcAddress(const char *symbol, void **fn, int version, cuuint64_t flags);
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);

#define P(key, fmt, ...) printf(key "=" fmt "\n", __VA_ARGS__)
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(3); } } while (0)
#define MiB (1ULL << 20)

static uint64_t (*h_used)(int);
static uint64_t (*h_busy)(int, int, uint64_t, uint64_t);
static uint64_t (*h_now)(void);
static uint64_t (*h_launches)(int);
static CUcontext ctx;
static CUmodule mod;

static void setup(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    h_used = (uint64_t (*)(int))dlsym(h, "simgpu_used_bytes");
    h_busy = (uint64_t (*)(int, int, uint64_t, uint64_t))dlsym(h, "simgpu_busy_ns");
    h_now = (uint64_t (*)(void))dlsym(h, "simgpu_now_ns");
    h_launches = (uint64_t (*)(int))dlsym(h, "simgpu_launches");
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, "simgpu-module\nfixed1 fixed 1ms\n"));
}
static unsigned long long used(void) { return (unsigned long long)h_used(0); }

static int cmd_v1(void) {
    setup();
    unsigned long long u0 = used();
    dptr32 p = 0;
    CK(cuMemAlloc(&p, 3 * MiB));
    P("v1_ptr_nonzero", "%d", p != 0);
    P("v1_used", "%llu", used() - u0);
    dptr32 base = 0;
    unsigned int size = 0;
    CK(cuMemGetAddressRange(&base, &size, p + 4096));
    P("v1_range", "%d,%u", base == p, size);
    CUdeviceptr b64 = 0;
    size_t s64 = 0;
    CK(cuMemGetAddressRange_v2(&b64, &s64, (CUdeviceptr)p + 100));
    P("v2_range_of_v1", "%d,%zu", b64 == p, s64);
    CK(cuMemFree(p));
    P("v1_freed_used", "%llu", used() - u0);
    dptr32 pp = 0;
    unsigned int pitch = 0;
    CK(cuMemAllocPitch(&pp, &pitch, 1000, 100, 4));
    P("v1_pitch", "%u", pitch);
    P("v1_pitch_used", "%llu", used() - u0);
    CK(cuMemFree(pp));
    unsigned int fr = 0, tot = 0, dt = 0;
    CK(cuMemGetInfo(&fr, &tot));
    CK(cuDeviceTotalMem(&dt, 0));
    P("v1_info", "%u,%u,%u", fr, tot, dt);
    size_t fr2 = 0, tot2 = 0;
    CK(cuMemGetInfo_v2(&fr2, &tot2));
    P("v2_info", "%zu,%zu", fr2, tot2);
    CUcontext c1;
    CK(cuCtxCreate(&c1, 0, 0));
    CUcontext cur;
    CK(cuCtxGetCurrent(&cur));
    P("v1_ctx_current", "%d", cur == c1);
    CUdeviceptr q;
    CK(cuMemAlloc_v2(&q, 5 * MiB));
    P("ctx_alloc_used", "%llu", used() - u0);
    CK(cuCtxDestroy(c1));
    P("ctx_destroyed_used", "%llu", used() - u0);
    CK(cuCtxSetCurrent(ctx));
    CUarray a, a3;
    desc1_t d1 = {1000, 10, CU_AD_FORMAT_FLOAT, 1};
    desc3_t d3 = {100, 10, 4, CU_AD_FORMAT_UNSIGNED_INT8, 4, 0};
    CK(cuArrayCreate(&a, &d1));
    P("v1_array_used", "%llu", used() - u0);
    CK(cuArray3DCreate(&a3, &d3));
    P("v1_array3d_used", "%llu", used() - u0);
    CK(cuArrayDestroy(a));
    CK(cuArrayDestroy(a3));
    P("arrays_freed_used", "%llu", used() - u0);
    return 0;
}

static int cmd_oldlaunch(void) {
    setup();
    CUfunction sl, blk;
    CK(cuModuleGetFunction(&sl, mod, "sleep"));
    CK(cuModuleGetFunction(&blk, mod, "blk_100000"));
    uint64_t ns = 30000000;
    CK(cuFuncSetBlockShape(sl, 128, 1, 1));
    CK(cuParamSetSize(sl, 8));
    CK(cuParamSetv(sl, 0, &ns, 8));
    uint64_t before = h_launches(0), t0 = h_now();
    CK(cuLaunch(sl));
    CK(cuCtxSynchronize());
    P("launch_busy_ms", "%.1f", (double)h_busy(0, 0, t0, h_now() + 1000000) / 1e6);
    CK(cuParamSeti(sl, 0, 10000000u));   /* the low 4 bytes: 10 ms */
    CK(cuParamSeti(sl, 4, 0u));
    t0 = h_now();
    CK(cuLaunchGrid(sl, 1, 1));
    CK(cuCtxSynchronize());
    P("launch_grid_seti_busy_ms", "%.1f", (double)h_busy(0, 0, t0, h_now() + 1000000) / 1e6);
    CK(cuFuncSetBlockShape(blk, 32, 1, 1));
    t0 = h_now();
    CK(cuLaunchGrid(blk, 4, 5));
    CK(cuCtxSynchronize());
    P("launch_grid_blocks_busy_ms", "%.1f", (double)h_busy(0, 0, t0, h_now() + 1000000) / 1e6);
    CUstream s;
    CK(cuStreamCreate(&s, 0));
    t0 = h_now();
    CK(cuLaunchGridAsync(blk, 10, 1, s));
    CK(cuStreamSynchronize(s));
    P("launch_grid_async_busy_ms", "%.1f", (double)h_busy(0, 0, t0, h_now() + 1000000) / 1e6);
    P("launches", "%llu", (unsigned long long)(h_launches(0) - before));
    P("bad_shape", "%d", (int)cuFuncSetBlockShape(sl, 0, 1, 1));
    P("bad_param", "%d", (int)cuParamSetv(sl, 4094, &ns, 8));
    P("bad_grid", "%d", (int)cuLaunchGrid(sl, 0, 1));
    float f = 1.5f;
    P("param_f", "%d", (int)cuParamSetf(sl, 8, f));
    return 0;
}

static int cmd_multidev(void) {
    setup();
    int n = 0;
    CK(cuDeviceGetCount(&n));
    CUcontext c1;
    CK(cuDevicePrimaryCtxRetain(&c1, 1));
    CUstream s0, s1;
    CK(cuStreamCreate(&s0, 0));
    CK(cuCtxSetCurrent(c1));
    CK(cuStreamCreate(&s1, 0));
    CK(cuCtxSetCurrent(ctx));
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, "sleep"));
    uint64_t ns = 5000000;
    void *args[] = {&ns};
    CUDA_LAUNCH_PARAMS lp[2];
    memset(lp, 0, sizeof lp);
    for (int i = 0; i < 2; i++) {
        lp[i].function = f;
        lp[i].gridDimX = lp[i].gridDimY = lp[i].gridDimZ = 1;
        lp[i].blockDimX = lp[i].blockDimY = lp[i].blockDimZ = 32;
        lp[i].kernelParams = args;
    }
    lp[0].hStream = s0;
    lp[1].hStream = s1;
    uint64_t l0 = h_launches(0), l1 = h_launches(1);
    CK(cuLaunchCooperativeKernelMultiDevice(lp, 2, 0));
    P("devices", "%d", n);
    P("launched", "%llu,%llu", (unsigned long long)(h_launches(0) - l0), (unsigned long long)(h_launches(1) - l1));
    lp[1].hStream = s0;
    P("same_device", "%d", (int)cuLaunchCooperativeKernelMultiDevice(lp, 2, 0));
    lp[1].hStream = NULL;
    P("null_stream", "%d", (int)cuLaunchCooperativeKernelMultiDevice(lp, 2, 0));
    lp[1].hStream = s1;
    lp[1].gridDimX = 2;
    P("grid_mismatch", "%d", (int)cuLaunchCooperativeKernelMultiDevice(lp, 2, 0));
    return 0;
}

static int cmd_graphmem(void) {
    setup();
    unsigned long long u0 = used();
    CUgraph g;
    CK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.poolProps.location.id = 0;
    ap.bytesize = 10 * MiB;
    CUgraphNode an, kn, fn;
    CK(cuGraphAddMemAllocNode(&an, g, NULL, 0, &ap));
    CUdeviceptr addr = ap.dptr;
    P("alloc_addr_nonzero", "%d", addr != 0);
    P("after_add_used", "%llu", used() - u0);
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, "fixed1"));
    CUDA_KERNEL_NODE_PARAMS kp;
    memset(&kp, 0, sizeof kp);
    kp.func = f;
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1;
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1;
    CK(cuGraphAddKernelNode(&kn, g, &an, 1, &kp));
    CK(cuGraphAddMemFreeNode(&fn, g, &kn, 1, addr));
    CUdeviceptr got = 0;
    CK(cuGraphMemFreeNodeGetParams(fn, &got));
    P("free_node_addr", "%d", got == addr);
    CUDA_MEM_ALLOC_NODE_PARAMS back;
    CK(cuGraphMemAllocNodeGetParams(an, &back));
    P("alloc_node_params", "%d,%zu", back.dptr == addr, back.bytesize);
    P("free_twice", "%d", (int)cuGraphAddMemFreeNode(&fn, g, &kn, 1, addr));
    P("free_not_graph", "%d", (int)cuGraphAddMemFreeNode(&fn, g, NULL, 0, 12345));
    CUgraphExec ex, ex2;
    CK(cuGraphInstantiateWithFlags(&ex, g, 0));
    P("after_instantiate_used", "%llu", used() - u0);
    P("second_instantiation", "%d", (int)cuGraphInstantiateWithFlags(&ex2, g, 0));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuGraphUpload(ex, s));
    P("after_upload_used", "%llu", used() - u0);
    CK(cuGraphLaunch(ex, s));
    CK(cuGraphLaunch(ex, s));
    CK(cuStreamSynchronize(s));
    P("after_launch_used", "%llu", used() - u0);
    cuuint64_t v = 0;
    CK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v));
    P("attr_reserved", "%llu", (unsigned long long)v);
    CK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v));
    P("attr_used", "%llu", (unsigned long long)v);
    CK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &v));
    P("attr_used_high", "%llu", (unsigned long long)v);
    CK(cuDeviceGraphMemTrim(0));
    P("after_trim_used", "%llu", used() - u0);
    CK(cuGraphExecDestroy(ex));
    CK(cuGraphDestroy(g));
    /* an allocation the graph does not free, auto-freed on relaunch */
    CUgraph g2;
    CK(cuGraphCreate(&g2, 0));
    ap.bytesize = 4 * MiB;
    CK(cuGraphAddMemAllocNode(&an, g2, NULL, 0, &ap));
    CUgraphExec ex3;
    CK(cuGraphInstantiateWithFlags(&ex3, g2, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    CK(cuGraphLaunch(ex3, s));
    CK(cuGraphLaunch(ex3, s));
    CK(cuStreamSynchronize(s));
    CK(cuDeviceGetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &v));
    P("auto_free_used", "%llu", (unsigned long long)v);
    CK(cuGraphExecDestroy(ex3));
    CK(cuGraphDestroy(g2));
    P("graph_gone_allocation_live", "%llu", used() - u0);
    CK(cuMemFreeAsync(ap.dptr, s));
    CK(cuStreamSynchronize(s));
    CK(cuDeviceGraphMemTrim(0));
    P("final_used", "%llu", used() - u0);
    return 0;
}

static void hexout(const char *key, const void *p, size_t n) {
    printf("%s=", key);
    for (size_t i = 0; i < n; i++) printf("%02x", ((const unsigned char *)p)[i]);
    printf("\n");
}
static void hexin(const char *s, void *p, size_t n) {
    for (size_t i = 0; i < n && s[2 * i]; i++) sscanf(s + 2 * i, "%2hhx", (unsigned char *)p + i);
}
static void wait_line(void) {
    char line[64];
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin)) {}
}

static int cmd_ipc_export(void) {
    setup();
    CUdeviceptr p, q;
    CK(cuMemAlloc_v2(&p, 6 * MiB));
    CK(cuMemAllocAsync(&q, 2 * MiB, NULL));
    CUipcMemHandle h;
    CK(cuIpcGetMemHandle(&h, p));
    hexout("handle", &h, sizeof h);
    P("async_handle", "%d", (int)cuIpcGetMemHandle(&h, q));
    CUdeviceptr mine;
    P("open_own", "%d", (int)cuIpcOpenMemHandle_v2(&mine, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    P("used", "%llu", used());
    wait_line();   /* the importer runs */
    CK(cuMemFree_v2(p));
    P("freed", "%d", 1);
    wait_line();
    return 0;
}
static int cmd_ipc_import(const char *hex) {
    setup();
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    hexin(hex, &h, sizeof h);
    unsigned long long u0 = used();
    CUdeviceptr a = 0, b = 0;
    P("flags_zero", "%d", (int)cuIpcOpenMemHandle_v2(&a, h, 0));
    CK(cuIpcOpenMemHandle_v2(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CK(cuIpcOpenMemHandle(&b, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    P("same_address", "%d", a == b && a);
    P("used_delta", "%llu", used() - u0);
    CUdeviceptr base;
    size_t size;
    CK(cuMemGetAddressRange_v2(&base, &size, a + 100));
    P("range", "%d,%zu", base == a, size);
    CK(cuIpcCloseMemHandle(a));
    CK(cuIpcCloseMemHandle(b));
    P("close_again", "%d", (int)cuIpcCloseMemHandle(a));
    return 0;
}
static int cmd_ipc_stale(const char *hex) {
    setup();
    CUipcMemHandle h;
    memset(&h, 0, sizeof h);
    hexin(hex, &h, sizeof h);
    CUdeviceptr a = 0;
    P("open_stale", "%d", (int)cuIpcOpenMemHandle_v2(&a, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    return 0;
}

static CUmemAllocationProp vmm_prop(int fd_type) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    prop.requestedHandleTypes = fd_type ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    return prop;
}
static int cmd_share_export(void) {
    setup();
    CUmemAllocationProp prop = vmm_prop(1), plain = vmm_prop(0);
    CUmemGenericAllocationHandle h, h2, again;
    CK(cuMemCreate(&h, 8 * MiB, &prop, 0));
    CK(cuMemCreate(&h2, 2 * MiB, &plain, 0));
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    P("fd", "%d", fd);
    P("pid", "%d", (int)getpid());
    P("not_requested", "%d", (int)cuMemExportToShareableHandle(&fd, h2, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    P("fabric", "%d", (int)cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_FABRIC, 0));
    CK(cuMemImportFromShareableHandle(&again, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    P("own_import_same", "%d", again == h);
    CK(cuMemRelease(again));
    P("used", "%llu", used());
    wait_line();
    CK(cuMemRelease(h));
    P("released", "%d", 1);
    wait_line();
    return 0;
}
static int cmd_share_import(int fd) {
    setup();
    unsigned long long u0 = used();
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    P("import_used_delta", "%llu", used() - u0);
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0));
    CK(cuMemMap(va, 8 * MiB, 0, h, 0));
    P("mapped_used_delta", "%llu", used() - u0);
    CK(cuMemUnmap(va, 8 * MiB));
    CK(cuMemRelease(h));
    P("released_used_delta", "%llu", used() - u0);
    /* external memory over a simulator export: the same allocation, no new memory */
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = dup(fd);
    d.size = 8 * MiB;
    CUexternalMemory em;
    CK(cuImportExternalMemory(&em, &d));
    P("ext_over_export_used_delta", "%llu", used() - u0);
    CK(cuDestroyExternalMemory(em));
    return 0;
}
static int cmd_share_stale(int fd) {
    setup();
    CUmemGenericAllocationHandle h;
    P("import_stale", "%d", (int)cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                                                  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    return 0;
}

static int cmd_extmem(void) {
    setup();
    unsigned long long u0 = used();
    int fd = memfd_create("vulkan-stand-in", 0);
    if (ftruncate(fd, 8 * MiB)) return 4;
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    d.size = 7 * MiB;
    CUexternalMemory em;
    CK(cuImportExternalMemory(&em, &d));
    P("import_used", "%llu", used() - u0);
    P("fd_closed", "%d", fcntl(fd, F_GETFD) < 0 && errno == EBADF);
    CUDA_EXTERNAL_MEMORY_BUFFER_DESC bd;
    memset(&bd, 0, sizeof bd);
    bd.offset = 1 * MiB;
    bd.size = 4 * MiB;
    CUdeviceptr p;
    CK(cuExternalMemoryGetMappedBuffer(&p, em, &bd));
    P("mapped_used", "%llu", used() - u0);
    bd.size = 16 * MiB;
    CUdeviceptr big;
    P("map_too_big", "%d", (int)cuExternalMemoryGetMappedBuffer(&big, em, &bd));
    CK(cuMemFree_v2(p));
    CK(cuDestroyExternalMemory(em));
    P("destroyed_used", "%llu", used() - u0);
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_D3D12_HEAP;
    P("d3d12", "%d", (int)cuImportExternalMemory(&em, &d));
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = memfd_create("too-big", 0);
    d.size = 1ULL << 50;
    P("import_too_big", "%d", (int)cuImportExternalMemory(&em, &d));
    return 0;
}

static int cmd_green(void) {
    setup();
    unsigned long long u0 = used();
    CUdevResource all;
    CK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    P("sms", "%u,%u,%u", all.sm.smCount, all.sm.minSmPartitionSize, all.sm.smCoscheduledAlignment);
    unsigned n = 0;
    CK(cuDevSmResourceSplitByCount(NULL, &n, &all, NULL, 0, 16));
    P("groups_query", "%u", n);
    CUdevResource groups[8], rest;
    n = 2;
    CK(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 15));
    P("groups", "%u,%u,%u", n, groups[0].sm.smCount, rest.sm.smCount);
    P("too_many_sms", "%d", (int)cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 1000));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, groups, 2));
    CUdevResource other[1];
    unsigned one = 1;
    CK(cuDevSmResourceSplitByCount(other, &one, &all, NULL, 0, 8));
    CUdevResource mixed[2] = {groups[0], other[0]};
    CUdevResourceDesc bad;
    P("mixed_splits", "%d", (int)cuDevResourceGenerateDesc(&bad, mixed, 2));
    CUgreenCtx gc;
    P("no_default_stream_flag", "%d", (int)cuGreenCtxCreate(&gc, desc, 0, 0));
    CK(cuGreenCtxCreate(&gc, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CUdevResource mine;
    CK(cuGreenCtxGetDevResource(gc, &mine, CU_DEV_RESOURCE_TYPE_SM));
    P("green_sms", "%u", mine.sm.smCount);
    CUcontext gctx;
    CK(cuCtxFromGreenCtx(&gctx, gc));
    CK(cuCtxSetCurrent(gctx));
    CUdevice dev = -1;
    CK(cuCtxGetDevice(&dev));
    P("green_device", "%d", dev);
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, 4 * MiB));
    P("green_alloc_used", "%llu", used() - u0);
    CUstream s;
    P("stream_blocking", "%d", (int)cuGreenCtxStreamCreate(&s, gc, 0, 0));
    CK(cuGreenCtxStreamCreate(&s, gc, CU_STREAM_NON_BLOCKING, 0));
    CUfunction f;
    CK(cuModuleGetFunction(&f, mod, "fixed1"));
    uint64_t l0 = h_launches(0);
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CK(cuStreamSynchronize(s));
    P("green_launches", "%llu", (unsigned long long)(h_launches(0) - l0));
    CK(cuCtxSetCurrent(ctx));
    CK(cuDevicePrimaryCtxReset_v2(0));
    P("after_reset_used", "%llu", used() - u0);
    CK(cuStreamDestroy(s));
    CK(cuGreenCtxDestroy(gc));
    return 0;
}

static int cmd_reset(void) {
    setup();
    unsigned long long u0 = used();
    CUdeviceptr a, b, c, asy;
    CK(cuMemAlloc_v2(&a, 4 * MiB));
    CK(cuMemAllocManaged(&b, 2 * MiB, CU_MEM_ATTACH_GLOBAL));
    size_t pitch;
    CK(cuMemAllocPitch_v2(&c, &pitch, 4096, 256, 4));
    CUarray arr;
    CUDA_ARRAY_DESCRIPTOR d = {1024, 1024, CU_AD_FORMAT_FLOAT, 1};
    CK(cuArrayCreate_v2(&arr, &d));
    CK(cuMemAllocAsync(&asy, 8 * MiB, NULL));
    P("before_reset", "%llu", used() - u0);
    CK(cuDevicePrimaryCtxReset(0));
    P("after_reset", "%llu", used() - u0);
    unsigned flags;
    int active;
    CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    P("still_active", "%d", active);
    P("free_after_reset", "%d", (int)cuMemFree_v2(a));
    CK(cuMemFreeAsync(asy, NULL));
    P("end", "%llu", used() - u0);
    return 0;
}

typedef struct { const char *symbol; int version; int ptsz; const char *expect; } pa_t;
static int cmd_procaddr(void) {
    setup();
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    static const pa_t cases[] = {
        {"cuMemAlloc", 2000, 0, "cuMemAlloc"}, {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
        {"cuMemAlloc", 13000, 0, "cuMemAlloc_v2"}, {"cuMemFree", 2000, 0, "cuMemFree"},
        {"cuMemGetInfo", 3010, 0, "cuMemGetInfo"}, {"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2"},
        {"cuDeviceTotalMem", 2000, 0, "cuDeviceTotalMem"}, {"cuCtxCreate", 2000, 0, "cuCtxCreate"},
        {"cuCtxCreate", 3020, 0, "cuCtxCreate_v2"}, {"cuArrayCreate", 2000, 0, "cuArrayCreate"},
        {"cuArray3DCreate", 3020, 0, "cuArray3DCreate_v2"}, {"cuMemAllocPitch", 2000, 0, "cuMemAllocPitch"},
        {"cuMemGetAddressRange", 2000, 0, "cuMemGetAddressRange"},
        {"cuMemGetAddressRange", 3020, 0, "cuMemGetAddressRange_v2"},
        {"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture"},
        {"cuStreamBeginCapture", 10010, 0, "cuStreamBeginCapture_v2"},
        {"cuStreamBeginCapture", 10000, 1, "cuStreamBeginCapture_ptsz"},
        {"cuStreamBeginCapture", 12000, 1, "cuStreamBeginCapture_v2_ptsz"},
        {"cuStreamBeginCaptureToGraph", 12030, 0, "cuStreamBeginCaptureToGraph"},
        {"cuStreamBeginCaptureToGraph", 12020, 0, NULL},
        {"cuStreamEndCapture", 10000, 1, "cuStreamEndCapture_ptsz"},
        {"cuStreamIsCapturing", 10000, 0, "cuStreamIsCapturing"},
        {"cuStreamGetCaptureInfo", 10010, 0, "cuStreamGetCaptureInfo"},
        {"cuStreamGetCaptureInfo", 11030, 0, "cuStreamGetCaptureInfo_v2"},
        {"cuStreamGetCaptureInfo", 12030, 1, "cuStreamGetCaptureInfo_v3_ptsz"},
        {"cuThreadExchangeStreamCaptureMode", 10010, 0, "cuThreadExchangeStreamCaptureMode"},
        {"cuStreamWaitEvent", 3020, 0, "cuStreamWaitEvent"}, {"cuStreamWaitEvent", 7000, 1, "cuStreamWaitEvent_ptsz"},
        {"cuGraphInstantiate", 10000, 0, "cuGraphInstantiate"}, {"cuGraphInstantiate", 11000, 0, "cuGraphInstantiate_v2"},
        {"cuGraphInstantiate", 12000, 0, "cuGraphInstantiateWithFlags"},
        {"cuGraphAddMemAllocNode", 11040, 0, "cuGraphAddMemAllocNode"}, {"cuGraphAddMemAllocNode", 11030, 0, NULL},
        {"cuGraphAddMemFreeNode", 11040, 0, "cuGraphAddMemFreeNode"}, {"cuDeviceGraphMemTrim", 11040, 0, "cuDeviceGraphMemTrim"},
        {"cuIpcGetMemHandle", 4010, 0, "cuIpcGetMemHandle"}, {"cuIpcOpenMemHandle", 4010, 0, "cuIpcOpenMemHandle"},
        {"cuIpcOpenMemHandle", 11000, 0, "cuIpcOpenMemHandle_v2"}, {"cuIpcCloseMemHandle", 4010, 0, "cuIpcCloseMemHandle"},
        {"cuMemExportToShareableHandle", 10020, 0, "cuMemExportToShareableHandle"},
        {"cuMemImportFromShareableHandle", 10020, 0, "cuMemImportFromShareableHandle"},
        {"cuImportExternalMemory", 10000, 0, "cuImportExternalMemory"},
        {"cuExternalMemoryGetMappedBuffer", 10000, 0, "cuExternalMemoryGetMappedBuffer"},
        {"cuDestroyExternalMemory", 10000, 0, "cuDestroyExternalMemory"},
        {"cuDeviceGetDevResource", 12040, 0, "cuDeviceGetDevResource"},
        {"cuDevSmResourceSplitByCount", 12040, 0, "cuDevSmResourceSplitByCount"},
        {"cuDevResourceGenerateDesc", 12040, 0, "cuDevResourceGenerateDesc"},
        {"cuGreenCtxCreate", 12040, 0, "cuGreenCtxCreate"}, {"cuGreenCtxDestroy", 12040, 0, "cuGreenCtxDestroy"},
        {"cuCtxFromGreenCtx", 12040, 0, "cuCtxFromGreenCtx"}, {"cuGreenCtxStreamCreate", 12050, 0, "cuGreenCtxStreamCreate"},
        {"cuGreenCtxStreamCreate", 12040, 0, NULL},
        {"cuDevicePrimaryCtxReset", 7000, 0, "cuDevicePrimaryCtxReset"},
        {"cuDevicePrimaryCtxReset", 11000, 0, "cuDevicePrimaryCtxReset_v2"},
        {"cuFuncSetBlockShape", 2000, 0, "cuFuncSetBlockShape"}, {"cuParamSetSize", 2000, 0, "cuParamSetSize"},
        {"cuParamSetv", 2000, 0, "cuParamSetv"}, {"cuParamSeti", 2000, 0, "cuParamSeti"}, {"cuLaunch", 2000, 0, "cuLaunch"},
        {"cuLaunchGrid", 2000, 0, "cuLaunchGrid"}, {"cuLaunchGridAsync", 2000, 0, "cuLaunchGridAsync"},
        {"cuLaunchCooperativeKernelMultiDevice", 9000, 0, "cuLaunchCooperativeKernelMultiDevice"},
    };
    int bad = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        CUresult r = cuGetProcAddress_v2(cases[i].symbol, &fn, cases[i].version,
                                         cases[i].ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0, &st);
        void *want = cases[i].expect ? dlsym(lib, cases[i].expect) : NULL;
        int ok = cases[i].expect ? (r == CUDA_SUCCESS && fn == want && want) : (r == CUDA_ERROR_NOT_FOUND && !fn &&
                                                                                  st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
        if (!ok) {
            printf("mismatch=%s@%d%s\n", cases[i].symbol, cases[i].version, cases[i].ptsz ? "/ptsz" : "");
            bad++;
        }
    }
    P("procaddr_cases", "%zu", sizeof cases / sizeof cases[0]);
    P("procaddr_bad", "%d", bad);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(cmd, "v1")) return cmd_v1();
    if (!strcmp(cmd, "oldlaunch")) return cmd_oldlaunch();
    if (!strcmp(cmd, "multidev")) return cmd_multidev();
    if (!strcmp(cmd, "graphmem")) return cmd_graphmem();
    if (!strcmp(cmd, "ipc_export")) return cmd_ipc_export();
    if (!strcmp(cmd, "ipc_import")) return cmd_ipc_import(arg);
    if (!strcmp(cmd, "ipc_stale")) return cmd_ipc_stale(arg);
    if (!strcmp(cmd, "share_export")) return cmd_share_export();
    if (!strcmp(cmd, "share_import")) return cmd_share_import(atoi(arg));
    if (!strcmp(cmd, "share_stale")) return cmd_share_stale(atoi(arg));
    if (!strcmp(cmd, "extmem")) return cmd_extmem();
    if (!strcmp(cmd, "green")) return cmd_green();
    if (!strcmp(cmd, "reset")) return cmd_reset();
    if (!strcmp(cmd, "procaddr")) return cmd_procaddr();
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}
