/*
 * limiter_impl.h - compute (SM) limiter, included by hooks.c.
 *
 * Budget.  One token bucket per device in the shared region (vgpu_ext_t.sm[dev]), shared by every process of
 * the container.  Tokens are nanoseconds of GPU time and refill at limit% of wall time; the refill stops at
 * VGPU_BUCKET_NS of wall time worth, so idle time cannot be saved up for long bursts.  A launch is admitted while
 * the bucket is positive and may drive it into debt, which later launches wait out (threads waiting on one bucket
 * wake at spread times, so they do not all submit at once): over time the GPU time charged is exactly limit% of
 * wall time.  Each thread takes tokens from the shared bucket in chunks (VGPU_CHUNK_NS) into a reservoir of its
 * own, so most launches touch no shared memory and take no lock.
 *
 * Charge.  Closed loop on measured GPU time: a launch is charged, when it is admitted, the current estimate of
 * its function's GPU time (per CUfunction, per CUgraphExec); one launch in `every` is timed with a pair of CUDA
 * events around it, and when the timing completes the bucket is corrected.  A timed launch stands for every launch
 * of its function since the previous timed one: the correction is (their count) x (measured time) - (what they
 * were charged).  That total is an unbiased estimate of their GPU time whatever the estimate was, so the charge
 * follows kernels whose duration varies from launch to launch or drifts, without looking at grid sizes.  The
 * estimate (a moving average of the measurements) only keeps the corrections small.  How often a function is
 * timed follows the spread of its durations (timing_interval): steady kernels one launch in VGPU_EVERY_MAX,
 * kernels whose duration varies as much as its mean every launch.
 *
 * Cost.  A timing is three driver calls (two records, one elapsed time, which also says whether the timing is
 * done), so a steady kernel adds well under one call per launch whatever its length.  Finished timings are
 * collected oldest first, stopping at the first still running: when a timing is due, and once per wait of a
 * throttled thread, which is not in a hurry.  A process that sees one device never asks the driver which context
 * is current.
 *
 * What the events measure is the time from the engine reaching the first event to it reaching the second.  Work
 * the device runs between the two that is not this launch's (other contexts' time slices, other streams) is
 * counted too, which over-charges: the container then gets less than its limit, never more.  A timing whose
 * submission took long on the CPU (the thread was preempted between the first event and the kernel, and other
 * processes' work may have landed between them) is dropped: its launches count towards the next timing instead.
 *
 * What a pair adds.  On a real GPU (docs/isolation.md, measured on an H100) a pair around one launch reads more than
 * the device time that launch costs when launches run back to back, in two ways.  The events take device time of
 * their own: about what a pair with nothing between reads (1.25 us there; around a kernel queued behind others a
 * pair reads 1.44 us more than the launch costs back to back).  So the least an empty pair has read on the device
 * (timed at its first VGPU_CAL_FIRST timings and with one in VGPU_CAL_EVERY after, right behind the timed launch; a
 * pair the engine had reached before its second event was recorded, or a reading over VGPU_PAIR_MAX_NS, is not
 * taken) is taken off each timing: being the least, it stays below what the events add.  And on an idle
 * stream the engine reaches the first event as soon as it is submitted, then waits for the kernel the host is still
 * submitting (about 2.5 us there): that wait stays charged.  Timing only launches that find the stream busy would
 * avoid it, but then which launches are timed would depend on the durations before them, and the corrections
 * would no longer be unbiased (a pattern of long and short kernels would be under-charged).
 */
#define VGPU_BUCKET_NS 100000000ULL  /* bucket size, in wall ns at the limit's rate */
#define VGPU_CHUNK_NS 200000LL       /* GPU ns a process takes from the shared bucket at a time */
#define VGPU_UNKNOWN_NS 1000000LL    /* charge of a launch of a function never measured */
#define VGPU_EVERY_MAX 64
#define VGPU_TIMING_NS 100000.0      /* short kernels: timed at most once per this much of their GPU time */
#define VGPU_STEADY_CV2 0.0225       /* functions this steady (CV 0.15) are timed one launch in VGPU_EVERY_MAX */
#define VGPU_PRECISION_NS 100000.0   /* every x CV^2 x mean at most this: the charge errs ~1 % per s of GPU time */
#define VGPU_WARMUP 8                /* time the first launches of a function, all of them */
#define VGPU_VAR_SPAN 32             /* timings the spread of a function's durations is estimated over */
#define VGPU_PAIRS 64
#define VGPU_SUBMIT_NS 200000ULL     /* a timed submission slower than this may have let other work in: dropped */
#define VGPU_CAL_FIRST 4             /* empty pairs timed at a device's first timings... */
#define VGPU_CAL_EVERY 64            /* ...then one with every this many timings */
#define VGPU_PAIR_MAX_NS 4000        /* an empty pair reading more than this is not taken as the events' own time */

typedef struct {
    int64_t est;             /* GPU ns per launch (moving average); 0 = never measured */
    double var;              /* moving variance of the timings, ns^2 */
    uint32_t since;          /* launches since the last timed one */
    uint32_t every;          /* time one launch in this many */
    int64_t charged;         /* ns charged to those launches */
    uint32_t samples;
} launch_stats_t;

typedef struct {
    CUevent start, end;
    CUcontext ctx;
    launch_stats_t *stats;
    int64_t charged;         /* what the launches this timing stands for were charged */
    uint32_t weight;         /* how many launches it stands for; 0: an empty pair, timing the events themselves */
    int row;
    int state;               /* PAIR_UNUSED, PAIR_FREE, PAIR_TAKEN, PAIR_PENDING */
} event_pair_t;
enum { PAIR_UNUSED = 0, PAIR_FREE, PAIR_TAKEN, PAIR_PENDING };

static event_pair_t g_pairs[VGPU_PAIRS];
static int g_pending[VGPU_PAIRS];   /* indexes of pending pairs, oldest first */
static int g_npending;
static THREAD_LOCAL int64_t t_reservoir[VGPU_MAX_DEVICES];  /* tokens this thread took from the shared bucket */
static uint64_t g_gpu_ns[VGPU_MAX_DEVICES];     /* GPU ns this process paid for in the current second */
static uint64_t g_last_sec;
static int64_t g_pair_ns[VGPU_MAX_DEVICES];     /* the least an empty pair read on the device; 0: none yet */
static uint32_t g_timings[VGPU_MAX_DEVICES];    /* timings started on the device */
static THREAD_LOCAL struct { unsigned gen; int row; uint32_t uses; int valid; CUcontext ctx; } t_ctx;
static THREAD_LOCAL struct { uint64_t key; launch_stats_t *stats; } t_fn;

/* Once per second: last_kernel_time, and this process's share of each device (slot.device_util.sm_util, %),
 * from the GPU time its launches were charged (only known while a compute limit is active). */
static void note_second(uint64_t sec) {
    uint64_t elapsed = g_last_sec ? sec - g_last_sec : 1;
    g_last_sec = sec;
    vgpu_pace_refresh(sec);
    __atomic_store_n(&g_vgpu.region->last_kernel_time, sec, __ATOMIC_RELAXED);
    int slot = vgpu_slot();
    for (int d = 0; d < VGPU_MAX_DEVICES && slot >= 0; d++) {
        int64_t ns = (int64_t)__atomic_exchange_n(&g_gpu_ns[d], 0, __ATOMIC_RELAXED);
        uint64_t pct = elapsed > 5 || ns <= 0 ? 0 : (uint64_t)ns / (elapsed * 10000000ULL);
        __atomic_store_n(&g_vgpu.region->procs[slot].device_util[d].sm_util, pct > 100 ? 100 : pct, __ATOMIC_RELAXED);
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
    if (g_vgpu.policy == POLICY_DISABLE) return 0;
    uint64_t lim = vgpu_sm_limit(r);
    if (!lim || lim >= 100) return 0;
    if (g_vgpu.policy == POLICY_DEFAULT && __atomic_load_n(&g_vgpu.region->utilization_switch, __ATOMIC_RELAXED) == 0)
        return 0;
    return 1;
}

/* The thread's current context changed (our context hooks): its cached device is stale. */
static inline void forget_current_context(void) { t_ctx.valid = 0; }

/*
 * Region row of the device a launch runs on.  With one device in the process that is the answer, with no driver
 * call.  With several, the current context's device is cached per thread: the context hooks drop the cache when
 * the thread switches contexts, a destroyed context drops every thread's, and the cache is checked against the
 * driver every 64 launches in case a context was switched on a path we do not see.
 */
static inline int launch_row(void) {
    int n = __atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE);
    if (UNLIKELY(n < 0)) {
        map_devices();
        n = __atomic_load_n(&g_ndev, __ATOMIC_ACQUIRE);
    }
    if (LIKELY(n == 1)) return g_ord2r[0];
    unsigned gen = __atomic_load_n(&g_ctx_gen, __ATOMIC_RELAXED);
    if (LIKELY(t_ctx.valid && t_ctx.gen == gen && (++t_ctx.uses & 63))) return t_ctx.row;
    CUcontext ctx = NULL;
    t_ctx.valid = real_cuCtxGetCurrent && real_cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx;
    t_ctx.ctx = ctx;
    t_ctx.row = t_ctx.valid ? cur_row() : -1;
    t_ctx.gen = gen;
    t_ctx.uses = 1;
    return t_ctx.row;
}

/* The current context, from the thread's cache while our context hooks have seen no switch. */
static CUcontext current_context(void) {
    unsigned gen = __atomic_load_n(&g_ctx_gen, __ATOMIC_RELAXED);
    if (t_ctx.valid && t_ctx.gen == gen && t_ctx.ctx) return t_ctx.ctx;
    CUcontext ctx = NULL;
    if (!real_cuCtxGetCurrent || real_cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return NULL;
    t_ctx.ctx = ctx;
    t_ctx.row = cur_row();
    t_ctx.gen = gen;
    t_ctx.uses = 1;
    t_ctx.valid = 1;
    return ctx;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000ULL), (long)(ns % 1000000000ULL)};
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
}

/* Adds the refill since the last one to device r's shared bucket.  The refill stops at the cap, so idle time is not
 * saved up; tokens above the cap can only be corrections that gave back what launches were over-charged, and they
 * are kept (cutting them would charge those launches twice). */
static void refill(vgpu_sm_state_t *st, uint64_t lim, uint64_t now) {
    int64_t cap = (int64_t)(VGPU_BUCKET_NS * lim / 100);
    uint64_t last = __atomic_load_n(&st->last_refill, __ATOMIC_ACQUIRE);
    if (now <= last || !__atomic_compare_exchange_n(&st->last_refill, &last, now, 0, __ATOMIC_ACQ_REL,
                                                    __ATOMIC_RELAXED))
        return;
    int64_t add = last ? (int64_t)((now - last) * lim / 100) : cap;
    int64_t t = __atomic_load_n(&st->tokens, __ATOMIC_ACQUIRE);
    if (add > cap - t) add = cap - t;
    if (add > 0) __atomic_add_fetch(&st->tokens, add, __ATOMIC_ACQ_REL);
}

static void collect_timings(void);

/* 0..63, per thread: spreads the wake-ups of threads that wait on one bucket */
static inline uint64_t jitter(void) {
    static THREAD_LOCAL uint32_t x;
    if (!x) x = (uint32_t)(uintptr_t)&x ^ (uint32_t)vgpu_now_ns() ^ 0x9e3779b9u;
    x ^= x << 13; x ^= x >> 17; x ^= x << 5;
    return x & 63;
}

/* Slow path of the gate: wait until device r's shared bucket is positive, then pay `cost` plus a chunk for the
 * reservoir out of it. */
static void gate_slow(int r, int64_t cost) {
    vgpu_sm_state_t *st = &g_vgpu.ext->sm[r];
    while (__atomic_load_n(&g_vgpu.region->recent_kernel, __ATOMIC_RELAXED) < 0) sleep_ns(10000000ULL); /* monitor block */
    if (__atomic_load_n(&g_vgpu.region->recent_kernel, __ATOMIC_RELAXED) != 2)
        __atomic_store_n(&g_vgpu.region->recent_kernel, 2, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t lim = vgpu_sm_limit(r);
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
        /* corrections that arrived during the wait count before the next one is decided (one call per wait
         * while timings are in flight: a waiting thread is not in a hurry) */
        if (__atomic_load_n(&g_npending, __ATOMIC_RELAXED)) {
            collect_timings();
            if (__atomic_load_n(&st->tokens, __ATOMIC_ACQUIRE) > 0) continue;
        }
        uint64_t wait = (uint64_t)(-t + 1) * 100 / lim;
        if (wait < 20000) wait = 20000;
        if (wait > 2000000) wait = 2000000;
        wait = wait / 2 + wait * jitter() / 64;
        sleep_ns(wait);
        __atomic_add_fetch(&st->throttled_ns, wait, __ATOMIC_RELAXED);
    }
}

/* Admits a launch of estimated cost `cost` on device r. */
static inline void gate(int r, int64_t cost) {
    if (LIKELY(t_reservoir[r] >= cost)) t_reservoir[r] -= cost;
    else gate_slow(r, cost);
}

/*
 * How often to time a function's launches.  The corrections are exact for the timed launches and an estimate for
 * the others, whose error grows with the spread of the function's durations: the error of n launches' total is
 * about CV * sqrt(every / n) of it, and n launches of mean m fill a stretch of GPU time G = n * m, so over G the
 * charge errs by CV * sqrt(every * m / G).  Two bounds: every x CV^2 x m at most VGPU_PRECISION_NS (about 1 % over
 * each second of GPU time, whatever the kernels' length: long kernels with a spread are few per second, so each is
 * timed), and every x CV^2 at most 64 x 0.15^2 (steady functions, CV 0.15 or less, one launch in VGPU_EVERY_MAX;
 * down to every launch for short kernels whose duration varies as much as their mean).  Short kernels are timed at
 * most once per VGPU_TIMING_NS of their GPU time whatever their spread: their errors are small in absolute terms,
 * and timing each of them would cost more than they run.
 */
static uint32_t timing_interval(const launch_stats_t *ls) {
    if (ls->samples < VGPU_WARMUP) return 1;
    double mean = (double)ls->est, cv2 = ls->var / (mean * mean);
    double every = cv2 > 0 ? VGPU_EVERY_MAX * VGPU_STEADY_CV2 / cv2 : VGPU_EVERY_MAX;
    double precise = ls->var > 0 ? VGPU_PRECISION_NS * mean / ls->var : VGPU_EVERY_MAX;
    if (precise < every) every = precise;
    double by_cost = (double)VGPU_TIMING_NS / mean;
    if (every < by_cost) every = by_cost;
    return every >= VGPU_EVERY_MAX ? VGPU_EVERY_MAX : every <= 1 ? 1 : (uint32_t)every;
}

/* Applies the outcome of a timing to the shared bucket and the function's estimate, or of an empty pair to the
 * events' own time.  Caller holds g_lim_mu. */
static void settle(event_pair_t *p, int64_t measured) {
    if (!p->weight) {
        if (measured > 0 && measured <= VGPU_PAIR_MAX_NS && (!g_pair_ns[p->row] || measured < g_pair_ns[p->row]))
            g_pair_ns[p->row] = measured;
        return;
    }
    measured = measured > g_pair_ns[p->row] ? measured - g_pair_ns[p->row] : 0;
    vgpu_sm_state_t *st = &g_vgpu.ext->sm[p->row];
    __atomic_add_fetch(&st->measured_ns, (uint64_t)measured, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->read_ns, (uint64_t)p->weight * (uint64_t)measured, __ATOMIC_RELAXED);
    measured = (int64_t)((double)measured * vgpu_pace(p->row));   /* the node's correction (pace.c) */
    int64_t correction = (int64_t)p->weight * measured - p->charged;
    if (correction) __atomic_sub_fetch(&st->tokens, correction, __ATOMIC_ACQ_REL);
    __atomic_add_fetch(&g_gpu_ns[p->row], (uint64_t)correction, __ATOMIC_RELAXED);
    __atomic_add_fetch(&st->charged_ns, (uint64_t)(p->charged + correction), __ATOMIC_RELAXED);
    launch_stats_t *ls = p->stats;
    int64_t est = ls->est;
    double dev = (double)(measured - est);
    if (est) {   /* a plain average over the first VGPU_VAR_SPAN deviations, then a moving one that long */
        uint32_t n = ls->samples < VGPU_VAR_SPAN ? ls->samples : VGPU_VAR_SPAN;
        ls->var += (dev * dev - ls->var) / n;
    }
    est = est ? est + (measured - est) / 8 : measured;
    if (est < 1) est = 1;
    __atomic_store_n(&ls->est, est, __ATOMIC_RELAXED);
    ls->samples++;
    /* fewer timings only gradually, more at once: a run of similar durations from a function that sometimes runs
     * much longer must not space its timings out just before a long one, which would then stand for many */
    uint32_t every = timing_interval(ls), was = ls->every;
    if (every > was + was / 4 + 1) every = was + was / 4 + 1;
    __atomic_store_n(&ls->every, every, __ATOMIC_RELAXED);
}

/* Collects finished timings, oldest first, stopping at the first one still running.  Nothing is queried while a
 * capture forbids it. */
static void collect_timings(void) {
    pthread_mutex_lock(&g_lim_mu);
    int done = 0;
    while (done < g_npending && !timing_paused()) {
        event_pair_t *p = &g_pairs[g_pending[done]];
        float ms = 0;
        /* one call: the elapsed time, or CUDA_ERROR_NOT_READY while either event has not completed */
        CUresult q = real_cuEventElapsedTime(&ms, p->start, p->end);
        if (q == CUDA_ERROR_NOT_READY) break;
        if (q == CUDA_SUCCESS) settle(p, ms > 0 ? (int64_t)((double)ms * 1e6) : 0);
        p->state = PAIR_FREE;
        done++;
    }
    if (done) {
        memmove(g_pending, g_pending + done, (size_t)(g_npending - done) * sizeof g_pending[0]);
        __atomic_store_n(&g_npending, g_npending - done, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g_lim_mu);
}

/* With every event pair in flight, waits for the oldest timing to complete rather than skip timing this launch:
 * a timing that stood for many launches would make the corrections, and the share, swing widely. */
static void wait_for_pair(void) {
    while (__atomic_load_n(&g_npending, __ATOMIC_RELAXED) >= VGPU_PAIRS && !timing_paused()) {
        collect_timings();
        if (__atomic_load_n(&g_npending, __ATOMIC_RELAXED) >= VGPU_PAIRS) sleep_ns(50000);
    }
}

/* A free event pair of context `ctx`, or NULL.  Caller holds g_lim_mu. */
static event_pair_t *pair_acquire_nolock(CUcontext ctx) {
    event_pair_t *spare = NULL;
    for (int i = 0; i < VGPU_PAIRS; i++) {
        event_pair_t *p = &g_pairs[i];
        if (p->state == PAIR_FREE && p->ctx == ctx) return p;
        if (!spare && p->state == PAIR_UNUSED) spare = p;
    }
    if (!spare) {   /* all pairs belong to other contexts: recycle a free one */
        for (int i = 0; i < VGPU_PAIRS && !spare; i++)
            if (g_pairs[i].state == PAIR_FREE) spare = &g_pairs[i];
        if (!spare) return NULL;
        real_cuEventDestroy_v2(spare->start);
        real_cuEventDestroy_v2(spare->end);
        spare->state = PAIR_UNUSED;
    }
    if (real_cuEventCreate(&spare->start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return NULL;
    if (real_cuEventCreate(&spare->end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
        real_cuEventDestroy_v2(spare->start);
        return NULL;
    }
    spare->ctx = ctx;
    spare->state = PAIR_FREE;
    return spare;
}

/* Context `ctx` is about to be destroyed: its events go with it, and its pending timings are dropped (their
 * launches keep the charge they were admitted with). */
static void forget_context_timings(CUcontext ctx) {
    if (!ctx) return;
    pthread_mutex_lock(&g_lim_mu);
    int keep = 0;
    for (int i = 0; i < g_npending; i++)
        if (g_pairs[g_pending[i]].ctx != ctx) g_pending[keep++] = g_pending[i];
    __atomic_store_n(&g_npending, keep, __ATOMIC_RELAXED);
    for (int i = 0; i < VGPU_PAIRS; i++) {
        event_pair_t *p = &g_pairs[i];
        if (p->state == PAIR_UNUSED || p->ctx != ctx) continue;
        real_cuEventDestroy_v2(p->start);
        real_cuEventDestroy_v2(p->end);
        memset(p, 0, sizeof *p);
    }
    pthread_mutex_unlock(&g_lim_mu);
}

static launch_stats_t *stats_slow(uint64_t key) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, K_FUNC, key);
    if (e && !e->aux) {
        launch_stats_t *ls = calloc(1, sizeof(launch_stats_t));
        if (ls) ls->every = 1;
        e->aux = (uint64_t)(uintptr_t)ls;
    }
    launch_stats_t *ls = e ? (launch_stats_t *)(uintptr_t)e->aux : NULL;
    pthread_mutex_unlock(&g_map_mu);
    return ls;
}

static inline launch_stats_t *stats_get(uint64_t key) {
    if (LIKELY(t_fn.key == key && t_fn.stats)) return t_fn.stats;
    launch_stats_t *ls = stats_slow(key);
    t_fn.key = key;
    t_fn.stats = ls;
    return ls;
}

typedef CUresult (*thunk_t)(void *);

/* Queues an empty pair on stream `s` of context `ctx` (device r), when one is free. */
static void time_empty_pair(int r, CUcontext ctx, CUstream s) {
    pthread_mutex_lock(&g_lim_mu);
    event_pair_t *p = g_npending < VGPU_PAIRS && !timing_paused() ? pair_acquire_nolock(ctx) : NULL;
    if (p) p->state = PAIR_TAKEN;
    pthread_mutex_unlock(&g_lim_mu);
    if (!p) return;
    int recorded = real_cuEventRecord(p->start, s) == CUDA_SUCCESS && real_cuEventRecord(p->end, s) == CUDA_SUCCESS;
    /* kept only when both events were queued behind the launch just timed (the engine has not reached the first
     * yet): then it runs them back to back and the reading is their own device time; on a stream already idle the
     * reading would also hold however long this thread took between the two records */
    int queued = recorded && real_cuEventQuery(p->start) == CUDA_ERROR_NOT_READY;
    pthread_mutex_lock(&g_lim_mu);
    if (queued && g_npending < VGPU_PAIRS && !timing_paused()) {
        p->stats = NULL;
        p->weight = 0;
        p->charged = 0;
        p->row = r;
        p->state = PAIR_PENDING;
        g_pending[g_npending] = (int)(p - g_pairs);
        __atomic_store_n(&g_npending, g_npending + 1, __ATOMIC_RELAXED);
    } else {
        p->state = PAIR_FREE;
    }
    pthread_mutex_unlock(&g_lim_mu);
}

/* A launch due for timing: events around it on its stream, kept when the submission was quick. */
static CUresult timed_launch(int r, launch_stats_t *ls, uint32_t n, int64_t charged, CUstream s, thunk_t call,
                             void *args) {
    if (__atomic_load_n(&g_npending, __ATOMIC_RELAXED)) collect_timings();
    wait_for_pair();
    CUcontext ctx = timing_paused() ? NULL : current_context();
    event_pair_t *p = NULL;
    if (ctx) {
        pthread_mutex_lock(&g_lim_mu);
        p = g_npending < VGPU_PAIRS && !timing_paused() ? pair_acquire_nolock(ctx) : NULL;
        if (p) p->state = PAIR_TAKEN;
        pthread_mutex_unlock(&g_lim_mu);
    }
    uint64_t t0 = vgpu_now_ns();
    if (!p || real_cuEventRecord(p->start, s) != CUDA_SUCCESS) {
        if (p) { pthread_mutex_lock(&g_lim_mu); p->state = PAIR_FREE; pthread_mutex_unlock(&g_lim_mu); }
        __atomic_store_n(&ls->since, n, __ATOMIC_RELAXED);
        __atomic_store_n(&ls->charged, charged, __ATOMIC_RELAXED);
        return call(args);
    }
    CUresult res = call(args);
    int recorded = res == CUDA_SUCCESS && real_cuEventRecord(p->end, s) == CUDA_SUCCESS;
    int quick = vgpu_now_ns() - t0 <= VGPU_SUBMIT_NS, calibrate = 0;
    pthread_mutex_lock(&g_lim_mu);
    if (recorded && quick && !timing_paused()) {
        uint32_t k = g_timings[r]++;
        calibrate = k < VGPU_CAL_FIRST || k % VGPU_CAL_EVERY == 0;
        p->stats = ls;
        p->weight = n;
        p->charged = charged;
        p->row = r;
        p->state = PAIR_PENDING;
        g_pending[g_npending] = (int)(p - g_pairs);
        __atomic_store_n(&g_npending, g_npending + 1, __ATOMIC_RELAXED);
        __atomic_store_n(&ls->since, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ls->charged, 0, __ATOMIC_RELAXED);
        __atomic_add_fetch(&g_vgpu.ext->sm[r].launches, n, __ATOMIC_RELAXED);
    } else {
        p->state = PAIR_FREE;
        if (res == CUDA_SUCCESS) {   /* untimed after all: these launches count towards the next timing */
            __atomic_store_n(&ls->since, n, __ATOMIC_RELAXED);
            __atomic_store_n(&ls->charged, charged, __ATOMIC_RELAXED);
        }
    }
    pthread_mutex_unlock(&g_lim_mu);
    if (calibrate) time_empty_pair(r, ctx, s);
    return res;
}

/* A launch on device r under its compute limit; `s` names its stream for the timing's events (the per-thread default
 * stream as CU_STREAM_PER_THREAD). */
static CUresult limited_launch(int r, uint64_t key, CUstream s, thunk_t call, void *args) {
    launch_stats_t *ls = stats_get(key);
    if (UNLIKELY(!ls)) return call(args);
    int64_t est = __atomic_load_n(&ls->est, __ATOMIC_RELAXED);
    int64_t cost = est ? est : VGPU_UNKNOWN_NS;
    uint32_t n = __atomic_load_n(&ls->since, __ATOMIC_RELAXED) + 1;
    int64_t charged = __atomic_load_n(&ls->charged, __ATOMIC_RELAXED) + cost;
    gate(r, cost);
    if (LIKELY(n < __atomic_load_n(&ls->every, __ATOMIC_RELAXED)) || UNLIKELY(timing_paused())) {
        __atomic_store_n(&ls->since, n, __ATOMIC_RELAXED);
        __atomic_store_n(&ls->charged, charged, __ATOMIC_RELAXED);
        return call(args);
    }
    return timed_launch(r, ls, n, charged, s, call, args);
}

/* The device of a launch when a compute limit applies to it and the launch is not captured; -1 otherwise (the
 * caller then calls the driver directly). */
static inline int limited_device(CUstream s, int ptsz) {
    note_kernel();
    int r = launch_row();
    if (r < 0 || !sm_enabled(r) || UNLIKELY(stream_capturing(s, ptsz))) return -1;
    return r;
}

/* ---- the launch entry points */
typedef struct {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **, void **);
    CUfunction f; unsigned gx, gy, gz, bx, by, bz, shm; CUstream s; void **params, **extra;
} kernel_launch_t;
static CUresult kernel_launch_call(void *p) {
    kernel_launch_t *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params, a->extra);
}
static CUresult launch_kernel(__typeof__(real_cuLaunchKernel) fn, int ptsz, CUfunction f, unsigned gx, unsigned gy,
                              unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                              void **params, void **extra) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int r;
    if (LIKELY(!g_vgpu.active) || (r = limited_device(s, ptsz)) < 0)
        return fn(f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
    kernel_launch_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, stream_handle(s, ptsz), kernel_launch_call, &a);
}
EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    return launch_kernel(REAL(cuLaunchKernel), 0, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}
EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned shm, CUstream s, void **params, void **extra) {
    return launch_kernel(REAL(cuLaunchKernel_ptsz), 1, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);
}

typedef struct {
    CUresult (*fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                   void **);
    CUfunction f; unsigned gx, gy, gz, bx, by, bz, shm; CUstream s; void **params;
} coop_launch_t;
static CUresult coop_launch_call(void *p) {
    coop_launch_t *a = p;
    return a->fn(a->f, a->gx, a->gy, a->gz, a->bx, a->by, a->bz, a->shm, a->s, a->params);
}
static CUresult launch_coop(__typeof__(real_cuLaunchCooperativeKernel) fn, int ptsz, CUfunction f, unsigned gx,
                            unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned shm, CUstream s,
                            void **params) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int r;
    if (LIKELY(!g_vgpu.active) || (r = limited_device(s, ptsz)) < 0) return fn(f, gx, gy, gz, bx, by, bz, shm, s, params);
    coop_launch_t a = {fn, f, gx, gy, gz, bx, by, bz, shm, s, params};
    return limited_launch(r, (uint64_t)(uintptr_t)f, stream_handle(s, ptsz), coop_launch_call, &a);
}
EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                          unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    return launch_coop(REAL(cuLaunchCooperativeKernel), 0, f, gx, gy, gz, bx, by, bz, shm, s, params);
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned shm, CUstream s, void **params) {
    return launch_coop(REAL(cuLaunchCooperativeKernel_ptsz), 1, f, gx, gy, gz, bx, by, bz, shm, s, params);
}

typedef struct {
    CUresult (*fn)(const CUlaunchConfig *, CUfunction, void **, void **);
    const CUlaunchConfig *c; CUfunction f; void **params, **extra;
} config_launch_t;
static CUresult config_launch_call(void *p) { config_launch_t *a = p; return a->fn(a->c, a->f, a->params, a->extra); }
static CUresult launch_ex(__typeof__(real_cuLaunchKernelEx) fn, int ptsz, const CUlaunchConfig *c, CUfunction f,
                          void **params, void **extra) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int r;
    if (LIKELY(!g_vgpu.active) || !c || (r = limited_device(c->hStream, ptsz)) < 0) return fn(c, f, params, extra);
    config_launch_t a = {fn, c, f, params, extra};
    return limited_launch(r, (uint64_t)(uintptr_t)f, stream_handle(c->hStream, ptsz), config_launch_call, &a);
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return launch_ex(REAL(cuLaunchKernelEx), 0, c, f, params, extra);
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    return launch_ex(REAL(cuLaunchKernelEx_ptsz), 1, c, f, params, extra);
}

/* the launch API of CUDA 2 (parameters set beforehand with cuParamSet*): the legacy default stream or a stream */
typedef struct { CUresult (*fn)(CUfunction, int, int, CUstream); CUfunction f; int w, h; CUstream s; int kind; }
    grid_launch_t;
static CUresult grid_launch_call(void *p) {
    grid_launch_t *a = p;
    if (a->kind == 0) return ((CUresult(*)(CUfunction))(void *)a->fn)(a->f);
    if (a->kind == 1) return ((CUresult(*)(CUfunction, int, int))(void *)a->fn)(a->f, a->w, a->h);
    return a->fn(a->f, a->w, a->h, a->s);
}
static CUresult launch_grid(void *fn, int kind, CUfunction f, int w, int h, CUstream s) {
    grid_launch_t a = {(CUresult(*)(CUfunction, int, int, CUstream))fn, f, w, h, s, kind};
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int r;
    if (LIKELY(!g_vgpu.active) || (r = limited_device(s, 0)) < 0) return grid_launch_call(&a);
    return limited_launch(r, (uint64_t)(uintptr_t)f, s, grid_launch_call, &a);
}
EXPORT CUresult cuLaunch(CUfunction f) { return launch_grid((void *)REAL(cuLaunch), 0, f, 1, 1, NULL); }
EXPORT CUresult cuLaunchGrid(CUfunction f, int w, int h) {
    return launch_grid((void *)REAL(cuLaunchGrid), 1, f, w, h, NULL);
}
EXPORT CUresult cuLaunchGridAsync(CUfunction f, int w, int h, CUstream s) {
    return launch_grid((void *)REAL(cuLaunchGridAsync), 2, f, w, h, s);
}

/* Deprecated since CUDA 11.3 and one launch across several devices, which one budget per device cannot time:
 * refused while a compute limit applies to any device of the container. */
EXPORT CUresult cuLaunchCooperativeKernelMultiDevice(CUDA_LAUNCH_PARAMS *list, unsigned int n, unsigned int flags) {
    __typeof__(real_cuLaunchCooperativeKernelMultiDevice) fn = REAL(cuLaunchCooperativeKernelMultiDevice);
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !list) return fn(list, n, flags);
    for (int r = 0; r < VGPU_MAX_DEVICES; r++)
        if (sm_enabled(r)) {
            VLOG(VLOG_WARN, "cuLaunchCooperativeKernelMultiDevice refused: a compute limit applies");
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    return fn(list, n, flags);
}

typedef struct { CUresult (*fn)(CUgraphExec, CUstream); CUgraphExec g; CUstream s; } graph_launch_t;
static CUresult graph_launch_call(void *p) { graph_launch_t *a = p; return a->fn(a->g, a->s); }
static CUresult launch_graph(__typeof__(real_cuGraphLaunch) fn, int ptsz, CUgraphExec g, CUstream s) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int r;
    if (LIKELY(!g_vgpu.active) || (r = limited_device(s, ptsz)) < 0) return fn(g, s);
    graph_launch_t a = {fn, g, s};
    return limited_launch(r, (uint64_t)(uintptr_t)g ^ 0x4000000000000000ULL, stream_handle(s, ptsz),
                          graph_launch_call, &a);
}
EXPORT CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return launch_graph(REAL(cuGraphLaunch), 0, g, s); }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) {
    return launch_graph(REAL(cuGraphLaunch_ptsz), 1, g, s);
}
