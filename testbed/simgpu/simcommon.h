/*
 * simcommon.h - state shared by the simulated libcuda.so.1 and libnvidia-ml.so.1 (TEST INFRASTRUCTURE ONLY).
 *
 * Configuration (environment):
 *   SIMGPU_DEVICES      comma list of NAME:MEMORY_MIB[:SM_COUNT[:UUID]], default "Sim-A100-40GB:40960:108";
 *                       UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) is what NVML and cuDeviceGetUuid report,
 *                       derived from the name and the position when absent or malformed
 *   SIMGPU_STATE        path of the shared state file (default /dev/shm/simgpu-<uid>.state); every process that
 *                       uses the same path shares device memory and the per-device kernel timeline
 *   SIMGPU_NS_PER_BLOCK default kernel cost in ns per thread block (default 1000)
 *   SIMGPU_MAX_QUEUE_US how far (us) the device timeline may run ahead of "now" before a launch blocks (20000)
 *   SIMGPU_DRIVER_VERSION value of cuDriverGetVersion (default 13000)
 *
 * The state file holds, per device, the bytes in use, the time until which the device is busy ("busy_until",
 * CLOCK_MONOTONIC ns, which is system wide) and a ring of 10 ms buckets of busy time; per process the same
 * buckets and the bytes it holds.  Kernels of all processes are serialised on their device's timeline, which is
 * how launches from several processes contend for one device.  All locks are robust process-shared mutexes.
 */
#ifndef SIMCOMMON_H
#define SIMCOMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SIM_MAX_DEV 8
#define SIM_MAX_PROC 64
#define SIM_BUCKETS 512
#define SIM_BUCKET_NS 10000000ULL
#define SIM_MAGIC 0x53494d4750553031ULL /* "SIMGPU01" */

typedef struct { uint64_t epoch; uint64_t busy; } sim_bucket_t;

typedef struct {
    pthread_mutex_t lock;
    uint64_t busy_until;
    uint64_t used;
    uint64_t busy_total;
    uint64_t launches;
    sim_bucket_t util[SIM_BUCKETS];
} sim_dev_t;

typedef struct {
    int32_t pid;
    int32_t pad;
    uint64_t starttime;
    uint64_t used[SIM_MAX_DEV];
    uint64_t busy_total[SIM_MAX_DEV];
    sim_bucket_t util[SIM_MAX_DEV][SIM_BUCKETS];
} sim_proc_t;

typedef struct {
    uint64_t magic;
    pthread_mutex_t plock;
    sim_dev_t dev[SIM_MAX_DEV];
    sim_proc_t proc[SIM_MAX_PROC];
} sim_state_t;

typedef struct {
    char name[64];
    char uuid[80];
    uint64_t total;
    int sms;
} sim_devcfg_t;

static sim_devcfg_t g_cfg[SIM_MAX_DEV];
static int g_ndev;
static sim_state_t *g_st;
static int g_myslot = -1;
static pid_t g_mypid;

static inline uint64_t sim_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static inline void sim_sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

static uint64_t sim_env_u64(const char *name, uint64_t dflt) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    return *end ? dflt : (uint64_t)v;
}

/* GPU- followed by 32 hex digits in groups of 8-4-4-4-12 */
static int sim_valid_uuid(const char *u) {
    static const int groups[] = {8, 4, 4, 4, 12};
    if (strncmp(u, "GPU-", 4)) return 0;
    u += 4;
    for (int g = 0; g < 5; g++) {
        for (int i = 0; i < groups[g]; i++, u++)
            if (!((*u >= '0' && *u <= '9') || (*u >= 'a' && *u <= 'f') || (*u >= 'A' && *u <= 'F'))) return 0;
        if (*u != (g < 4 ? '-' : '\0')) return 0;
        u++;
    }
    return 1;
}

static void sim_parse_devices(void) {
    const char *spec = getenv("SIMGPU_DEVICES");
    if (!spec || !*spec) spec = "Sim-A100-40GB:40960:108";
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", spec);
    g_ndev = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && g_ndev < SIM_MAX_DEV; tok = strtok_r(NULL, ",", &save)) {
        sim_devcfg_t *d = &g_cfg[g_ndev];
        char *c1 = strchr(tok, ':');
        unsigned long long mib = 16384;
        int sms = 80;
        const char *uuid = NULL;
        if (c1) {
            *c1 = 0;
            char *c2 = strchr(c1 + 1, ':');
            if (c2) {
                *c2 = 0;
                char *c3 = strchr(c2 + 1, ':');
                if (c3) { *c3 = 0; uuid = c3 + 1; }
                sms = atoi(c2 + 1);
            }
            mib = strtoull(c1 + 1, NULL, 10);
        }
        snprintf(d->name, sizeof d->name, "%s", tok);
        d->total = (uint64_t)mib << 20;
        d->sms = sms > 0 ? sms : 80;
        if (uuid && sim_valid_uuid(uuid)) {
            snprintf(d->uuid, sizeof d->uuid, "%s", uuid);
        } else {
            /* deterministic UUID per index and name */
            uint32_t h = 2166136261u;
            for (const char *p = d->name; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
            snprintf(d->uuid, sizeof d->uuid, "GPU-%08x-5349-4d47-8000-%012x", h, 0x51a000 + g_ndev);
        }
        g_ndev++;
    }
}

static void sim_init_mutex(pthread_mutex_t *m) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
}

static inline void sim_lock(pthread_mutex_t *m) {
    if (pthread_mutex_lock(m) == EOWNERDEAD) pthread_mutex_consistent(m);
}
static inline void sim_unlock(pthread_mutex_t *m) { pthread_mutex_unlock(m); }

static uint64_t sim_proc_starttime(pid_t pid) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p) return 0;
    /* field 3 starts after ") "; starttime is field 22 */
    int field = 2;
    for (p++; *p && field < 22; p++) if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

static int sim_proc_alive(pid_t pid, uint64_t start) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    uint64_t s = sim_proc_starttime(pid);
    if (s == 0) return 0;
    if (start && s != start) return 0;
    /* a zombie holds no device memory */
    char path[64], buf[256];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (n > 0) {
            buf[n] = 0;
            char *p = strrchr(buf, ')');
            if (p && (p[2] == 'Z' || p[2] == 'X')) return 0;
        }
    }
    return 1;
}

/* Caller holds plock.  Frees the slots (and device bytes) of processes that are gone. */
static void sim_reap_nolock(void) {
    for (int i = 0; i < SIM_MAX_PROC; i++) {
        sim_proc_t *p = &g_st->proc[i];
        if (p->pid && p->pid != g_mypid && !sim_proc_alive(p->pid, p->starttime)) {
            for (int d = 0; d < SIM_MAX_DEV; d++) {
                if (p->used[d]) {
                    sim_lock(&g_st->dev[d].lock);
                    g_st->dev[d].used -= p->used[d];
                    sim_unlock(&g_st->dev[d].lock);
                }
            }
            memset(p, 0, sizeof *p);
        }
    }
}

static char g_st_path[512];

static void sim_state_path(char *path, size_t n) {
    const char *s = getenv("SIMGPU_STATE");
    if (s && *s) snprintf(path, n, "%s", s);
    else snprintf(path, n, "/dev/shm/simgpu-%d.state", (int)getuid());
}

static int sim_attach_state(void) {
    if (g_st) return 0;
    char path[512];
    sim_state_path(path, sizeof path);
    snprintf(g_st_path, sizeof g_st_path, "%s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    flock(fd, LOCK_EX);
    struct stat stt;
    fstat(fd, &stt);
    if ((size_t)stt.st_size < sizeof(sim_state_t) && ftruncate(fd, sizeof(sim_state_t)) != 0) {
        flock(fd, LOCK_UN); close(fd); return -1;
    }
    sim_state_t *st = mmap(NULL, sizeof(sim_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st == MAP_FAILED) { flock(fd, LOCK_UN); close(fd); return -1; }
    if (st->magic != SIM_MAGIC) {
        memset(st, 0, sizeof *st);
        sim_init_mutex(&st->plock);
        for (int d = 0; d < SIM_MAX_DEV; d++) sim_init_mutex(&st->dev[d].lock);
        __atomic_store_n(&st->magic, SIM_MAGIC, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    g_st = st;
    return 0;
}

/* Like a real driver, a process's device memory goes away when it exits. */
static void sim_exit_release(void) {
    if (!g_st || g_myslot < 0 || g_mypid != getpid()) return;
    sim_proc_t *p = &g_st->proc[g_myslot];
    for (int d = 0; d < SIM_MAX_DEV; d++) {
        sim_lock(&g_st->dev[d].lock);
        g_st->dev[d].used -= p->used[d];
        p->used[d] = 0;
        sim_unlock(&g_st->dev[d].lock);
    }
}

/* Registers this process in the state file (once per process; again after fork). */
static int sim_register(void) {
    pid_t me = getpid();
    if (g_myslot >= 0 && g_mypid == me) return 0;
    if (sim_attach_state()) return -1;
    g_mypid = me;
    uint64_t start = sim_proc_starttime(me);
    sim_lock(&g_st->plock);
    sim_reap_nolock();
    int slot = -1;
    for (int i = 0; i < SIM_MAX_PROC; i++) {
        if (g_st->proc[i].pid == me) { slot = i; break; }
        if (slot < 0 && g_st->proc[i].pid == 0) slot = i;
    }
    if (slot >= 0 && g_st->proc[slot].pid != me) {
        memset(&g_st->proc[slot], 0, sizeof g_st->proc[slot]);
        g_st->proc[slot].pid = me;
        g_st->proc[slot].starttime = start;
    }
    sim_unlock(&g_st->plock);
    g_myslot = slot;
    static int registered;
    if (!registered++) atexit(sim_exit_release);
    return slot >= 0 ? 0 : -1;
}

static inline void sim_bucket_add(sim_bucket_t *ring, uint64_t s, uint64_t e) {
    while (s < e) {
        uint64_t b = s / SIM_BUCKET_NS;
        uint64_t bend = (b + 1) * SIM_BUCKET_NS;
        uint64_t chunk = (e < bend ? e : bend) - s;
        sim_bucket_t *k = &ring[b % SIM_BUCKETS];
        if (k->epoch != b) { k->epoch = b; k->busy = 0; }
        k->busy += chunk;
        s += chunk;
    }
}

/* Busy ns in [t0, t1) from a bucket ring; partial buckets are counted pro rata. */
static inline uint64_t sim_bucket_sum(const sim_bucket_t *ring, uint64_t t0, uint64_t t1) {
    uint64_t total = 0;
    if (t1 <= t0) return 0;
    for (uint64_t b = t0 / SIM_BUCKET_NS; b * SIM_BUCKET_NS < t1; b++) {
        const sim_bucket_t *k = &ring[b % SIM_BUCKETS];
        if (k->epoch != b) continue;
        uint64_t bs = b * SIM_BUCKET_NS, be = bs + SIM_BUCKET_NS;
        uint64_t lo = t0 > bs ? t0 : bs, hi = t1 < be ? t1 : be;
        total += (uint64_t)((double)k->busy * (double)(hi - lo) / (double)SIM_BUCKET_NS);
    }
    return total;
}

static void sim_common_init(void) {
    if (g_ndev == 0) sim_parse_devices();
}

#endif
