/*
 * gpusim.h - the simulated node's GPUs: configuration and the state file every simulated process maps.
 * TEST INFRASTRUCTURE.  Shares no code or header with the isolation library it is used to test.
 *
 * Environment:
 *   SIMGPU_DEVICES   the GPUs this process sees: comma list of NAME:MIB[:SMS[:UUID[:FLAGS]]]; FLAGS is a '+' list
 *                    of `mig` (MIG mode on), `numaN` (NUMA node N), `busN` (PCI bus number N, decimal or 0x hex;
 *                    default: the 1-based position in the list), `rootN` (the PCIe root complex / host bridge the
 *                    GPU hangs off, default 0) and `nvlN` (an NVLink peer: the GPU on PCI bus N, which need not be
 *                    in the list; one flag per peer, the GPU's GS_NVLINKS links shared out among its peers).
 *                    Without a UUID one is derived from the name and the position.  Default "Sim-A100-40GB:40960:108".
 *                    NVML enumerates the GPUs by PCI bus number; CUDA orders them as CUDA_DEVICE_ORDER says
 *                    (FASTEST_FIRST, the default: most SMs first; PCI_BUS_ID) and then applies CUDA_VISIBLE_DEVICES
 *                    (indices into that order, or GPU UUIDs / unique UUID prefixes).  Ties keep bus order, then the
 *                    listed order, so a list of identical GPUs keeps its order everywhere.
 *   SIMGPU_STATE     the node's state file (default /dev/shm/simgpu-<uid>.state).  Devices are keyed by UUID in
 *                    it, so processes that see different subsets of a node's GPUs still share each GPU.
 *   SIMGPU_SEED      seed of the kernel-duration draws (default 1; mixed with the pid).
 *   SIMGPU_QUEUE_DEPTH  launches a stream may have in flight before a launch blocks (default 1024).
 *   SIMGPU_TIMESLICE_NS  time-slice the GPU between contexts with slices this long (default 0: the one
 *                    first-in-first-out engine below); every process using a node's GPUs should set the same.
 *   SIMGPU_CTXSW_NS  with time slicing, what a switch between contexts costs the engine (default 0).
 *   SIMGPU_DRIVER_VERSION  cuDriverGetVersion (default 13000).
 *   SIMGPU_CTX_BYTES  device memory each CUDA context takes (libcuda; default 0).
 *   SIMGPU_CALLS_DUMP  a file each libcuda process appends its per-entry-point call counts to when it exits.
 *
 * The device model: one execution engine per GPU that takes work (kernels and event records) from every stream
 * of every process in the order it was submitted; a kernel occupies the whole GPU for its duration.  That order
 * is fixed at submission, so each piece of work gets its start and end time when it is submitted and the device
 * timeline ("gs_tl") is written then: the busy share of a GPU, or of one process on it, over any past window is
 * read from there.  A process's memory is freed when it exits; processes that died are noticed and reaped.
 * With SIMGPU_TIMESLICE_NS the GPU time-slices between processes instead, as a real GPU does between contexts
 * (timeslice.h): then the times are only known once the schedule reaches them.
 *
 * Process identity does not rest on pids (which PID namespaces make ambiguous): each process holds an open file
 * description lock (F_OFD_SETLK) on one byte of the state file, at GS_LIVE_BASE + its slot, for as long as it lives;
 * a slot whose byte nobody holds belongs to a process that is gone.  A forked child drops its copy of that file
 * description at once (pthread_atfork), so it never keeps its parent's identity alive.
 */
#ifndef GPUSIM_H
#define GPUSIM_H

#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define GS_NDEV 16            /* GPUs in one node's state */
#define GS_NVLINKS 18         /* NVLink links of a simulated GPU that has NVLink (an H100 SXM has 18) */
#define GS_NPROC 64           /* processes using the node's GPUs at once */
#define GS_DEV_TICK 1000000ULL   /* device timeline: 1 ms bins ... */
#define GS_DEV_BINS 16384        /* ... over the last 16 s */
#define GS_PROC_TICK 2000000ULL  /* per-process timeline: 2 ms bins ... */
#define GS_PROC_BINS 8192        /* ... over the last 16 s */
#define GS_NLIMIT 64          /* per-cgroup memory limits */
#define GS_XID_RING 32
#define GS_CGROUP_LEN 256
#define GS_NEXPORT 256        /* allocations exported to other processes (IPC handles, shareable handles) */
#define GS_STATE_MAGIC 0x34454441544e4953ULL
#define GS_LIVE_BASE (1LL << 40)  /* lock byte of process slot i: GS_LIVE_BASE + i, far past the mapped state */

typedef struct { uint32_t tick; uint32_t busy; } gs_bin_t;

/* Time slicing (timeslice.h): one run queue per context, keyed by its process. */
#define GS_TSQ 16             /* processes with queued work on one GPU at once */
#define GS_TSRING 4096        /* items a run queue remembers, pending and finished */

typedef struct {
    uint64_t seq;             /* which item of its queue this entry holds; 0: never used */
    uint64_t left;            /* device ns it still has to run */
    uint64_t at;              /* when the engine first reached it; UINT64_MAX until then */
    uint64_t fin;             /* when it finished; UINT64_MAX until then */
} gs_item_t;

typedef struct {
    uint64_t gen;             /* the owner process's gen (gs_proc_t.gen); 0: free */
    int32_t proc;             /* the owner's process slot */
    uint32_t pad_;
    uint64_t head;            /* seq of the oldest unfinished item */
    uint64_t next;            /* seq the next item gets */
    uint64_t lost_fin;        /* finish time of the newest item whose ring entry was reused */
    gs_item_t ring[GS_TSRING];
} gs_runq_t;

typedef struct {
    char uuid[48];            /* "" = slot free */
    pthread_mutex_t mu;       /* guards the timeline, memory and Xid ring of this GPU */
    uint64_t total;           /* bytes */
    uint64_t used;
    uint64_t tail;            /* CLOCK_MONOTONIC ns at which all submitted work is done */
    uint64_t launches;
    uint64_t busy_ns;
    uint32_t lost;            /* fell off the bus: NVML answers GPU_IS_LOST */
    uint32_t xid_count;
    uint32_t xid_code[GS_XID_RING];
    gs_bin_t tl[GS_DEV_BINS];
    /* time slicing (timeslice.h); all zero while every process runs the first-in-first-out engine */
    uint64_t ts_slice;        /* slice length, ns; 0: this GPU never time-sliced */
    uint64_t ts_switch;       /* cost of a switch between contexts, ns */
    uint64_t ts_now;          /* the schedule is worked out up to this time */
    uint64_t ts_slice_left;   /* of the running context's slice */
    uint64_t ts_switch_left;  /* of the switch under way */
    int32_t ts_cur;           /* run queue on the engine, plus one; 0: idle */
    uint32_t ts_pad_;
    gs_runq_t rq[GS_TSQ];
} gs_gpu_t;

typedef struct {
    int32_t pid;              /* 0 = free; as the process sees itself (its own PID namespace) */
    int32_t owner;            /* the last pid that used the slot: its timeline stays readable until reuse */
    uint64_t born;            /* /proc/<pid>/stat start time, against pid reuse (only without OFD locks) */
    uint64_t gen;             /* which occupant of the slot this is: unique per join in the node state */
    uint32_t live_lock;       /* 1: the process holds its slot's OFD lock byte, and liveness is read from it */
    uint32_t pad_;
    char cgroup[GS_CGROUP_LEN];   /* unified-hierarchy path of the process, e.g. /kubepods/pod1/ctr */
    uint64_t mem[GS_NDEV];
    uint64_t busy_ns[GS_NDEV];
    gs_bin_t tl[GS_NDEV][GS_PROC_BINS];
} gs_proc_t;

typedef struct {
    char path[GS_CGROUP_LEN]; /* "" = free; the cgroup directory as given to nvmlDeviceSetMemoryLimits_v1 */
    char uuid[48];
    uint64_t soft, hard;
} gs_limit_t;

/* an allocation another process may map: a cuIpcGetMemHandle'd buffer or a shareable-handle export */
typedef struct {
    uint64_t serial;          /* 0 = free; unique over the node state's life */
    int32_t proc;             /* exporter's process slot ... */
    uint32_t gpu;             /* ... and state GPU slot */
    uint64_t gen;             /* exporter's gen: the entry dies with its process */
    uint64_t addr, bytes;
} gs_export_t;

typedef struct {
    uint64_t magic;
    pthread_mutex_t mu;       /* guards the process table, the GPU table, the limits and the exports */
    gs_gpu_t gpu[GS_NDEV];
    gs_limit_t limit[GS_NLIMIT];
    uint64_t next_gen, next_serial;
    gs_export_t exports[GS_NEXPORT];
    uint32_t next_proc;       /* slots are handed out round robin, so a finished process's timeline lasts */
    gs_proc_t proc[GS_NPROC];
} gs_state_t;

/* what this process was configured to see */
typedef struct {
    char name[96];
    char uuid[48];
    uint64_t total;
    int sms;
    int mig;
    int numa;
    int bus;                  /* PCI bus number */
    int root;                 /* PCIe root complex (host bridge) */
    int npeer;                /* NVLink peers; 0: no NVLink */
    int peer[GS_NVLINKS];     /* their PCI bus numbers */
    int listed;               /* position in SIMGPU_DEVICES */
    int slot;                 /* index into gs_state_t.gpu, -1 until attached */
} gs_view_t;

/* GS_ORDER_CUDA (set by simcuda.c before including this header): enumerate as CUDA does, else as NVML does */
#ifndef GS_ORDER_CUDA
#define GS_ORDER_CUDA 0
#endif

static gs_view_t gs_all[GS_NDEV];   /* every GPU of SIMGPU_DEVICES, as listed */
static int gs_nall = -1;
static gs_view_t gs_view[GS_NDEV];  /* the GPUs this library enumerates, in its order (index = ordinal) */
static int gs_nview = -1;
static gs_state_t *gs_st;
static char gs_st_path[512];
static ino_t gs_st_ino;       /* inode of the mapped state file */
static int gs_me = -1;        /* our process slot */
static pid_t gs_me_pid;
static int gs_live_fd = -1;   /* the open file description holding our slot's lock byte */
static int gs_probe_fd = -1;  /* an open file description of the state file for asking about others' locks */

static inline uint64_t gs_clock(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void gs_nap(uint64_t ns) {
    uint64_t until = gs_clock() + ns;
    struct timespec t;
    t.tv_sec = (time_t)(until / 1000000000ULL);
    t.tv_nsec = (long)(until - (uint64_t)t.tv_sec * 1000000000ULL);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR) {}
}

static uint64_t gs_env_num(const char *key, uint64_t fallback) {
    const char *v = getenv(key);
    char *end = NULL;
    if (!v || !*v) return fallback;
    unsigned long long x = strtoull(v, &end, 10);
    return (end && *end == 0) ? (uint64_t)x : fallback;
}

static int gs_uuid_ok(const char *s) {
    static const int len[5] = {8, 4, 4, 4, 12};
    if (strncmp(s, "GPU-", 4) != 0) return 0;
    s += 4;
    for (int g = 0; g < 5; g++) {
        for (int k = 0; k < len[g]; k++, s++) {
            char c = *s;
            int hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
            if (!hex) return 0;
        }
        if (g < 4 ? *s != '-' : *s != 0) return 0;
        s++;
    }
    return 1;
}

/* Parses SIMGPU_DEVICES into gs_all. */
static void gs_parse_devices(void) {
    const char *spec = getenv("SIMGPU_DEVICES");
    char text[8192];
    snprintf(text, sizeof text, "%s", spec && *spec ? spec : "Sim-A100-40GB:40960:108");
    int n = 0;
    char *outer = NULL;
    memset(gs_all, 0, sizeof gs_all);
    for (char *item = strtok_r(text, ",", &outer); item && n < GS_NDEV; item = strtok_r(NULL, ",", &outer)) {
        gs_view_t *v = &gs_all[n];
        char *field[5] = {item, NULL, NULL, NULL, NULL};
        for (int f = 1; f < 5; f++) {
            char *colon = field[f - 1] ? strchr(field[f - 1], ':') : NULL;
            if (!colon) break;
            *colon = 0;
            field[f] = colon + 1;
        }
        snprintf(v->name, sizeof v->name, "%s", field[0]);
        v->total = (field[1] ? strtoull(field[1], NULL, 10) : 16384ULL) << 20;
        v->sms = field[2] ? atoi(field[2]) : 0;
        if (v->sms <= 0) v->sms = 80;
        v->numa = -1;
        v->slot = -1;
        v->listed = n;
        v->bus = n + 1;
        if (field[3] && gs_uuid_ok(field[3])) {
            snprintf(v->uuid, sizeof v->uuid, "%s", field[3]);
        } else {
            uint64_t h = 1469598103934665603ULL;
            for (const char *c = v->name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ULL;
            snprintf(v->uuid, sizeof v->uuid, "GPU-%08x-%04x-4d53-9000-%012llx", (unsigned)(h >> 32),
                     (unsigned)(h & 0xffff), 0xa11ce0000ULL + (unsigned long long)n);
        }
        for (char *flag = field[4]; flag && *flag;) {
            char *plus = strchr(flag, '+');
            if (plus) *plus = 0;
            if (!strcmp(flag, "mig")) v->mig = 1;
            else if (!strncmp(flag, "numa", 4)) v->numa = atoi(flag + 4);
            else if (!strncmp(flag, "bus", 3)) v->bus = (int)(strtol(flag + 3, NULL, 0) & 0xff);
            else if (!strncmp(flag, "root", 4)) v->root = atoi(flag + 4);
            else if (!strncmp(flag, "nvl", 3) && v->npeer < GS_NVLINKS)
                v->peer[v->npeer++] = (int)(strtol(flag + 3, NULL, 0) & 0xff);
            flag = plus ? plus + 1 : NULL;
        }
        n++;
    }
    gs_nall = n;
}

/* Orders: 1 when a comes after b.  PCI order: bus, then listing.  Fastest first: more SMs first, then PCI order. */
static int gs_after(const gs_view_t *a, const gs_view_t *b, int fastest) {
    if (fastest && a->sms != b->sms) return a->sms < b->sms;
    if (a->bus != b->bus) return a->bus > b->bus;
    return a->listed > b->listed;
}

static void gs_sort(gs_view_t *v, int n, int fastest) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && gs_after(&v[j - 1], &v[j], fastest); j--) {
            gs_view_t t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
}

/* CUDA_VISIBLE_DEVICES over the ordered list `in`: indices into it or (unique prefixes of) UUIDs, in the order
 * given; the first entry that names no device (or one already taken) ends the list.  Returns the count. */
static int gs_cuda_visible(const gs_view_t *in, int n, gs_view_t *out) {
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    if (!env) {
        memcpy(out, in, sizeof *in * (size_t)n);
        return n;
    }
    char text[1024];
    snprintf(text, sizeof text, "%s", env);
    int taken[GS_NDEV] = {0}, m = 0;
    char *save = NULL;
    for (char *tok = strtok_r(text, ",", &save); tok && m < GS_NDEV; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ' || *tok == '\t') tok++;
        size_t len = strlen(tok);
        while (len && (tok[len - 1] == ' ' || tok[len - 1] == '\t')) tok[--len] = 0;
        int pick = -1;
        if (!strncmp(tok, "GPU-", 4)) {
            for (int i = 0; i < n; i++) {
                if (strncasecmp(in[i].uuid, tok, len)) continue;
                if (pick >= 0) { pick = -1; break; }   /* ambiguous prefix */
                pick = i;
            }
        } else {
            char *end = NULL;
            long x = strtol(tok, &end, 10);
            if (end != tok && !*end && x >= 0 && x < n) pick = (int)x;
        }
        if (pick < 0 || taken[pick]) break;
        taken[pick] = 1;
        out[m++] = in[pick];
    }
    return m;
}

/* Parses SIMGPU_DEVICES (once) and puts the GPUs this library enumerates, in its order, in gs_view. */
static void gs_configure(void) {
    if (gs_nall >= 0 && gs_nview >= 0) return;
    gs_parse_devices();
    gs_view_t sorted[GS_NDEV];
    memcpy(sorted, gs_all, sizeof sorted);
    if (GS_ORDER_CUDA) {
        const char *order = getenv("CUDA_DEVICE_ORDER");
        gs_sort(sorted, gs_nall, !(order && !strcmp(order, "PCI_BUS_ID")));
        gs_nview = gs_cuda_visible(sorted, gs_nall, gs_view);
    } else {
        gs_sort(sorted, gs_nall, 0);
        memcpy(gs_view, sorted, sizeof sorted);
        gs_nview = gs_nall;
    }
}

static void gs_mutex_init(pthread_mutex_t *m) {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(m, &attr);
    pthread_mutexattr_destroy(&attr);
}

static void gs_lock(pthread_mutex_t *m) {
    if (pthread_mutex_lock(m) == EOWNERDEAD) pthread_mutex_consistent(m);
}

static void gs_unlock(pthread_mutex_t *m) { pthread_mutex_unlock(m); }

/* start time (field 22) and state (field 3) of a process; 0 when it does not exist */
static uint64_t gs_born(pid_t pid, char *state) {
    char name[48], line[768];
    snprintf(name, sizeof name, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(name, "re");
    if (!f) return 0;
    size_t got = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[got] = 0;
    char *rest = strrchr(line, ')'), st = 0;
    unsigned long long start = 0;
    /* after the command: state, then 18 numbers, then the start time */
    if (!rest || sscanf(rest + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
                        &st, &start) != 2)
        return 0;
    if (state) *state = st;
    return start;
}

/* The unified-hierarchy cgroup of this process ("" when there is none). */
static void gs_own_cgroup(char *out, size_t n) {
    out[0] = 0;
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return;
    char line[GS_CGROUP_LEN + 32];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "0::", 3) == 0) {
            size_t len = strcspn(line + 3, "\n");
            if (len >= n) len = n - 1;
            memcpy(out, line + 3, len);
            out[len] = 0;
            break;
        }
    }
    fclose(f);
}

/* One byte of the state file per process slot, locked by the slot's process for as long as it lives.  op is
 * F_OFD_SETLK (take it) or F_OFD_GETLK (ask who has it: *held says whether another file description does). */
static int gs_live_op(int fd, int slot, int op, int *held) {
    struct flock lk = {.l_start = GS_LIVE_BASE + slot, .l_len = 1, .l_whence = SEEK_SET, .l_type = F_WRLCK};
    int rc = fcntl(fd, op, &lk);
    if (held) *held = rc == 0 && lk.l_type != F_UNLCK;
    return rc;
}

/* Is slot i's process gone?  With an OFD lock: nobody holds its byte.  Without (a file system that has no OFD
 * locks): its pid no longer names a live process born when it joined, as this process's PID namespace sees it. */
static int gs_proc_gone(const gs_proc_t *pr) {
    int i = (int)(pr - gs_st->proc);
    if (i == gs_me && pr->pid == gs_me_pid && gs_me_pid == getpid()) return 0;
    if (pr->live_lock) {
        int held = 0;
        if (gs_probe_fd < 0) gs_probe_fd = open(gs_st_path, O_RDWR | O_CLOEXEC);
        if (gs_probe_fd >= 0 && gs_live_op(gs_probe_fd, i, F_OFD_GETLK, &held) == 0) return !held;
    }
    char state = 0;
    uint64_t born = gs_born(pr->pid, &state);
    return born == 0 || born != pr->born || state == 'Z' || state == 'X';
}

/* Caller holds gs_st->mu.  Frees the exports of process slot i. */
static void gs_drop_exports_locked(int i) {
    for (int e = 0; e < GS_NEXPORT; e++)
        if (gs_st->exports[e].serial && gs_st->exports[e].proc == i) gs_st->exports[e].serial = 0;
}

/* Caller holds gs_st->mu.  Gives back what dead processes held. */
static void gs_reap_locked(void) {
    for (int i = 0; i < GS_NPROC; i++) {
        gs_proc_t *pr = &gs_st->proc[i];
        if (!pr->pid || i == gs_me || !gs_proc_gone(pr)) continue;
        for (int d = 0; d < GS_NDEV; d++) {
            if (!pr->mem[d]) continue;
            gs_lock(&gs_st->gpu[d].mu);
            gs_st->gpu[d].used -= pr->mem[d];
            gs_unlock(&gs_st->gpu[d].mu);
            pr->mem[d] = 0;
        }
        gs_drop_exports_locked(i);
        pr->pid = 0;
    }
}

static int gs_map(void) {
    if (gs_st) return 0;
    const char *env = getenv("SIMGPU_STATE");
    if (env && *env) snprintf(gs_st_path, sizeof gs_st_path, "%s", env);
    else snprintf(gs_st_path, sizeof gs_st_path, "/dev/shm/simgpu-%d.state", (int)getuid());
    int fd = open(gs_st_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) return -1;
    flock(fd, LOCK_EX);
    struct stat sb;
    int bad = fstat(fd, &sb) != 0 || ((size_t)sb.st_size < sizeof(gs_state_t) && ftruncate(fd, sizeof(gs_state_t)));
    gs_st_ino = sb.st_ino;
    gs_state_t *st = bad ? MAP_FAILED
                         : mmap(NULL, sizeof(gs_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (st != MAP_FAILED && st->magic != GS_STATE_MAGIC) {
        memset(st, 0, sizeof *st);   /* a new file, or one another layout wrote */
        gs_mutex_init(&st->mu);
        for (int d = 0; d < GS_NDEV; d++) gs_mutex_init(&st->gpu[d].mu);
        __atomic_store_n(&st->magic, GS_STATE_MAGIC, __ATOMIC_RELEASE);
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (st == MAP_FAILED) return -1;
    gs_st = st;
    return 0;
}

/* For test helpers in a process that is not a simulated CUDA/NVML user: follow SIMGPU_STATE to whatever file it
 * names now (a test may point it at another file, or the file may have been replaced). */
static void gs_follow_state(void) {
    char want[512];
    const char *env = getenv("SIMGPU_STATE");
    if (env && *env) snprintf(want, sizeof want, "%s", env);
    else snprintf(want, sizeof want, "/dev/shm/simgpu-%d.state", (int)getuid());
    struct stat sb;
    if (gs_st && (strcmp(want, gs_st_path) || stat(want, &sb) || sb.st_ino != gs_st_ino)) {
        munmap(gs_st, sizeof *gs_st);
        gs_st = NULL;
        if (gs_probe_fd >= 0) close(gs_probe_fd);
        gs_probe_fd = -1;
    }
}

/* Finds (or adds) the state slot of every configured GPU.  Returns -1 when the node state is full. */
static int gs_attach_gpus(void) {
    gs_configure();
    if (gs_map()) return -1;
    int rc = 0;
    gs_lock(&gs_st->mu);
    for (int v = 0; v < gs_nall; v++) {
        int found = -1, free_slot = -1;
        for (int d = 0; d < GS_NDEV; d++) {
            if (!strcmp(gs_st->gpu[d].uuid, gs_all[v].uuid)) { found = d; break; }
            if (free_slot < 0 && !gs_st->gpu[d].uuid[0]) free_slot = d;
        }
        if (found < 0 && free_slot >= 0) {
            found = free_slot;
            snprintf(gs_st->gpu[found].uuid, sizeof gs_st->gpu[found].uuid, "%s", gs_all[v].uuid);
        }
        if (found < 0) rc = -1;
        else gs_st->gpu[found].total = gs_all[v].total;
        gs_all[v].slot = found;
    }
    for (int v = 0; v < gs_nview; v++) gs_view[v].slot = gs_all[gs_view[v].listed].slot;
    gs_unlock(&gs_st->mu);
    return rc;
}

static void gs_leave(void) {
    if (!gs_st || gs_me < 0 || gs_me_pid != getpid()) return;
    gs_proc_t *pr = &gs_st->proc[gs_me];
    gs_lock(&gs_st->mu);
    for (int d = 0; d < GS_NDEV; d++) {
        if (!pr->mem[d]) continue;
        gs_lock(&gs_st->gpu[d].mu);
        gs_st->gpu[d].used -= pr->mem[d];
        pr->mem[d] = 0;
        gs_unlock(&gs_st->gpu[d].mu);
    }
    gs_drop_exports_locked(gs_me);
    pr->pid = 0;
    gs_unlock(&gs_st->mu);
    if (gs_live_fd >= 0) close(gs_live_fd);
    gs_live_fd = -1;
}

/* In a forked child: the parent's lock byte is the parent's; drop our reference to its file description. */
static void gs_after_fork_child(void) {
    if (gs_live_fd >= 0) close(gs_live_fd);
    gs_live_fd = -1;
    if (gs_probe_fd >= 0) close(gs_probe_fd);
    gs_probe_fd = -1;
}

/* Registers this process (once; again in a forked child).  Returns -1 when the table is full. */
static int gs_join(void) {
    pid_t self = getpid();
    if (gs_me >= 0 && gs_me_pid == self) return 0;
    if (gs_attach_gpus()) return -1;
    static int hooked;
    if (!hooked++) {
        atexit(gs_leave);
        pthread_atfork(NULL, NULL, gs_after_fork_child);
    }
    gs_me_pid = self;
    gs_me = -1;
    if (gs_live_fd >= 0) close(gs_live_fd);
    gs_live_fd = open(gs_st_path, O_RDWR | O_CLOEXEC);
    uint64_t born = gs_born(self, NULL);
    gs_lock(&gs_st->mu);
    gs_reap_locked();
    for (int k = 0; k < GS_NPROC && gs_me < 0; k++) {
        int i = (int)((gs_st->next_proc + (uint32_t)k) % GS_NPROC);
        gs_proc_t *pr = &gs_st->proc[i];
        if (pr->pid) continue;
        /* take the slot's lock byte first: a slot is never seen taken but unlocked */
        int locked = gs_live_fd >= 0 && gs_live_op(gs_live_fd, i, F_OFD_SETLK, NULL) == 0;
        if (!locked && gs_live_fd >= 0 && (errno == EAGAIN || errno == EACCES)) continue;   /* still held */
        gs_st->next_proc = (uint32_t)i + 1;
        pr->pid = self;
        pr->owner = self;
        pr->born = born;
        pr->gen = ++gs_st->next_gen;
        pr->live_lock = (uint32_t)locked;
        memset(pr->mem, 0, sizeof pr->mem);
        memset(pr->busy_ns, 0, sizeof pr->busy_ns);
        memset(pr->tl, 0, sizeof pr->tl);
        gs_own_cgroup(pr->cgroup, sizeof pr->cgroup);
        gs_me = i;
    }
    gs_unlock(&gs_st->mu);
    return gs_me >= 0 ? 0 : -1;
}

/* Adds the busy interval [a, b) to a bin ring. */
static void gs_tl_add(gs_bin_t *ring, uint32_t nbins, uint64_t tick, uint64_t a, uint64_t b) {
    while (a < b) {
        uint64_t k = a / tick, edge = (k + 1) * tick;
        uint64_t upto = b < edge ? b : edge;
        gs_bin_t *bin = &ring[k % nbins];
        if (bin->tick != (uint32_t)k) { bin->tick = (uint32_t)k; bin->busy = 0; }
        bin->busy += (uint32_t)(upto - a);
        a = upto;
    }
}

/* Busy ns of a bin ring over [a, b); bins cut by the window count pro rata. */
static uint64_t gs_tl_sum(const gs_bin_t *ring, uint32_t nbins, uint64_t tick, uint64_t a, uint64_t b) {
    double sum = 0;
    for (uint64_t k = a / tick; k * tick < b; k++) {
        const gs_bin_t *bin = &ring[k % nbins];
        if (bin->tick != (uint32_t)k) continue;
        uint64_t lo = k * tick > a ? k * tick : a, hi = (k + 1) * tick < b ? (k + 1) * tick : b;
        sum += (double)bin->busy * (double)(hi - lo) / (double)tick;
    }
    return (uint64_t)sum;
}

/* Does a limit set on cgroup directory `dir` (a path under a cgroup mount) cover a process in cgroup `cg`?  It
 * does when `dir` ends with `cg` or with one of its ancestors (limits apply to the subtree, as cgroup limits do). */
static int gs_cgroup_covers(const char *dir, const char *cg) {
    size_t n = strlen(cg), dl = strlen(dir);
    while (dl > 1 && dir[dl - 1] == '/') dl--;
    for (size_t len = n; len > 1; len--) {
        if (len < n && cg[len] != '/') continue;
        if (dl >= len && !strncmp(dir + dl - len, cg, len)) return 1;
    }
    return 0;
}

#include "timeslice.h"

#endif
