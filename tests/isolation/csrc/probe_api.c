/*
 * probe_api.c - drives the CUDA entry points real programs reach libvgpu.so through, beyond probe.c's: the CUDA 2
 * ABI, graph memory nodes, memory of other processes (IPC, external memory), stream capture with its modes, and the
 * driver calls a launch costs.  Linked against the simulated libcuda; run with libvgpu.so preloaded.  Each
 * sub-command prints key=value lines.
 */
#define _GNU_SOURCE
#define __CUDA_API_VERSION_INTERNAL 1   /* cuda.h then declares every entry point under its own versioned name */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);

#define CK(x) do { CUresult _r = (x); if (_r) { printf("error=%s:%d\n", #x, (int)_r); fflush(stdout); exit(3); } } while (0)
#define P(key, fmt, ...) printf("%s=" fmt "\n", key, __VA_ARGS__)

static const size_t MiB = 1 << 20;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static CUcontext setup(int dev) {
    CUcontext c;
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&c, dev));
    CK(cuCtxSetCurrent(c));
    return c;
}

static void *sim_fn(const char *name) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return h ? dlsym(h, name) : NULL;
}

/* legacy CHUNK_MIB: every entry point of the CUDA 2 ABI, allocated until refused, one after another */
static int cmd_legacy(size_t chunk_mib) {
    setup(0);
    unsigned int fr = 0, tot = 0, dev_total = 0;
    CK(cuMemGetInfo(&fr, &tot));
    CK(cuDeviceTotalMem(&dev_total, 0));
    P("meminfo_total", "%u", tot);
    P("devtotal", "%u", dev_total);
    unsigned int chunk = (unsigned int)(chunk_mib * MiB);
    CUdeviceptr_v1 ptr[256];
    int n = 0;
    CUresult r;
    while (n < 256 && (r = cuMemAlloc(&ptr[n], chunk)) == CUDA_SUCCESS) n++;
    P("alloc_bytes", "%zu", (size_t)n * chunk);
    P("alloc_err", "%d", (int)r);
    for (int i = 0; i < n; i++) CK(cuMemFree(ptr[i]));
    n = 0;
    unsigned int pitch = 0;
    while (n < 256 && (r = cuMemAllocPitch(&ptr[n], &pitch, 4096, chunk / 4096, 4)) == CUDA_SUCCESS) n++;
    P("pitch_bytes", "%zu", (size_t)n * pitch * (chunk / 4096));
    P("pitch_err", "%d", (int)r);
    for (int i = 0; i < n; i++) CK(cuMemFree(ptr[i]));
    CUarray arr[256];
    CUDA_ARRAY_DESCRIPTOR_v1 d = {.Width = 4096, .Height = chunk / 4096 / 4, .Format = CU_AD_FORMAT_FLOAT,
                                  .NumChannels = 1};
    n = 0;
    while (n < 256 && (r = cuArrayCreate(&arr[n], &d)) == CUDA_SUCCESS) n++;
    P("array_bytes", "%zu", (size_t)n * chunk);
    P("array_err", "%d", (int)r);
    for (int i = 0; i < n; i++) CK(cuArrayDestroy(arr[i]));
    CUDA_ARRAY3D_DESCRIPTOR_v1 d3 = {.Width = 1024, .Height = 256, .Depth = chunk / 1024 / 256 / 4,
                                     .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    n = 0;
    while (n < 256 && (r = cuArray3DCreate(&arr[n], &d3)) == CUDA_SUCCESS) n++;
    P("array3d_bytes", "%zu", (size_t)n * chunk);
    P("array3d_err", "%d", (int)r);
    for (int i = 0; i < n; i++) CK(cuArrayDestroy(arr[i]));
    CUcontext mine;
    r = cuCtxCreate(&mine, 0, 0);
    P("ctx_create", "%d", (int)r);
    if (r == CUDA_SUCCESS) CK(cuCtxDestroy_v2(mine));
    fflush(stdout);
    return 0;
}

/* graphmem CHUNK_MIB: graph memory nodes added until refused; then the graph is destroyed and added to again */
static int cmd_graphmem(size_t chunk_mib) {
    setup(0);
    for (int round = 0; round < 2; round++) {
        CUgraph g;
        CK(cuGraphCreate(&g, 0));
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = 0;
        p.bytesize = chunk_mib * MiB;
        int n = 0;
        CUresult r;
        CUgraphNode node;
        while (n < 256 && (r = cuGraphAddMemAllocNode(&node, g, NULL, 0, &p)) == CUDA_SUCCESS) n++;
        printf("round%d_bytes=%zu\nround%d_err=%d\n", round, (size_t)n * p.bytesize, round, (int)r);
        CK(cuGraphDestroy(g));
    }
    fflush(stdout);
    return 0;
}

/* ipc_export MIB FILE SECONDS: allocate, write the IPC handle to FILE, hold the memory */
static int cmd_ipc_export(size_t mib, const char *path, double seconds) {
    setup(0);
    CUdeviceptr p;
    CK(cuMemAlloc_v2(&p, mib * MiB));
    CUipcMemHandle h;
    CK(cuIpcGetMemHandle(&h, p));
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(&h, sizeof h, 1, f) != 1) return 3;
    fclose(f);
    P("exported", "%d", 1);
    fflush(stdout);
    usleep((useconds_t)(seconds * 1e6));
    return 0;
}

/* ipc_import FILE CHUNK_MIB: open the handle in FILE, then allocate chunks until refused */
static int cmd_ipc_import(const char *path, size_t chunk_mib) {
    setup(0);
    CUipcMemHandle h;
    FILE *f = fopen(path, "rb");
    if (!f || fread(&h, sizeof h, 1, f) != 1) return 3;
    fclose(f);
    CUdeviceptr mapped;
    CUresult r = cuIpcOpenMemHandle_v2(&mapped, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    P("open", "%d", (int)r);
    CUdeviceptr p;
    int n = 0;
    while (n < 1024 && cuMemAlloc_v2(&p, chunk_mib * MiB) == CUDA_SUCCESS) n++;
    P("after_open_bytes", "%zu", (size_t)n * chunk_mib * MiB);
    if (r == CUDA_SUCCESS) P("close", "%d", (int)cuIpcCloseMemHandle(mapped));
    CUresult again = cuMemAlloc_v2(&p, chunk_mib * MiB);
    P("after_close", "%d", (int)again);
    fflush(stdout);
    return 0;
}

/* extmem MIB: import MIB of memory another API allocated (an opaque file descriptor), then release it */
static int cmd_extmem(size_t mib) {
    setup(0);
    CUDA_EXTERNAL_MEMORY_HANDLE_DESC d;
    memset(&d, 0, sizeof d);
    d.type = CU_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = memfd_create("external", 0);
    d.size = mib * MiB;
    CUexternalMemory m;
    CUresult r = cuImportExternalMemory(&m, &d);
    P("import", "%d", (int)r);
    if (r == CUDA_SUCCESS) {
        CUDA_EXTERNAL_MEMORY_BUFFER_DESC b;
        memset(&b, 0, sizeof b);
        b.size = d.size;
        CUdeviceptr p;
        P("mapped", "%d", (int)cuExternalMemoryGetMappedBuffer(&p, m, &b));
        size_t fr, tot;
        CK(cuMemGetInfo_v2(&fr, &tot));
        P("used_while_imported", "%zu", tot - fr);
        CK(cuMemFree_v2(p));
        CK(cuDestroyExternalMemory(m));
    }
    size_t fr, tot;
    CK(cuMemGetInfo_v2(&fr, &tot));
    P("used_after", "%zu", tot - fr);
    fflush(stdout);
    return 0;
}

/* Kernels whose duration the simulated GPU takes from a module image (its format; the library cannot see it). */
static const char *IMAGE =
    "simgpu-module\n"
    "short fixed 20us\n"
    "medium fixed 200us\n"
    "long fixed 2ms\n"
    "varied lognormal 300us 1.0\n"
    "spread lognormal 1500us 0.6\n";

static CUfunction function(const char *name) {
    static CUmodule m;
    if (!m) CK(cuModuleLoadData(&m, IMAGE));
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, name));
    return f;
}

typedef struct { CUstream s; CUfunction f; volatile int stop; uint64_t launches; } worker_t;

static void *launcher(void *arg) {
    worker_t *w = arg;
    CUcontext c;
    CK(cuDevicePrimaryCtxRetain(&c, 0));
    CK(cuCtxSetCurrent(c));
    while (!w->stop) {
        CK(cuLaunchKernel(w->f, 1, 1, 1, 32, 1, 1, 0, w->s, NULL, NULL));
        w->launches++;
    }
    return NULL;
}

/* capture MODE KERNELS REPLAYS: while another thread launches limited kernels on its own stream, this thread
 * captures KERNELS launches into a graph (MODE: global, thread_local or relaxed), then replays it REPLAYS times */
static int cmd_capture(const char *mode_name, int kernels, int replays) {
    setup(0);
    CUstreamCaptureMode mode = !strcmp(mode_name, "relaxed") ? CU_STREAM_CAPTURE_MODE_RELAXED
                               : !strcmp(mode_name, "thread_local") ? CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
                                                                     : CU_STREAM_CAPTURE_MODE_GLOBAL;
    CUfunction f = function("medium");
    worker_t w = {.f = function("varied")};
    CK(cuStreamCreate(&w.s, CU_STREAM_NON_BLOCKING));
    pthread_t t;
    pthread_create(&t, NULL, launcher, &w);
    usleep(200000);                        /* the other thread has timings in flight */
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamBeginCapture_v2(s, mode));
    for (int i = 0; i < kernels; i++) {
        CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
        usleep(2000);                      /* a capture that lasts while the other thread launches */
    }
    CUgraph g = NULL;
    CUresult end = cuStreamEndCapture(s, &g);
    P("end", "%d", (int)end);
    w.stop = 1;
    pthread_join(t, NULL);
    uint64_t (*invalidations)(void) = (uint64_t (*)(void))sim_fn("simgpu_capture_invalidations");
    P("invalidations", "%llu", invalidations ? (unsigned long long)invalidations() : 999ULL);
    P("other_launches", "%llu", (unsigned long long)w.launches);
    if (end != CUDA_SUCCESS) { fflush(stdout); return 0; }
    CUgraphExec ge;
    CK(cuGraphInstantiateWithFlags(&ge, g, 0));
    uint64_t t0 = now_ns();
    for (int i = 0; i < replays; i++) CK(cuGraphLaunch(ge, s));
    CK(cuStreamSynchronize(s));
    P("replay_seconds", "%.4f", (double)(now_ns() - t0) / 1e9);
    P("replays", "%d", replays);
    fflush(stdout);
    return 0;
}

/* count KERNEL N: the driver calls N launches of a fixed-length kernel cost, all told */
static int cmd_count(const char *kernel, int n) {
    setup(0);
    CUfunction f = function(kernel);
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    uint64_t (*calls)(void) = (uint64_t (*)(void))sim_fn("simgpu_calls_total");
    uint64_t (*launch_calls)(const char *) = (uint64_t (*)(const char *))sim_fn("simgpu_calls");
    if (!calls || !launch_calls) return 3;
    for (int i = 0; i < 16; i++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));   /* warm-up */
    CK(cuStreamSynchronize(s));
    uint64_t before = calls(), launches_before = launch_calls("cuLaunchKernel");
    for (int i = 0; i < n; i++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    uint64_t after = calls(), launches = launch_calls("cuLaunchKernel") - launches_before;
    CK(cuStreamSynchronize(s));
    P("launches", "%llu", (unsigned long long)launches);
    P("calls", "%llu", (unsigned long long)(after - before));
    P("extra_per_launch", "%.4f", (double)(after - before - launches) / (double)launches);
    fflush(stdout);
    return 0;
}

/* devices CHUNK_MIB: for each CUDA ordinal, its UUID and what it lets this container allocate */
static int cmd_devices(size_t chunk_mib) {
    CK(cuInit(0));
    int n = 0;
    CK(cuDeviceGetCount(&n));
    P("count", "%d", n);
    for (int d = 0; d < n; d++) {
        CUcontext c;
        CK(cuDevicePrimaryCtxRetain(&c, d));
        CK(cuCtxSetCurrent(c));
        CUuuid u;
        CK(cuDeviceGetUuid_v2(&u, d));
        const unsigned char *b = (const unsigned char *)u.bytes;
        printf("uuid%d=GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n", d, b[0], b[1], b[2],
               b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
        size_t fr, tot;
        CK(cuMemGetInfo_v2(&fr, &tot));
        printf("total%d=%zu\n", d, tot);
        CUdeviceptr p;
        int k = 0;
        while (k < 4096 && cuMemAlloc_v2(&p, chunk_mib * MiB) == CUDA_SUCCESS) k++;
        printf("bytes%d=%zu\n", d, (size_t)k * chunk_mib * MiB);
    }
    fflush(stdout);
    return 0;
}

/* oldlaunch SECONDS: a saturating loop of CUDA 2 launches (cuParamSetv, cuLaunchGrid) of 500 us kernels */
static int cmd_oldlaunch(double seconds) {
    setup(0);
    CUmodule m;
    CK(cuModuleLoadData(&m, "old-style"));
    CUfunction f;
    CK(cuModuleGetFunction(&f, m, "sleep"));      /* the simulated GPU runs it for its first parameter, in ns */
    uint64_t ns = 500000;
    CK(cuFuncSetBlockShape(f, 32, 1, 1));
    CK(cuParamSetv(f, 0, &ns, sizeof ns));
    CK(cuParamSetSize(f, sizeof ns));
    CK(cuLaunchGrid(f, 1, 1));
    CK(cuCtxSynchronize());
    uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9), launches = 0;
    while (now_ns() < end) {
        CK(cuLaunchGrid(f, 1, 1));
        launches++;
    }
    CK(cuCtxSynchronize());
    P("launches", "%llu", (unsigned long long)launches);
    P("seconds", "%.4f", (double)(now_ns() - t0) / 1e9);
    P("kernel_ns", "%llu", (unsigned long long)ns);
    fflush(stdout);
    return 0;
}

/* multidev: one cooperative launch through the deprecated multi-device entry point */
static int cmd_multidev(void) {
    setup(0);
    CUDA_LAUNCH_PARAMS p;
    memset(&p, 0, sizeof p);
    p.function = function("short");
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = 32;
    p.blockDimY = p.blockDimZ = 1;
    CK(cuStreamCreate(&p.hStream, CU_STREAM_NON_BLOCKING));
    P("launch", "%d", (int)cuLaunchCooperativeKernelMultiDevice(&p, 1, 0));
    fflush(stdout);
    return 0;
}

/* green: a green context on 8 SMs, the container's memory before, with and after it */
static int cmd_green(void) {
    setup(0);
    size_t fr, tot;
    CK(cuMemGetInfo_v2(&fr, &tot));
    P("used_before", "%zu", tot - fr);
    CUdevResource all, group;
    unsigned n = 1;
    CK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    CK(cuDevSmResourceSplitByCount(&group, &n, &all, NULL, 0, 8));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, &group, 1));
    CUgreenCtx g;
    P("create", "%d", (int)cuGreenCtxCreate(&g, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuMemGetInfo_v2(&fr, &tot));
    P("used_with_green", "%zu", tot - fr);
    CK(cuGreenCtxDestroy(g));
    CK(cuMemGetInfo_v2(&fr, &tot));
    P("used_after", "%zu", tot - fr);
    fflush(stdout);
    return 0;
}

/* shareable MIB CACHE: VMM memory exported as a file descriptor, which a new process (this program again, its
 * accounting file CACHE, or ours when CACHE is "same") imports, maps and then allocates beside until refused */
static int cmd_shareable(const char *self, size_t mib, const char *cache) {
    setup(0);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h;
    CK(cuMemCreate(&h, mib * MiB, &prop, 0));
    int fd = -1;
    CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        if (strcmp(cache, "same")) setenv("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache, 1);
        fcntl(fd, F_SETFD, 0);   /* handed over through exec, as a socket would pass it */
        char fds[16], mibs[32];
        snprintf(fds, sizeof fds, "%d", fd);
        snprintf(mibs, sizeof mibs, "%zu", mib);
        execl(self, self, "shareable_import", fds, mibs, (char *)NULL);
        _exit(5);
    }
    int status = 0;
    waitpid(child, &status, 0);
    P("child_status", "%d", status);
    fflush(stdout);
    return 0;
}

static int cmd_shareable_import(int fd, size_t mib) {
    setup(0);
    CUmemGenericAllocationHandle h;
    CK(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, mib * MiB, 0, 0, 0));
    CUresult map = cuMemMap(va, mib * MiB, 0, h, 0);
    P("map", "%d", (int)map);
    CUdeviceptr p;
    int n = 0;
    while (n < 1024 && cuMemAlloc_v2(&p, 50 * MiB) == CUDA_SUCCESS) n++;
    P("beside_bytes", "%zu", (size_t)n * 50 * MiB);
    fflush(stdout);
    return 0;
}

/* ctxcycle ROUNDS: limited launches in a created context, destroyed while its timings may be in flight, then the
 * same in the next context (the driver may hand it the same address); the launches of a primary context, reset,
 * likewise.  How many driver calls used an event of a destroyed context. */
static int cmd_ctxcycle(int rounds) {
    CK(cuInit(0));
    CUfunction f = NULL;
    for (int i = 0; i < rounds; i++) {
        CUcontext c;
        CK(cuCtxCreate_v2(&c, 0, 0));
        CUmodule m;
        CK(cuModuleLoadData(&m, IMAGE));
        CK(cuModuleGetFunction(&f, m, "varied"));
        for (int k = 0; k < 40; k++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CK(cuCtxDestroy_v2(c));
    }
    CUcontext p;
    CK(cuDevicePrimaryCtxRetain(&p, 0));
    CK(cuCtxSetCurrent(p));
    CUmodule m;
    CK(cuModuleLoadData(&m, IMAGE));
    CK(cuModuleGetFunction(&f, m, "varied"));
    for (int k = 0; k < 40; k++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CK(cuDevicePrimaryCtxReset_v2(0));
    CK(cuDevicePrimaryCtxRetain(&p, 0));
    CK(cuCtxSetCurrent(p));
    CK(cuModuleLoadData(&m, IMAGE));
    CK(cuModuleGetFunction(&f, m, "varied"));
    for (int k = 0; k < 40; k++) CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    CK(cuCtxSynchronize());
    uint64_t (*dead)(void) = (uint64_t (*)(void))sim_fn("simgpu_dead_event_uses");
    P("dead_event_uses", "%llu", dead ? (unsigned long long)dead() : 999ULL);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: probe_api CMD ...\n"); return 2; }
    const char *c = argv[1];
    if (!strcmp(c, "legacy")) return cmd_legacy(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "graphmem")) return cmd_graphmem(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "ipc_export")) return cmd_ipc_export(strtoull(argv[2], NULL, 0), argv[3], atof(argv[4]));
    if (!strcmp(c, "ipc_import")) return cmd_ipc_import(argv[2], strtoull(argv[3], NULL, 0));
    if (!strcmp(c, "extmem")) return cmd_extmem(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "capture")) return cmd_capture(argv[2], atoi(argv[3]), atoi(argv[4]));
    if (!strcmp(c, "count")) return cmd_count(argv[2], atoi(argv[3]));
    if (!strcmp(c, "devices")) return cmd_devices(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "oldlaunch")) return cmd_oldlaunch(atof(argv[2]));
    if (!strcmp(c, "multidev")) return cmd_multidev();
    if (!strcmp(c, "ctxcycle")) return cmd_ctxcycle(atoi(argv[2]));
    if (!strcmp(c, "green")) return cmd_green();
    if (!strcmp(c, "shareable")) return cmd_shareable(argv[0], strtoull(argv[2], NULL, 0), argv[3]);
    if (!strcmp(c, "shareable_import")) return cmd_shareable_import(atoi(argv[2]), strtoull(argv[3], NULL, 0));
    fprintf(stderr, "unknown command %s\n", c);
    return 2;
}
