/*
 * sim_slices.c - one process's share of a time-sliced simulated GPU (no libvgpu.so), for
 * tests/isolation/test_sim_timeslice.py:
 *   run START_NS MS   set up, then at CLOCK_MONOTONIC START_NS launch one kernel of MS ms between two events on a
 *                     stream, and print: query (cuEventQuery of the second event right after submitting), elapsed
 *                     (ms between the events), done (ms from START_NS until cuStreamSynchronize returned)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); return 3; } } while (0)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static int cmd_run(uint64_t start, const char *ms) {
    char image[128];
    snprintf(image, sizeof image, "simgpu-module\nk fixed %sms\n", ms);
    CUcontext ctx;
    CUmodule m;
    CUfunction f;
    CUstream s;
    CUevent a, b;
    CK(cuInit(0));
    CK(cuDevicePrimaryCtxRetain(&ctx, 0));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&m, image));
    CK(cuModuleGetFunction(&f, m, "k"));
    CK(cuStreamCreate(&s, 0));
    CK(cuEventCreate(&a, 0));
    CK(cuEventCreate(&b, 0));
    struct timespec t = {.tv_sec = (time_t)(start / 1000000000ULL), .tv_nsec = (long)(start % 1000000000ULL)};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL);
    CK(cuEventRecord(a, s));
    CK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL));
    CK(cuEventRecord(b, s));
    CUresult query = cuEventQuery(b);
    CK(cuStreamSynchronize(s));
    uint64_t done = now_ns();
    float elapsed = 0;
    CK(cuEventElapsedTime(&elapsed, a, b));
    printf("query=%d\nelapsed=%.3f\ndone=%.3f\n", (int)query, elapsed, (double)(done - start) / 1e6);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "run")) return cmd_run(strtoull(argv[2], NULL, 10), argv[3]);
    fprintf(stderr, "usage: sim_slices run START_NS MS\n");
    return 2;
}
