/*
 * kerneltime.h - how long a simulated kernel runs.  TEST INFRASTRUCTURE.
 *
 * A kernel's duration is drawn when it is launched and is not a function of anything the caller passes, unless
 * the function says so.  A module image that starts with the line "simgpu-module" describes its functions, one
 * per line:
 *
 *     NAME DIST ARGS... [drift PERIOD AMPLITUDE] [phase PERIOD FACTOR]
 *
 *   fixed T               always T
 *   perblock T            T per thread block of the grid (duration proportional to the grid)
 *   lognormal MEAN CV     log-normal with that mean and coefficient of variation
 *   uniform LO HI         uniform in [LO, HI]
 *   bimodal SHORT LONG P  SHORT or LONG (each log-normal with CV 0.3), LONG with probability P
 *   drift                 the mean is scaled by 1 + AMPLITUDE * sin(2 pi t / PERIOD) (t: CLOCK_MONOTONIC)
 *   phase                 the mean is scaled by FACTOR during every other PERIOD
 *
 * Times take a unit: ns, us, ms or s.  Functions not described (and any function of any other image) keep the
 * old fixed-cost model: a name ending in _N costs N ns per block, "sleep" runs for the uint64 its first kernel
 * parameter points to, anything else 1000 ns per block.
 */
#ifndef KERNELTIME_H
#define KERNELTIME_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { KT_PERBLOCK, KT_FIXED, KT_LOGNORMAL, KT_UNIFORM, KT_BIMODAL, KT_PARAM };

typedef struct {
    char name[64];
    int dist;
    double a, b, c;               /* parameters of the distribution, ns or plain numbers */
    double drift_period, drift_amp, phase_period, phase_factor;
} kt_func_t;

static double kt_time(const char *tok) {
    char *end = NULL;
    double v = strtod(tok, &end);
    if (!end || !strcmp(end, "ns") || !*end) return v;
    if (!strcmp(end, "us")) return v * 1e3;
    if (!strcmp(end, "ms")) return v * 1e6;
    if (!strcmp(end, "s")) return v * 1e9;
    return v;
}

/* Fills `f` from the description of `name` in a module image; 0 when the image describes it. */
static int kt_from_image(const char *image, const char *name, kt_func_t *f) {
    static const char header[] = "simgpu-module";
    if (!image || strncmp(image, header, sizeof header - 1)) return -1;
    const char *line = strchr(image, '\n');
    while (line && *line) {
        line++;
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        char buf[512];
        if (len >= sizeof buf) len = sizeof buf - 1;
        memcpy(buf, line, len);
        buf[len] = 0;
        char *tok[16];
        int nt = 0;
        char *save = NULL;
        for (char *t = strtok_r(buf, " \t", &save); t && nt < 16; t = strtok_r(NULL, " \t", &save)) tok[nt++] = t;
        if (nt >= 3 && !strcmp(tok[0], name)) {
            memset(f, 0, sizeof *f);
            snprintf(f->name, sizeof f->name, "%s", name);
            int i = 2;
            if (!strcmp(tok[1], "fixed")) { f->dist = KT_FIXED; f->a = kt_time(tok[i++]); }
            else if (!strcmp(tok[1], "perblock")) { f->dist = KT_PERBLOCK; f->a = kt_time(tok[i++]); }
            else if (!strcmp(tok[1], "lognormal") && nt >= 4) {
                f->dist = KT_LOGNORMAL; f->a = kt_time(tok[i++]); f->b = atof(tok[i++]);
            } else if (!strcmp(tok[1], "uniform") && nt >= 4) {
                f->dist = KT_UNIFORM; f->a = kt_time(tok[i++]); f->b = kt_time(tok[i++]);
            } else if (!strcmp(tok[1], "bimodal") && nt >= 5) {
                f->dist = KT_BIMODAL; f->a = kt_time(tok[i++]); f->b = kt_time(tok[i++]); f->c = atof(tok[i++]);
            } else {
                return -1;
            }
            while (i + 2 < nt) {
                if (!strcmp(tok[i], "drift")) { f->drift_period = kt_time(tok[i + 1]); f->drift_amp = atof(tok[i + 2]); }
                else if (!strcmp(tok[i], "phase")) { f->phase_period = kt_time(tok[i + 1]); f->phase_factor = atof(tok[i + 2]); }
                i += 3;
            }
            return 0;
        }
        line = eol;
    }
    return -1;
}

/* The fixed-cost model of functions no image describes. */
static void kt_default(const char *name, kt_func_t *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->dist = KT_PERBLOCK;
    f->a = 1000;
    const char *us = strrchr(name, '_');
    if (!strcmp(name, "sleep")) f->dist = KT_PARAM;
    else if (us && us[1] >= '0' && us[1] <= '9') f->a = (double)strtoull(us + 1, NULL, 10);
}

/* xorshift64* in thread-local state, seeded per thread */
static __thread uint64_t kt_rng;

static double kt_unit(void) {
    if (!kt_rng) {
        kt_rng = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)getpid() << 20) ^ (uint64_t)(uintptr_t)&kt_rng;
        const char *seed = getenv("SIMGPU_SEED");
        kt_rng ^= (seed && *seed ? strtoull(seed, NULL, 10) : 1) * 0xd1342543de82ef95ULL;
        if (!kt_rng) kt_rng = 1;
    }
    kt_rng ^= kt_rng >> 12;
    kt_rng ^= kt_rng << 25;
    kt_rng ^= kt_rng >> 27;
    return (double)((kt_rng * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

static double kt_gauss(void) {
    double u = kt_unit(), v = kt_unit();
    if (u < 1e-300) u = 1e-300;
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static double kt_lognormal(double mean, double cv) {
    double s2 = log(1.0 + cv * cv);
    return exp(log(mean) - s2 / 2 + sqrt(s2) * kt_gauss());
}

/* Duration in ns of one launch of `f` at time `now` with `blocks` thread blocks. */
static uint64_t kt_draw(const kt_func_t *f, uint64_t blocks, uint64_t now, uint64_t param) {
    double scale = 1.0, d;
    if (f->drift_period > 0) scale *= 1.0 + f->drift_amp * sin(6.283185307179586 * (double)now / f->drift_period);
    if (f->phase_period > 0 && ((uint64_t)((double)now / f->phase_period) & 1)) scale *= f->phase_factor;
    switch (f->dist) {
    case KT_PARAM: return param;
    case KT_FIXED: d = f->a; break;
    case KT_LOGNORMAL: d = kt_lognormal(f->a * scale, f->b); scale = 1; break;
    case KT_UNIFORM: d = f->a + (f->b - f->a) * kt_unit(); break;
    case KT_BIMODAL: d = kt_lognormal(kt_unit() < f->c ? f->b : f->a, 0.3); break;
    default: d = f->a * (double)blocks; break;
    }
    d *= scale;
    return d < 1 ? 1 : (uint64_t)d;
}

#endif
