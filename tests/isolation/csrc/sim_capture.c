/*
 * sim_capture.c - drives the simulated libcuda's stream capture directly (no libvgpu.so): each sub-command runs one
 * scenario and prints key=value lines for tests/isolation/test_sim_capture.py.  Error codes print as numbers.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#undef cuStreamBeginCapture
#undef cuStreamGetCaptureInfo
CUresult cuStreamBeginCapture(CUstream s);   /* the CUDA 10.0 ABI: no mode */
CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode);
CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph *g);
CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus *st);
CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                             unsigned bz, unsigned shm, CUstream s, void **params, void **extra);
CUresult cuStreamGetCaptureInfo(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id);
CUresult cuStreamGetCaptureInfo_v2(CUstream s, CUstreamCaptureStatus *st, cuuint64_t *id, CUgraph *g,
                                   const CUgraphNode **deps, size_t *n);

#define P(key, fmt, ...) printf(key "=" fmt "\n", __VA_ARGS__)
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(3); } } while (0)

static uint64_t (*h_launches)(int);
static uint64_t (*h_used)(int);
static uint64_t (*h_busy)(int, int, uint64_t, uint64_t);
static uint64_t (*h_now)(void);
static uint64_t (*h_inval)(void);
static CUcontext ctx;
static CUmodule mod;
static CUfunction k_sleep, k_fixed;

static void setup(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    h_launches = (uint64_t (*)(int))dlsym(h, "simgpu_launches");
    h_used = (uint64_t (*)(int))dlsym(h, "simgpu_used_bytes");
    h_busy = (uint64_t (*)(int, int, uint64_t, uint64_t))dlsym(h, "simgpu_busy_ns");
    h_now = (uint64_t (*)(void))dlsym(h, "simgpu_now_ns");
    h_inval = (uint64_t (*)(void))dlsym(h, "simgpu_capture_invalidations");
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, d));
    CK(cuCtxSetCurrent(ctx));
    CK(cuModuleLoadData(&mod, "simgpu-module\nfixed5 fixed 5ms\n"));
    CK(cuModuleGetFunction(&k_sleep, mod, "sleep"));
    CK(cuModuleGetFunction(&k_fixed, mod, "fixed5"));
}

/* a "sleep" kernel of `ns` on stream s */
static CUresult sleep_on(CUstream s, uint64_t ns) {
    void *args[] = {&ns};
    return cuLaunchKernel(k_sleep, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

static CUstreamCaptureStatus status_of(CUstream s) {
    CUstreamCaptureStatus st = (CUstreamCaptureStatus)-1;
    CUresult r = cuStreamIsCapturing(s, &st);
    return r ? (CUstreamCaptureStatus)(100 + (int)r) : st;
}

static size_t node_count(CUgraph g) {
    size_t n = 0;
    if (!g || cuGraphGetNodes(g, NULL, &n)) return (size_t)-1;
    return n;
}

/* capture three kernels, check nothing ran, then run the graph twice */
static int cmd_basic(void) {
    setup();
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    uint64_t before = h_launches(0);
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    P("status_active", "%d", (int)status_of(s));
    CUstreamCaptureStatus st;
    cuuint64_t id = 0;
    CUgraph inside = NULL;
    const CUgraphNode *deps = NULL;
    const CUgraphEdgeData *edges = NULL;
    size_t nd = 99;
    CK(cuStreamGetCaptureInfo_v3(s, &st, &id, &inside, &deps, &edges, &nd));
    P("info_deps_before", "%zu", nd);
    P("info_id_nonzero", "%d", id != 0);
    CK(sleep_on(s, 20000000));
    CK(sleep_on(s, 20000000));
    CK(cuLaunchKernel(k_fixed, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CK(cuStreamGetCaptureInfo_v3(s, &st, &id, &inside, &deps, &edges, &nd));
    P("info_deps_after", "%zu", nd);
    P("info_graph_nodes", "%zu", node_count(inside));
    cuuint64_t id1 = 0;
    CK(cuStreamGetCaptureInfo(s, &st, &id1));
    P("info_v1_same_id", "%d", id1 == id);
    P("launches_during_capture", "%llu", (unsigned long long)(h_launches(0) - before));
    CUgraph g;
    CK(cuStreamEndCapture(s, &g));
    P("status_after", "%d", (int)status_of(s));
    P("graph_nodes", "%zu", node_count(g));
    CUgraphNodeType type;
    CUgraphNode nodes[3];
    size_t n = 3;
    CK(cuGraphGetNodes(g, nodes, &n));
    CK(cuGraphNodeGetType(nodes[0], &type));
    P("node0_type", "%d", (int)type);
    CUgraphExec ex;
    CK(cuGraphInstantiateWithFlags(&ex, g, 0));
    uint64_t t0 = h_now();
    CK(cuGraphLaunch(ex, s));
    CK(cuGraphLaunch(ex, s));
    CK(cuStreamSynchronize(s));
    uint64_t t1 = h_now();
    P("launches_after_two_runs", "%llu", (unsigned long long)(h_launches(0) - before));
    P("busy_ms", "%.1f", (double)h_busy(0, 0, t0 - 1000000, t1 + 1000000) / 1e6);
    P("invalidations", "%llu", (unsigned long long)h_inval());
    return 0;
}

/* capture mode rules, one potentially unsafe call at a time, each from a second thread or this one */
typedef struct { int what; CUresult rc; CUstreamCaptureMode mode; } job_t;
static CUevent plain_event;
static CUstream other_stream;
static void *do_unsafe(void *arg) {
    job_t *j = arg;
    CUstreamCaptureMode m = j->mode;
    cuCtxSetCurrent(ctx);
    cuThreadExchangeStreamCaptureMode(&m);
    CUdeviceptr p = 0;
    switch (j->what) {
    case 0: j->rc = cuMemAlloc(&p, 1 << 20); if (!j->rc) cuMemFree(p); break;
    case 1: j->rc = cuEventQuery(plain_event); if (j->rc == CUDA_ERROR_NOT_READY) j->rc = 0; break;
    case 2: j->rc = cuStreamSynchronize(other_stream); break;
    case 3: j->rc = cuEventSynchronize(plain_event); break;
    case 4: j->rc = cuStreamQuery(other_stream); if (j->rc == CUDA_ERROR_NOT_READY) j->rc = 0; break;
    case 5: j->rc = cuCtxSynchronize(); break;
    }
    m = j->mode;
    cuThreadExchangeStreamCaptureMode(&m);
    return NULL;
}
static CUresult unsafe_in(int thread, int what, CUstreamCaptureMode mode) {
    job_t j = {what, 0, mode};
    if (thread) {
        pthread_t t;
        pthread_create(&t, NULL, do_unsafe, &j);
        pthread_join(t, NULL);
    } else {
        do_unsafe(&j);
    }
    return j.rc;
}
/* begins a capture of `cmode`, makes one unsafe call, ends it: "<call rc>,<end rc>" */
static void trial(const char *key, CUstream s, CUstreamCaptureMode cmode, int thread, int what,
                  CUstreamCaptureMode tmode) {
    CK(cuStreamBeginCapture_v2(s, cmode));
    CK(sleep_on(s, 1000));
    CUresult r = unsafe_in(thread, what, tmode);
    CUgraph g = (CUgraph)1;
    CUresult e = cuStreamEndCapture(s, &g);
    printf("%s=%d,%d,%s\n", key, (int)r, (int)e, g ? "graph" : "null");
    if (g) cuGraphDestroy(g);
}
static int cmd_modes(void) {
    setup();
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&other_stream, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&plain_event, 0));
    CK(cuEventRecord(plain_event, other_stream));
    const CUstreamCaptureMode G = CU_STREAM_CAPTURE_MODE_GLOBAL, T = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                              R = CU_STREAM_CAPTURE_MODE_RELAXED;
    trial("global_other_thread_alloc", s, G, 1, 0, G);
    trial("global_other_thread_relaxed_alloc", s, G, 1, 0, R);
    trial("global_other_thread_threadlocal_alloc", s, G, 1, 0, T);
    trial("global_same_thread_alloc", s, G, 0, 0, G);
    trial("threadlocal_other_thread_alloc", s, T, 1, 0, G);
    trial("threadlocal_same_thread_alloc", s, T, 0, 0, G);
    trial("threadlocal_same_thread_relaxed_alloc", s, T, 0, 0, R);
    trial("relaxed_same_thread_alloc", s, R, 0, 0, G);
    trial("relaxed_other_thread_alloc", s, R, 1, 0, G);
    trial("global_other_thread_event_query", s, G, 1, 1, G);
    trial("global_other_thread_stream_sync", s, G, 1, 2, G);
    trial("global_other_thread_event_sync", s, G, 1, 3, G);
    trial("global_other_thread_stream_query", s, G, 1, 4, G);
    trial("global_same_thread_ctx_sync", s, G, 0, 5, G);
    trial("relaxed_same_thread_ctx_sync", s, R, 0, 5, G);
    trial("relaxed_same_thread_event_query", s, R, 0, 1, G);
    P("invalidations", "%llu", (unsigned long long)h_inval());
    /* the capturing stream itself cannot be synchronized or queried, whatever the mode */
    CK(cuStreamBeginCapture_v2(s, R));
    CUresult q = cuStreamQuery(s);
    CUresult again = sleep_on(s, 1000);
    CUgraph g = (CUgraph)1;
    CUresult e = cuStreamEndCapture(s, &g);
    printf("relaxed_query_capturing=%d,%d,%d,%s\n", (int)q, (int)again, (int)e, g ? "graph" : "null");
    CK(cuStreamBeginCapture_v2(s, R));
    q = cuStreamSynchronize(s);
    e = cuStreamEndCapture(s, &g);
    printf("relaxed_sync_capturing=%d,%d\n", (int)q, (int)e);
    P("invalidations_end", "%llu", (unsigned long long)h_inval());
    /* cuThreadExchangeStreamCaptureMode swaps */
    CUstreamCaptureMode m = R;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    P("exchange_old", "%d", (int)m);
    CK(cuThreadExchangeStreamCaptureMode(&m));
    P("exchange_back", "%d", (int)m);
    m = (CUstreamCaptureMode)7;
    P("exchange_bad", "%d", (int)cuThreadExchangeStreamCaptureMode(&m));
    return 0;
}

/* events recorded inside a capture */
static int cmd_events(void) {
    setup();
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent ev;
    CK(cuEventCreate(&ev, 0));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CK(sleep_on(s, 1000));
    CK(cuEventRecord(ev, s));
    P("query_captured", "%d", (int)cuEventQuery(ev));
    P("status_after_query", "%d", (int)status_of(s));
    P("launch_after_invalid", "%d", (int)sleep_on(s, 1000));
    CUgraph g = (CUgraph)1;
    P("end", "%d", (int)cuStreamEndCapture(s, &g));
    P("end_graph_null", "%d", g == NULL);
    P("sync_captured_after_end", "%d", (int)cuEventSynchronize(ev));
    CK(cuEventRecord(ev, s));
    P("query_rerecorded", "%d", (int)cuEventSynchronize(ev));
    P("invalidations", "%llu", (unsigned long long)h_inval());
    return 0;
}

/* the legacy stream while blocking / non-blocking streams of the same context capture */
static int cmd_legacy(void) {
    setup();
    CUstream blocking, nonblocking;
    CK(cuStreamCreate(&blocking, 0));
    CK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CK(cuThreadExchangeStreamCaptureMode(&m));
    CK(cuStreamBeginCapture_v2(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUstreamCaptureStatus st;
    P("is_capturing_legacy", "%d", (int)cuStreamIsCapturing(NULL, &st));
    P("is_capturing_legacy_handle", "%d", (int)cuStreamIsCapturing(CU_STREAM_LEGACY, &st));
    P("status_after_is_capturing", "%d", (int)status_of(blocking));
    P("launch_legacy", "%d", (int)sleep_on(NULL, 1000));
    P("status_after_launch", "%d", (int)status_of(blocking));
    CUgraph g = (CUgraph)1;
    P("end", "%d", (int)cuStreamEndCapture(blocking, &g));
    CK(cuStreamBeginCapture_v2(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    P("memcpy_sync", "%d", (int)cuMemcpyHtoD(0, &m, sizeof m));
    P("end_memcpy", "%d", (int)cuStreamEndCapture(blocking, &g));
    CK(cuStreamBeginCapture_v2(blocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    P("sync_legacy", "%d", (int)cuStreamSynchronize(NULL));
    P("end_sync", "%d", (int)cuStreamEndCapture(blocking, &g));
    CK(cuStreamBeginCapture_v2(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED));
    P("launch_legacy_nonblocking", "%d", (int)sleep_on(NULL, 1000));
    P("end_nonblocking", "%d", (int)cuStreamEndCapture(nonblocking, &g));
    P("begin_on_legacy", "%d", (int)cuStreamBeginCapture_v2(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    P("invalidations", "%llu", (unsigned long long)h_inval());
    return 0;
}

/* cross-stream dependencies: fork and join through events */
static int cmd_forkjoin(void) {
    setup();
    CUstream s1, s2, s3;
    CK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
    CUevent fork, join, outside;
    CK(cuEventCreate(&fork, 0));
    CK(cuEventCreate(&join, 0));
    CK(cuEventCreate(&outside, 0));
    uint64_t before = h_launches(0);
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(sleep_on(s1, 1000000));
    CK(cuEventRecord(fork, s1));
    P("s2_before_wait", "%d", (int)status_of(s2));
    CK(cuStreamWaitEvent(s2, fork, 0));
    P("s2_after_wait", "%d", (int)status_of(s2));
    cuuint64_t id1 = 0, id2 = 0;
    CUstreamCaptureStatus st;
    CK(cuStreamGetCaptureInfo(s1, &st, &id1));
    CK(cuStreamGetCaptureInfo(s2, &st, &id2));
    P("same_capture", "%d", id1 == id2 && id1);
    CK(sleep_on(s2, 2000000));
    CK(sleep_on(s1, 3000000));
    CK(cuEventRecord(join, s2));
    CK(cuStreamWaitEvent(s1, join, 0));
    CK(sleep_on(s1, 4000000));
    P("end_from_forked", "%d", (int)cuStreamEndCapture(s2, &(CUgraph){0}));
    CUgraph g = NULL;
    CUresult e = cuStreamEndCapture(s1, &g);
    P("end_joined", "%d", (int)e);
    /* the forked-stream end above invalidated it; do it again properly */
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(sleep_on(s1, 1000000));
    CK(cuEventRecord(fork, s1));
    CK(cuStreamWaitEvent(s2, fork, 0));
    CK(sleep_on(s2, 2000000));
    CK(sleep_on(s1, 3000000));
    CK(cuEventRecord(join, s2));
    CK(cuStreamWaitEvent(s1, join, 0));
    CK(sleep_on(s1, 4000000));
    e = cuStreamEndCapture(s1, &g);
    P("end_joined_again", "%d", (int)e);
    P("joined_nodes", "%zu", node_count(g));
    P("s2_after_end", "%d", (int)status_of(s2));
    P("launches_during", "%llu", (unsigned long long)(h_launches(0) - before));
    CUgraphExec ex;
    CK(cuGraphInstantiate(&ex, g, 0));
    uint64_t t0 = h_now();
    CK(cuGraphLaunch(ex, s3));
    CK(cuStreamSynchronize(s3));
    P("joined_busy_ms", "%.1f", (double)h_busy(0, 0, t0 - 1000000, h_now() + 1000000) / 1e6);
    /* a fork never joined back */
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuEventRecord(fork, s1));
    CK(cuStreamWaitEvent(s2, fork, 0));
    CK(sleep_on(s2, 1000));
    g = (CUgraph)1;
    P("end_unjoined", "%d", (int)cuStreamEndCapture(s1, &g));
    P("unjoined_graph_null", "%d", g == NULL);
    P("s2_after_unjoined", "%d", (int)status_of(s2));
    /* two captures cannot merge */
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuStreamBeginCapture_v2(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuEventRecord(fork, s1));
    P("wait_merge", "%d", (int)cuStreamWaitEvent(s2, fork, 0));
    P("end_merge_s1", "%d", (int)cuStreamEndCapture(s1, &g));
    P("end_merge_s2", "%d", (int)cuStreamEndCapture(s2, &g));
    /* waiting on work outside the capture */
    CK(cuEventRecord(outside, s3));
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    P("wait_outside", "%d", (int)cuStreamWaitEvent(s1, outside, 0));
    P("end_outside", "%d", (int)cuStreamEndCapture(s1, &g));
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    P("wait_outside_external", "%d", (int)cuStreamWaitEvent(s1, outside, CU_EVENT_WAIT_EXTERNAL));
    P("end_outside_external", "%d", (int)cuStreamEndCapture(s1, &g));
    P("external_nodes", "%zu", node_count(g));
    P("wait_external_uncaptured", "%d", (int)cuStreamWaitEvent(s1, outside, CU_EVENT_WAIT_EXTERNAL));
    /* the capture sequence's end is the origin stream's */
    CK(cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    P("begin_twice", "%d", (int)cuStreamBeginCapture_v2(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuStreamEndCapture(s1, &g));
    P("end_not_capturing", "%d", (int)cuStreamEndCapture(s1, &g));
    P("invalidations", "%llu", (unsigned long long)h_inval());
    return 0;
}

/* end from another thread */
static CUstream wt_stream;
static CUresult wt_rc;
static void *end_elsewhere(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    CUgraph g;
    wt_rc = cuStreamEndCapture(wt_stream, &g);
    return NULL;
}
static int cmd_threads(void) {
    setup();
    CK(cuStreamCreate(&wt_stream, CU_STREAM_NON_BLOCKING));
    pthread_t t;
    CK(cuStreamBeginCapture_v2(wt_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    pthread_create(&t, NULL, end_elsewhere, NULL);
    pthread_join(t, NULL);
    P("end_other_thread_threadlocal", "%d", (int)wt_rc);
    P("still_active", "%d", (int)status_of(wt_stream));
    CUgraph g;
    CK(cuStreamEndCapture(wt_stream, &g));
    CK(cuStreamBeginCapture_v2(wt_stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    pthread_create(&t, NULL, end_elsewhere, NULL);
    pthread_join(t, NULL);
    P("end_other_thread_relaxed", "%d", (int)wt_rc);
    /* the CUDA 10.0 symbol: no mode, global */
    CK(cuStreamBeginCapture(wt_stream));
    P("old_begin_status", "%d", (int)status_of(wt_stream));
    P("old_begin_other_thread_alloc", "%d", (int)unsafe_in(1, 0, CU_STREAM_CAPTURE_MODE_GLOBAL));
    P("old_begin_end", "%d", (int)cuStreamEndCapture(wt_stream, &g));
    return 0;
}

/* the per-thread default stream (the _ptsz entry points) */
static int cmd_ptsz(void) {
    setup();
    uint64_t before = h_launches(0);
    CK(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    CUstreamCaptureStatus st;
    CK(cuStreamIsCapturing_ptsz(NULL, &st));
    P("ptsz_status", "%d", (int)st);
    CK(cuStreamIsCapturing_ptsz(CU_STREAM_PER_THREAD, &st));
    P("per_thread_handle_status", "%d", (int)st);
    uint64_t ns = 1000;
    void *args[] = {&ns};
    CK(cuLaunchKernel_ptsz(k_sleep, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CK(cuLaunchKernel(k_sleep, 1, 1, 1, 1, 1, 1, 0, CU_STREAM_PER_THREAD, args, NULL));
    P("legacy_while_per_thread_captures", "%d", (int)sleep_on(CU_STREAM_LEGACY, 1000));
    CUgraph g = (CUgraph)1;
    P("end_ptsz", "%d", (int)cuStreamEndCapture_ptsz(NULL, &g));
    CK(cuStreamBeginCapture_v2_ptsz(NULL, CU_STREAM_CAPTURE_MODE_RELAXED));
    CK(cuLaunchKernel_ptsz(k_sleep, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CK(cuLaunchKernel_ptsz(k_sleep, 1, 1, 1, 1, 1, 1, 0, NULL, args, NULL));
    CK(cuStreamEndCapture_ptsz(NULL, &g));
    P("ptsz_nodes", "%zu", node_count(g));
    P("launches_during", "%llu", (unsigned long long)(h_launches(0) - before));
    return 0;
}

/* graph launches, event record nodes and stream-ordered allocations inside a capture */
static int cmd_nested(void) {
    setup();
    CUstream s, t;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
    CUgraph inner;
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(sleep_on(s, 1000000));
    CK(sleep_on(s, 1000000));
    CK(cuStreamEndCapture(s, &inner));
    CUgraphExec inner_ex;
    CK(cuGraphInstantiateWithFlags(&inner_ex, inner, 0));
    CUevent mark;
    CK(cuEventCreate(&mark, 0));
    uint64_t used0 = h_used(0), before = h_launches(0);
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuGraphLaunch(inner_ex, s));
    CK(cuEventRecordWithFlags(mark, s, CU_EVENT_RECORD_EXTERNAL));
    CUdeviceptr buf = 0;
    CK(cuMemAllocAsync(&buf, 64 << 20, s));
    P("alloc_in_capture_used_delta", "%llu", (unsigned long long)(h_used(0) - used0));
    CK(sleep_on(s, 1000000));
    CK(cuMemFreeAsync(buf, s));
    CUgraph outer;
    CK(cuStreamEndCapture(s, &outer));
    P("outer_nodes", "%zu", node_count(outer));
    P("launches_during", "%llu", (unsigned long long)(h_launches(0) - before));
    P("record_external_outside", "%d", (int)cuEventRecordWithFlags(mark, s, CU_EVENT_RECORD_EXTERNAL));
    CUgraphExec ex;
    CK(cuGraphInstantiateWithFlags(&ex, outer, 0));
    P("used_after_instantiate", "%llu", (unsigned long long)(h_used(0) - used0));
    CK(cuGraphLaunch(ex, t));
    P("used_after_launch", "%llu", (unsigned long long)(h_used(0) - used0));
    CK(cuStreamSynchronize(t));
    P("mark_query", "%d", (int)cuEventQuery(mark));
    P("launches_after", "%llu", (unsigned long long)(h_launches(0) - before));
    CK(cuGraphLaunch(ex, t));
    CK(cuStreamSynchronize(t));
    P("used_after_relaunch", "%llu", (unsigned long long)(h_used(0) - used0));
    CK(cuDeviceGraphMemTrim(0));
    P("used_after_trim", "%llu", (unsigned long long)(h_used(0) - used0));
    /* a graph whose allocation outlives it */
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuMemAllocAsync(&buf, 32 << 20, s));
    CK(sleep_on(s, 1000));
    CUgraph keep;
    CK(cuStreamEndCapture(s, &keep));
    CUgraphExec keep_ex;
    CK(cuGraphInstantiateWithFlags(&keep_ex, keep, 0));
    CK(cuGraphLaunch(keep_ex, t));
    CK(cuStreamSynchronize(t));
    P("unfreed_used", "%llu", (unsigned long long)(h_used(0) - used0));
    P("relaunch_unfreed", "%d", (int)cuGraphLaunch(keep_ex, t));
    CK(cuMemFree(buf));
    P("after_free_used", "%llu", (unsigned long long)(h_used(0) - used0));
    CK(cuDeviceGraphMemTrim(0));
    P("after_free_trim_used", "%llu", (unsigned long long)(h_used(0) - used0));
    /* freeing what is not a graph allocation, in a capture */
    CUdeviceptr plain;
    CK(cuMemAlloc(&plain, 1 << 20));
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    P("free_async_plain_in_capture", "%d", (int)cuMemFreeAsync(plain, s));
    CUgraph dropped = (CUgraph)1;
    P("end_after_bad_free", "%d", (int)cuStreamEndCapture(s, &dropped));
    /* capture into an existing graph */
    CUgraph into;
    CUgraphNode root;
    CK(cuGraphCreate(&into, 0));
    CK(cuGraphAddEmptyNode(&root, into, NULL, 0));
    CK(cuStreamBeginCaptureToGraph(s, into, &root, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(sleep_on(s, 1000));
    CUgraph back = NULL;
    CK(cuStreamEndCapture(s, &back));
    P("to_graph_same", "%d", back == into);
    P("to_graph_nodes", "%zu", node_count(into));
    P("invalidations", "%llu", (unsigned long long)h_inval());
    return 0;
}


/* dependency updates, instantiation with parameters, event record nodes, a capturing stream destroyed */
static int cmd_misc(void) {
    setup();
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUgraphNode none = NULL;
    P("update_not_capturing", "%d", (int)cuStreamUpdateCaptureDependencies_v2(s, &none, NULL, 0, 0));
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(sleep_on(s, 1000));
    CK(sleep_on(s, 1000));
    CUstreamCaptureStatus st;
    const CUgraphNode *deps = NULL;
    size_t nd = 0;
    CK(cuStreamGetCaptureInfo_v2(s, &st, NULL, NULL, &deps, &nd));
    CUgraphNode last = deps[0];
    CK(cuStreamUpdateCaptureDependencies_v2(s, NULL, NULL, 0, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
    CK(cuStreamGetCaptureInfo_v2(s, &st, NULL, NULL, &deps, &nd));
    P("deps_after_set_empty", "%zu", nd);
    CK(cuStreamUpdateCaptureDependencies_v2(s, &last, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
    CK(cuStreamGetCaptureInfo_v2(s, &st, NULL, NULL, &deps, &nd));
    P("deps_after_add", "%zu,%d", nd, nd == 1 && deps[0] == last);
    CUgraph other;
    CUgraphNode foreign;
    CK(cuGraphCreate(&other, 0));
    CK(cuGraphAddEmptyNode(&foreign, other, NULL, 0));
    P("update_foreign_node", "%d", (int)cuStreamUpdateCaptureDependencies_v2(s, &foreign, NULL, 1, 0));
    CK(sleep_on(s, 1000));
    CUgraph g;
    CK(cuStreamEndCapture(s, &g));
    P("misc_nodes", "%zu", node_count(g));
    /* an event record node, and instantiation with parameters and upload */
    CUgraph eg;
    CUevent ev;
    CUgraphNode rec, alloc;
    CK(cuEventCreate(&ev, 0));
    CK(cuGraphCreate(&eg, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    ap.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    ap.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    ap.bytesize = 6 << 20;
    CK(cuGraphAddMemAllocNode(&alloc, eg, NULL, 0, &ap));
    CK(cuGraphAddEventRecordNode(&rec, eg, &alloc, 1, ev));
    CK(cuGraphAddMemFreeNode(&alloc, eg, &rec, 1, ap.dptr));
    uint64_t used0 = h_used(0);
    CUDA_GRAPH_INSTANTIATE_PARAMS ip;
    memset(&ip, 0, sizeof ip);
    ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    ip.hUploadStream = s;
    CUgraphExec ex;
    CK(cuGraphInstantiateWithParams(&ex, eg, &ip));
    P("with_params_result", "%d", (int)ip.result_out);
    P("uploaded_used", "%llu", (unsigned long long)(h_used(0) - used0));
    P("event_before_launch", "%d", (int)cuEventQuery(ev));
    CK(cuGraphLaunch(ex, s));
    CK(cuStreamSynchronize(s));
    P("event_after_launch", "%d", (int)cuEventQuery(ev));
    cuuint64_t zero = 0, one = 1;
    P("reset_high", "%d", (int)cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &zero));
    P("set_high_nonzero", "%d", (int)cuDeviceSetGraphMemAttribute(0, CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, &one));
    /* a capturing stream destroyed: its capture is over, and was invalid */
    uint64_t before = h_inval();
    CUstream doomed;
    CK(cuStreamCreate(&doomed, CU_STREAM_NON_BLOCKING));
    CK(cuStreamBeginCapture_v2(doomed, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CK(cuStreamDestroy(doomed));
    CUdeviceptr p;
    P("alloc_after_destroyed_capture", "%d", (int)cuMemAlloc(&p, 1 << 20));
    P("destroy_invalidations", "%llu", (unsigned long long)(h_inval() - before));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (!strcmp(cmd, "basic")) return cmd_basic();
    if (!strcmp(cmd, "modes")) return cmd_modes();
    if (!strcmp(cmd, "events")) return cmd_events();
    if (!strcmp(cmd, "legacy")) return cmd_legacy();
    if (!strcmp(cmd, "forkjoin")) return cmd_forkjoin();
    if (!strcmp(cmd, "threads")) return cmd_threads();
    if (!strcmp(cmd, "ptsz")) return cmd_ptsz();
    if (!strcmp(cmd, "nested")) return cmd_nested();
    if (!strcmp(cmd, "misc")) return cmd_misc();
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}
