/*
 * context_impl.h - contexts, included by hooks.c.
 *
 * A context costs device memory of its own; with VGPU_CONTEXT_OVERHEAD set, each context (the primary context of
 * a device once, every created or green context) is charged that much.  Destroying a context (cuCtxDestroy, the
 * last release or a reset of a primary context) also destroys the limiter's events in it, so none of ours is ever
 * used after its context is gone.  Switching the current context drops the calling thread's cached launch device.
 */
#define MAX_PRIMARY 64
static int g_prim_refs[MAX_PRIMARY];          /* our count of retains of each device's primary context */
static CUcontext g_prim_ctx[MAX_PRIMARY];     /* the primary context of each device, once retained */

static void context_gone(CUcontext c) {
    forget_context_timings(c);
    __atomic_add_fetch(&g_ctx_gen, 1, __ATOMIC_RELAXED);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pc, CUdevice dev) {
    __typeof__(real_cuDevicePrimaryCtxRetain) f = REAL(cuDevicePrimaryCtxRetain);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || dev < 0 || dev >= MAX_PRIMARY) return f(pc, dev);
    int first = __atomic_fetch_add(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL) == 0;
    int r = g_vgpu.context_overhead ? ord2row(dev) : -1;
    if (first && r >= 0 && vgpu_reserve(r, g_vgpu.context_overhead, ACCT_CONTEXT)) {
        __atomic_fetch_sub(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL);
        return refuse(pc);
    }
    CUresult res = f(pc, dev);
    if (res == CUDA_SUCCESS && pc) __atomic_store_n(&g_prim_ctx[dev], *pc, __ATOMIC_RELEASE);
    if (res != CUDA_SUCCESS && __atomic_sub_fetch(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL) == 0 && r >= 0)
        vgpu_release(r, g_vgpu.context_overhead, ACCT_CONTEXT);
    return res;
}

/* The primary context of `dev` is gone (its last release, or a reset): its events and its overhead with it. */
static void primary_gone(CUdevice dev) {
    context_gone(__atomic_load_n(&g_prim_ctx[dev], __ATOMIC_ACQUIRE));
    __atomic_store_n(&g_prim_refs[dev], 0, __ATOMIC_RELEASE);
    if (g_vgpu.context_overhead) vgpu_release(ord2row(dev), g_vgpu.context_overhead, ACCT_CONTEXT);
}

static CUresult primary_release(__typeof__(real_cuDevicePrimaryCtxRelease_v2) f, CUdevice dev) {
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || dev < 0 || dev >= MAX_PRIMARY) return f(dev);
    /* the last reference: the driver destroys the context, so our events in it go first */
    int last = __atomic_load_n(&g_prim_refs[dev], __ATOMIC_ACQUIRE) == 1;
    if (last) forget_context_timings(__atomic_load_n(&g_prim_ctx[dev], __ATOMIC_ACQUIRE));
    CUresult res = f(dev);
    if (res != CUDA_SUCCESS) return res;
    int left = __atomic_sub_fetch(&g_prim_refs[dev], 1, __ATOMIC_ACQ_REL);
    if (left == 0) primary_gone(dev);
    else if (left < 0) __atomic_store_n(&g_prim_refs[dev], 0, __ATOMIC_RELEASE);
    return res;
}
EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    return primary_release(REAL(cuDevicePrimaryCtxRelease), dev);
}
EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return primary_release(REAL(cuDevicePrimaryCtxRelease_v2), dev);
}

static CUresult primary_reset(__typeof__(real_cuDevicePrimaryCtxReset_v2) f, CUdevice dev) {
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || dev < 0 || dev >= MAX_PRIMARY) return f(dev);
    forget_context_timings(__atomic_load_n(&g_prim_ctx[dev], __ATOMIC_ACQUIRE));
    CUresult res = f(dev);
    if (res == CUDA_SUCCESS && __atomic_load_n(&g_prim_refs[dev], __ATOMIC_ACQUIRE) > 0) primary_gone(dev);
    return res;
}
EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return primary_reset(REAL(cuDevicePrimaryCtxReset), dev); }
EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return primary_reset(REAL(cuDevicePrimaryCtxReset_v2), dev);
}

/* Charges a new context's overhead: the region row, -1 when nothing is charged, -2 when it does not fit. */
static int ctx_pre(CUdevice dev) {
    if (!g_vgpu.active || !g_vgpu.context_overhead) return -1;
    int r = ord2row(dev);
    if (r < 0) return -1;
    return vgpu_reserve(r, g_vgpu.context_overhead, ACCT_CONTEXT) ? -2 : r;
}
static CUresult ctx_post(int r, CUresult res, uint64_t key, int kind) {
    forget_current_context();   /* a created context becomes current */
    if (r < 0) return res;
    if (res != CUDA_SUCCESS) { vgpu_release(r, g_vgpu.context_overhead, ACCT_CONTEXT); return res; }
    rec_put(kind, key, r, g_vgpu.context_overhead, 0);
    return res;
}
#define CTX_CREATE(call, pc, dev) ({                                                              \
    vgpu_ensure_init();                                                                           \
    int r_ = ctx_pre(dev);                                                                        \
    CUresult res_ = r_ == -2 ? refuse(pc) : (call);                                               \
    r_ == -2 ? res_ : ctx_post(r_, res_, res_ == CUDA_SUCCESS && (pc) ? (uint64_t)(uintptr_t)*(pc) : 0, K_CTX); })

EXPORT CUresult cuCtxCreate(CUcontext *pc, unsigned int flags, CUdevice dev) {
    return CTX_CREATE(CALL(cuCtxCreate, pc, flags, dev), pc, dev);
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *pc, unsigned int flags, CUdevice dev) {
    return CTX_CREATE(CALL(cuCtxCreate_v2, pc, flags, dev), pc, dev);
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *pc, CUexecAffinityParam *p, int n, unsigned int flags, CUdevice dev) {
    return CTX_CREATE(CALL(cuCtxCreate_v3, pc, p, n, flags, dev), pc, dev);
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *pc, CUctxCreateParams *p, unsigned int flags, CUdevice dev) {
    return CTX_CREATE(CALL(cuCtxCreate_v4, pc, p, flags, dev), pc, dev);
}

static CUresult ctx_destroy(__typeof__(real_cuCtxDestroy_v2) f, CUcontext c) {
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (g_vgpu.active) forget_context_timings(c);
    CUresult res = f(c);
    __atomic_add_fetch(&g_ctx_gen, 1, __ATOMIC_RELAXED);
    if (res == CUDA_SUCCESS && g_vgpu.active) rec_release(K_CTX, (uint64_t)(uintptr_t)c, ACCT_CONTEXT);
    return res;
}
EXPORT CUresult cuCtxDestroy(CUcontext c) { return ctx_destroy(REAL(cuCtxDestroy), c); }
EXPORT CUresult cuCtxDestroy_v2(CUcontext c) { return ctx_destroy(REAL(cuCtxDestroy_v2), c); }

EXPORT CUresult cuCtxSetCurrent(CUcontext c) {
    forget_current_context();
    return CALL(cuCtxSetCurrent, c);
}
EXPORT CUresult cuCtxPushCurrent(CUcontext c) {
    forget_current_context();
    return CALL(cuCtxPushCurrent, c);
}
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext c) {
    forget_current_context();
    return CALL(cuCtxPushCurrent_v2, c);
}
EXPORT CUresult cuCtxPopCurrent(CUcontext *c) {
    forget_current_context();
    return CALL(cuCtxPopCurrent, c);
}
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *c) {
    forget_current_context();
    return CALL(cuCtxPopCurrent_v2, c);
}

/* green contexts (CUDA 12.4): a context on a subset of a device's SMs, charged like any context */
EXPORT CUresult cuGreenCtxCreate(CUgreenCtx *pc, CUdevResourceDesc desc, CUdevice dev, unsigned int flags) {
    return CTX_CREATE(CALL(cuGreenCtxCreate, pc, desc, dev, flags), pc, dev);
}
EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx c) {
    CUresult res = CALL(cuGreenCtxDestroy, c);
    __atomic_add_fetch(&g_ctx_gen, 1, __ATOMIC_RELAXED);
    if (res == CUDA_SUCCESS && g_vgpu.active) rec_release(K_CTX, (uint64_t)(uintptr_t)c, ACCT_CONTEXT);
    return res;
}
