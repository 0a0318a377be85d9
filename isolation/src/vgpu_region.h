/*
 * vgpu_region.h - layout of the shared accounting file ($CUDA_DEVICE_MEMORY_SHARED_CACHE).
 *
 * Bytes [0, 2008952) are HAMi-core's v1.2 `shared_region_t`, byte for byte, so HAMi's vGPUmonitor reads our file
 * and we read HAMi-core's.  Our own state (a robust mutex, container-wide counters, slot start times and the
 * compute budget) lives in `vgpu_ext_t` at VGPU_EXT_OFFSET, after the v1 region.  Version 2 appended, per slot,
 * how its owner's liveness is known (a lock byte at VGPU_SLOT_LOCK_BASE + slot that the owner holds with an open
 * file description lock) and the owner's PID namespace, plus the hashes of memory the container exported; fields
 * are only ever appended, so processes of an older version keep working beside newer ones.
 *
 * The block between the CDEF markers is plain C that cffi's cdef() parses as is (isolation/region.py reads
 * this very file), so the Python reader and the library cannot drift apart.  Fields HAMi-core treats as
 * atomics are plain integers here; the library accesses them with __atomic builtins.  sem_t fields (unused
 * by us, kept for HAMi-core) are opaque 32-byte arrays.
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stddef.h>
#include <stdint.h>

#define VGPU_MAGIC 19920718
#define VGPU_MAJOR 1
#define VGPU_MINOR 2
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_PROCS 1024
#define VGPU_UUID_LEN 96
#define VGPU_V1_SIZE 2008952
#define VGPU_EXT_OFFSET 2011136 /* first 4 KiB boundary after the v1 region */
#define VGPU_EXT_MAGIC 0x3154584555504756ULL /* "VGPUEXT1" little endian */
#define VGPU_EXT_VERSION 2       /* 2 appended slot_flags, slot_pidns and exported; version 1 files are upgraded */
#define VGPU_EXPORTS 64
#define VGPU_SLOT_LOCKED 1u       /* slot_flags: the owner holds the slot's liveness lock for its whole life */
#define VGPU_SLOT_LOCK_BASE (1LL << 40) /* byte offset of slot 0's liveness lock (past the end: locks only) */

/* CDEF-BEGIN */
typedef struct {
    uint64_t context_size;
    uint64_t module_size;
    uint64_t data_size;
    uint64_t offset;
    uint64_t total;
    uint64_t unused[3];
} vgpu_devmem_t;

typedef struct {
    uint64_t dec_util;
    uint64_t enc_util;
    uint64_t sm_util;
    uint64_t unused[3];
} vgpu_devutil_t;

typedef struct {
    int32_t pid;
    int32_t hostpid;
    vgpu_devmem_t used[16];
    uint64_t monitorused[16];
    vgpu_devutil_t device_util[16];
    int32_t status;
    int32_t pad0;
    uint64_t seqlock;
    uint64_t unused[2];
} vgpu_proc_slot_t;

typedef struct {
    int32_t initialized_flag;
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    uint8_t sem[32];
    uint64_t device_num;
    char uuids[16][96];
    uint64_t limit[16];
    uint64_t sm_limit[16];
    vgpu_proc_slot_t procs[1024];
    int32_t proc_num;
    int32_t utilization_switch;
    int32_t recent_kernel;
    int32_t priority;
    uint64_t last_kernel_time;
    uint8_t sem_postinit[32];
} vgpu_region_t;

typedef struct {
    int64_t tokens;
    uint64_t last_refill;
    uint64_t charged_ns;
    uint64_t launches;
    uint64_t throttled_ns;
    uint64_t measured_ns;
    uint64_t read_ns;    /* what charged_ns would be without the node's pace factors (pace.c): the uncorrected charge */
    uint64_t pad[1];
} vgpu_sm_state_t;

typedef struct {
    uint64_t magic;
    uint32_t version;
    uint32_t size;
    uint8_t lock[64];
    uint64_t used[16];
    uint64_t oom_count[16];
    uint64_t peak[16];
    uint64_t slot_start[1024];
    vgpu_sm_state_t sm[16];
    uint32_t slot_flags[1024];
    uint64_t slot_pidns[1024];
    uint64_t exported[64];
    uint32_t exported_next;
    uint32_t pad1;
} vgpu_ext_t;
/* CDEF-END */

#define VGPU_FILE_SIZE (VGPU_EXT_OFFSET + sizeof(vgpu_ext_t))

/* The v1 layout, checked against the figures of HAMi-core 1.2 (x86-64). */
_Static_assert(sizeof(vgpu_devmem_t) == 64, "device_memory_t size");
_Static_assert(sizeof(vgpu_devutil_t) == 48, "device_util_t size");
_Static_assert(sizeof(vgpu_proc_slot_t) == 1960, "proc slot size");
_Static_assert(offsetof(vgpu_proc_slot_t, pid) == 0, "slot.pid");
_Static_assert(offsetof(vgpu_proc_slot_t, hostpid) == 4, "slot.hostpid");
_Static_assert(offsetof(vgpu_proc_slot_t, used) == 8, "slot.used");
_Static_assert(offsetof(vgpu_proc_slot_t, monitorused) == 1032, "slot.monitorused");
_Static_assert(offsetof(vgpu_proc_slot_t, device_util) == 1160, "slot.device_util");
_Static_assert(offsetof(vgpu_proc_slot_t, status) == 1928, "slot.status");
_Static_assert(offsetof(vgpu_proc_slot_t, seqlock) == 1936, "slot.seqlock");
_Static_assert(offsetof(vgpu_proc_slot_t, unused) == 1944, "slot.unused");
_Static_assert(offsetof(vgpu_region_t, initialized_flag) == 0, "initialized_flag");
_Static_assert(offsetof(vgpu_region_t, major_version) == 4, "major_version");
_Static_assert(offsetof(vgpu_region_t, minor_version) == 8, "minor_version");
_Static_assert(offsetof(vgpu_region_t, sm_init_flag) == 12, "sm_init_flag");
_Static_assert(offsetof(vgpu_region_t, owner_pid) == 16, "owner_pid");
_Static_assert(offsetof(vgpu_region_t, sem) == 24, "sem");
_Static_assert(offsetof(vgpu_region_t, device_num) == 56, "device_num");
_Static_assert(offsetof(vgpu_region_t, uuids) == 64, "uuids");
_Static_assert(offsetof(vgpu_region_t, limit) == 1600, "limit");
_Static_assert(offsetof(vgpu_region_t, sm_limit) == 1728, "sm_limit");
_Static_assert(offsetof(vgpu_region_t, procs) == 1856, "procs");
_Static_assert(offsetof(vgpu_region_t, proc_num) == 2008896, "proc_num");
_Static_assert(offsetof(vgpu_region_t, utilization_switch) == 2008900, "utilization_switch");
_Static_assert(offsetof(vgpu_region_t, recent_kernel) == 2008904, "recent_kernel");
_Static_assert(offsetof(vgpu_region_t, priority) == 2008908, "priority");
_Static_assert(offsetof(vgpu_region_t, last_kernel_time) == 2008912, "last_kernel_time");
_Static_assert(offsetof(vgpu_region_t, sem_postinit) == 2008920, "sem_postinit");
_Static_assert(sizeof(vgpu_region_t) == VGPU_V1_SIZE, "v1 region size");
_Static_assert(VGPU_EXT_OFFSET >= VGPU_V1_SIZE && VGPU_EXT_OFFSET % 4096 == 0, "extension placement");
_Static_assert(sizeof(vgpu_sm_state_t) == 64, "sm state size");
_Static_assert(offsetof(vgpu_ext_t, slot_flags) == 9680, "version 2 fields follow the version 1 extension");

#endif
