/*
 * tamper.c - a tenant's process that rewrites its own container's accounting file (the file every process of the
 * container may write), with libvgpu.so preloaded, for tests/isolation/test_memory.py:
 *   uuid                 print the UUID of device 0 (run without the library)
 *   zero MIB             allocate MIB MiB at a time; after each allocation write 0 into the file's usage counters
 *   rows MIB             after cuInit, fill the file's device table with other UUIDs; then allocate as above
 *   moved MIB            after cuInit, move device 0's UUID to the table's second row; then allocate as above
 * Prints count= (allocations that succeeded), allocated= (MiB) and err= (the refusing call's CUresult).
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vgpu_region.h"

static vgpu_region_t *region;
static vgpu_ext_t *ext;

static void map_file(void) {
    const char *path = getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    int fd = path ? open(path, O_RDWR) : -1;
    void *m = fd < 0 ? MAP_FAILED : mmap(NULL, VGPU_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        printf("error=map\n");
        exit(3);
    }
    region = m;
    ext = (vgpu_ext_t *)((char *)m + VGPU_EXT_OFFSET);
}

static void uuid_of(CUdevice d, char *out, size_t len) {
    CUuuid u;
    const unsigned char *b = (const unsigned char *)u.bytes;
    cuDeviceGetUuid(&u, d);
    snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
             b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    size_t chunk = (size_t)(argc > 2 ? strtoull(argv[2], NULL, 0) : 256) << 20;
    char uuid[VGPU_UUID_LEN];
    if (cuInit(0)) {
        printf("init=failed\n");
        return 3;
    }
    if (!strcmp(mode, "uuid")) {
        uuid_of(0, uuid, sizeof uuid);
        printf("uuid=%s\n", uuid);
        return 0;
    }
    map_file();
    if (!strcmp(mode, "rows")) {
        for (int i = 0; i < VGPU_MAX_DEVICES; i++) snprintf(region->uuids[i], VGPU_UUID_LEN, "GPU-other-%d", i);
        region->device_num = VGPU_MAX_DEVICES;
    } else if (!strcmp(mode, "moved")) {
        memcpy(region->uuids[1], region->uuids[0], VGPU_UUID_LEN);
        snprintf(region->uuids[0], VGPU_UUID_LEN, "GPU-other");
        region->device_num = 2;
    }
    CUcontext ctx;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx)) {
        printf("error=context\n");
        return 3;
    }
    int count = 0;
    CUresult err = CUDA_SUCCESS;
    for (; count < 1000; count++) {
        CUdeviceptr p;
        err = cuMemAlloc(&p, chunk);
        if (err) break;
        if (!strcmp(mode, "zero"))
            for (int i = 0; i < VGPU_MAX_DEVICES; i++) ext->used[i] = 0;
    }
    printf("count=%d\nallocated=%llu\nerr=%d\n", count, (unsigned long long)(count * (chunk >> 20)), (int)err);
    return 0;
}
