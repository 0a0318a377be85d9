/*
 * objtable.h - the simulated driver's table of live device addresses and mappings.  TEST INFRASTRUCTURE.
 *
 * Separate chaining over 4096 buckets, one malloc'd node per record.  Not thread safe: callers lock.
 * ot_each visits every record (address-range queries: rare, so a full walk).
 */
#ifndef OBJTABLE_H
#define OBJTABLE_H

#include <stdint.h>
#include <stdlib.h>

typedef struct ot_node {
    struct ot_node *next;
    uint64_t addr;
    int tag;                  /* what the address names: a pointer, a mapping ... */
    int gpu;                  /* index into the process's view */
    int aux;                  /* what kind of it (an allocation API, a reference count ...) */
    uint64_t bytes;           /* what it holds */
    uint64_t asked;           /* what the caller asked for */
    uint64_t serial;          /* an export serial (gpusim.h gs_export_t), 0 when none */
    void *obj;
} ot_node_t;

#define OT_BUCKETS 4096
typedef struct { ot_node_t *bucket[OT_BUCKETS]; } ot_table_t;

static inline unsigned ot_slot(uint64_t addr, int tag) {
    uint64_t x = (addr >> 9) ^ (addr >> 23) ^ ((uint64_t)tag << 7);
    return (unsigned)(x * 11400714819323198485ULL >> 52) & (OT_BUCKETS - 1);
}

static ot_node_t *ot_get(ot_table_t *t, int tag, uint64_t addr) {
    for (ot_node_t *n = t->bucket[ot_slot(addr, tag)]; n; n = n->next)
        if (n->addr == addr && n->tag == tag) return n;
    return NULL;
}

static ot_node_t *ot_add(ot_table_t *t, int tag, uint64_t addr) {
    ot_node_t *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    unsigned s = ot_slot(addr, tag);
    n->addr = addr;
    n->tag = tag;
    n->next = t->bucket[s];
    t->bucket[s] = n;
    return n;
}

/* Unlinks and returns the record (the caller frees it), or NULL. */
static ot_node_t *ot_remove(ot_table_t *t, int tag, uint64_t addr) {
    for (ot_node_t **link = &t->bucket[ot_slot(addr, tag)]; *link; link = &(*link)->next) {
        ot_node_t *n = *link;
        if (n->addr == addr && n->tag == tag) {
            *link = n->next;
            return n;
        }
    }
    return NULL;
}

/* Calls fn on every record with tag `tag` until it returns nonzero; returns that record or NULL. */
static ot_node_t *ot_each(ot_table_t *t, int tag, int (*fn)(ot_node_t *, void *), void *arg) {
    for (unsigned b = 0; b < OT_BUCKETS; b++)
        for (ot_node_t *n = t->bucket[b], *next; n; n = next) {
            next = n->next;
            if (n->tag == tag && fn(n, arg)) return n;
        }
    return NULL;
}

#endif
