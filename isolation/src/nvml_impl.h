/*
 * nvml_impl.h - NVML entry points, included by hooks.c: initialisation fails with the configuration, and the
 * memory queries report the limit of the device (matched by UUID) as its total.
 */
#define NVML_REAL(fn) (load_nvml(), vgpu_ensure_init(), real_##fn)

EXPORT nvmlReturn_t nvmlInit(void) {
    __typeof__(real_nvmlInit) f = NVML_REAL(nvmlInit);
    if (g_vgpu.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f() : NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlInit_v2(void) {
    __typeof__(real_nvmlInit_v2) f = NVML_REAL(nvmlInit_v2);
    if (g_vgpu.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f() : NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    __typeof__(real_nvmlInitWithFlags) f = NVML_REAL(nvmlInitWithFlags);
    if (g_vgpu.config_error) return NVML_ERROR_UNKNOWN;
    return f ? f(flags) : NVML_ERROR_LIBRARY_NOT_FOUND;
}

static int nvml_row(nvmlDevice_t h) {
    char uuid[VGPU_UUID_LEN];
    if (!real_nvmlDeviceGetUUID || real_nvmlDeviceGetUUID(h, uuid, sizeof uuid) != NVML_SUCCESS) return -1;
    return vgpu_row_for_uuid(uuid);
}

static void nvml_clamp(nvmlDevice_t h, unsigned long long *total, unsigned long long *fr, unsigned long long *used) {
    int r = nvml_row(h);
    uint64_t lim = vgpu_limit(r);
    if (r < 0 || !lim) return;
    uint64_t u = vgpu_used(r);
    uint64_t t = lim < *total ? lim : *total;
    uint64_t f = t > u ? t - u : 0;
    if (f > *fr) f = *fr;
    *total = t;
    *fr = f;
    *used = u;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
    __typeof__(real_nvmlDeviceGetMemoryInfo) f = NVML_REAL(nvmlDeviceGetMemoryInfo);
    if (!f) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t res = f(h, m);
    if (res == NVML_SUCCESS && g_vgpu.active && m) nvml_clamp(h, &m->total, &m->free, &m->used);
    return res;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
    __typeof__(real_nvmlDeviceGetMemoryInfo_v2) f = NVML_REAL(nvmlDeviceGetMemoryInfo_v2);
    if (!f) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t res = f(h, m);
    if (res == NVML_SUCCESS && g_vgpu.active && m) nvml_clamp(h, &m->total, &m->free, &m->used);
    return res;
}
