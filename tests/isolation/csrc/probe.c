/*
 * probe.c - a test program that drives the CUDA driver API directly (against the simulated GPU, usually with
 * libvgpu.so preloaded).  Each sub-command prints key=value lines the pytest side parses.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "vgpu_nvml.h"
#include "vgpu_region.h"
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

#define CK(x) do { CUresult _r = (x); if (_r) { printf("error=%s:%d\n", #x, (int)_r); fflush(stdout); exit(3); } } while (0)

static uint64_t now_ns(void) {
    struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}
static CUcontext g_ctx;
static void setup(int dev) {
    CK(cuInit(0));
    CUdevice d; CK(cuDeviceGet(&d, dev));
    CK(cuDevicePrimaryCtxRetain(&g_ctx, d));
    CK(cuCtxSetCurrent(g_ctx));
}
static uint64_t (*sim_used)(int);
static void load_sim_helpers(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    sim_used = (uint64_t (*)(int))dlsym(h, "simgpu_used_bytes");
}
static void meminfo(const char *tag) {
    size_t fr = 0, tot = 0, dt = 0;
    CK(cuMemGetInfo(&fr, &tot));
    CK(cuDeviceTotalMem(&dt, 0));
    printf("%s_free=%zu\n%s_total=%zu\n%s_devtotal=%zu\n", tag, fr, tag, tot, tag, dt);
}
static void nvml_info(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) { printf("nvml=missing\n"); return; }
    nvmlReturn_t (*init)(void) = (nvmlReturn_t (*)(void))dlsym(h, "nvmlInit_v2");
    nvmlReturn_t (*get)(unsigned, nvmlDevice_t *) = (nvmlReturn_t (*)(unsigned, nvmlDevice_t *))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    nvmlReturn_t (*mi)(nvmlDevice_t, nvmlMemory_t *) = (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    nvmlReturn_t (*mi2)(nvmlDevice_t, nvmlMemory_v2_t *) = (nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t *))dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    nvmlDevice_t dev;
    if (init() || get(0, &dev)) { printf("nvml=error\n"); return; }
    nvmlMemory_t m; nvmlMemory_v2_t m2; memset(&m2, 0, sizeof m2); m2.version = nvmlMemory_v2;
    if (!mi(dev, &m)) printf("nvml_total=%llu\nnvml_free=%llu\nnvml_used=%llu\n", m.total, m.free, m.used);
    if (!mi2(dev, &m2)) printf("nvml2_total=%llu\nnvml2_free=%llu\nnvml2_used=%llu\n", m2.total, m2.free, m2.used);
}

/* allocate `chunk` bytes until failure */
static int cmd_chunks(size_t chunk) {
    setup(0);
    meminfo("before");
    int n = 0; CUresult r; CUdeviceptr p;
    while ((r = cuMemAlloc(&p, chunk)) == CUDA_SUCCESS) n++;
    printf("count=%d\nerr=%d\nallocated=%zu\n", n, (int)r, (size_t)n * chunk);
    load_sim_helpers();
    if (sim_used) printf("sim_used=%llu\n", (unsigned long long)sim_used(0));
    meminfo("after");
    nvml_info();
    fflush(stdout);
    return 0;
}

/* race: allocate/free small chunks as fast as possible; report any moment the device holds more than `limit` */
static int cmd_race(size_t chunk, size_t limit, double seconds, uint64_t start_at) {
    setup(0);
    load_sim_helpers();
    CUdeviceptr held[4096]; int nh = 0;
    unsigned seed = (unsigned)getpid();
    uint64_t violations = 0, allocs = 0, ooms = 0, maxseen = 0;
    while (now_ns() < start_at) {}
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    while (now_ns() < end) {
        if (nh < 4096 && (rand_r(&seed) % 3 != 0 || nh == 0)) {
            CUdeviceptr p; CUresult r = cuMemAlloc(&p, chunk);
            if (r == CUDA_SUCCESS) {
                held[nh++] = p; allocs++;
                uint64_t u = sim_used(0);
                if (u > maxseen) maxseen = u;
                if (u > limit) violations++;
            } else if (r == CUDA_ERROR_OUT_OF_MEMORY) ooms++;
            else { printf("unexpected=%d\n", (int)r); break; }
        } else {
            int i = rand_r(&seed) % nh;
            CK(cuMemFree(held[i])); held[i] = held[--nh];
        }
    }
    printf("held=%llu\n", (unsigned long long)nh * chunk);
    printf("allocs=%llu\nooms=%llu\nviolations=%llu\nmaxseen=%llu\n", (unsigned long long)allocs,
           (unsigned long long)ooms, (unsigned long long)violations, (unsigned long long)maxseen);
    fflush(stdout);
    return 0;
}

/* alloc/free loop; prints a heartbeat line per iteration batch when `beat` */
static int cmd_loop(size_t chunk, double seconds, int beat) {
    setup(0);
    uint64_t end = seconds > 0 ? now_ns() + (uint64_t)(seconds * 1e9) : UINT64_MAX, last = now_ns(), maxgap = 0;
    uint64_t iters = 0, ooms = 0;
    while (now_ns() < end) {
        CUdeviceptr p[4]; int n = 0;
        for (int i = 0; i < 4; i++) { CUresult r = cuMemAlloc(&p[n], chunk); if (r == 0) n++; else if (r == CUDA_ERROR_OUT_OF_MEMORY) ooms++; else exit(4); }
        for (int i = 0; i < n; i++) cuMemFree(p[i]);
        iters++;
        uint64_t t = now_ns();
        if (t - last > maxgap) maxgap = t - last;
        last = t;
        if (beat && iters % 64 == 0) { printf("beat=%llu\n", (unsigned long long)t); fflush(stdout); }
    }
    printf("iters=%llu\nooms=%llu\nmaxgap_ns=%llu\n", (unsigned long long)iters, (unsigned long long)ooms,
           (unsigned long long)maxgap);
    fflush(stdout);
    return 0;
}

static size_t used_now(void) {
    size_t fr, tot; CK(cuMemGetInfo(&fr, &tot)); return tot - fr;
}
#define STEP(name) printf("%s=%zu\n", name, used_now())

/* exercise every allocation path, printing the accounted usage after each step */
static int cmd_paths(void) {
    CK(cuInit(0));
    CUcontext c; CK(cuDevicePrimaryCtxRetain(&c, 0)); CK(cuCtxSetCurrent(c));
    STEP("primary_ctx");
    CUcontext c2; CK(cuCtxCreate(&c2, NULL, 0, 0));
    STEP("ctx_create");
    CK(cuCtxDestroy(c2)); CK(cuCtxSetCurrent(c));
    STEP("ctx_destroy");
    CUdeviceptr p; CK(cuMemAlloc(&p, 4 << 20)); STEP("alloc");
    CK(cuMemFree(p)); STEP("free");
    size_t pitch; CK(cuMemAllocPitch(&p, &pitch, 1000, 2048, 4));
    printf("pitch=%zu\n", pitch); STEP("pitch");
    CK(cuMemFree(p)); STEP("pitch_free");
    CK(cuMemAllocManaged(&p, 8 << 20, CU_MEM_ATTACH_GLOBAL)); STEP("managed");
    CK(cuMemFree(p)); STEP("managed_free");
    CK(cuMemAllocAsync(&p, 6 << 20, NULL)); STEP("async");
    CK(cuMemFreeAsync(p, NULL)); STEP("async_free");
    CUmemPoolProps pp; memset(&pp, 0, sizeof pp);
    pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED; pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE; pp.location.id = 0;
    CUmemoryPool pool; CK(cuMemPoolCreate(&pool, &pp));
    CK(cuMemAllocFromPoolAsync(&p, 10 << 20, pool, NULL)); STEP("pool");
    CK(cuMemFreeAsync(p, NULL)); STEP("pool_free");
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE; prop.location.id = 0;
    CUmemGenericAllocationHandle h; CK(cuMemCreate(&h, 16 << 20, &prop, 0)); STEP("vmm_create");
    CUdeviceptr va; CK(cuMemAddressReserve(&va, 16 << 20, 0, 0, 0));
    CK(cuMemMap(va, 16 << 20, 0, h, 0)); STEP("vmm_map");
    CK(cuMemRelease(h)); STEP("vmm_release_mapped");
    CK(cuMemUnmap(va, 16 << 20)); STEP("vmm_unmap");
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 1000, .Height = 1000, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CUarray arr; CK(cuArrayCreate(&arr, &ad)); STEP("array");
    CK(cuArrayDestroy(arr)); STEP("array_free");
    CUDA_ARRAY3D_DESCRIPTOR a3 = {.Width = 256, .Height = 256, .Depth = 64, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    CK(cuArray3DCreate(&arr, &a3)); STEP("array3d");
    CK(cuArrayDestroy(arr)); STEP("array3d_free");
    CUmipmappedArray mm; CK(cuMipmappedArrayCreate(&mm, &a3, 4)); STEP("mipmap");
    CK(cuMipmappedArrayDestroy(mm)); STEP("mipmap_free");
    CK(cuDevicePrimaryCtxRelease(0));
    fflush(stdout);
    return 0;
}

/* entry points through dlsym and cuGetProcAddress must be the ones libvgpu exports */
static int cmd_procaddr(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    static const char *names[] = {"cuMemAlloc_v2", "cuMemFree_v2", "cuLaunchKernel", "cuMemGetInfo_v2",
                                  "cuGetProcAddress_v2", "cuMemCreate", "cuGraphLaunch", NULL};
    for (int i = 0; names[i]; i++) {
        void *viaHandle = dlsym(lib, names[i]);
        void *viaDefault = dlsym(RTLD_DEFAULT, names[i]);
        void *viaNext = dlsym(RTLD_NEXT, names[i]);
        Dl_info di; dladdr(viaHandle, &di);
        printf("dlsym_%s=%s\n", names[i], di.dli_fname ? strrchr(di.dli_fname, '/') + 1 : "?");
        printf("same_%s=%d\n", names[i], viaHandle == viaDefault && viaDefault == viaNext);
    }
    /* twice in a row: repeated RTLD_NEXT lookups keep working */
    printf("next_twice=%d\n", dlsym(RTLD_NEXT, "cuInit") != NULL && dlsym(RTLD_NEXT, "cuInit") != NULL);
    printf("unknown_passthrough=%d\n", dlsym(lib, "simgpu_used_bytes") != NULL);
    CK(cuInit(0));
    struct { const char *name; int ver; cuuint64_t flags; } q[] = {
        {"cuMemAlloc", 12000, 0}, {"cuMemFree", 12000, 0}, {"cuLaunchKernel", 12000, 0},
        {"cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM}, {"cuMemAllocAsync", 12000, 0},
        {"cuGetProcAddress", 12000, 0}, {"cuCtxCreate", 11040, 0}, {"cuCtxCreate", 12050, 0},
        {"cuDeviceGetCount", 12000, 0}, {"cuMemAlloc", 3000, 0}, {"cuMemAlloc", 1000, 0}, {NULL, 0, 0}};
    for (int i = 0; q[i].name; i++) {
        void *fn = NULL; CUdriverProcAddressQueryResult st = 0;
        CUresult r = cuGetProcAddress_v2(q[i].name, &fn, q[i].ver, q[i].flags, &st);
        Dl_info di; const char *where = "none", *sname = "none";
        if (fn && dladdr(fn, &di)) { where = strrchr(di.dli_fname, '/') + 1; sname = di.dli_sname ? di.dli_sname : "?"; }
        printf("gpa_%s_%d_%d=%d,%d,%s,%s\n", q[i].name, q[i].ver, (int)q[i].flags, (int)r, (int)st, where, sname);
    }
    /* the cuGetProcAddress we got must itself hand out wrappers */
    CUresult (*gpa)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *) = NULL;
    CUdriverProcAddressQueryResult st;
    CK(cuGetProcAddress_v2("cuGetProcAddress", (void **)&gpa, 12000, 0, &st));
    void *fn = NULL; CK(gpa("cuMemAlloc", &fn, 12000, 0, &st));
    Dl_info di; dladdr(fn, &di);
    printf("gpa_chain=%s,%s\n", strrchr(di.dli_fname, '/') + 1, di.dli_sname);
    fflush(stdout);
    return 0;
}

/* saturating launch loop; kinds: kernel, ex, coop, graph */
static int cmd_spin(const char *kind, unsigned blocks, unsigned ns_per_block, double seconds) {
    setup(0);
    CUmodule m; CK(cuModuleLoadData(&m, "sim"));
    char fname[64]; snprintf(fname, sizeof fname, "work_%u", ns_per_block);
    CUfunction f; CK(cuModuleGetFunction(&f, m, fname));
    CUstream s; CK(cuStreamCreate(&s, 0));
    CUgraphExec ge = NULL;
    if (!strcmp(kind, "graph")) {
        CUgraph g; CK(cuGraphCreate(&g, 0));
        CUDA_KERNEL_NODE_PARAMS kp; memset(&kp, 0, sizeof kp);
        kp.func = f; kp.gridDimX = blocks; kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = 128; kp.blockDimY = kp.blockDimZ = 1;
        CUgraphNode n; CK(cuGraphAddKernelNode(&n, g, NULL, 0, &kp));
        CK(cuGraphInstantiate(&ge, g, 0));
    }
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), launches = 0;
    CUlaunchConfig cfg; memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = blocks; cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = 128; cfg.blockDimY = cfg.blockDimZ = 1; cfg.hStream = s;
    while (now_ns() < end) {
        if (!strcmp(kind, "kernel")) CK(cuLaunchKernel(f, blocks, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
        else if (!strcmp(kind, "ex")) CK(cuLaunchKernelEx(&cfg, f, NULL, NULL));
        else if (!strcmp(kind, "coop")) CK(cuLaunchCooperativeKernel(f, blocks, 1, 1, 128, 1, 1, 0, s, NULL));
        else CK(cuGraphLaunch(ge, s));
        launches++;
    }
    printf("launches=%llu\n", (unsigned long long)launches);
    fflush(stdout);
    return 0;
}


/* Workloads whose kernel durations only the simulated GPU knows (its module-image format, kerneltime.h there). */
static const char *MIX_IMAGE =
    "simgpu-module\n"
    "gemm lognormal 400us 1.2 drift 1700ms 0.5\n"
    "elem uniform 20us 90us\n"
    "attn lognormal 250us 0.6 phase 300ms 6\n"
    "big bimodal 300us 12ms 0.2\n"
    "tiny lognormal 30us 0.8\n"
    "node lognormal 120us 1.0\n"
    "short fixed 20us\n"
    "matmul4k fixed 2700us\n"
    "matmul2k fixed 350us\n";

/* mix WORKLOAD SECONDS STREAMS: saturating launches of a workload over STREAMS streams.  `long` and `medium` are
 * bench/gpu/tenants.py's loop (16 products of 4096- or 2048-wide matrices, as long as on an H100, then a wait). */
static int cmd_mix(const char *workload, double seconds, int nstreams) {
    setup(0);
    CUmodule m;
    CK(cuModuleLoadData(&m, MIX_IMAGE));
    const char *names[] = {"gemm", "elem", "attn", "big", "tiny", "node", "work_1000", "short", "matmul4k", "matmul2k"};
    CUfunction fn[10];
    for (int i = 0; i < 10; i++) CK(cuModuleGetFunction(&fn[i], m, names[i]));
    CUstream st[8];
    if (nstreams < 1) nstreams = 1;
    if (nstreams > 8) nstreams = 8;
    for (int i = 0; i < nstreams; i++) CK(cuStreamCreate(&st[i], 0));
    CUgraphExec ge = NULL;
    if (!strcmp(workload, "graph")) {
        CUgraph g; CK(cuGraphCreate(&g, 0));
        CUDA_KERNEL_NODE_PARAMS kp; memset(&kp, 0, sizeof kp);
        kp.gridDimX = 64; kp.gridDimY = kp.gridDimZ = 1; kp.blockDimX = 128; kp.blockDimY = kp.blockDimZ = 1;
        CUgraphNode prev = NULL, n;
        for (int i = 0; i < 4; i++) {
            kp.func = i == 3 ? fn[1] : fn[5];
            CK(cuGraphAddKernelNode(&n, g, prev ? &prev : NULL, prev ? 1 : 0, &kp));
            prev = n;
        }
        CK(cuGraphInstantiate(&ge, g, 0));
    }
    unsigned seed = (unsigned)getpid() * 2654435761u;
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9), launches = 0;
    while (now_ns() < end) {
        CUstream s = st[launches % (uint64_t)nstreams];
        unsigned r = rand_r(&seed) % 100;
        CUfunction f;
        if (ge) { CK(cuGraphLaunch(ge, s)); launches++; continue; }
        if (!strcmp(workload, "constant")) f = fn[6];                      /* 1000 ns x 100 blocks, always */
        else if (!strcmp(workload, "varied")) f = r < 60 ? fn[0] : fn[1];
        else if (!strcmp(workload, "bursty")) f = r < 80 ? fn[2] : fn[4];
        else if (!strcmp(workload, "mixed")) f = r < 30 ? fn[3] : r < 70 ? fn[4] : fn[0];
        else if (!strcmp(workload, "short")) f = fn[7];                    /* 20 us, always */
        else if (!strcmp(workload, "long")) f = fn[8];
        else if (!strcmp(workload, "medium")) f = fn[9];
        else { fprintf(stderr, "unknown workload %s\n", workload); return 2; }
        CK(cuLaunchKernel(f, 100, 1, 1, 128, 1, 1, 0, s, NULL, NULL));
        launches++;
        if ((f == fn[8] || f == fn[9]) && launches % 16 == 0) CK(cuStreamSynchronize(s));
    }
    printf("launches=%llu\n", (unsigned long long)launches);
    fflush(stdout);
    return 0;
}


/* refused allocations: what the caller's out-parameters hold afterwards (they start as garbage) */
static int cmd_refuse(size_t bytes) {
    setup(0);
    CUdeviceptr p = 0xdeadbeef; size_t pitch = 0;
    CUresult r = cuMemAlloc(&p, bytes);
    printf("alloc=%d,%llx\n", (int)r, (unsigned long long)p);
    p = 0xdeadbeef;
    r = cuMemAllocPitch(&p, &pitch, bytes / 1024, 1024, 4);
    printf("pitch=%d,%llx\n", (int)r, (unsigned long long)p);
    p = 0xdeadbeef;
    r = cuMemAllocManaged(&p, bytes, CU_MEM_ATTACH_GLOBAL);
    printf("managed=%d,%llx\n", (int)r, (unsigned long long)p);
    p = 0xdeadbeef;
    r = cuMemAllocAsync(&p, bytes, NULL);
    printf("async=%d,%llx\n", (int)r, (unsigned long long)p);
    CUmemAllocationProp prop; memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED; prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    CUmemGenericAllocationHandle h = 0xdeadbeef;
    r = cuMemCreate(&h, (bytes + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1), &prop, 0);
    printf("vmm=%d,%llx\n", (int)r, (unsigned long long)h);
    CUarray arr = (CUarray)0xdeadbeef;
    CUDA_ARRAY_DESCRIPTOR ad = {.Width = 8192, .Height = bytes / 8192 / 4 + 1, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 1};
    r = cuArrayCreate(&arr, &ad);
    printf("array=%d,%llx\n", (int)r, (unsigned long long)(uintptr_t)arr);
    CK(cuMemFree(0));
    fflush(stdout);
    return 0;
}

/* n launches of a 1 ns kernel and n alloc/free pairs: the hot path, for syscall counting */
static int cmd_hot(int n) {
    setup(0);
    CUmodule m; CK(cuModuleLoadData(&m, "sim"));
    CUfunction f; CK(cuModuleGetFunction(&f, m, "work_1"));
    for (int i = 0; i < n; i++) {
        CUdeviceptr p;
        CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
        CK(cuMemAlloc(&p, 4096));
        CK(cuMemFree(p));
    }
    printf("done=%d\n", n);
    return 0;
}

/* hold MIB SECONDS: allocate MIB at once, report, keep it for SECONDS */
static int cmd_hold(size_t mib, double seconds) {
    setup(0);
    CUdeviceptr p = 0;
    CUresult r = cuMemAlloc(&p, mib << 20);
    printf("alloc=%d\n", (int)r);
    fflush(stdout);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    printf("done=1\n");
    fflush(stdout);
    return 0;
}

/* a signal handler that ends the process from wherever it interrupted it, here inside the library's region lock */
static void exit_now(int sig) { (void)sig; exit(0); }
static int cmd_exit_in_lock(void) {
    setup(0);
    signal(SIGALRM, exit_now);
    struct itimerval it = {{0, 0}, {0, 150000}};
    setitimer(ITIMER_REAL, &it, NULL);
    printf("started=1\n");
    fflush(stdout);
    for (;;) {
        CUdeviceptr p;
        if (cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS) cuMemFree(p);
    }
}

/* poison FILE: leave the accounting file's region mutex unrecoverable (its owner died and the next locker
 * unlocked it without marking it consistent) */
static int cmd_poison(const char *path) {
    int fd = open(path, O_RDWR);
    if (fd < 0) { perror("open"); return 3; }
    char *mem = mmap(NULL, VGPU_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mem == MAP_FAILED) { perror("mmap"); return 3; }
    pthread_mutex_t *m = (pthread_mutex_t *)((vgpu_ext_t *)(mem + VGPU_EXT_OFFSET))->lock;
    pid_t child = fork();
    if (child == 0) { pthread_mutex_lock(m); _exit(0); }
    waitpid(child, NULL, 0);
    int first = pthread_mutex_lock(m);
    if (first == EOWNERDEAD) pthread_mutex_unlock(m);
    int second = pthread_mutex_lock(m);
    printf("first=%d\nsecond=%d\npoisoned=%d\n", first, second, second == ENOTRECOVERABLE);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: probe CMD ...\n"); return 2; }
    const char *c = argv[1];
    if (!strcmp(c, "chunks")) return cmd_chunks(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "race")) return cmd_race(strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0), atof(argv[4]), strtoull(argv[5], NULL, 0));
    if (!strcmp(c, "loop")) return cmd_loop(strtoull(argv[2], NULL, 0), atof(argv[3]), argc > 4 && atoi(argv[4]));
    if (!strcmp(c, "paths")) return cmd_paths();
    if (!strcmp(c, "procaddr")) return cmd_procaddr();
    if (!strcmp(c, "spin")) return cmd_spin(argv[2], (unsigned)atoi(argv[3]), (unsigned)atoi(argv[4]), atof(argv[5]));
    if (!strcmp(c, "hot")) return cmd_hot(atoi(argv[2]));
    if (!strcmp(c, "refuse")) return cmd_refuse(strtoull(argv[2], NULL, 0));
    if (!strcmp(c, "mix")) return cmd_mix(argv[2], atof(argv[3]), argc > 4 ? atoi(argv[4]) : 1);
    if (!strcmp(c, "hold")) return cmd_hold(strtoull(argv[2], NULL, 0), atof(argv[3]));
    if (!strcmp(c, "exit_in_lock")) return cmd_exit_in_lock();
    if (!strcmp(c, "poison")) return cmd_poison(argv[2]);
    if (!strcmp(c, "init")) { CUresult r = cuInit(0); printf("init=%d\n", (int)r); return 0; }
    fprintf(stderr, "unknown command %s\n", c);
    return 2;
}
