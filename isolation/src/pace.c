/*
 * pace.c - the node's correction of the compute limiter's timings.
 *
 * On a GPU that time-slices between contexts, the pair of events around a launch also reads the slices other
 * contexts ran while the launch was preempted, so the limiter charges a container more than its launches cost and
 * it gets less than its limit (docs/isolation.md).  The node's device plugin sees what each pod's processes really
 * ran (NVML's per-process utilization, from the driver) beside what this library charged them (the accounting file),
 * and publishes per GPU the factor the timings are to be multiplied by, in a file it mounts read-only into the
 * container at VGPU_PACE_PATH: one line `UUID FACTOR` per GPU.  The file is read once a second (the limiter calls
 * vgpu_pace_refresh); a factor counts only while the file is fresh (rewritten within VGPU_PACE_STALE_S) and is
 * held within [VGPU_PACE_MIN, VGPU_PACE_MAX].  Without a fresh file the factor is 1, the uncorrected timing, which
 * errs towards less GPU time than the limit, never more.  VGPU_PACE_FILE names another file, and counts only where
 * no limits file is mounted (see env.c): a pod that can set its environment cannot point the library at its own.
 */
#include "vgpu_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define VGPU_PACE_PATH "/usr/local/vgpu/pace/factors"
#define VGPU_LIMITS_MOUNT "/usr/local/vgpu/limits.env"
#define VGPU_PACE_STALE_S 10
#define VGPU_PACE_MIN 0.2
#define VGPU_PACE_MAX 2.0
#define VGPU_PACE_MAX_BYTES 4096

static double g_pace[VGPU_MAX_DEVICES];   /* by region row; 0: no factor */

static const char *pace_path(void) {
    static const char *path;
    if (!path) {
        const char *other = getenv("VGPU_PACE_FILE");
        path = access(VGPU_LIMITS_MOUNT, F_OK) != 0 && other && *other ? other : VGPU_PACE_PATH;
    }
    return path;
}

/* The region row of a GPU, without adding one: a GPU this container has no row for runs none of its launches. */
static int known_row(const char *uuid) {
    int n = (int)__atomic_load_n(&g_vgpu.region->device_num, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n && i < VGPU_MAX_DEVICES; i++)
        if (!strncasecmp(g_vgpu.region->uuids[i], uuid, VGPU_UUID_LEN)) return i;
    return -1;
}

static void pace_clear(void) {
    for (int r = 0; r < VGPU_MAX_DEVICES; r++) g_pace[r] = 0;
}

void vgpu_pace_refresh(uint64_t now_sec) {
    if (!g_vgpu.region) return;
    struct stat sb;
    /* read afresh each time (a small file, once a second): a GPU may have got its row since the last reading */
    int fd = open(pace_path(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
        (uint64_t)sb.st_mtim.tv_sec + VGPU_PACE_STALE_S < now_sec) {
        if (fd >= 0) close(fd);
        pace_clear();
        return;
    }
    char text[VGPU_PACE_MAX_BYTES + 1];
    ssize_t got;
    do got = read(fd, text, VGPU_PACE_MAX_BYTES); while (got < 0 && errno == EINTR);
    close(fd);
    if (got < 0) return;
    text[got] = 0;
    pace_clear();
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char uuid[VGPU_UUID_LEN];
        double factor = 0;
        if (sscanf(line, "%95s %lf", uuid, &factor) != 2 || !(factor == factor)) continue;   /* not a line of ours */
        int row = known_row(uuid);
        if (row < 0) continue;
        g_pace[row] = factor < VGPU_PACE_MIN ? VGPU_PACE_MIN : factor > VGPU_PACE_MAX ? VGPU_PACE_MAX : factor;
    }
}

double vgpu_pace(int row) {
    double f = row >= 0 && row < VGPU_MAX_DEVICES ? g_pace[row] : 0;
    return f > 0 ? f : 1.0;
}
