/*
 * env.c - configuration of libvgpu.so from the environment (the variables of the wire contract).
 */
#include "vgpu_internal.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

int vgpu_log_level = 2;

void vgpu_log(int level, const char *fmt, ...) {
    static const char *names[] = {"ERROR", "ERROR", "WARN", "INFO", "DEBUG"};
    char buf[512];
    int n = snprintf(buf, sizeof buf, "[vgpu %s pid=%d] ", names[level < 0 ? 0 : level > 4 ? 4 : level], (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(buf + n, sizeof buf - (size_t)n - 2, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof buf - 2) n = (int)sizeof buf - 2;
    buf[n++] = '\n';
    ssize_t w = write(2, buf, (size_t)n);
    (void)w;
}

/*
 * Sizes: decimal digits, then an optional binary suffix: k|m|g|t (any case), Ki|Mi|Gi|Ti, KB|MB|GB|TB, KiB|MiB|
 * GiB|TiB.  Surrounding blanks are ignored.  Returns 0 on success, -1 on anything else (empty, sign, hex, junk,
 * overflow).
 */
int vgpu_parse_size(const char *s, uint64_t *out) {
    if (!s) return -1;
    while (isspace((unsigned char)*s)) s++;
    if (!isdigit((unsigned char)*s)) return -1;
    uint64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
        s++;
    }
    char suf[8] = {0};
    size_t n = 0;
    while (*s && !isspace((unsigned char)*s)) {
        if (n >= sizeof suf - 1) return -1;
        suf[n++] = *s++;
    }
    while (isspace((unsigned char)*s)) s++;
    if (*s) return -1;
    unsigned shift = 0;
    if (n) {
        switch (tolower((unsigned char)suf[0])) {
        case 'k': shift = 10; break;
        case 'm': shift = 20; break;
        case 'g': shift = 30; break;
        case 't': shift = 40; break;
        default: return -1;
        }
        const char *rest = suf + 1;
        if (*rest && strcmp(rest, "i") && strcmp(rest, "B") && strcmp(rest, "iB") && strcmp(rest, "b") &&
            strcmp(rest, "ib"))
            return -1;
    }
    if (shift && v > (UINT64_MAX >> shift)) return -1;
    *out = v << shift;
    return 0;
}

/* A percentage 0..100, decimal only. */
int vgpu_parse_percent(const char *s, int *out) {
    uint64_t v;
    if (!s) return -1;
    const char *p = s;
    while (isspace((unsigned char)*p)) p++;
    for (const char *q = p; *q && !isspace((unsigned char)*q); q++)
        if (!isdigit((unsigned char)*q)) return -1;
    if (vgpu_parse_size(s, &v) || v > 100) return -1;
    *out = (int)v;
    return 0;
}

/*
 * The limits file.  The device plugin writes every variable of the contract it hands a container (limits, UUIDs,
 * switches) also into a file it mounts read-only at VGPU_LIMITS_PATH.  Where that file exists, those variables are
 * read from it alone and the environment is not consulted for them: the pod can set the environment by env, envFrom,
 * a shell prefix or setenv, but it cannot change a read-only mount.  VGPU_LIMITS_FILE names another file, and counts
 * only where VGPU_LIMITS_PATH does not exist (tests; containers set up by HAMi's plugin, which mounts none, read the
 * environment as before).  A file that exists but cannot be read or parsed is a configuration error: CUDA and NVML
 * are then refused, never run with limits from elsewhere.
 */
#define VGPU_LIMITS_PATH "/usr/local/vgpu/limits.env"
#define LIMITS_MAX_ENTRIES 128
#define LIMITS_MAX_BYTES 65536

static struct {
    char name[64];
    char value[512];
} limit_entries[LIMITS_MAX_ENTRIES];
static int limit_count;
static int limits_from_file;   /* 1: variables come from the file; 0: from the environment */
static pthread_once_t limits_once = PTHREAD_ONCE_INIT;

static void limits_broken(const char *path, const char *what) {
    VLOG(VLOG_ERROR, "the limits file %s %s: limits are configured but cannot be read", path, what);
    g_vgpu.config_error = 1;
    limits_from_file = 1;   /* and no variable comes from the environment instead */
    limit_count = 0;
}

static void load_limits(void) {
    const char *path = VGPU_LIMITS_PATH;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) {
        const char *other = getenv("VGPU_LIMITS_FILE");
        if (!other || !*other) return;
        path = other;
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    }
    if (fd < 0) {
        limits_broken(path, strerror(errno));
        return;
    }
    static char text[LIMITS_MAX_BYTES + 1];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, text + len, LIMITS_MAX_BYTES + 1 - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            close(fd);
            limits_broken(path, strerror(errno));
            return;
        }
        if (n == 0) break;
        len += (size_t)n;
        if (len > LIMITS_MAX_BYTES) {
            close(fd);
            limits_broken(path, "is larger than any the device plugin writes");
            return;
        }
    }
    close(fd);
    text[len] = 0;
    limits_from_file = 1;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        size_t name_len = eq ? (size_t)(eq - line) : 0;
        if (!eq || !name_len || name_len >= sizeof limit_entries[0].name ||
            strlen(eq + 1) >= sizeof limit_entries[0].value || limit_count >= LIMITS_MAX_ENTRIES) {
            limits_broken(path, "has a line that is not NAME=VALUE");
            return;
        }
        memcpy(limit_entries[limit_count].name, line, name_len);
        limit_entries[limit_count].name[name_len] = 0;
        snprintf(limit_entries[limit_count].value, sizeof limit_entries[0].value, "%s", eq + 1);
        limit_count++;
    }
}

const char *vgpu_config(const char *name) {
    pthread_once(&limits_once, load_limits);
    if (!limits_from_file) return getenv(name);
    for (int i = 0; i < limit_count; i++)
        if (!strcmp(limit_entries[i].name, name)) return limit_entries[i].value;
    return NULL;
}

static void read_mem(const char *name, uint64_t *dst) {
    const char *s = vgpu_config(name);
    if (!s || !*s) return;
    uint64_t v;
    if (vgpu_parse_size(s, &v)) {
        VLOG(VLOG_ERROR, "invalid %s=\"%s\": expected bytes with an optional suffix k, m, g, Ki, Mi, Gi", name, s);
        g_vgpu.config_error = 1;
        return;
    }
    *dst = v;
}

static void read_sm(const char *name, int *dst) {
    const char *s = vgpu_config(name);
    if (!s || !*s) return;
    int v;
    if (vgpu_parse_percent(s, &v)) {
        VLOG(VLOG_ERROR, "invalid %s=\"%s\": expected an integer percentage 0..100", name, s);
        g_vgpu.config_error = 1;
        return;
    }
    *dst = v;
}

/*
 * The GPUs the limits' positions refer to: CUDA_DEVICE_MEMORY_LIMIT_<i> and CUDA_DEVICE_SM_LIMIT_<i> belong to the
 * i-th UUID of VGPU_DEVICE_UUIDS, else of NVIDIA_VISIBLE_DEVICES when that lists UUIDs (the device plugin writes
 * both in grant order).  CUDA numbers devices its own way (fastest first, then by PCI bus), so positions are
 * matched to devices by UUID.  Anything else (indexes, "all", MIG names) leaves grant_count 0: limits then apply
 * by CUDA ordinal.
 */
static void read_grant_uuids(void) {
    const char *list = vgpu_config("VGPU_DEVICE_UUIDS");
    if (!list || !*list) list = vgpu_config("NVIDIA_VISIBLE_DEVICES");
    g_vgpu.grant_count = 0;
    if (!list || !*list) return;
    char buf[VGPU_MAX_DEVICES * VGPU_UUID_LEN];
    snprintf(buf, sizeof buf, "%s", list);
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok)) tok++;
        size_t len = strlen(tok);
        while (len && isspace((unsigned char)tok[len - 1])) tok[--len] = 0;
        if (strncasecmp(tok, "GPU-", 4) || len >= VGPU_UUID_LEN || n >= VGPU_MAX_DEVICES) return;
        snprintf(g_vgpu.grant_uuid[n++], VGPU_UUID_LEN, "%s", tok);
    }
    g_vgpu.grant_count = n;
}

void vgpu_read_env(void) {
    const char *lvl = getenv("LIBCUDA_LOG_LEVEL");
    if (lvl && *lvl) vgpu_log_level = atoi(lvl);

    uint64_t all = 0;
    read_mem("CUDA_DEVICE_MEMORY_LIMIT", &all);
    int sm_all = 0;
    read_sm("CUDA_DEVICE_SM_LIMIT", &sm_all);
    int any = 0;
    for (int i = 0; i < VGPU_MAX_DEVICES; i++) {
        char name[64];
        uint64_t m = 0;
        snprintf(name, sizeof name, "CUDA_DEVICE_MEMORY_LIMIT_%d", i);
        read_mem(name, &m);
        g_vgpu.mem_limit[i] = m ? m : all;
        int sm = 0;
        snprintf(name, sizeof name, "CUDA_DEVICE_SM_LIMIT_%d", i);
        read_sm(name, &sm);
        sm = sm ? sm : sm_all;
        g_vgpu.sm_limit[i] = (sm <= 0 || sm >= 100) ? 0 : sm;   /* 0 = not limited */
        if (g_vgpu.mem_limit[i] || g_vgpu.sm_limit[i]) any = 1;
        if (g_vgpu.sm_limit[i]) g_vgpu.sm_configured = 1;
    }
    read_grant_uuids();
    const char *pol = vgpu_config("GPU_CORE_UTILIZATION_POLICY");
    g_vgpu.policy = POLICY_DEFAULT;
    if (pol && *pol) {
        if (!strcasecmp(pol, "force")) g_vgpu.policy = POLICY_FORCE;
        else if (!strcasecmp(pol, "disable")) g_vgpu.policy = POLICY_DISABLE;
        else if (strcasecmp(pol, "default")) {
            VLOG(VLOG_ERROR, "invalid GPU_CORE_UTILIZATION_POLICY=\"%s\": expected default, force or disable", pol);
            g_vgpu.config_error = 1;
        }
    }
    g_vgpu.context_overhead = 0;
    read_mem("VGPU_CONTEXT_OVERHEAD", &g_vgpu.context_overhead);
    const char *fo = vgpu_config("VGPU_ISOLATION_FAIL_OPEN");
    g_vgpu.fail_open = fo && !strcmp(fo, "1");
    const char *cm = vgpu_config("VGPU_COUNT_MANAGED");
    g_vgpu.count_managed = !(cm && (!strcmp(cm, "0") || !strcasecmp(cm, "false")));
    g_vgpu.active = any && !g_vgpu.config_error;
}
