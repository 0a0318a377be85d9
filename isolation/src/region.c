/*
 * region.c - the shared accounting file: creation/attach, process slots, reserve/release of device memory.
 *
 * Locking: one robust, process-shared pthread mutex in the extension block guards slot allocation and all
 * counters.  A process killed while holding it leaves the mutex "owner dead"; the next locker rebuilds the
 * container-wide counters from the per-slot counters (the per-slot values are the truth), reclaims the slots
 * of dead processes and marks the mutex consistent, so nobody ever waits on a dead process.  A mutex left
 * unrecoverable fails closed: allocations are refused.
 *
 * Memory check: reserve-then-allocate.  Under the mutex, `ext.used[dev] + size <= limit[dev]` is checked and
 * the bytes are charged to both the container counter and this process's slot before the driver is called; a
 * failed driver call gives them back.  Two processes can therefore never both pass the check.
 *
 * Who owns a slot: processes of one container may live in different PID namespaces (two containers of a pod
 * sharing a file, a DRA claim shared by pods), where PIDs say nothing (both may be PID 1).  Each process holds,
 * for as long as it lives, an open file description lock on one byte of the file (VGPU_SLOT_LOCK_BASE + its
 * slot); the kernel drops it when the process dies, whatever its namespace.  A slot is dead when its byte is
 * unlocked and, if its owner is in our PID namespace, its PID no longer runs with the recorded start time (a
 * program that closed our descriptor keeps its slot while it runs).  Slots written without the lock (HAMi-core,
 * older versions of this library) are judged by PID and start time as before.
 */
#include "vgpu_internal.h"
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t g_my_start;
static uint64_t g_my_pidns;
static int g_live_fd = -1;           /* our descriptor of the file: holds our slot's liveness lock */
static char g_path[PATH_MAX];
static int g_unrecoverable;          /* the region mutex cannot be used any more: fail closed */
static THREAD_LOCAL int t_lock_held;     /* this thread holds the region mutex */
/* VGPU_TEST_HOLD_LOCK_US: tests only, sleeps inside the lock to provoke SIGKILLs there */
static unsigned g_test_hold_us;

uint64_t vgpu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t proc_start(pid_t pid, char *state) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    if (!p || !p[1] || !p[2]) return 0;
    if (state) *state = p[2];
    int field = 2;
    for (p++; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

/* Inode of our PID namespace (0 when /proc does not tell). */
static uint64_t own_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* An open file description lock on slot i's liveness byte: F_WRLCK to take, F_UNLCK to drop.  0 or -1/errno. */
static int live_lock(int fd, int i, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(VGPU_SLOT_LOCK_BASE + i);
    fl.l_len = 1;
    return fcntl(fd, F_OFD_SETLK, &fl);
}

/* 1 when some process holds slot i's liveness byte, 0 when none does, -1 when we cannot tell. */
static int live_held(int i) {
    if (g_live_fd < 0) return -1;
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(VGPU_SLOT_LOCK_BASE + i);
    fl.l_len = 1;
    if (fcntl(g_live_fd, F_OFD_GETLK, &fl) != 0) return -1;
    return fl.l_type != F_UNLCK;
}

/* By PID: the pid exists, is not a zombie and (if recorded) has the same start time. */
static int pid_alive(int i) {
    vgpu_proc_slot_t *s = &g_vgpu.region->procs[i];
    pid_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char st = 0;
    uint64_t start = proc_start(pid, &st);
    if (start == 0) return errno == EACCES;   /* cannot tell: keep it */
    if (st == 'Z' || st == 'X') return 0;
    uint64_t rec = g_vgpu.ext->slot_start[i];
    return rec == 0 || rec == start;
}

static int slot_alive(int i) {
    if (!(g_vgpu.ext->slot_flags[i] & VGPU_SLOT_LOCKED)) return pid_alive(i);
    int held = live_held(i);
    if (held != 0) return 1;                  /* held, or we cannot tell: keep it */
    uint64_t ns = g_vgpu.ext->slot_pidns[i];
    if (!ns || ns != g_my_pidns) return 0;    /* unlocked, and its PID means nothing here */
    if (g_vgpu.region->procs[i].pid == g_vgpu.pid) return 0;   /* unlocked and ours: an image of this process before exec */
    return pid_alive(i);
}

static void slot_adjust(int i, int row, int kind, int64_t delta) {
    vgpu_proc_slot_t *s = &g_vgpu.region->procs[i];
    vgpu_devmem_t *u = &s->used[row];
    __atomic_add_fetch(&s->seqlock, 1, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&u->total, (uint64_t)delta, __ATOMIC_RELAXED);
    uint64_t *part = kind == ACCT_CONTEXT ? &u->context_size : kind == ACCT_MODULE ? &u->module_size : &u->data_size;
    __atomic_add_fetch(part, (uint64_t)delta, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->seqlock, 1, __ATOMIC_ACQ_REL);
}

/* Caller holds the lock.  Gives back everything slot i holds and frees it. */
static void slot_clear_nolock(int i) {
    vgpu_proc_slot_t *s = &g_vgpu.region->procs[i];
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t t = s->used[d].total;
        uint64_t cur = g_vgpu.ext->used[d];
        __atomic_store_n(&g_vgpu.ext->used[d], cur >= t ? cur - t : 0, __ATOMIC_RELAXED);
    }
    __atomic_store_n(&s->status, 0, __ATOMIC_RELEASE);
    memset(s->used, 0, sizeof s->used);
    memset(s->monitorused, 0, sizeof s->monitorused);
    memset(s->device_util, 0, sizeof s->device_util);
    s->hostpid = 0;
    g_vgpu.ext->slot_start[i] = 0;
    g_vgpu.ext->slot_flags[i] = 0;
    g_vgpu.ext->slot_pidns[i] = 0;
    __atomic_store_n(&s->pid, 0, __ATOMIC_RELEASE);
}

static void fix_proc_num_nolock(void) {
    int n = 0;
    for (int i = 0; i < VGPU_MAX_PROCS; i++)
        if (g_vgpu.region->procs[i].pid) n = i + 1;
    __atomic_store_n(&g_vgpu.region->proc_num, n, __ATOMIC_RELEASE);
}

/* Caller holds the lock.  Reclaims slots of processes that are gone; returns how many. */
static int reap_nolock(void) {
    int n = 0, top = g_vgpu.region->proc_num;
    if (top > VGPU_MAX_PROCS || top < 0) top = VGPU_MAX_PROCS;
    for (int i = 0; i < top; i++) {
        if (g_vgpu.region->procs[i].pid && i != g_vgpu.slot && !slot_alive(i)) {
            VLOG(VLOG_INFO, "reclaiming slot %d of dead pid %d", i, g_vgpu.region->procs[i].pid);
            slot_clear_nolock(i);
            n++;
        }
    }
    if (n) fix_proc_num_nolock();
    return n;
}

/* Caller holds the lock.  Rebuilds the container counters from the slots (after an update was cut short). */
static void rebuild_nolock(void) {
    reap_nolock();
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        uint64_t sum = 0;
        for (int i = 0; i < VGPU_MAX_PROCS; i++)
            if (g_vgpu.region->procs[i].pid) sum += g_vgpu.region->procs[i].used[d].total;
        __atomic_store_n(&g_vgpu.ext->used[d], sum, __ATOMIC_RELAXED);
    }
    fix_proc_num_nolock();
}

/* Takes the region mutex; -1 (nothing taken) when it is unrecoverable. */
static int lock_region(void) {
    if (UNLIKELY(g_unrecoverable)) return -1;
    pthread_mutex_t *m = (pthread_mutex_t *)g_vgpu.ext->lock;
    int r = pthread_mutex_lock(m);
    if (UNLIKELY(r == EOWNERDEAD)) {
        t_lock_held = 1;
        VLOG(VLOG_WARN, "shared region lock owner died; rebuilding counters");
        rebuild_nolock();
        pthread_mutex_consistent(m);
        return 0;
    }
    if (UNLIKELY(r != 0)) {
        if (!__atomic_exchange_n(&g_unrecoverable, 1, __ATOMIC_ACQ_REL))
            VLOG(VLOG_ERROR, "shared region lock unusable (%s): allocations are refused from now on", strerror(r));
        return -1;
    }
    t_lock_held = 1;
    return 0;
}
static void unlock_region(void) {
    t_lock_held = 0;
    pthread_mutex_unlock((pthread_mutex_t *)g_vgpu.ext->lock);
}

static void init_mutex(void *mem) {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init((pthread_mutex_t *)mem, &a);
    pthread_mutexattr_destroy(&a);
}

/*
 * At exit: give back our slot.  exit() may run from a signal handler that interrupted this very thread inside
 * the region lock: then the counters are rebuilt from the slots (the interrupted update may be half done) without
 * locking again.  When another thread holds the lock for more than a second the slot is left to the next process
 * to reap (our liveness lock goes with us).
 */
static void on_exit_release(void) {
    if (!g_vgpu.ext || g_vgpu.slot < 0 || g_vgpu.pid != getpid()) return;
    int mine = g_vgpu.slot, locked = t_lock_held;
    if (!locked && !g_unrecoverable) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        int r = pthread_mutex_timedlock((pthread_mutex_t *)g_vgpu.ext->lock, &until);
        if (r == EOWNERDEAD) pthread_mutex_consistent((pthread_mutex_t *)g_vgpu.ext->lock);
        locked = r == 0 || r == EOWNERDEAD;
        if (locked) t_lock_held = 1;
    }
    if (locked) {
        g_vgpu.slot = -1;
        slot_clear_nolock(mine);
        rebuild_nolock();
        unlock_region();
    }
    if (g_live_fd >= 0) live_lock(g_live_fd, mine, F_UNLCK);
    g_vgpu.slot = -1;
}

static void on_fork_child(void) {
    g_vgpu.slot = -1;            /* the child registers its own slot on first use */
    memset(g_vgpu.own_used, 0, sizeof g_vgpu.own_used);  /* and holds nothing of the parent's */
    g_vgpu.pid = getpid();
    g_my_start = 0;
    t_lock_held = 0;
    /* our copy of the parent's descriptor would keep the parent's liveness lock after the parent died */
    if (g_live_fd >= 0) close(g_live_fd);
    g_live_fd = -1;
}

/* Version 1 extension blocks (an older library created the file) gain the version 2 fields, zero. */
static void upgrade_ext(vgpu_ext_t *x) {
    if (x->version >= VGPU_EXT_VERSION) return;
    memset(x->slot_flags, 0, sizeof *x - offsetof(vgpu_ext_t, slot_flags));
    x->size = sizeof *x;
    __atomic_store_n(&x->version, VGPU_EXT_VERSION, __ATOMIC_RELEASE);
}

/* A new region: rows 0.. are the positions of the grant, so row i carries limit i whatever CUDA's device order. */
static void seed_devices(vgpu_region_t *r) {
    for (int i = 0; i < g_vgpu.grant_count; i++) snprintf(r->uuids[i], VGPU_UUID_LEN, "%s", g_vgpu.grant_uuid[i]);
    r->device_num = (uint64_t)g_vgpu.grant_count;
}

/*
 * Attach the shared accounting file named by CUDA_DEVICE_MEMORY_SHARED_CACHE, creating it if needed.  Its blocks
 * are allocated before it is mapped (posix_fallocate), so a full disk fails here, with a reason, instead of
 * raising SIGBUS on a later store into a hole.  On failure returns -1 with one line of reason in `why`, or -2
 * when the file holds a limit looser than this process's own (changed inside the container: never run open).
 */
int vgpu_region_attach(char *why, size_t why_len) {
    if (g_vgpu.region) return 0;
    const char *path = vgpu_config("CUDA_DEVICE_MEMORY_SHARED_CACHE");
    if (!path || !*path) path = "/tmp/cudevshr.cache";
    snprintf(g_path, sizeof g_path, "%s", path);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open the accounting file %s: %s", path, strerror(errno));
        return -1;
    }
    fchmod(fd, 0666);
    flock(fd, LOCK_EX);
    struct stat st;
    const char *step = "inspect";
    int err = fstat(fd, &st) ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
    if (!err) {
        step = "allocate";
        err = posix_fallocate(fd, 0, (off_t)VGPU_FILE_SIZE);
    }
    void *mem = MAP_FAILED;
    if (!err) {
        step = "map";
        mem = mmap(NULL, VGPU_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (mem == MAP_FAILED) err = errno;
    }
    if (err) {
        snprintf(why, why_len, "cannot %s the accounting file %s: %s", step, path,
                 err == EINVAL && !strcmp(step, "inspect") ? "not a regular file" : strerror(err));
        flock(fd, LOCK_UN);
        close(fd);
        return -1;
    }
    vgpu_region_t *r = mem;
    vgpu_ext_t *x = (vgpu_ext_t *)((char *)mem + VGPU_EXT_OFFSET);
    if (__atomic_load_n(&r->initialized_flag, __ATOMIC_ACQUIRE) != VGPU_MAGIC) {
        memset(r, 0, sizeof *r);
        r->major_version = VGPU_MAJOR;
        r->minor_version = VGPU_MINOR;
        for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
            r->limit[i] = g_vgpu.mem_limit[i];
            r->sm_limit[i] = (uint64_t)g_vgpu.sm_limit[i];
        }
        seed_devices(r);
        r->utilization_switch = 1;
        r->recent_kernel = 2;
        const char *prio = getenv("CUDA_TASK_PRIORITY");
        r->priority = prio && *prio ? atoi(prio) : 1;
        memset(x, 0, sizeof *x);
        __atomic_store_n(&r->initialized_flag, VGPU_MAGIC, __ATOMIC_RELEASE);
    } else {
        /* The file is writable inside the container: a limit in it looser than this process's own (0 is none)
         * was raised there, or the file is another container's. A tighter one is obeyed (vgpu_limit). */
        for (int i = 0; i < VGPU_MAX_DEVICES && !err; i++) {
            uint64_t mine = g_vgpu.mem_limit[i], theirs = r->limit[i];
            uint64_t my_sm = (uint64_t)g_vgpu.sm_limit[i], their_sm = r->sm_limit[i];
            if (mine && (!theirs || theirs > mine)) {
                snprintf(why, why_len, "the accounting file %s gives device %d a memory limit of %llu bytes (0: "
                         "none), looser than the %llu this container was given", path, i,
                         (unsigned long long)theirs, (unsigned long long)mine);
                err = EPERM;
            } else if (my_sm && (!their_sm || their_sm > my_sm)) {
                snprintf(why, why_len, "the accounting file %s gives device %d a compute limit of %llu%% (0: none), "
                         "looser than the %llu%% this container was given", path, i, (unsigned long long)their_sm,
                         (unsigned long long)my_sm);
                err = EPERM;
            }
        }
        if (err) {
            munmap(mem, VGPU_FILE_SIZE);
            flock(fd, LOCK_UN);
            close(fd);
            return -2;
        }
    }
    g_vgpu.region = r;
    g_vgpu.ext = x;
    if (x->magic != VGPU_EXT_MAGIC) {
        memset(x, 0, sizeof *x);
        init_mutex(x->lock);
        x->version = VGPU_EXT_VERSION;
        x->size = sizeof *x;
        for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
            uint64_t sum = 0;
            for (int i = 0; i < VGPU_MAX_PROCS; i++)
                if (r->procs[i].pid) sum += r->procs[i].used[d].total;
            x->used[d] = sum;
        }
        __atomic_store_n(&x->magic, VGPU_EXT_MAGIC, __ATOMIC_RELEASE);
    }
    upgrade_ext(x);
    flock(fd, LOCK_UN);
    close(fd);
    g_vgpu.slot = -1;
    g_my_pidns = own_pidns();
    const char *hold = getenv("VGPU_TEST_HOLD_LOCK_US");
    if (hold && *hold) g_test_hold_us = (unsigned)strtoul(hold, NULL, 10);
    atexit(on_exit_release);
    pthread_atfork(NULL, NULL, on_fork_child);
    return 0;
}

/* Takes the liveness lock of slot i; returns the slot flags to record (0 when the kernel has no OFD locks). */
static int claim_liveness(int i, uint32_t *flags) {
    *flags = 0;
    if (g_live_fd < 0) return 0;
    if (live_lock(g_live_fd, i, F_WRLCK) == 0) {
        *flags = VGPU_SLOT_LOCKED;
        return 0;
    }
    return errno == EAGAIN || errno == EACCES ? -1 : 0;   /* -1: a live process holds it: not free after all */
}

/* Returns this process's slot index, registering it on first use; -1 if the table is full. */
int vgpu_slot(void) {
    /* fast path without getpid(): the fork handler resets g_vgpu.slot in the child */
    if (LIKELY(g_vgpu.slot >= 0)) return g_vgpu.slot;
    pid_t me = getpid();
    g_vgpu.pid = me;
    if (!g_my_start) g_my_start = proc_start(me, NULL);
    if (g_live_fd < 0) {
        int fd = open(g_path, O_RDWR | O_CLOEXEC);
        /* out of the way of programs that reuse low descriptor numbers */
        g_live_fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 512) : -1;
        if (g_live_fd < 0) g_live_fd = fd;
        else if (fd >= 0) close(fd);
    }
    if (lock_region()) return -1;
    reap_nolock();
    int slot = -1;
    uint32_t flags = 0;
    for (int i = 0; i < VGPU_MAX_PROCS && slot < 0; i++)
        if (g_vgpu.region->procs[i].pid == 0 && claim_liveness(i, &flags) == 0) slot = i;
    if (slot >= 0) {
        vgpu_proc_slot_t *s = &g_vgpu.region->procs[slot];
        memset(s, 0, sizeof *s);
        g_vgpu.ext->slot_start[slot] = g_my_start;
        g_vgpu.ext->slot_flags[slot] = flags;
        g_vgpu.ext->slot_pidns[slot] = g_my_pidns;
        s->status = 1;
        __atomic_store_n(&s->pid, me, __ATOMIC_RELEASE);
        fix_proc_num_nolock();
    } else {
        VLOG(VLOG_ERROR, "no free process slot in the shared region (%d in use)", VGPU_MAX_PROCS);
    }
    unlock_region();
    g_vgpu.slot = slot;
    return slot;
}

/* The tighter of two limits, 0 meaning none. */
static inline uint64_t tighter(uint64_t a, uint64_t b) { return !a ? b : !b ? a : a < b ? a : b; }

/* A device's memory limit: the tighter of this process's own (from its environment, or set for a device the grant
 * does not name) and the one in the accounting file, which the container can write: changing the file never
 * loosens a limit. */
uint64_t vgpu_limit(int row) {
    if (!g_vgpu.region || row < 0 || row >= VGPU_MAX_DEVICES) return 0;
    return tighter(g_vgpu.mem_limit[row], __atomic_load_n(&g_vgpu.region->limit[row], __ATOMIC_RELAXED));
}


uint64_t vgpu_used(int row) {
    if (!g_vgpu.ext || row < 0 || row >= VGPU_MAX_DEVICES) return 0;
    return __atomic_load_n(&g_vgpu.ext->used[row], __ATOMIC_RELAXED);
}

/* 0 when `bytes` were charged to device row, -1 when that would exceed its limit (nothing charged). */
/*
 * The accounting file is written by every process of the container, so a tenant can write it too.  What it says
 * is checked against what this process knows on its own: the memory it holds per row (own_used, in its own memory)
 * and, in hooks.c, which row each granted UUID must have.  A file that contradicts either was changed: from then on
 * every charge is refused, after one error line, rather than trusting any of it.
 */
void vgpu_mark_tampered(const char *fmt, ...) {
    if (__atomic_exchange_n(&g_vgpu.tampered, 1, __ATOMIC_ACQ_REL)) return;
    char why[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    VLOG(VLOG_ERROR, "%s: the accounting file was changed, so device memory allocations are refused", why);
}

int vgpu_reserve(int row, uint64_t bytes, int kind) {
    if (row < 0 || row >= VGPU_MAX_DEVICES) return 0;
    if (UNLIKELY(__atomic_load_n(&g_vgpu.tampered, __ATOMIC_ACQUIRE))) return -1;
    int slot = vgpu_slot();
    if (slot < 0 || lock_region()) return -1;
    uint64_t lim = vgpu_limit(row);
    uint64_t used = g_vgpu.ext->used[row];
    if (UNLIKELY(used < g_vgpu.own_used[row])) {
        unlock_region();
        vgpu_mark_tampered("device %d: the file counts %llu bytes in use, less than this process alone holds (%llu)",
                           row, (unsigned long long)used, (unsigned long long)g_vgpu.own_used[row]);
        return -1;
    }
    if (lim && (used + bytes > lim || used + bytes < used)) {
        if (reap_nolock()) used = g_vgpu.ext->used[row];
        if (used + bytes > lim || used + bytes < used) {
            g_vgpu.ext->oom_count[row]++;
            unlock_region();
            VLOG(VLOG_INFO, "device %d: out of memory: %llu used + %llu requested > limit %llu", row,
                 (unsigned long long)used, (unsigned long long)bytes, (unsigned long long)lim);
            return -1;
        }
    }
    __atomic_store_n(&g_vgpu.ext->used[row], used + bytes, __ATOMIC_RELAXED);
    if (UNLIKELY(g_test_hold_us)) usleep(g_test_hold_us); /* fault injection: widen the locked window */
    if (used + bytes > g_vgpu.ext->peak[row]) g_vgpu.ext->peak[row] = used + bytes;
    slot_adjust(slot, row, kind, (int64_t)bytes);
    g_vgpu.own_used[row] += bytes;
    unlock_region();
    return 0;
}

void vgpu_release(int row, uint64_t bytes, int kind) {
    if (row < 0 || row >= VGPU_MAX_DEVICES || !bytes) return;
    int slot = vgpu_slot();
    if (slot < 0 || lock_region()) return;
    uint64_t used = g_vgpu.ext->used[row];
    __atomic_store_n(&g_vgpu.ext->used[row], used >= bytes ? used - bytes : 0, __ATOMIC_RELAXED);
    slot_adjust(slot, row, kind, -(int64_t)bytes);
    g_vgpu.own_used[row] = g_vgpu.own_used[row] >= bytes ? g_vgpu.own_used[row] - bytes : 0;
    unlock_region();
}

/* Caller holds the lock.  A device the grant does not name (its UUID is not in the list the limits' positions
 * follow) gets the tightest of the granted limits rather than none. */
static void unlisted_device_limits(int row, const char *uuid) {
    uint64_t mem = 0, sm = 0;
    for (int i = 0; i < g_vgpu.grant_count; i++) {
        uint64_t m = g_vgpu.region->limit[i], c = g_vgpu.region->sm_limit[i];
        if (m && (!mem || m < mem)) mem = m;
        if (c && (!sm || c < sm)) sm = c;
    }
    if (!g_vgpu.region->limit[row]) g_vgpu.region->limit[row] = mem;
    if (!g_vgpu.region->sm_limit[row]) g_vgpu.region->sm_limit[row] = sm;
    if (!g_vgpu.mem_limit[row]) g_vgpu.mem_limit[row] = mem;  /* this process's own copy, which the file cannot loosen */
    if (!g_vgpu.sm_limit[row]) g_vgpu.sm_limit[row] = (int)sm;
    VLOG(VLOG_WARN, "%s is not among the granted GPUs; it gets the tightest granted limits (%llu bytes, %llu%%)", uuid,
         (unsigned long long)g_vgpu.region->limit[row], (unsigned long long)g_vgpu.region->sm_limit[row]);
}

/* Region device index of a UUID, adding it to the table if new; -1 when the table is full. */
int vgpu_row_for_uuid(const char *uuid) {
    if (!g_vgpu.region || !uuid || !*uuid) return -1;
    int n = (int)__atomic_load_n(&g_vgpu.region->device_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_MAX_DEVICES; i++)
        if (!strncasecmp(g_vgpu.region->uuids[i], uuid, VGPU_UUID_LEN)) return i;
    /* an unusable lock: any row will do, since every charge against it is refused (-1 would mean "not limited") */
    if (lock_region()) return 0;
    n = (int)g_vgpu.region->device_num;
    int found = -1;
    for (int i = 0; i < n && i < VGPU_MAX_DEVICES && found < 0; i++)
        if (!strncasecmp(g_vgpu.region->uuids[i], uuid, VGPU_UUID_LEN)) found = i;
    if (found < 0 && n < VGPU_MAX_DEVICES) {
        if (g_vgpu.grant_count && n >= g_vgpu.grant_count) unlisted_device_limits(n, uuid);
        snprintf(g_vgpu.region->uuids[n], VGPU_UUID_LEN, "%s", uuid);
        __atomic_store_n(&g_vgpu.region->device_num, (uint64_t)(n + 1), __ATOMIC_RELEASE);
        found = n;
    }
    unlock_region();
    return found;
}

/* Remembers memory this container exported (IPC handle, shareable handle), so its own processes importing it
 * are not charged twice. */
void vgpu_note_export(uint64_t hash) {
    if (!g_vgpu.ext || !hash) return;
    uint32_t at = __atomic_fetch_add(&g_vgpu.ext->exported_next, 1, __ATOMIC_ACQ_REL);
    __atomic_store_n(&g_vgpu.ext->exported[at % VGPU_EXPORTS], hash, __ATOMIC_RELEASE);
}

int vgpu_exported(uint64_t hash) {
    if (!g_vgpu.ext || !hash) return 0;
    for (int i = 0; i < VGPU_EXPORTS; i++)
        if (__atomic_load_n(&g_vgpu.ext->exported[i], __ATOMIC_ACQUIRE) == hash) return 1;
    return 0;
}
