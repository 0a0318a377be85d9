/*
 * sim_holder.c - a simulated-CUDA process that holds device memory until it is killed (no libvgpu.so), for
 * tests/isolation/test_sim_pidns.py:
 *   hold MIB       allocate MIB MiB, print "ready", wait
 *   forkhold MIB   allocate MIB MiB, fork a child that never touches CUDA and sleeps, print "ready child=PID", wait
 *   used           join the node (which reaps the dead) and print what GPU 0 holds
 *   privatehold MIB  as hold, through a private copy of the driver (dlmopen into a new link-map namespace), which
 *                  a preloaded libvgpu.so does not interpose: the bypass tests/deviceplugin/test_dp_guard.py stops
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void alloc_mib(unsigned mib) {
    CUcontext ctx;
    CUdeviceptr p;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) || cuMemAlloc(&p, (size_t)mib << 20)) {
        printf("error=alloc\n");
        exit(3);
    }
}

/* hold, through a copy of libcuda.so.1 loaded into a namespace of its own */
static void alloc_mib_private(unsigned mib) {
    void *lib = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned) = lib ? (CUresult (*)(unsigned))dlsym(lib, "cuInit") : NULL;
    CUresult (*retain)(CUcontext *, CUdevice) =
        lib ? (CUresult (*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain") : NULL;
    CUresult (*current)(CUcontext) = lib ? (CUresult (*)(CUcontext))dlsym(lib, "cuCtxSetCurrent") : NULL;
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        lib ? (CUresult (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2") : NULL;
    CUcontext ctx;
    CUdeviceptr p;
    if (!init || !retain || !current || !alloc || init(0) || retain(&ctx, 0) || current(ctx) ||
        alloc(&p, (size_t)mib << 20)) {
        printf("error=alloc\n");
        exit(3);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    unsigned mib = argc > 2 ? (unsigned)atoi(argv[2]) : 0;
    if (!strcmp(cmd, "hold")) {
        alloc_mib(mib);
        printf("ready pid=%d\n", (int)getpid());
        for (;;) pause();
    }
    if (!strcmp(cmd, "privatehold")) {
        alloc_mib_private(mib);
        printf("ready pid=%d\n", (int)getpid());
        for (;;) pause();
    }
    if (!strcmp(cmd, "forkhold")) {
        alloc_mib(mib);
        pid_t child = fork();
        if (child == 0) {
            for (;;) pause();
        }
        printf("ready child=%d\n", (int)child);
        for (;;) pause();
    }
    if (!strcmp(cmd, "used")) {
        uint64_t (*used)(int) = (uint64_t (*)(int))dlsym(dlopen("libcuda.so.1", RTLD_NOW), "simgpu_used_bytes");
        CUresult r = cuInit(0);
        printf("init=%d\nused=%llu\n", (int)r, (unsigned long long)used(0));
        return 0;
    }
    return 2;
}
