/*
 * limiter_impl.h - compute (SM) limiter, included by hooks.c.
 *
 * Budget: one token bucket per device in the shared region (vgpu_ext_t.sm[dev]), shared by every process of the
 * container.  Tokens are nanoseconds of GPU time; they refill at limit% of wall time (a bucket holds at most
 * VGPU_BUCKET_NS of wall time worth, so idle time cannot be saved up for long bursts).  A launch waits while the
 * bucket is empty (tokens <= 0), then takes its estimated cost; the bucket may go into debt, which later launches
 * wait out, so the long-run admitted GPU time is exactly limit% of wall time.  Waits are computed nanosleeps.
 *
 * Cost model, measured on the device: each kernel function (and each CUgraphExec) has an estimate of GPU ns per
 * thread block (per launch for graphs).  The first launch of a function is timed synchronously with a pair of
 * CUDA events around it; afterwards every VGPU_SAMPLE_EVERY-th launch is timed asynchronously (events polled on
 * later launches).  Event timing includes time other processes' kernels occupied the device between the two
 * events, which only ever inflates a sample, so the estimate is the minimum of the last VGPU_SAMPLES samples.
 * cuEvent timing works the same on the real driver and the simulated one, which is why it was chosen over
 * reading a device timeline (impossible on real hardware) or NVML sampling (needs host PIDs, 1 s granularity).
 */
#define VGPU_BUCKET_NS 20000000ULL
#define VGPU_SAMPLE_EVERY 8
#define VGPU_SAMPLES 32
#define VGPU_PAIRS 16

typedef struct {
    uint64_t est;            /* GPU ns per unit; 0 = unknown */
    uint64_t samp[VGPU_SAMPLES];
    uint32_t n, next, count;
} fstat_t;

typedef struct {
    CUevent e0, e1;
    CUcontext ctx;
    fstat_t *fs;
    uint64_t units;
    int ridx;
    int state;               /* 0 unused, 1 free, 2 pending */
} evpair_t;

static evpair_t g_pairs[VGPU_PAIRS];
static int g_npending;
static pthread_mutex_t g_lim_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_last_sec;
static uint64_t g_gpu_ns[VGPU_MAX_DEVICES];   /* GPU ns charged by this process in the current second */

/* Once per second: last_kernel_time, and this process's share of each device (slot.device_util.sm_util, %),
 * computed from the GPU time its launches were charged (only known while a compute limit is active). */
static void note_kernel(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    if ((uint64_t)ts.tv_sec != g_last_sec) {
        uint64_t elapsed = g_last_sec ? (uint64_t)ts.tv_sec - g_last_sec : 1;
        g_last_sec = (uint64_t)ts.tv_sec;
        __atomic_store_n(&vg.region->last_kernel_time, (uint64_t)ts.tv_sec, __ATOMIC_RELAXED);
        int slot = vgpu_slot();
        for (int d = 0; d < VGPU_MAX_DEVICES && slot >= 0; d++) {
            uint64_t ns = __atomic_exchange_n(&g_gpu_ns[d], 0, __ATOMIC_RELAXED);
            uint64_t pct = elapsed > 5 ? 0 : ns / (elapsed * 10000000ULL);
            __atomic_store_n(&vg.region->procs[slot].device_util[d].sm_util, pct > 100 ? 100 : pct,
                             __ATOMIC_RELAXED);
        }
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

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* Waits until device r's container budget has tokens, then takes `cost` ns of it. */
static void sm_gate(int r, int64_t cost) {
    vgpu_sm_state_t *st = &vg.ext->sm[r];
    while (__atomic_load_n(&vg.region->recent_kernel, __ATOMIC_RELAXED) < 0) sleep_ns(10000000ULL); /* monitor block */
    if (__atomic_load_n(&vg.region->recent_kernel, __ATOMIC_RELAXED) != 2)
        __atomic_store_n(&vg.region->recent_kernel, 2, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t lim = __atomic_load_n(&vg.region->sm_limit[r], __ATOMIC_RELAXED);
        if (!lim || lim >= 100) return;
        uint64_t now = vgpu_now_ns();
        int64_t cap = (int64_t)(VGPU_BUCKET_NS * lim / 100);
        uint64_t last = __atomic_load_n(&st->last_refill, __ATOMIC_ACQUIRE);
        if (now > last && __atomic_compare_exchange_n(&st->last_refill, &last, now, 0, __ATOMIC_ACQ_REL,
                                                      __ATOMIC_RELAXED)) {
            int64_t add = last ? (int64_t)((now - last) * lim / 100) : cap;
            int64_t t = __atomic_add_fetch(&st->tokens, add, __ATOMIC_ACQ_REL);
            while (t > cap && !__atomic_compare_exchange_n(&st->tokens, &t, cap, 0, __ATOMIC_ACQ_REL,
                                                           __ATOMIC_RELAXED)) {}
        }
        int64_t t = __atomic_load_n(&st->tokens, __ATOMIC_ACQUIRE);
        if (t > 0) {
            __atomic_sub_fetch(&st->tokens, cost, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&g_gpu_ns[r], (uint64_t)cost, __ATOMIC_RELAXED);
            __atomic_add_fetch(&st->launches, 1, __ATOMIC_RELAXED);
            __atomic_add_fetch(&st->charged_ns, (uint64_t)cost, __ATOMIC_RELAXED);
            return;
        }
        uint64_t wait = (uint64_t)(-t + 1) * 100 / lim;
        if (wait < 20000) wait = 20000;
        if (wait > 5000000) wait = 5000000;
        sleep_ns(wait);
        __atomic_add_fetch(&st->throttled_ns, wait, __ATOMIC_RELAXED);
    }
}

static fstat_t *fstat_get(uint64_t key) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, K_FUNC, key);
    if (e && !e->aux) e->aux = (uint64_t)(uintptr_t)calloc(1, sizeof(fstat_t));
    fstat_t *fs = e ? (fstat_t *)(uintptr_t)e->aux : NULL;
    pthread_mutex_unlock(&g_map_mu);
    return fs;
}

/* Caller holds g_lim_mu. */
static void sample_add(fstat_t *fs, uint64_t per_unit) {
    fs->samp[fs->next++ % VGPU_SAMPLES] = per_unit;
    if (fs->n < VGPU_SAMPLES) fs->n++;
    uint64_t m = UINT64_MAX;
    for (uint32_t i = 0; i < fs->n; i++) if (fs->samp[i] < m) m = fs->samp[i];
    fs->est = m ? m : 1;
}

static int pair_elapsed_ns(evpair_t *p, uint64_t *ns) {
    float ms = 0;
    if (!real_cuEventElapsedTime || real_cuEventElapsedTime(&ms, p->e0, p->e1) != CUDA_SUCCESS) return -1;
    *ns = ms > 0 ? (uint64_t)((double)ms * 1e6) : 0;
    return 0;
}

/* Caller holds g_lim_mu.  Harvests finished asynchronous samples. */
static void poll_pending_nolock(void) {
    for (int i = 0; i < VGPU_PAIRS && g_npending; i++) {
        evpair_t *p = &g_pairs[i];
        if (p->state != 2 || real_cuEventQuery(p->e1) != CUDA_SUCCESS) continue;
        uint64_t ns;
        if (!pair_elapsed_ns(p, &ns) && p->units) {
            sample_add(p->fs, ns / p->units);
            __atomic_add_fetch(&vg.ext->sm[p->ridx].measured_ns, ns, __ATOMIC_RELAXED);
        }
        p->state = 1;
        g_npending--;
    }
}

/* Caller holds g_lim_mu.  A free event pair of the current context, or NULL. */
static evpair_t *pair_acquire_nolock(void) {
    CUcontext ctx = NULL;
    if (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return NULL;
    if (!real_cuEventCreate || !real_cuEventRecord || !real_cuEventQuery) return NULL;
    for (int i = 0; i < VGPU_PAIRS; i++) {
        evpair_t *p = &g_pairs[i];
        if (p->state == 1 && p->ctx == ctx) return p;
    }
    for (int i = 0; i < VGPU_PAIRS; i++) {
        evpair_t *p = &g_pairs[i];
        if (p->state == 0) {
            if (real_cuEventCreate(&p->e0, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
            if (real_cuEventCreate(&p->e1, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
            p->ctx = ctx;
            p->state = 1;
            return p;
        }
    }
    return NULL;
}

typedef CUresult (*thunk_t)(void *);

static CUresult limited_launch(int r, uint64_t key, uint64_t units, CUstream s, thunk_t call, void *args) {
    if (!units) units = 1;
    fstat_t *fs = fstat_get(key);
    evpair_t *ep = NULL;
    int unknown;
    int64_t cost;
    pthread_mutex_lock(&g_lim_mu);
    if (g_npending) poll_pending_nolock();
    unknown = !fs || fs->est == 0;
    cost = unknown ? 0 : (int64_t)(fs->est * units);
    if (fs && (unknown || ++fs->count % VGPU_SAMPLE_EVERY == 0)) {
        ep = pair_acquire_nolock();
        if (ep) ep->state = 3; /* taken */
    }
    pthread_mutex_unlock(&g_lim_mu);
    if (unknown && !ep) cost = (int64_t)(units * 1000); /* cannot measure: assume 1 us per block */

    sm_gate(r, cost);
    if (ep && real_cuEventRecord(ep->e0, s) != CUDA_SUCCESS) {
        pthread_mutex_lock(&g_lim_mu); ep->state = 1; pthread_mutex_unlock(&g_lim_mu);
        ep = NULL;
    }
    CUresult res = call(args);
    if (!ep) return res;
    if (res != CUDA_SUCCESS || real_cuEventRecord(ep->e1, s) != CUDA_SUCCESS) {
        pthread_mutex_lock(&g_lim_mu); ep->state = 1; pthread_mutex_unlock(&g_lim_mu);
        return res;
    }
    ep->fs = fs;
    ep->units = units;
    ep->ridx = r;
    if (unknown) {
        uint64_t ns = 0;
        if (real_cuEventSynchronize) real_cuEventSynchronize(ep->e1);
        int ok = !pair_elapsed_ns(ep, &ns);
        pthread_mutex_lock(&g_lim_mu);
        if (ok) {
            sample_add(fs, ns / units ? ns / units : 1);
            __atomic_sub_fetch(&vg.ext->sm[r].tokens, (int64_t)ns, __ATOMIC_ACQ_REL);
            __atomic_add_fetch(&g_gpu_ns[r], ns, __ATOMIC_RELAXED);
            __atomic_add_fetch(&vg.ext->sm[r].charged_ns, ns, __ATOMIC_RELAXED);
            __atomic_add_fetch(&vg.ext->sm[r].measured_ns, ns, __ATOMIC_RELAXED);
        }
        ep->state = 1;
        pthread_mutex_unlock(&g_lim_mu);
    } else {
        pthread_mutex_lock(&g_lim_mu);
        ep->state = 2;
        g_npending++;
        pthread_mutex_unlock(&g_lim_mu);
    }
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
    int r = cur_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    lk_args_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, (uint64_t)gx * gy * gz, s, lk_call, &a);
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
    int r = cur_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params);
    ck_args_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params};
    return limited_launch(r, (uint64_t)(uintptr_t)f, (uint64_t)gx * gy * gz, s, ck_call, &a);
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
    int r = cur_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(c, f, params, extra);
    kx_args_t a = {fn, c, f, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, (uint64_t)c->gridDimX * c->gridDimY * c->gridDimZ, c->hStream,
                          kx_call, &a);
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
    int r = cur_ridx();
    if (r < 0 || !sm_enabled(r)) return fn(g, s);
    gl_args_t a = {fn, g, s};
    return limited_launch(r, (uint64_t)(uintptr_t)g ^ 0x4000000000000000ULL, 1, s, gl_call, &a);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return launch_graph(REAL(cuGraphLaunch), g, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return launch_graph(REAL(cuGraphLaunch_ptsz), g, s); }
