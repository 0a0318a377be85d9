/*
 * event_timing.c - what a pair of CUDA events around one kernel launch measures, against the device time the
 * launch costs when launches run back to back.  libvgpu.so's compute limiter charges each launch from such a pair;
 * this program shows where the pair's reading and the launch's real cost part.
 *
 * Build and run (bench/gpu/h100.sh does):  gcc -O2 -I$CUDA_INCLUDE event_timing.c -ldl -o event_timing && ./event_timing
 * For each spin length (the doctor's spin kernel, PTX) it prints, in ns:
 *   b2b      device time per launch of 200 launches queued back to back behind a 50 ms kernel
 *   idle     a pair around one launch on an idle stream (the limiter's case when a throttled loop resumes)
 *   queued   a pair around one launch queued behind a 5 ms kernel
 *   gated    a pair around one launch on an idle stream held by cuStreamWaitValue32 until the host has submitted
 *            the start event, the kernel and the end event (the host then releases it)
 *   empty    a pair with nothing between
 *   launch_cpu  host time of the cuLaunchKernel call
 * as the median and the minimum of 100 tries.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *PTX =
    ".version 6.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry sleep(.param .u64 ns)\n{\n .reg .pred %p<2>;\n .reg .b64 %rd<5>;\n"
    " ld.param.u64 %rd1, [ns];\n mov.u64 %rd2, %globaltimer;\n$L_spin:\n mov.u64 %rd3, %globaltimer;\n"
    " sub.u64 %rd4, %rd3, %rd2;\n setp.lt.u64 %p1, %rd4, %rd1;\n @%p1 bra $L_spin;\n ret;\n}\n";

#define TRIES 100
#define FN(name, ...) static CUresult (*p_##name)(__VA_ARGS__)
FN(cuInit, unsigned);
FN(cuDevicePrimaryCtxRetain, CUcontext *, CUdevice);
FN(cuCtxSetCurrent, CUcontext);
FN(cuModuleLoadData, CUmodule *, const void *);
FN(cuModuleGetFunction, CUfunction *, CUmodule, const char *);
FN(cuStreamCreate, CUstream *, unsigned);
FN(cuStreamSynchronize, CUstream);
FN(cuEventCreate, CUevent *, unsigned);
FN(cuEventRecord, CUevent, CUstream);
FN(cuEventSynchronize, CUevent);
FN(cuEventElapsedTime, float *, CUevent, CUevent);
FN(cuLaunchKernel, CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
   void **, void **);
FN(cuMemHostAlloc, void **, size_t, unsigned);
FN(cuMemHostGetDevicePointer_v2, CUdeviceptr *, void *, unsigned);
FN(cuStreamWaitValue32_v2, CUstream, CUdeviceptr, cuuint32_t, unsigned);

static CUfunction g_fn;
static CUstream g_s;
static CUevent g_a, g_b;

static void check(CUresult r, const char *what) {
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "event_timing: %s failed: %d\n", what, (int)r);
        exit(2);
    }
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void launch(uint64_t ns) {
    void *args[] = {&ns};
    check(p_cuLaunchKernel(g_fn, 1, 1, 1, 1, 1, 1, 0, g_s, args, NULL), "cuLaunchKernel");
}

static double elapsed(void) {
    float ms = 0;
    check(p_cuEventSynchronize(g_b), "cuEventSynchronize");
    check(p_cuEventElapsedTime(&ms, g_a, g_b), "cuEventElapsedTime");
    return (double)ms * 1e6;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void row(const char *what, uint64_t spin, double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    printf("%-10s spin %7llu  median %10.0f  min %10.0f\n", what, (unsigned long long)spin, v[n / 2], v[0]);
}

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) { fprintf(stderr, "event_timing: %s\n", dlerror()); return 2; }
#define LOAD(name) p_##name = dlsym(h, #name)
    LOAD(cuInit); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuCtxSetCurrent); LOAD(cuModuleLoadData);
    LOAD(cuModuleGetFunction); LOAD(cuStreamCreate); LOAD(cuStreamSynchronize); LOAD(cuEventCreate);
    LOAD(cuEventRecord); LOAD(cuEventSynchronize); LOAD(cuEventElapsedTime); LOAD(cuLaunchKernel);
    LOAD(cuMemHostAlloc); LOAD(cuMemHostGetDevicePointer_v2); LOAD(cuStreamWaitValue32_v2);
    CUcontext ctx;
    CUmodule mod;
    check(p_cuInit(0), "cuInit");
    check(p_cuDevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
    check(p_cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    check(p_cuModuleLoadData(&mod, PTX), "cuModuleLoadData");
    check(p_cuModuleGetFunction(&g_fn, mod, "sleep"), "cuModuleGetFunction");
    check(p_cuStreamCreate(&g_s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    check(p_cuEventCreate(&g_a, CU_EVENT_DEFAULT), "cuEventCreate");
    check(p_cuEventCreate(&g_b, CU_EVENT_DEFAULT), "cuEventCreate");
    volatile uint32_t *flag = NULL;
    CUdeviceptr dflag = 0;
    int gated = p_cuMemHostAlloc && p_cuStreamWaitValue32_v2 &&
                p_cuMemHostAlloc((void **)&flag, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS &&
                p_cuMemHostGetDevicePointer_v2(&dflag, (void *)flag, 0) == CUDA_SUCCESS;
    if (gated) *flag = 0;
    printf("gated pairs: %s\n", gated ? "cuStreamWaitValue32_v2 on host-mapped memory" : "unavailable");
    launch(1000000);
    check(p_cuStreamSynchronize(g_s), "warm-up");

    const uint64_t spins[] = {0, 20000, 500000, 2000000};
    double v[TRIES], cpu[TRIES];
    uint32_t seq = 0;
    for (size_t k = 0; k < sizeof spins / sizeof spins[0]; k++) {
        uint64_t spin = spins[k];
        for (int i = 0; i < 10; i++) {
            launch(50000000);
            check(p_cuEventRecord(g_a, g_s), "record");
            for (int j = 0; j < 200; j++) launch(spin);
            check(p_cuEventRecord(g_b, g_s), "record");
            v[i] = elapsed() / 200;
        }
        row("b2b", spin, v, 10);
        for (int i = 0; i < TRIES; i++) {
            check(p_cuStreamSynchronize(g_s), "sync");
            check(p_cuEventRecord(g_a, g_s), "record");
            uint64_t t0 = now_ns();
            launch(spin);
            cpu[i] = (double)(now_ns() - t0);
            check(p_cuEventRecord(g_b, g_s), "record");
            v[i] = elapsed();
        }
        row("idle", spin, v, TRIES);
        row("launch_cpu", spin, cpu, TRIES);
        for (int i = 0; i < TRIES; i++) {
            launch(5000000);
            check(p_cuEventRecord(g_a, g_s), "record");
            launch(spin);
            check(p_cuEventRecord(g_b, g_s), "record");
            v[i] = elapsed();
        }
        row("queued", spin, v, TRIES);
        if (gated) {
            for (int i = 0; i < TRIES; i++) {
                check(p_cuStreamSynchronize(g_s), "sync");
                seq++;
                check(p_cuStreamWaitValue32_v2(g_s, dflag, seq, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32_v2");
                check(p_cuEventRecord(g_a, g_s), "record");
                launch(spin);
                check(p_cuEventRecord(g_b, g_s), "record");
                __atomic_store_n(flag, seq, __ATOMIC_RELEASE);
                v[i] = elapsed();
            }
            row("gated", spin, v, TRIES);
        }
    }
    for (int i = 0; i < TRIES; i++) {
        check(p_cuStreamSynchronize(g_s), "sync");
        check(p_cuEventRecord(g_a, g_s), "record");
        check(p_cuEventRecord(g_b, g_s), "record");
        v[i] = elapsed();
    }
    row("empty", 0, v, TRIES);
    return 0;
}
