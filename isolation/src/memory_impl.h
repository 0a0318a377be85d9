/*
 * memory_impl.h - device memory entry points, included by hooks.c.
 *
 * Every way a container can come to hold device memory is charged to the device it lives on, before the driver
 * is asked (reserve, then allocate; a failed call gives the charge back), and given back when it is freed:
 *   - allocations: cuMemAlloc (both ABIs), cuMemAllocPitch (both), cuMemAllocManaged, stream-ordered allocations,
 *     VMM physical memory (cuMemCreate), arrays (both descriptor ABIs) and mipmapped arrays;
 *   - graph memory nodes (cuGraphAddMemAllocNode, cuGraphAddNode of that type): charged when the node is added,
 *     given back with the graph (the driver keeps such memory for the graph's lifetime, reusing it across launches);
 *   - memory of other processes mapped in: IPC handles, VMM shareable handles, external memory (Vulkan, ...).  It is
 *     charged to the importer unless a process of this container exported it (already charged here once);
 *   - the context's own memory, when VGPU_CONTEXT_OVERHEAD says how much (context_impl.h).
 * Queries (cuMemGetInfo, cuDeviceTotalMem, both ABIs, and NVML in nvml_impl.h) report the limit as the total.
 */
static uint64_t alloc_granule(uint64_t size) {
    /* the driver maps large allocations in 2 MiB pages and sub-allocates small ones */
    if (size > (1ULL << 20)) return (size + (2ULL << 20) - 1) & ~((2ULL << 20) - 1);
    return (size + 511) & ~511ULL;
}

static CUresult charged_alloc(int row, uint64_t charge, CUresult r_call, uint64_t ptr, int kind) {
    if (r_call != CUDA_SUCCESS) { vgpu_release(row, charge, ACCT_DATA); return r_call; }
    rec_put(kind, ptr, row, charge, 0);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    __typeof__(real_cuMemAlloc_v2) f = REAL(cuMemAlloc_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !n) return f(p, n);
    int r = cur_row();
    if (r < 0) { VLOG(VLOG_DEBUG, "alloc: no current device, not accounted"); return f(p, n); }
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, n);
    return charged_alloc(r, c, res, res == CUDA_SUCCESS ? (uint64_t)*p : 0, K_PTR);
}

/* the CUDA 2 ABI: 32-bit device pointers and sizes */
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *p, unsigned int n) {
    __typeof__(real_cuMemAlloc) f = REAL(cuMemAlloc);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !n) return f(p, n);
    int r = cur_row();
    if (r < 0) return f(p, n);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, n);
    return charged_alloc(r, c, res, res == CUDA_SUCCESS ? (uint64_t)*p : 0, K_PTR);
}

static CUresult freed(CUresult res, uint64_t p) {
    if (res == CUDA_SUCCESS) rec_release(K_PTR, p, ACCT_DATA);
    return res;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    __typeof__(real_cuMemFree_v2) f = REAL(cuMemFree_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active)) return f(p);
    return freed(f(p), (uint64_t)p);
}
EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
    __typeof__(real_cuMemFree) f = REAL(cuMemFree);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active)) return f(p);
    return freed(f(p), (uint64_t)p);
}

/* Pitched allocations: reserved at the widest pitch the driver uses (512-byte rows), settled on the pitch the
 * driver returned.  `settle` is 0 when the final charge fits, else the allocation was freed and refused. */
static int pitch_settle(int r, uint64_t est, uint64_t ptr, uint64_t pitch, uint64_t h, void (*free_it)(uint64_t)) {
    uint64_t real_sz = alloc_granule(pitch * h);
    if (real_sz > est && vgpu_reserve(r, real_sz - est, ACCT_DATA)) {
        free_it(ptr);
        vgpu_release(r, est, ACCT_DATA);
        return -1;
    }
    if (real_sz < est) vgpu_release(r, est - real_sz, ACCT_DATA);
    rec_put(K_PTR, ptr, r, real_sz, 0);
    return 0;
}
static uint64_t pitch_estimate(uint64_t w, uint64_t h) { return alloc_granule(((w + 511) & ~511ULL) * h); }
static void free_v2(uint64_t p) { real_cuMemFree_v2((CUdeviceptr)p); }
static void free_v1(uint64_t p) { real_cuMemFree((CUdeviceptr_v1)p); }

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned int elem) {
    __typeof__(real_cuMemAllocPitch_v2) f = REAL(cuMemAllocPitch_v2);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !pitch) return f(p, pitch, w, h, elem);
    int r = cur_row();
    if (r < 0) return f(p, pitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h);
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, pitch, w, h, elem);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    return pitch_settle(r, est, (uint64_t)*p, *pitch, h, free_v2) ? refuse(p) : CUDA_SUCCESS;
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *p, unsigned int *pitch, unsigned int w, unsigned int h,
                                unsigned int elem) {
    __typeof__(real_cuMemAllocPitch) f = REAL(cuMemAllocPitch);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !pitch) return f(p, pitch, w, h, elem);
    int r = cur_row();
    if (r < 0) return f(p, pitch, w, h, elem);
    uint64_t est = pitch_estimate(w, h);
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, pitch, w, h, elem);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    return pitch_settle(r, est, (uint64_t)*p, *pitch, h, free_v1) ? refuse(p) : CUDA_SUCCESS;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned int flags) {
    __typeof__(real_cuMemAllocManaged) f = REAL(cuMemAllocManaged);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !g_vgpu.count_managed || !p || !n) return f(p, n, flags);
    int r = cur_row();
    if (r < 0) return f(p, n, flags);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, n, flags);
    return charged_alloc(r, c, res, res == CUDA_SUCCESS ? (uint64_t)*p : 0, K_PTR);
}

static int pool_row(CUmemoryPool pool) {
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_POOL, (uint64_t)(uintptr_t)pool);
    int r = e ? e->dev : -1;
    pthread_mutex_unlock(&g_map_mu);
    return r >= 0 ? r : cur_row();
}

static CUresult alloc_async(int ptsz, CUdeviceptr *p, size_t n, CUstream s) {
    __typeof__(real_cuMemAllocAsync) f = ptsz ? REAL(cuMemAllocAsync_ptsz) : REAL(cuMemAllocAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !n) return f(p, n, s);
    int r = cur_row();
    if (r < 0) return f(p, n, s);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, n, s);
    return charged_alloc(r, c, res, res == CUDA_SUCCESS ? (uint64_t)*p : 0, K_PTR);
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(0, p, n, s); }
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { return alloc_async(1, p, n, s); }

static CUresult alloc_pool(int ptsz, CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    __typeof__(real_cuMemAllocFromPoolAsync) f =
        ptsz ? REAL(cuMemAllocFromPoolAsync_ptsz) : REAL(cuMemAllocFromPoolAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !p || !n) return f(p, n, pool, s);
    int r = pool_row(pool);
    if (r < 0) return f(p, n, pool, s);
    uint64_t c = alloc_granule(n);
    if (vgpu_reserve(r, c, ACCT_DATA)) return refuse(p);
    CUresult res = f(p, n, pool, s);
    return charged_alloc(r, c, res, res == CUDA_SUCCESS ? (uint64_t)*p : 0, K_PTR);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return alloc_pool(0, p, n, pool, s);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    return alloc_pool(1, p, n, pool, s);
}

static CUresult free_async(int ptsz, CUdeviceptr p, CUstream s) {
    __typeof__(real_cuMemFreeAsync) f = ptsz ? REAL(cuMemFreeAsync_ptsz) : REAL(cuMemFreeAsync);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active)) return f(p, s);
    return freed(f(p, s), (uint64_t)p);
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return free_async(0, p, s); }
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return free_async(1, p, s); }

EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult res = CALL(cuMemPoolCreate, pool, props);
    if (res == CUDA_SUCCESS && g_vgpu.active && props && props->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        rec_put(K_POOL, (uint64_t)(uintptr_t)*pool, ord2row(props->location.id), 0, 0);
    return res;
}

/* ---- VMM: a physical handle is charged once at cuMemCreate and given back when its last reference (the handle
 * itself, retains, mappings) is gone, which is when the driver frees it too.  An imported handle (another
 * process's memory) is charged per mapping instead: its size is only known when it is mapped. */
enum { HANDLE_OWN = 0, HANDLE_IMPORTED = 1, HANDLE_IMPORTED_FREE = 2 };

static void handle_unref(uint64_t h) {
    int r = -1;
    uint64_t size = 0, drop = 0;
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_HANDLE, h);
    if (e && --e->aux == 0) { r = e->dev; size = e->size; drop = 1; vmap_del(&g_map, e); }
    pthread_mutex_unlock(&g_map_mu);
    if (drop && size) vgpu_release(r, size, ACCT_DATA);
}
/* Adds a reference; returns the handle's import state, -1 when we do not know the handle. */
static int handle_ref(uint64_t h) {
    int state = -1;
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_find(&g_map, K_HANDLE, h);
    if (e) { e->aux++; state = e->dev < 0 ? (int)-e->dev - 1 : HANDLE_OWN; }
    pthread_mutex_unlock(&g_map_mu);
    return state;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                            unsigned long long flags) {
    __typeof__(real_cuMemCreate) f = REAL(cuMemCreate);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !h || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return f(h, size, prop, flags);
    int r = ord2row(prop->location.id);
    if (r < 0) return f(h, size, prop, flags);
    if (vgpu_reserve(r, size, ACCT_DATA)) return refuse(h);
    CUresult res = f(h, size, prop, flags);
    if (res != CUDA_SUCCESS) { vgpu_release(r, size, ACCT_DATA); return res; }
    rec_put(K_HANDLE, (uint64_t)*h, r, size, 1);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    CUresult res = CALL(cuMemRelease, h);
    if (res == CUDA_SUCCESS && g_vgpu.active) handle_unref((uint64_t)h);
    return res;
}

/* The region row an imported handle's memory lives on. */
static int handle_row(CUmemGenericAllocationHandle h) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    if (!real_cuMemGetAllocationPropertiesFromHandle ||
        real_cuMemGetAllocationPropertiesFromHandle(&prop, h) != CUDA_SUCCESS ||
        prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return cur_row();
    return ord2row(prop.location.id);
}

EXPORT CUresult cuMemMap(CUdeviceptr p, size_t size, size_t off, CUmemGenericAllocationHandle h,
                         unsigned long long flags) {
    __typeof__(real_cuMemMap) f = REAL(cuMemMap);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active)) return f(p, size, off, h, flags);
    int state = handle_ref((uint64_t)h);
    int r = -1;
    if (state == HANDLE_IMPORTED) {
        r = handle_row(h);
        if (r >= 0 && vgpu_reserve(r, size, ACCT_DATA)) { handle_unref((uint64_t)h); return OOM; }
    }
    CUresult res = f(p, size, off, h, flags);
    if (res != CUDA_SUCCESS) {
        if (r >= 0) vgpu_release(r, size, ACCT_DATA);
        if (state >= 0) handle_unref((uint64_t)h);
        return res;
    }
    if (state >= 0) rec_put(K_MAPPING, (uint64_t)p, -1, size, (uint64_t)h);
    if (r >= 0) rec_put(K_IMPORT, (uint64_t)p, r, size, 0);
    return res;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t size) {
    CUresult res = CALL(cuMemUnmap, p, size);
    uint64_t h;
    if (res != CUDA_SUCCESS || !g_vgpu.active) return res;
    rec_release(K_IMPORT, (uint64_t)p, ACCT_DATA);
    if (rec_take(K_MAPPING, (uint64_t)p, NULL, NULL, &h)) handle_unref(h);
    return res;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr) {
    CUresult res = CALL(cuMemRetainAllocationHandle, h, addr);
    if (res == CUDA_SUCCESS && g_vgpu.active && h) handle_ref((uint64_t)*h);
    return res;
}

/* ---- memory shared between processes */
static uint64_t hash_bytes(uint64_t seed, const void *data, size_t n) {
    const unsigned char *b = data;
    uint64_t h = 1469598103934665603ULL ^ seed;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h ? h : 1;
}
/* What identifies an exported file descriptor in any process it is passed to: the file it refers to. */
static uint64_t fd_identity(int fd) {
    struct stat st;
    if (fstat(fd, &st)) return 0;
    uint64_t id[2] = {(uint64_t)st.st_dev, (uint64_t)st.st_ino};
    return hash_bytes(2, id, sizeof id);
}

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
    CUresult res = CALL(cuIpcGetMemHandle, h, p);
    if (res == CUDA_SUCCESS && g_vgpu.active && h) vgpu_note_export(hash_bytes(1, h->reserved, sizeof h->reserved));
    return res;
}

static CUresult ipc_open(__typeof__(real_cuIpcOpenMemHandle_v2) f, CUdeviceptr *p, CUipcMemHandle h,
                         unsigned int flags) {
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    CUresult res = f(p, h, flags);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !p || vgpu_exported(hash_bytes(1, h.reserved, sizeof h.reserved)))
        return res;
    CUdeviceptr base = 0;
    size_t size = 0;
    int r = cur_row();
    if (r < 0 || !real_cuMemGetAddressRange_v2 || real_cuMemGetAddressRange_v2(&base, &size, *p) != CUDA_SUCCESS)
        return res;
    if (vgpu_reserve(r, size, ACCT_DATA)) {
        if (real_cuIpcCloseMemHandle) real_cuIpcCloseMemHandle(*p);
        return refuse(p);
    }
    rec_put(K_IPC, (uint64_t)*p, r, size, 0);
    return res;
}
EXPORT CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open(REAL(cuIpcOpenMemHandle), p, h, flags);
}
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
    return ipc_open(REAL(cuIpcOpenMemHandle_v2), p, h, flags);
}
EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
    CUresult res = CALL(cuIpcCloseMemHandle, p);
    if (res == CUDA_SUCCESS && g_vgpu.active) rec_release(K_IPC, (uint64_t)p, ACCT_DATA);
    return res;
}

EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType type,
                                             unsigned long long flags) {
    CUresult res = CALL(cuMemExportToShareableHandle, out, h, type, flags);
    if (res == CUDA_SUCCESS && g_vgpu.active && out && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        vgpu_note_export(fd_identity(*(int *)out));
    return res;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                               CUmemAllocationHandleType type) {
    CUresult res = CALL(cuMemImportFromShareableHandle, h, os_handle, type);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !h) return res;
    int ours = type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
               vgpu_exported(fd_identity((int)(intptr_t)os_handle));
    /* dev < 0 marks an imported handle: -1 - state */
    rec_put(K_HANDLE, (uint64_t)*h, -1 - (ours ? HANDLE_IMPORTED_FREE : HANDLE_IMPORTED), 0, 1);
    return res;
}

EXPORT CUresult cuImportExternalMemory(CUexternalMemory *m, const CUDA_EXTERNAL_MEMORY_HANDLE_DESC *desc) {
    __typeof__(real_cuImportExternalMemory) f = REAL(cuImportExternalMemory);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !m || !desc || !desc->size) return f(m, desc);
    int r = cur_row();
    if (r < 0) return f(m, desc);
    if (vgpu_reserve(r, desc->size, ACCT_DATA)) return refuse(m);
    CUresult res = f(m, desc);
    if (res != CUDA_SUCCESS) { vgpu_release(r, desc->size, ACCT_DATA); return res; }
    rec_put(K_EXTMEM, (uint64_t)(uintptr_t)*m, r, desc->size, 0);
    return res;
}
EXPORT CUresult cuDestroyExternalMemory(CUexternalMemory m) {
    CUresult res = CALL(cuDestroyExternalMemory, m);
    if (res == CUDA_SUCCESS && g_vgpu.active) rec_release(K_EXTMEM, (uint64_t)(uintptr_t)m, ACCT_DATA);
    return res;
}

/* ---- graph memory nodes: charged per graph and device, given back with the graph */
static int graph_mem_reserve(const CUmemPoolProps *pool, size_t bytes, uint64_t *charge) {
    *charge = 0;
    if (!g_vgpu.active || !pool || pool->location.type != CU_MEM_LOCATION_TYPE_DEVICE || !bytes) return -1;
    int r = ord2row(pool->location.id);
    if (r < 0) return -1;
    *charge = alloc_granule(bytes);
    return vgpu_reserve(r, *charge, ACCT_DATA) ? -2 : r;
}
static CUresult graph_mem_added(int r, uint64_t charge, CUresult res, CUgraph g) {
    if (r < 0) return res;
    if (res != CUDA_SUCCESS) { vgpu_release(r, charge, ACCT_DATA); return res; }
    pthread_mutex_lock(&g_map_mu);
    vmap_entry_t *e = vmap_put(&g_map, (uint32_t)(K_GRAPHMEM + r), (uint64_t)(uintptr_t)g);
    if (e) { e->dev = r; e->size += charge; }
    pthread_mutex_unlock(&g_map_mu);
    return res;
}

EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                                       CUDA_MEM_ALLOC_NODE_PARAMS *params) {
    uint64_t charge;
    vgpu_ensure_init();
    int r = graph_mem_reserve(params ? &params->poolProps : NULL, params ? params->bytesize : 0, &charge);
    if (r == -2) return OOM;
    return graph_mem_added(r, charge, CALL(cuGraphAddMemAllocNode, node, g, deps, n, params), g);
}

static int node_mem_reserve(const CUgraphNodeParams *p, uint64_t *charge) {
    *charge = 0;
    if (!p || p->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return -1;
    return graph_mem_reserve(&p->alloc.poolProps, p->alloc.bytesize, charge);
}
EXPORT CUresult cuGraphAddNode(CUgraphNode *node, CUgraph g, const CUgraphNode *deps, size_t n,
                               CUgraphNodeParams *params) {
    uint64_t charge;
    vgpu_ensure_init();
    int r = node_mem_reserve(params, &charge);
    if (r == -2) return OOM;
    return graph_mem_added(r, charge, CALL(cuGraphAddNode, node, g, deps, n, params), g);
}
EXPORT CUresult cuGraphAddNode_v2(CUgraphNode *node, CUgraph g, const CUgraphNode *deps,
                                  const CUgraphEdgeData *edges, size_t n, CUgraphNodeParams *params) {
    uint64_t charge;
    vgpu_ensure_init();
    int r = node_mem_reserve(params, &charge);
    if (r == -2) return OOM;
    return graph_mem_added(r, charge, CALL(cuGraphAddNode_v2, node, g, deps, edges, n, params), g);
}

EXPORT CUresult cuGraphDestroy(CUgraph g) {
    CUresult res = CALL(cuGraphDestroy, g);
    if (res == CUDA_SUCCESS && g_vgpu.active)
        for (int r = 0; r < VGPU_MAX_DEVICES; r++) rec_release(K_GRAPHMEM + r, (uint64_t)(uintptr_t)g, ACCT_DATA);
    return res;
}

/* ---- arrays: reserve an estimate from the descriptor, then settle on the driver's memory requirements */
static uint64_t fmt_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8: case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16: case CU_AD_FORMAT_SIGNED_INT16: case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32: case CU_AD_FORMAT_SIGNED_INT32: case CU_AD_FORMAT_FLOAT: return 4;
    default: return 4;
    }
}
static uint64_t array_est(uint64_t w, uint64_t h, uint64_t d, CUarray_format f, unsigned ch) {
    return w * fmt_bytes(f) * (ch ? ch : 1) * (h ? h : 1) * (d ? d : 1);
}

static CUresult settle_array(int r, uint64_t est, void *handle, int mip) {
    CUDA_ARRAY_MEMORY_REQUIREMENTS req;
    uint64_t real_sz = est;
    CUdevice dev = 0;
    if (real_cuCtxGetDevice) real_cuCtxGetDevice(&dev);
    CUresult q = mip ? (real_cuMipmappedArrayGetMemoryRequirements
                            ? real_cuMipmappedArrayGetMemoryRequirements(&req, (CUmipmappedArray)handle, dev)
                            : CUDA_ERROR_NOT_FOUND)
                     : (real_cuArrayGetMemoryRequirements
                            ? real_cuArrayGetMemoryRequirements(&req, (CUarray)handle, dev)
                            : CUDA_ERROR_NOT_FOUND);
    if (q == CUDA_SUCCESS && req.size) real_sz = req.size;
    if (real_sz > est && vgpu_reserve(r, real_sz - est, ACCT_DATA)) {
        vgpu_release(r, est, ACCT_DATA);
        return OOM;
    }
    if (real_sz < est) vgpu_release(r, est - real_sz, ACCT_DATA);
    rec_put(K_ARRAY, (uint64_t)(uintptr_t)handle, r, real_sz, 0);
    return CUDA_SUCCESS;
}

/* Creates an array through `create` (any descriptor ABI) charged `est` up front. */
#define ARRAY_CREATE(fn, a, d, est_expr) ({                                                       \
    __typeof__(real_##fn) f_ = REAL(fn);                                                          \
    CUresult res_;                                                                                \
    int r_;                                                                                       \
    if (UNLIKELY(!f_)) res_ = CUDA_ERROR_NOT_FOUND;                                               \
    else if (LIKELY(!g_vgpu.active) || !(a) || !(d) || (r_ = cur_row()) < 0) res_ = f_(a, d);        \
    else {                                                                                        \
        uint64_t est_ = (est_expr);                                                               \
        if (vgpu_reserve(r_, est_, ACCT_DATA)) res_ = refuse(a);                                  \
        else if ((res_ = f_(a, d)) != CUDA_SUCCESS) vgpu_release(r_, est_, ACCT_DATA);            \
        else if ((res_ = settle_array(r_, est_, *(a), 0)) != CUDA_SUCCESS) {                      \
            real_cuArrayDestroy(*(a));                                                            \
            *(a) = NULL;                                                                          \
        }                                                                                         \
    }                                                                                             \
    res_; })

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    return ARRAY_CREATE(cuArrayCreate_v2, a, d, array_est(d->Width, d->Height, 1, d->Format, d->NumChannels));
}
EXPORT CUresult cuArrayCreate(CUarray *a, const CUDA_ARRAY_DESCRIPTOR_v1 *d) {
    return ARRAY_CREATE(cuArrayCreate, a, d, array_est(d->Width, d->Height, 1, d->Format, d->NumChannels));
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    return ARRAY_CREATE(cuArray3DCreate_v2, a, d, array_est(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}
EXPORT CUresult cuArray3DCreate(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR_v1 *d) {
    return ARRAY_CREATE(cuArray3DCreate, a, d, array_est(d->Width, d->Height, d->Depth, d->Format, d->NumChannels));
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels) {
    __typeof__(real_cuMipmappedArrayCreate) f = REAL(cuMipmappedArrayCreate);
    if (UNLIKELY(!f)) return CUDA_ERROR_NOT_FOUND;
    if (LIKELY(!g_vgpu.active) || !a || !d) return f(a, d, levels);
    int r = cur_row();
    if (r < 0) return f(a, d, levels);
    uint64_t est = 0, w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < levels; l++) {
        est += array_est(w ? w : 1, h, z, d->Format, d->NumChannels);
        w = w > 1 ? w / 2 : 1; h = h > 1 ? h / 2 : h; z = z > 1 ? z / 2 : z;
    }
    if (vgpu_reserve(r, est, ACCT_DATA)) return refuse(a);
    CUresult res = f(a, d, levels);
    if (res != CUDA_SUCCESS) { vgpu_release(r, est, ACCT_DATA); return res; }
    res = settle_array(r, est, *a, 1);
    if (res != CUDA_SUCCESS) { real_cuMipmappedArrayDestroy(*a); *a = NULL; }
    return res;
}

static CUresult destroy_array(CUresult res, void *a) {
    if (res == CUDA_SUCCESS && g_vgpu.active) rec_release(K_ARRAY, (uint64_t)(uintptr_t)a, ACCT_DATA);
    return res;
}
EXPORT CUresult cuArrayDestroy(CUarray a) { return destroy_array(CALL(cuArrayDestroy, a), a); }
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    return destroy_array(CALL(cuMipmappedArrayDestroy, a), a);
}

/* ---- memory queries: the limit is the total */
static void clamp_info(int r, uint64_t *fr, uint64_t *tot) {
    uint64_t lim = vgpu_limit(r);
    if (!lim) return;
    uint64_t total = lim < *tot ? lim : *tot;
    uint64_t used = vgpu_used(r);
    uint64_t f = total > used ? total - used : 0;
    if (f > *fr) f = *fr;
    *tot = total;
    *fr = f;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *fr, size_t *tot) {
    CUresult res = CALL(cuMemGetInfo_v2, fr, tot);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !fr || !tot) return res;
    int r = cur_row();
    uint64_t f = *fr, t = *tot;
    if (r >= 0) clamp_info(r, &f, &t);
    *fr = f;
    *tot = t;
    return res;
}
EXPORT CUresult cuMemGetInfo(unsigned int *fr, unsigned int *tot) {
    CUresult res = CALL(cuMemGetInfo, fr, tot);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !fr || !tot) return res;
    int r = cur_row();
    uint64_t f = *fr, t = *tot;
    if (r >= 0) clamp_info(r, &f, &t);
    *fr = (unsigned int)f;
    *tot = (unsigned int)t;
    return res;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    CUresult res = CALL(cuDeviceTotalMem_v2, bytes, dev);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !bytes) return res;
    uint64_t lim = vgpu_limit(ord2row(dev));
    if (lim && lim < *bytes) *bytes = lim;
    return res;
}
EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    CUresult res = CALL(cuDeviceTotalMem, bytes, dev);
    if (res != CUDA_SUCCESS || !g_vgpu.active || !bytes) return res;
    uint64_t lim = vgpu_limit(ord2row(dev));
    if (lim && lim < *bytes) *bytes = (unsigned int)lim;
    return res;
}
