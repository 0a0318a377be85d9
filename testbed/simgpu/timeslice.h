/*
 * timeslice.h - the simulated GPU's time-slicing engine.  TEST INFRASTRUCTURE.  Included by gpusim.h.
 *
 * A real GPU runs one context at a time and switches between the contexts that have work when the running one's
 * time slice ends (a kernel still running is preempted and resumes in that context's next slice), or when the
 * running one has nothing left to do; a switch costs the engine a little time.  So a kernel's end, and the time
 * an event records, depend on what other processes submit afterwards: unlike the first-in-first-out engine of
 * gpusim.h, nothing can be worked out when the work is submitted.
 *
 * The model: each process that has work on a GPU owns one run queue there (its contexts share it), a ring of
 * items, each a kernel (device ns still to run) or an event's mark (0 ns, or SIMGPU_EVENT_NS).  The engine takes
 * the queues round robin, for at most one slice each, the items of a queue in order; an item of 0 ns that follows
 * the item just finished is reached at once, within the same slice.  Nothing runs the schedule in the background:
 * whoever looks at the GPU (a submission, a query or synchronisation, NVML, the busy counters) works the schedule
 * out up to the present under the GPU's lock first (gs_ts_advance_locked), writing the run segments into the
 * device's and each process's timeline as they happen, so NVML's per-process utilization is what ran.  Callers
 * hold tickets (a queue and a sequence number) instead of times and turn them into times once the schedule has
 * reached them; a caller that waits sleeps until the earliest time its item could end (gs_ts_project_locked)
 * and looks again.
 */
#ifndef TIMESLICE_H
#define TIMESLICE_H

#define GS_TICKET (1ULL << 63)   /* a value with this bit is a ticket, not a time */
#define GS_TICKET_REACH (1ULL << 62)   /* ... for when the engine reaches the item, not when it ends */
#define GS_TICKET_SEQ ((1ULL << 52) - 1)
#define GS_NEVER UINT64_MAX

static inline uint64_t gs_ticket(int q, uint64_t seq, int reach) {
    return GS_TICKET | (reach ? GS_TICKET_REACH : 0) | ((uint64_t)q << 52) | (seq & GS_TICKET_SEQ);
}
static inline int gs_ticket_queue(uint64_t t) { return (int)((t >> 52) & 0xff); }

/* The slice length and switch cost this process was started with (0: no time slicing). */
static uint64_t gs_ts_slice_env(void) {
    static int64_t v = -1;
    if (v < 0) v = (int64_t)gs_env_num("SIMGPU_TIMESLICE_NS", 0);
    return (uint64_t)v;
}
static uint64_t gs_ts_switch_env(void) {
    static int64_t v = -1;
    if (v < 0) v = (int64_t)gs_env_num("SIMGPU_CTXSW_NS", 0);
    return (uint64_t)v;
}

/* Does queue q have work that may run?  A queue whose owner is gone loses its work (as a context that died). */
static int gs_ts_runnable(gs_gpu_t *g, int q) {
    gs_runq_t *r = &g->rq[q];
    if (!r->gen || r->head >= r->next) return 0;
    const gs_proc_t *pr = &gs_st->proc[r->proc];
    if (!pr->pid || pr->gen != r->gen) {
        r->head = r->next;
        return 0;
    }
    return 1;
}

/* The next queue with work after queue `after` (-1: from the start), round robin; `after` itself last. */
static int gs_ts_pick(gs_gpu_t *g, int after) {
    for (int k = 1; k <= GS_TSQ; k++) {
        int q = (after + k + GS_TSQ) % GS_TSQ;
        if (gs_ts_runnable(g, q)) return q;
    }
    return -1;
}

/* Caller holds g->mu.  Works the schedule out from where it stands to `now`. */
static void gs_ts_advance_locked(gs_gpu_t *g, uint64_t now) {
    if (!g->ts_slice) return;
    uint64_t t = g->ts_now ? g->ts_now : now;
    int gslot = (int)(g - gs_st->gpu);
    while (t < now) {
        int cur = g->ts_cur - 1;
        if (cur < 0 || g->ts_slice_left == 0 || !gs_ts_runnable(g, cur)) {
            int next = gs_ts_pick(g, cur);
            if (next < 0) {   /* nothing to run: idle until now */
                g->ts_cur = 0;
                g->ts_switch_left = 0;
                t = now;
                break;
            }
            if (cur >= 0 && next != cur) g->ts_switch_left = g->ts_switch;
            g->ts_cur = next + 1;
            g->ts_slice_left = g->ts_slice;
            cur = next;
        }
        if (g->ts_switch_left) {
            uint64_t d = g->ts_switch_left < now - t ? g->ts_switch_left : now - t;
            g->ts_switch_left -= d;
            t += d;
            continue;
        }
        gs_runq_t *r = &g->rq[cur];
        gs_item_t *it = &r->ring[r->head % GS_TSRING];
        if (it->at == GS_NEVER) it->at = t;
        uint64_t run = it->left;
        if (run > g->ts_slice_left) run = g->ts_slice_left;
        if (run > now - t) run = now - t;
        if (run) {
            gs_proc_t *pr = &gs_st->proc[r->proc];
            gs_tl_add(g->tl, GS_DEV_BINS, GS_DEV_TICK, t, t + run);
            gs_tl_add(pr->tl[gslot], GS_PROC_BINS, GS_PROC_TICK, t, t + run);
            g->busy_ns += run;
            pr->busy_ns[gslot] += run;
            it->left -= run;
            g->ts_slice_left -= run;
            t += run;
        }
        if (it->left) continue;
        it->fin = t;
        r->head++;
        while (r->head < r->next) {   /* marks right behind it are reached at once */
            gs_item_t *mark = &r->ring[r->head % GS_TSRING];
            if (mark->left) break;
            mark->at = mark->fin = t;
            r->head++;
        }
    }
    g->ts_now = t;
}

/* Works GPU g's schedule out to the present, for a reader of its timelines or counters. */
static void gs_ts_catch_up(gs_gpu_t *g) {
    if (!__atomic_load_n(&g->ts_slice, __ATOMIC_ACQUIRE)) return;
    gs_lock(&g->mu);
    gs_ts_advance_locked(g, gs_clock());
    gs_unlock(&g->mu);
}

/* Caller holds g->mu.  This process's run queue on g, claimed if it has none; -1 when every queue is taken. */
static int gs_ts_queue_locked(gs_gpu_t *g) {
    const gs_proc_t *me = &gs_st->proc[gs_me];
    int free_q = -1;
    for (int q = 0; q < GS_TSQ; q++) {
        gs_runq_t *r = &g->rq[q];
        if (r->gen && r->proc == gs_me && r->gen == me->gen) return q;
        if (free_q >= 0) continue;
        if (!r->gen || !gs_st->proc[r->proc].pid || gs_st->proc[r->proc].gen != r->gen) free_q = q;
    }
    if (free_q < 0) return -1;
    gs_runq_t *r = &g->rq[free_q];
    if (!r->next) r->next = 1;   /* sequence numbers go on from the last owner's: old ring entries never match */
    r->head = r->next;
    r->proc = gs_me;
    r->gen = me->gen;
    return free_q;
}

/* Caller holds g->mu.  Appends an item of `left` ns to queue q (which has room); its sequence number. */
static uint64_t gs_ts_push_locked(gs_gpu_t *g, int q, uint64_t left) {
    gs_runq_t *r = &g->rq[q];
    uint64_t seq = r->next++;
    gs_item_t *it = &r->ring[seq % GS_TSRING];
    if (it->seq && it->fin != GS_NEVER && it->fin > r->lost_fin) r->lost_fin = it->fin;
    it->seq = seq;
    it->left = left;
    it->at = it->fin = GS_NEVER;
    return seq;
}

/* Caller holds g->mu and has advanced the schedule.  The time a ticket stands for; GS_NEVER while the schedule has
 * not got there. */
static uint64_t gs_ts_lookup_locked(gs_gpu_t *g, uint64_t ticket) {
    gs_runq_t *r = &g->rq[gs_ticket_queue(ticket)];
    uint64_t seq = ticket & GS_TICKET_SEQ;
    const gs_item_t *it = &r->ring[seq % GS_TSRING];
    int reach = (ticket & GS_TICKET_REACH) != 0;
    if (it->seq != seq) return seq < r->head ? r->lost_fin : GS_NEVER;   /* reused: it ended by lost_fin */
    return reach ? it->at : it->fin;
}

/* Caller holds g->mu and has advanced the schedule.  The earliest time the ticket's item can be reached (or end)
 * if nothing more is submitted: the schedule played forward on each queue's total of work left. */
static uint64_t gs_ts_project_locked(gs_gpu_t *g, uint64_t ticket) {
    int q = gs_ticket_queue(ticket);
    uint64_t seq = ticket & GS_TICKET_SEQ, left[GS_TSQ];
    if (ticket & GS_TICKET_REACH) seq--;   /* reached when everything before it has ended */
    for (int j = 0; j < GS_TSQ; j++) {
        left[j] = 0;
        if (!gs_ts_runnable(g, j)) continue;
        gs_runq_t *r = &g->rq[j];
        uint64_t upto = j == q ? seq + 1 : r->next;
        for (uint64_t s = r->head; s < upto && s < r->next; s++) left[j] += r->ring[s % GS_TSRING].left;
    }
    uint64_t t = g->ts_now, slice_left = g->ts_slice_left, sw = g->ts_switch_left;
    int cur = g->ts_cur - 1;
    for (int step = 0; left[q] && step < 1000000; step++) {
        if (cur < 0 || slice_left == 0 || !left[cur]) {
            int next = -1;
            for (int k = 1; k <= GS_TSQ && next < 0; k++)
                if (left[(cur + k + GS_TSQ) % GS_TSQ]) next = (cur + k + GS_TSQ) % GS_TSQ;
            if (cur >= 0 && next != cur) sw = g->ts_switch;
            cur = next;
            slice_left = g->ts_slice;
        }
        uint64_t run = left[cur] < slice_left ? left[cur] : slice_left;
        t += sw + run;
        sw = 0;
        left[cur] -= run;
        slice_left -= run;
    }
    return t;
}

#endif
