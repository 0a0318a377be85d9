/*
 * sim_events.c - drives the simulated libcuda directly (no libvgpu.so): events belong to the context current at
 * their creation and die with it (cuCtxDestroy, the last cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxReset,
 * cuGreenCtxDestroy).  Every later use of such an event is refused and counted by simgpu_dead_event_uses().
 * Each sub-command prints key=value lines for tests/isolation/test_sim_events.py.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the old symbols too (cudaTypedefs.h PFN_*_v2000 / _v7000: same ABIs as their successors) */
#undef cuEventElapsedTime
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev);
CUresult cuDevicePrimaryCtxReset(CUdevice dev);
/* the per-thread default stream entry points (cuda.h declares them only under CUDA_API_PER_THREAD_DEFAULT_STREAM) */
CUresult cuEventRecord_ptsz(CUevent ev, CUstream s);
CUresult cuEventRecordWithFlags_ptsz(CUevent ev, CUstream s, unsigned int flags);
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent ev, unsigned int flags);

#define P(key, fmt, ...) printf(key "=" fmt "\n", __VA_ARGS__)
#define CK(x) do { CUresult r_ = (x); if (r_) { printf("error=%s:%d\n", #x, (int)r_); fflush(stdout); exit(3); } } while (0)

static uint64_t (*h_dead)(void);
static unsigned long long dead(void) { return (unsigned long long)h_dead(); }

static void setup(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    h_dead = (uint64_t (*)(void))dlsym(h, "simgpu_dead_event_uses");
    if (!h_dead) { printf("error=no simgpu_dead_event_uses\n"); exit(3); }
    CK(cuInit(0));
}

/* Every event entry point on event `ev` (and `other`, a live event, for the two-event calls), on the current
 * context's streams: prints "<prefix>_<call>=<CUresult>" and returns how many calls were made. */
static int use_all(const char *prefix, CUevent ev, CUevent other) {
    float ms = 0;
    CUgraph g;
    CUgraphNode node;
    int n = 0;
#define U(name, call) do { printf("%s_" name "=%d\n", prefix, (int)(call)); n++; } while (0)
    U("record", cuEventRecord(ev, NULL));
    U("record_ptsz", cuEventRecord_ptsz(ev, NULL));
    U("record_flags", cuEventRecordWithFlags(ev, NULL, 0));
    U("record_flags_ptsz", cuEventRecordWithFlags_ptsz(ev, NULL, 0));
    U("query", cuEventQuery(ev));
    U("sync", cuEventSynchronize(ev));
    U("elapsed_start", cuEventElapsedTime(&ms, ev, other));
    U("elapsed_end", cuEventElapsedTime(&ms, other, ev));
    U("elapsed_v2", cuEventElapsedTime_v2(&ms, ev, other));
    U("wait", cuStreamWaitEvent(NULL, ev, 0));
    U("wait_ptsz", cuStreamWaitEvent_ptsz(NULL, ev, 0));
    CK(cuGraphCreate(&g, 0));
    U("graph_record_node", cuGraphAddEventRecordNode(&node, g, NULL, 0, ev));
    U("graph_wait_node", cuGraphAddEventWaitNode(&node, g, NULL, 0, ev));
    CK(cuGraphDestroy(g));
#undef U
    return n;
}

/* a live event works: recorded, complete, timed (the calls a dead one is refused) */
static void live_ok(const char *prefix, CUevent ev) {
    CUevent start;
    float ms = -1;
    unsigned long long d0 = dead();
    CK(cuEventCreate(&start, 0));
    CK(cuEventRecord(start, NULL));
    CK(cuEventRecord(ev, NULL));
    CK(cuEventRecordWithFlags_ptsz(ev, NULL, 0));
    CK(cuStreamWaitEvent(NULL, ev, 0));
    CK(cuEventSynchronize(ev));
    CK(cuEventQuery(ev));
    CK(cuEventElapsedTime_v2(&ms, start, ev));
    CK(cuEventDestroy(start));
    printf("%s_live_ok=%d\n", prefix, ms >= 0 && dead() == d0);
}

/* a created context: its events die at cuCtxDestroy; another context's events live on */
static int cmd_created(void) {
    setup();
    CUcontext primary, a;
    CK(cuDevicePrimaryCtxRetain(&primary, 0));
    CK(cuCtxSetCurrent(primary));
    CUevent in_primary, other;
    CK(cuEventCreate(&in_primary, 0));
    CK(cuEventCreate(&other, 0));
    CK(cuEventRecord(other, NULL));
    CK(cuCtxCreate(&a, NULL, 0, 0));   /* made current */
    CUevent ev, never_recorded;
    CK(cuEventCreate(&ev, CU_EVENT_BLOCKING_SYNC));
    CK(cuEventCreate(&never_recorded, 0));
    CK(cuEventRecord(ev, NULL));
    CK(cuEventSynchronize(ev));
    P("before", "%llu", dead());
    CK(cuCtxDestroy(a));
    CUcontext cur;
    CK(cuCtxGetCurrent(&cur));
    P("popped_to_primary", "%d", cur == primary);
    P("after_destroy", "%llu", dead());   /* destroying is no use */
    int calls = use_all("dead", ev, other);
    calls += use_all("dead_unrecorded", never_recorded, other);
    P("destroy", "%d", (int)cuEventDestroy(ev));
    P("destroy_again", "%d", (int)cuEventDestroy(ev));
    calls += 2;
    P("calls", "%d", calls);
    P("counted", "%llu", dead());
    unsigned long long d0 = dead();
    live_ok("primary", in_primary);
    CK(cuEventDestroy(in_primary));
    CK(cuEventDestroy(other));
    CK(cuEventDestroy(NULL));
    P("live_uses_counted", "%llu", dead() - d0);
    CK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* a new context at the old one's address does not revive the old context's events */
static int cmd_reuse(void) {
    setup();
    CUcontext a, b;
    CUevent old, fresh, other;
    CK(cuCtxCreate(&a, NULL, 0, 0));
    CK(cuEventCreate(&old, 0));
    CK(cuEventRecord(old, NULL));
    CK(cuCtxDestroy(a));
    CK(cuCtxCreate(&b, NULL, 0, 0));
    P("same_address", "%d", a == b);
    CK(cuEventCreate(&fresh, 0));
    CK(cuEventCreate(&other, 0));
    CK(cuEventRecord(other, NULL));
    P("fresh_is_new_handle", "%d", fresh != old);
    unsigned long long d0 = dead();
    int calls = use_all("old", old, other);
    P("old_destroy", "%d", (int)cuEventDestroy(old));
    calls++;
    P("calls", "%d", calls);
    P("counted", "%llu", dead() - d0);
    live_ok("fresh", fresh);
    /* the second context dies in turn: its events with it, the first's stay dead */
    CK(cuCtxDestroy(b));
    d0 = dead();
    CK(cuCtxCreate(&a, NULL, 0, 0));
    P("fresh_query", "%d", (int)cuEventQuery(fresh));
    P("old_query", "%d", (int)cuEventQuery(old));
    P("counted_second", "%llu", dead() - d0);
    CK(cuCtxDestroy(a));
    return 0;
}

/* the primary context: its events live while it is retained and die with its last release */
static int cmd_release(const char *which) {
    setup();
    int old_name = !strcmp(which, "v1");
    CUcontext p1, p2, p3;
    CK(cuDevicePrimaryCtxRetain(&p1, 0));
    CK(cuDevicePrimaryCtxRetain(&p2, 0));
    CK(cuCtxSetCurrent(p1));
    CUevent ev, other;
    CK(cuEventCreate(&ev, 0));
    CK(cuEventRecord(ev, NULL));
    CK(old_name ? cuDevicePrimaryCtxRelease(0) : cuDevicePrimaryCtxRelease_v2(0));   /* one reference left */
    live_ok("still_retained", ev);
    CK(old_name ? cuDevicePrimaryCtxRelease(0) : cuDevicePrimaryCtxRelease_v2(0));   /* the last: destroyed */
    int active = -1;
    unsigned flags = 0;
    CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    P("active", "%d", active);
    CK(cuDevicePrimaryCtxRetain(&p3, 0));   /* a new primary context, at the same address */
    P("same_address", "%d", p3 == p1);
    CK(cuCtxSetCurrent(p3));
    CK(cuEventCreate(&other, 0));
    CK(cuEventRecord(other, NULL));
    unsigned long long d0 = dead();
    int calls = use_all("dead", ev, other);
    P("destroy", "%d", (int)cuEventDestroy(ev));
    P("calls", "%d", calls + 1);
    P("counted", "%llu", dead() - d0);
    live_ok("new_primary", other);
    CK(cuEventDestroy(other));
    CK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* cuDevicePrimaryCtxReset: the primary context's events die, it stays retained; a created context's live on */
static int cmd_reset(const char *which) {
    setup();
    int old_name = !strcmp(which, "v1");
    CUcontext p, c;
    CK(cuDevicePrimaryCtxRetain(&p, 0));
    CK(cuCtxCreate(&c, NULL, 0, 0));
    CUevent in_created;
    CK(cuEventCreate(&in_created, 0));
    CK(cuCtxSetCurrent(p));
    CUevent ev, other;
    CK(cuEventCreate(&ev, 0));
    CK(cuEventRecord(ev, NULL));
    CK(old_name ? cuDevicePrimaryCtxReset(0) : cuDevicePrimaryCtxReset_v2(0));
    int active = -1;
    unsigned flags = 0;
    CK(cuDevicePrimaryCtxGetState(0, &flags, &active));
    P("still_active", "%d", active);
    CK(cuEventCreate(&other, 0));   /* the reset context takes new events */
    CK(cuEventRecord(other, NULL));
    unsigned long long d0 = dead();
    int calls = use_all("dead", ev, other);
    P("destroy", "%d", (int)cuEventDestroy(ev));
    P("calls", "%d", calls + 1);
    P("counted", "%llu", dead() - d0);
    live_ok("after_reset", other);
    CK(cuCtxSetCurrent(c));
    live_ok("created_ctx", in_created);
    CK(cuEventDestroy(in_created));
    CK(cuCtxDestroy(c));
    CK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* a green context's events die with it; its primary context's events live on */
static int cmd_green(void) {
    setup();
    CUcontext p, gctx;
    CK(cuDevicePrimaryCtxRetain(&p, 0));
    CK(cuCtxSetCurrent(p));
    CUevent in_primary;
    CK(cuEventCreate(&in_primary, 0));
    CUdevResource all, groups[2], rest;
    unsigned n = 2;
    CK(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM));
    CK(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 16));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, groups, 1));
    CUgreenCtx gc;
    CK(cuGreenCtxCreate(&gc, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuCtxFromGreenCtx(&gctx, gc));
    CK(cuCtxSetCurrent(gctx));
    CUevent ev;
    CK(cuEventCreate(&ev, 0));
    CK(cuEventRecord(ev, NULL));
    CK(cuCtxSetCurrent(p));
    CK(cuGreenCtxDestroy(gc));
    unsigned long long d0 = dead();
    P("query", "%d", (int)cuEventQuery(ev));
    P("destroy", "%d", (int)cuEventDestroy(ev));
    P("counted", "%llu", dead() - d0);
    live_ok("primary", in_primary);
    CK(cuEventDestroy(in_primary));
    CK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* events a capture and a graph hold: a captured event dies cleanly; a graph's record node of a dead event records
 * nothing and its launch is counted */
static int cmd_graph(void) {
    setup();
    CUcontext p, a;
    CK(cuDevicePrimaryCtxRetain(&p, 0));
    CK(cuCtxSetCurrent(p));
    CK(cuCtxCreate(&a, NULL, 0, 0));
    CUstream s;
    CUevent captured, node_event;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&captured, 0));
    CK(cuEventCreate(&node_event, 0));
    CUgraph g, cg;
    CUgraphNode node;
    CUgraphExec exec, cexec;
    CK(cuGraphCreate(&g, 0));
    CK(cuGraphAddEventRecordNode(&node, g, NULL, 0, node_event));
    CK(cuGraphInstantiateWithFlags(&exec, g, 0));
    CUmodule mod;
    CUfunction f;
    CK(cuModuleLoadData(&mod, "simgpu-module\nfixed1 fixed 1ms\n"));
    CK(cuModuleGetFunction(&f, mod, "fixed1"));
    CK(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED));
    CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
    CK(cuEventRecord(captured, s));   /* a captured event: it holds the capture's kernel node */
    CK(cuStreamEndCapture(s, &cg));
    CK(cuGraphInstantiateWithFlags(&cexec, cg, 0));
    CK(cuStreamDestroy(s));
    CK(cuCtxDestroy(a));   /* back to the primary context */
    unsigned long long d0 = dead();
    P("captured_query", "%d", (int)cuEventQuery(captured));
    P("captured_wait", "%d", (int)cuStreamWaitEvent(NULL, captured, 0));
    P("captured_destroy", "%d", (int)cuEventDestroy(captured));
    P("counted_captured", "%llu", dead() - d0);
    d0 = dead();
    P("launch", "%d", (int)cuGraphLaunch(exec, NULL));
    CK(cuCtxSynchronize());
    P("counted_launch", "%llu", dead() - d0);
    d0 = dead();
    P("launch_without_events", "%d", (int)cuGraphLaunch(cexec, NULL));
    P("counted_clean_launch", "%llu", dead() - d0);
    CK(cuGraphExecDestroy(exec));
    CK(cuGraphExecDestroy(cexec));
    CK(cuGraphDestroy(g));
    CK(cuGraphDestroy(cg));
    CK(cuDevicePrimaryCtxRelease_v2(0));
    return 0;
}

/* a context destroyed by one thread while current to another: that thread's new events are refused (cuCtxDestroy:
 * "attempting to access ctx from those threads will result in the error CUDA_ERROR_CONTEXT_IS_DESTROYED") */
static CUcontext stale_ctx;
static pthread_barrier_t stale_bar;
static CUevent stale_before;
static CUresult stale_create, stale_record, stale_created_after_reuse;
static void *stale_thread(void *arg) {
    (void)arg;
    CUevent ev;
    if (cuCtxSetCurrent(stale_ctx) || cuEventCreate(&stale_before, 0)) stale_create = CUDA_ERROR_UNKNOWN;
    pthread_barrier_wait(&stale_bar);   /* the main thread destroys the context */
    pthread_barrier_wait(&stale_bar);
    stale_create = cuEventCreate(&ev, 0);
    stale_record = cuEventRecord(stale_before, NULL);
    pthread_barrier_wait(&stale_bar);   /* the main thread makes a new context at the same address */
    pthread_barrier_wait(&stale_bar);
    stale_created_after_reuse = cuEventCreate(&ev, 0);   /* the handle names a live context again */
    if (stale_created_after_reuse == CUDA_SUCCESS) cuEventDestroy(ev);
    return NULL;
}
static int cmd_stale(void) {
    setup();
    pthread_t t;
    CK(cuCtxCreate(&stale_ctx, NULL, 0, 0));
    CK(cuCtxPopCurrent(NULL));
    pthread_barrier_init(&stale_bar, NULL, 2);
    pthread_create(&t, NULL, stale_thread, NULL);
    pthread_barrier_wait(&stale_bar);
    unsigned long long d0 = dead();
    CK(cuCtxDestroy(stale_ctx));
    P("destroy_again", "%d", (int)cuCtxDestroy(stale_ctx));
    pthread_barrier_wait(&stale_bar);
    pthread_barrier_wait(&stale_bar);
    CUcontext b;
    CK(cuCtxCreate(&b, NULL, 0, 0));
    P("same_address", "%d", b == stale_ctx);
    pthread_barrier_wait(&stale_bar);
    pthread_join(t, NULL);
    P("create", "%d", (int)stale_create);
    P("record_old", "%d", (int)stale_record);
    P("create_after_reuse", "%d", (int)stale_created_after_reuse);
    P("counted", "%llu", dead() - d0);
    CK(cuCtxDestroy(b));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    const char *arg = argc > 2 ? argv[2] : "";
    if (!strcmp(cmd, "created")) return cmd_created();
    if (!strcmp(cmd, "reuse")) return cmd_reuse();
    if (!strcmp(cmd, "release")) return cmd_release(arg);
    if (!strcmp(cmd, "reset")) return cmd_reset(arg);
    if (!strcmp(cmd, "green")) return cmd_green();
    if (!strcmp(cmd, "graph")) return cmd_graph();
    if (!strcmp(cmd, "stale")) return cmd_stale();
    fprintf(stderr, "unknown command %s\n", cmd);
    return 2;
}
