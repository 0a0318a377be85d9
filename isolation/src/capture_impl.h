/*
 * capture_impl.h - stream capture, included by hooks.c.
 *
 * While a stream is being captured (cuStreamBeginCapture .. cuStreamEndCapture, what torch.cuda.graph and
 * torch.compile's "reduce-overhead" mode do), work submitted to it is recorded into a graph, not run.  cuda.h
 * (cuThreadExchangeStreamCaptureMode) says that during a capture not begun in relaxed mode the capturing thread,
 * and in global mode every thread, is "prohibited from potentially unsafe API calls"; such a call fails and
 * invalidates the capture.  So the limiter, which times launches with events and polls them, must know:
 *   - launches into a capturing stream are neither gated nor timed (nothing runs; the graph is charged when it is
 *     launched, like any graph), and no event of ours is ever recorded into a capture;
 *   - while any capture not begun in relaxed mode is active in the process, no thread queries or waits on events
 *     and no new timing starts (launches are charged their estimate; timings resume after the capture).
 * The capture hooks count active captures; a capture begun before its count is visible to other threads would race
 * with a poll already under way, so beginning a capture first waits for any poll in flight (g_lim_mu).
 * A stream that joins a capture through cuStreamWaitEvent is found by asking the driver (cuStreamIsCapturing, a
 * call capture allows), which is done only while some capture is active: otherwise launches pay nothing.
 */
#define MAX_CAPTURES 64

typedef struct { CUstream stream; pthread_t thread; int strict; int used; } capture_t;

static capture_t g_capture[MAX_CAPTURES];
static int g_captures;               /* captures active in this process */
static int g_captures_strict;        /* ... of them not begun in relaxed mode */
static pthread_mutex_t g_capture_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t g_lim_mu = PTHREAD_MUTEX_INITIALIZER;   /* the limiter's timings (limiter_impl.h) */

/* The handle that names a stream for cuStreamIsCapturing: the per-thread default stream of a _ptsz call is
 * CU_STREAM_PER_THREAD. */
static inline CUstream stream_handle(CUstream s, int ptsz) { return (!s && ptsz) ? CU_STREAM_PER_THREAD : s; }

/* No new timing, no event query: some capture that forbids unsafe calls is active. */
static inline int timing_paused(void) { return __atomic_load_n(&g_captures_strict, __ATOMIC_ACQUIRE) != 0; }

/* A launch into stream `s` would be captured (only asked while some capture is active). */
static inline int stream_capturing(CUstream s, int ptsz) {
    if (LIKELY(!__atomic_load_n(&g_captures, __ATOMIC_ACQUIRE))) return 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    if (!real_cuStreamIsCapturing || real_cuStreamIsCapturing(stream_handle(s, ptsz), &st) != CUDA_SUCCESS)
        return 1;   /* cannot tell: treat as captured (ungated, untimed) */
    return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* Before the driver starts a capture: count it, then let any poll in flight finish. */
static int capture_opening(int strict) {
    __atomic_add_fetch(&g_captures, 1, __ATOMIC_ACQ_REL);
    if (strict) __atomic_add_fetch(&g_captures_strict, 1, __ATOMIC_ACQ_REL);
    pthread_mutex_lock(&g_lim_mu);
    pthread_mutex_unlock(&g_lim_mu);
    return strict;
}

static void capture_closed(int strict) {
    __atomic_sub_fetch(&g_captures, 1, __ATOMIC_ACQ_REL);
    if (strict) __atomic_sub_fetch(&g_captures_strict, 1, __ATOMIC_ACQ_REL);
}

static CUresult capture_begun(CUresult res, CUstream s, int ptsz, int strict) {
    if (res != CUDA_SUCCESS) { capture_closed(strict); return res; }
    pthread_mutex_lock(&g_capture_mu);
    int placed = 0;
    for (int i = 0; i < MAX_CAPTURES && !placed; i++) {
        if (g_capture[i].used) continue;
        g_capture[i] = (capture_t){stream_handle(s, ptsz), pthread_self(), strict, 1};
        placed = 1;
    }
    pthread_mutex_unlock(&g_capture_mu);
    if (!placed) VLOG(VLOG_WARN, "more than %d concurrent stream captures: timings stay paused", MAX_CAPTURES);
    return res;
}

/* After cuStreamEndCapture: a capture that ended (with its graph, or invalidated) is no longer counted. */
static CUresult capture_ended(CUresult res, CUstream s, int ptsz) {
    if (res != CUDA_SUCCESS && res != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return res;   /* still capturing */
    CUstream h = stream_handle(s, ptsz);
    int found = -1, strict = 0;
    pthread_mutex_lock(&g_capture_mu);
    for (int i = 0; i < MAX_CAPTURES && found < 0; i++) {
        capture_t *c = &g_capture[i];
        if (!c->used || c->stream != h) continue;
        if (h == CU_STREAM_PER_THREAD && !pthread_equal(c->thread, pthread_self())) continue;
        found = i;
        strict = c->strict;
        c->used = 0;
    }
    pthread_mutex_unlock(&g_capture_mu);
    if (found >= 0) capture_closed(strict);
    return res;
}

static CUresult begin_capture(__typeof__(real_cuStreamBeginCapture_v2) fn, CUstream s, CUstreamCaptureMode mode,
                              int ptsz) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int strict = capture_opening(mode != CU_STREAM_CAPTURE_MODE_RELAXED);
    return capture_begun(fn(s, mode), s, ptsz, strict);
}

/* the first form (CUDA 10.0) has no mode: the strictest one, as its successor's default */
EXPORT CUresult cuStreamBeginCapture(CUstream s) {
    __typeof__(real_cuStreamBeginCapture) fn = REAL(cuStreamBeginCapture);
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int strict = capture_opening(1);
    return capture_begun(fn(s), s, 0, strict);
}
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
    __typeof__(real_cuStreamBeginCapture_ptsz) fn = REAL(cuStreamBeginCapture_ptsz);
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int strict = capture_opening(1);
    return capture_begun(fn(s), s, 1, strict);
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
    return begin_capture(REAL(cuStreamBeginCapture_v2), s, mode, 0);
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
    return begin_capture(REAL(cuStreamBeginCapture_v2_ptsz), s, mode, 1);
}

static CUresult begin_capture_to_graph(__typeof__(real_cuStreamBeginCaptureToGraph) fn, CUstream s, CUgraph g,
                                       const CUgraphNode *deps, const CUgraphEdgeData *edges, size_t n,
                                       CUstreamCaptureMode mode, int ptsz) {
    if (UNLIKELY(!fn)) return CUDA_ERROR_NOT_FOUND;
    int strict = capture_opening(mode != CU_STREAM_CAPTURE_MODE_RELAXED);
    return capture_begun(fn(s, g, deps, edges, n, mode), s, ptsz, strict);
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode *deps,
                                            const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode) {
    return begin_capture_to_graph(REAL(cuStreamBeginCaptureToGraph), s, g, deps, edges, n, mode, 0);
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode *deps,
                                                 const CUgraphEdgeData *edges, size_t n, CUstreamCaptureMode mode) {
    return begin_capture_to_graph(REAL(cuStreamBeginCaptureToGraph_ptsz), s, g, deps, edges, n, mode, 1);
}

EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph *g) {
    return capture_ended(CALL(cuStreamEndCapture, s, g), s, 0);
}
EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g) {
    return capture_ended(CALL(cuStreamEndCapture_ptsz, s, g), s, 1);
}
