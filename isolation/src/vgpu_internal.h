/*
 * vgpu_internal.h - declarations shared by the translation units of libvgpu.so.
 */
#ifndef VGPU_INTERNAL_H
#define VGPU_INTERNAL_H

#define _GNU_SOURCE
/* cuda.h then declares every entry point under its own versioned name (cuMemAlloc is the v1 symbol, cuMemAlloc_v2
 * the current one, the _ptsz forms too) instead of mapping names to the newest version with macros. */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include "vgpu_nvml.h"
#include "vgpu_region.h"

#define HIDDEN __attribute__((visibility("hidden")))
/* Thread-local state in the static TLS block: the library is preloaded (LD_PRELOAD, ld.so.preload), so it is there
 * from the start, and a hot path reads it without a __tls_get_addr call.  Under 300 bytes, well within the surplus
 * glibc keeps should the library ever be dlopen()ed instead. */
#define THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
#define EXPORT __attribute__((visibility("default")))
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* log levels: errors always; LIBCUDA_LOG_LEVEL >= 2 warnings (default), >= 3 info, >= 4 debug */
enum { VLOG_ERROR = 0, VLOG_WARN = 2, VLOG_INFO = 3, VLOG_DEBUG = 4 };
HIDDEN extern int vgpu_log_level;
HIDDEN void vgpu_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define VLOG(lvl, ...) do { if ((lvl) == VLOG_ERROR || vgpu_log_level >= (lvl)) vgpu_log((lvl), __VA_ARGS__); } while (0)

/* policy values of GPU_CORE_UTILIZATION_POLICY */
enum { POLICY_DEFAULT = 0, POLICY_FORCE = 1, POLICY_DISABLE = 2 };

/* accounting kinds -> v1 fields */
enum { ACCT_CONTEXT = 0, ACCT_MODULE = 1, ACCT_DATA = 2 };

typedef struct {
    int config_error;        /* limits that cannot be enforced (a limit env var that does not parse, or no usable
                                accounting region without VGPU_ISOLATION_FAIL_OPEN): cuInit/nvmlInit fail */
    int fail_open;           /* VGPU_ISOLATION_FAIL_OPEN=1: without a usable region, run without limits */
    int active;              /* a shared region is attached (some limit configured) */
    int sm_configured;       /* some device has 0 < SM limit < 100 at start */
    int policy;
    uint64_t mem_limit[VGPU_MAX_DEVICES];   /* by position in the container's grant (see grant_uuid) */
    int sm_limit[VGPU_MAX_DEVICES];
    char grant_uuid[VGPU_MAX_DEVICES][VGPU_UUID_LEN]; /* the UUID each position's limits belong to */
    int grant_count;         /* positions with a UUID; 0 when the environment does not name the GPUs by UUID */
    uint64_t context_overhead;
    int count_managed;
    uint64_t own_used[VGPU_MAX_DEVICES];    /* by region row: what this process holds, in its own memory */
    int tampered;            /* the accounting file contradicts what this process knows: every charge is refused */
    vgpu_region_t *region;
    vgpu_ext_t *ext;
    int slot;
    pid_t pid;
} vgpu_state_t;

HIDDEN extern vgpu_state_t g_vgpu;

/* A device's compute limit (percent, 0 = none): the tighter of this process's own and the accounting file's, which
 * the container can write, so changing the file never loosens it. Inline: the launch path reads it every time. */
static inline uint64_t vgpu_sm_limit(int row) {
    uint64_t mine = (uint64_t)g_vgpu.sm_limit[row];
    uint64_t file = __atomic_load_n(&g_vgpu.region->sm_limit[row], __ATOMIC_RELAXED);
    return !mine ? file : !file ? mine : mine < file ? mine : file;
}

/* env.c */
HIDDEN int vgpu_parse_size(const char *s, uint64_t *out);
HIDDEN int vgpu_parse_percent(const char *s, int *out);
HIDDEN void vgpu_read_env(void);
HIDDEN const char *vgpu_config(const char *name);

/* region.c */
HIDDEN int vgpu_region_attach(char *why, size_t why_len);
HIDDEN int vgpu_slot(void);
HIDDEN int vgpu_reserve(int row, uint64_t bytes, int kind);
HIDDEN void vgpu_release(int row, uint64_t bytes, int kind);
HIDDEN int vgpu_row_for_uuid(const char *uuid);
/* pace.c: the node's correction of the compute limiter's timings (caller holds the limiter's lock) */
HIDDEN void vgpu_pace_refresh(uint64_t now_sec);
HIDDEN double vgpu_pace(int row);
HIDDEN void vgpu_mark_tampered(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
HIDDEN uint64_t vgpu_used(int row);
HIDDEN uint64_t vgpu_limit(int row);
HIDDEN uint64_t vgpu_now_ns(void);
HIDDEN void vgpu_note_export(uint64_t hash);
HIDDEN int vgpu_exported(uint64_t hash);

/* hooks.c */
HIDDEN void vgpu_ensure_init(void);
HIDDEN void *vgpu_wrapper_for(const char *name, void *real);
HIDDEN void *vgpu_wrapper_for_real(void *real);
HIDDEN extern void *(*vgpu_real_dlsym)(void *, const char *);

#endif
