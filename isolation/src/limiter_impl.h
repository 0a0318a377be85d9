/*
 * limiter_impl.h - compute (SM) limiter, included by hooks.c.
 *
 * Budget.  One token bucket per device in the shared region (vgpu_ext_t.sm[dev]), shared by every process of
 * the container.  Tokens are nanoseconds of GPU time and refill at limit% of wall time; the bucket holds at most
 * VGPU_BUCKET_NS of wall time worth, so idle time cannot be saved up for long bursts.  A launch is admitted while
 * the bucket is positive and may drive it into debt, which later launches wait out: over time the GPU time
 * charged is exactly limit% of wall time.  Each thread takes tokens from the shared bucket in chunks
 * (VGPU_CHUNK_NS) into a reservoir of its own, so most launches touch no shared memory and take no lock.
 *
 * Charge.  Closed loop on measured GPU time: a launch is charged, when it is admitted, the current estimate of
 * its function's GPU time (per CUfunction, per CUgraphExec); some launches are timed with a pair of CUDA events
 * around them, and when the timing completes the bucket is corrected.  A timed launch stands for every launch of
 * its function since the previous timed one: the correction is (their count) x (measured time) - (what they
 * were charged).  That total is an unbiased estimate of their GPU time whatever the estimate was, so the charge
 * follows kernels whose duration varies from launch to launch or drifts, without looking at grid sizes.  The
 * estimate (a moving average of the measurements) only keeps the corrections small.  Launches of functions with
 * short kernels are timed less often (one in up to VGPU_EVERY_MAX), so timing costs little per launch; a launch due
 * for timing waits for a free pair of events rather than go untimed.
 *
 * What the events measure is the time from the engine reaching the first event to it reaching the second: the
 * kernel's run time when the device runs one piece of work at a time.  Work of other contexts that the device
 * runs between the two events (time slicing, concurrent streams) is counted too, which over-charges: the
 * container then gets less than its limit, never more.
 */
#define VGPU_BUCKET_NS 100000000ULL  /* bucket size, in wall ns at the limit's rate */
#define VGPU_CHUNK_NS 200000LL       /* GPU ns a process takes from the shared bucket at a time */
#define VGPU_UNKNOWN_NS 1000000LL    /* charge of a launch of a function never measured */
#define VGPU_TIMING_NS 100000ULL     /* time every launch of functions at least this long */
#define VGPU_EVERY_MAX 64
#define VGPU_WARMUP 4                /* time the first launches of a function, all of them */
#define VGPU_PAIRS 64

typedef struct {
    int64_t est;             /* GPU ns per launch; 0 = never measured */
    uint32_t since;          /* launches since the last timed one */
    uint32_t every;          /* time one launch in this many */
    int64_t charged;         /* ns charged to those launches */
    uint32_t samples;
} fstat_t;

typedef struct {
    CUevent e0, e1;
    CUcontext ctx;
    fstat_t *fs;
    int64_t charged;         /* what the launches this timing stands for were charged */
    uint32_t weight;         /* how many launches it stands for */
    int ridx;
    int state;               /* 0 unused, 1 free, 2 taken, 3 pending */
} evpair_t;

static evpair_t g_pairs[VGPU_PAIRS];
static int g_pending[VGPU_PAIRS];   /* indexes of pending pairs, oldest first */
static int g_npending;
static pthread_mutex_t g_lim_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int64_t t_reservoir[VGPU_MAX_DEVICES];  /* tokens this thread took from the shared bucket */
static uint64_t g_gpu_ns[VGPU_MAX_DEVICES];     /* GPU ns this process paid for in the current second */
static uint64_t g_last_sec;
static __thread struct { CUcontext ctx; unsigned gen; int ridx; } t_ctx;
static __thread struct { uint64_t key; fstat_t *fs; } t_fn;

/* Once per second: last_kernel_time, and this process's share of each device (slot.device_util.sm_util, %),
 * from the GPU time its launches were charged (only known while a compute limit is active). */
static void note_second(uint64_t sec) {
    uint64_t elapsed = g_last_sec ? sec - g_last_sec : 1;
    g_last_sec = sec;
    __atomic_store_n(&vg.region->last_kernel_time, sec, __ATOMIC_RELAXED);
    int slot = vgpu_slot();
    for (int d = 0; d < VGPU_MAX_DEVICES && slot >= 0; d++) {
        int64_t ns = (int64_t)__atomic_exchange_n(&g_gpu_ns[d], 0, __ATOMIC_RELAXED);
        uint64_t pct = elapsed > 5 || ns <= 0 ? 0 : (uint64_t)ns / (elapsed * 10000000ULL);
        __atomic_store_n(&vg.region->procs[slot].device_util[d].sm_util, pct > 100 ? 100 : pct, __ATOMIC_RELAXED);
    }
}

static inline void note_kernel(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    if (UNLIKELY((uint64_t)ts.tv_sec != __atomic_load_n(&g_last_sec, __ATOMIC_RELAXED))) {
        pthread_mutex_lock(&g_lim_mu);
        if ((uint64_t)ts.tv_sec != g_last_sec) note_second((uint64_t)ts.tv_sec);
        pthread_mutex_unlock(&g_lim_mu);
    }
}

static inline int sm_enabled(int r) {
    if (vg.policy == POLICY_DISABLE) return 0;
    uint64_t lim = __atomic_load_n(&vg.region->sm_limit[r], __ATOMIC_RELAXED);
    if (!lim || lim >= 100) return 0;
    if (vg.policy == POLICY_DEFAULT && __atomic_load_n(&vg.region->utilization_switch, __ATOMIC_RELAXED) == 0)
        return 0;
    return 1;
}

/* Region index of the current context's device, cached per thread. */
static inline int launch_ridx(void) {
    CUcontext ctx = NULL;
    if (UNLIKELY(!real_cuCtxGetCurrent) || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return -1;
    unsigned gen = __atomic_load_n(&g_ctx_gen, __ATOMIC_RELAXED);
    if (LIKELY(t_ctx.ctx == ctx && t_ctx.gen == gen)) return t_ctx.ridx;
    int r = cur_ridx();
    t_ctx.ctx = ctx;
    t_ctx.gen = gen;
    t_ctx.ridx = r;
    return r;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* Adds the refill since the last one to device r's shared bucket (capped). */
static void refill(vgpu_sm_state_t *st, uint64_t lim, uint64_t now) {
    int64_t cap = (int64_t)(VGPU_BUCKET_NS * lim / 100);
    uint64_t last = __atomic_load_n(&st->last_refill, __ATOMIC_ACQUIRE);
    if (now <= last || !__atomic_compare_exchange_n(&st->last_refill, &last, now, 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_RELAXED))
        return;
    int64_t add = last ? (int64_t)((now - last) * lim / 100) : cap;
    int64_t t = __atomic_add_fetch(&st->tokens, add, __ATOMIC_ACQ_REL);
    while (t > cap && !__atomic_compare_exchange_n(&st->tokens, &t, cap, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {}
}

static void poll_timings(void);

/* Slow path of the gate: wait until device r's shared bucket is positive, then pay `cost` plus a chunk for the
 * reservoir out of it. */
static void gate_slow(int r, int64_t cost) {
    vgpu_sm_state_t *st = &vg.ext->sm[r];
    while (__atomic_load_n(&vg.region->recent_kernel, __ATOMIC_RELAXED) < 0) sleep_ns(10000000ULL); /* monitor block */
    if (__atomic_load_n(&vg.region->recent_kernel, __ATOMIC_RELAXED) != 2)
        __atomic_store_n(&vg.region->recent_kernel, 2, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t lim = __atomic_load_n(&vg.region->sm_limit[r], __ATOMIC_RELAXED);
        if (!lim || lim >= 100) return;
        refill(st, lim, vgpu_now_ns());
        int64_t t = __atomic_load_n(&st->tokens, __ATOMIC_ACQUIRE);
        if (t > 0) {
            int64_t take = cost - t_reservoir[r] + VGPU_CHUNK_NS;
            __atomic_sub_fetch(&st->tokens, take, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&g_gpu_ns[r], (uint64_t)take, __ATOMIC_RELAXED);
            t_reservoir[r] = VGPU_CHUNK_NS;
            return;
        }
        uint64_t wait = (uint64_t)(-t + 1) * 100 / lim;
        if (wait < 20000) wait = 20000;
        if (wait > 2000000) wait = 2000000;
        sleep_ns(wait);
        __atomic_add_fetch(&st->throttled_ns, wait, __ATOMIC_RELAXED);
        if (__atomic_load_n(&g_npending, __ATOMIC_RELAXED)) poll_timings();
    }
}

/* Admits a launch of estimated cost `cost` on device r. */
static inline void gate(int r, int64_t cost) {
    if (LIKELY(t_reservoir[r] >= cost)) t_reservoir[r] -= cost;
    else gate_slow(r, cost);
}

/* Applies the outcome of a timing to the shared bucket and the function's estimate.  Caller holds g_lim_mu. */
static void settle(evpair_t *p, int64_t measured) {
    vgpu_sm_state_t *st = &vg.ext->sm[p->ridx];
    int64_t correction = (int64_t)p->weight * measured - p->charged;
    if (correction) __atomic_sub_fetch(&st->tokens, correction, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&g_gpu_ns[p->ridx], (uint64_t)correction, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->charged_ns, (uint64_t)(p->charged + correction), __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->measured_ns, (uint64_t)measured, __ATOMIC_RELAXED);
    fstat_t *fs = p->fs;
    int64_t est = fs->est;
    est = est ? est + (measured - est) / 8 : measured;
    if (est < 1) est = 1;
    __atomic_store_n(&fs->est, est, __ATOMIC_RELAXED);
    fs->samples++;
    uint64_t every = fs->samples < VGPU_WARMUP || (uint64_t)est >= VGPU_TIMING_NS ? 1 : VGPU_TIMING_NS / (uint64_t)est;
    __atomic_store_n(&fs->every, (uint32_t)(every > VGPU_EVERY_MAX ? VGPU_EVERY_MAX : every), __ATOMIC_RELAXED);
}

/* Harvests finished timings, oldest first. */
static void poll_timings(void) {
    pthread_mutex_lock(&g_lim_mu);
    int keep = 0;
    for (int i = 0; i < g_npending; i++) {
        evpair_t *p = &g_pairs[g_pending[i]];
        CUresult q = real_cuEventQuery(p->e1);
        float ms = 0;
        if (q == CUDA_ERROR_NOT_READY) {
            g_pending[keep++] = g_pending[i];
            continue;
        }
        if (q == CUDA_SUCCESS && real_cuEventElapsedTime(&ms, p->e0, p->e1) == CUDA_SUCCESS)
            settle(p, ms > 0 ? (int64_t)((double)ms * 1e6) : 0);
        p->state = 1;
    }
    __atomic_store_n(&g_npending, keep, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_lim_mu);
}

/* With every event pair in flight, waits for the oldest timing to complete rather than skip timing this launch:
 * a timing that stood for many launches would make the corrections, and the share, swing widely. */
static void wait_oldest_timing(void) {
    CUevent e = NULL;
    pthread_mutex_lock(&g_lim_mu);
    if (g_npending) e = g_pairs[g_pending[0]].e1;
    pthread_mutex_unlock(&g_lim_mu);
    if (e && real_cuEventSynchronize) real_cuEventSynchronize(e);
    poll_timings();
}

/* A free event pair of the current context, or NULL.  Caller holds g_lim_mu. */
static evpair_t *pair_acquire_nolock(void) {
    CUcontext ctx = NULL;
    if (real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return NULL;
    evpair_t *spare = NULL;
    for (int i = 0; i < VGPU_PAIRS; i++) {
        evpair_t *p = &g_pairs[i];
        if (p->state == 1 && p->ctx == ctx) return p;
        if (!spare && p->state == 0) spare = p;
    }
    if (!spare || real_cuEventCreate(&spare->e0, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    if (real_cuEventCreate(&spare->e1, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    spare->ctx = ctx;
    spare->state = 1;
    return spare;
}

static fstat_t *fstat_slow(uint64_t key) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, K_FUNC, key);
    if (e && !e->aux) {
        fstat_t *fs = calloc(1, sizeof(fstat_t));
        if (fs) fs->every = 1;
        e->aux = (uint64_t)(uintptr_t)fs;
    }
    fstat_t *fs = e ? (fstat_t *)(uintptr_t)e->aux : NULL;
    pthread_mutex_unlock(&g_map_mu);
    return fs;
}

static inline fstat_t *fstat_get(uint64_t key) {
    if (LIKELY(t_fn.key == key && t_fn.fs)) return t_fn.fs;
    fstat_t *fs = fstat_slow(key);
    t_fn.key = key;
    t_fn.fs = fs;
    return fs;
}

typedef CUresult (*thunk_t)(void *);

static CUresult limited_launch(int r, uint64_t key, CUstream s, thunk_t call, void *args) {
    fstat_t *fs = fstat_get(key);
    if (UNLIKELY(!fs)) return call(args);
    int64_t est = __atomic_load_n(&fs->est, __ATOMIC_RELAXED);
    int64_t cost = est ? est : VGPU_UNKNOWN_NS;
    uint32_t n = __atomic_load_n(&fs->since, __ATOMIC_RELAXED) + 1;
    int64_t charged = __atomic_load_n(&fs->charged, __ATOMIC_RELAXED) + cost;
    gate(r, cost);
    if (LIKELY(n < __atomic_load_n(&fs->every, __ATOMIC_RELAXED))) {
        __atomic_store_n(&fs->since, n, __ATOMIC_RELAXED);
        __atomic_store_n(&fs->charged, charged, __ATOMIC_RELAXED);
        return call(args);
    }
    /* time this launch: it stands for the n launches since the last timing */
    if (__atomic_load_n(&g_npending, __ATOMIC_RELAXED)) poll_timings();
    if (UNLIKELY(__atomic_load_n(&g_npending, __ATOMIC_RELAXED) >= VGPU_PAIRS)) wait_oldest_timing();
    pthread_mutex_lock(&g_lim_mu);
    evpair_t *p = g_npending < VGPU_PAIRS ? pair_acquire_nolock() : NULL;
    if (p) p->state = 2;
    pthread_mutex_unlock(&g_lim_mu);
    if (!p || real_cuEventRecord(p->e0, s) != CUDA_SUCCESS) {
        if (p) { pthread_mutex_lock(&g_lim_mu); p->state = 1; pthread_mutex_unlock(&g_lim_mu); }
        __atomic_store_n(&fs->since, n, __ATOMIC_RELAXED);
        __atomic_store_n(&fs->charged, charged, __ATOMIC_RELAXED);
        return call(args);
    }
    CUresult res = call(args);
    pthread_mutex_lock(&g_lim_mu);
    if (res == CUDA_SUCCESS && real_cuEventRecord(p->e1, s) == CUDA_SUCCESS) {
        p->fs = fs;
        p->weight = n;
        p->charged = charged;
        p->ridx = r;
        p->state = 3;
        g_pending[g_npending] = (int)(p - g_pairs);
        __atomic_store_n(&g_npending, g_npending + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&fs->since, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&fs->charged, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&vg.ext->sm[r].launches, n, __ATOMIC_RELAXED);
    } else {
        p->state = 1;
    }
    pthread_mutex_unlock(&g_lim_mu);
    return res;
}

/* ---- the launch entry points */
typedef struct {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **, void **);
    CUfunction f; unsigned gx, gy, gz, bx, by, bz, shm; CUstream s; void **params, **extra;
} lk_args_t;
static CUresult lk_call(void *p) {
    lk_args_t *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params, a->extra);
}
static CUresult launch_kernel(__typeof__(real_cuLaunchKernel) fn, CUfunction f, unsigned gx, unsigned gy,
                              unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                              void **params, void **extra) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    note_kernel();
    int r = launch_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    lk_args_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, s, lk_call, &a);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    return launch_kernel(REAL(cuLaunchKernel), f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    return launch_kernel(REAL(cuLaunchKernel_ptsz), f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

typedef struct {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **);
    CUfunction f; unsigned gx, gy, gz, bx, by, bz, shm; CUstream s; void **params;
} ck_args_t;
static CUresult ck_call(void *p) {
    ck_args_t *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params);
}
static CUresult launch_coop(__typeof__(real_cuLaunchCooperativeKernel) fn, CUfunction f, unsigned gx, unsigned gy,
                            unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                            void **params) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params);
    note_kernel();
    int r = launch_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params);
    ck_args_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params};
    return limited_launch(r, (uint64_t)(uintptr_t)f, s, ck_call, &a);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    return launch_coop(REAL(cuLaunchCooperativeKernel), f, gx, gy, gz, bx, by, bz, shm, s, params);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    return launch_coop(REAL(cuLaunchCooperativeKernel_ptsz), f, gx, gy, gz, bx, by, bz, shm, s, params);
}

typedef struct {
    CUresult (*fn)(const CUlaunchConfig *, CUfunction, void **, void **);
    const CUlaunchConfig *c; CUfunction f; void **params, **extra;
} kx_args_t;
static CUresult kx_call(void *p) { kx_args_t *a = p; return a->fn(a->c, a->f, a->params, a->extra); }
static CUresult launch_ex(__typeof__(real_cuLaunchKernelEx) fn, const CUlaunchConfig *c, CUfunction f,
                          void **params, void **extra) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active) || !c) return fn(c, f, params, extra);
    note_kernel();
    int r = launch_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(c, f, params, extra);
    kx_args_t a = {fn, c, f, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, c->hStream, kx_call, &a);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return launch_ex(REAL(cuLaunchKernelEx), c, f, params, extra);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return launch_ex(REAL(cuLaunchKernelEx_ptsz), c, f, params, extra);
}

typedef struct { CUresult (*fn)(CUgraphExec, CUstream); CUgraphExec g; CUstream s; } gl_args_t;
static CUresult gl_call(void *p) { gl_args_t *a = p; return a->fn(a->g, a->s); }
static CUresult launch_graph(__typeof__(real_cuGraphLaunch) fn, CUgraphExec g, CUstream s) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!vg.active)) return fn(g, s);
    note_kernel();
    int r = launch_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(g, s);
    gl_args_t a = {fn, g, s};
    return limited_launch(r, (uint64_t)(uintptr_t)g ^ 0x4000000000000000ULL, s, gl_call, &a);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return launch_graph(REAL(cuGraphLaunch), g, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return launch_graph(REAL(cuGraphLaunch_ptsz), g, s); }
