/*
 * vgpu_map.h - a small process-local open-addressing hash map.
 *
 * Keys are (kind, 64-bit value) pairs so device pointers, VMM handles, arrays and pools can live in one table
 * without colliding.  Lookups, inserts and removals are O(1) on average.  The map is NOT thread safe by itself;
 * callers hold their own mutex.  Used by libvgpu.so (allocation records) and by the simulated driver.
 */
#ifndef VGPU_MAP_H
#define VGPU_MAP_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint64_t key;    /* 0 = empty */
    uint32_t kind;   /* 0 = empty, 0xffffffff = tombstone */
    int32_t dev;
    uint64_t size;
    uint64_t aux;    /* free-form: refcount, handle, pitch ... */
} vmap_entry_t;

typedef struct {
    vmap_entry_t *tab;
    size_t cap;      /* power of two */
    size_t used;     /* live entries */
    size_t filled;   /* live + tombstones */
} vmap_t;

#define VMAP_TOMB 0xffffffffu

static inline uint64_t vmap_hash(uint64_t k, uint32_t kind) {
    k ^= (uint64_t)kind * 0x9e3779b97f4a7c15ULL;
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

static int vmap_rehash(vmap_t *m, size_t ncap);

static inline vmap_entry_t *vmap_find(vmap_t *m, uint32_t kind, uint64_t key) {
    if (!m->tab) return NULL;
    size_t mask = m->cap - 1, i = vmap_hash(key, kind) & mask;
    for (;;) {
        vmap_entry_t *e = &m->tab[i];
        if (e->kind == 0) return NULL;
        if (e->kind == kind && e->key == key) return e;
        i = (i + 1) & mask;
    }
}

/* Returns the entry for (kind,key), inserting a zeroed one if absent; NULL only on allocation failure. */
static inline vmap_entry_t *vmap_put(vmap_t *m, uint32_t kind, uint64_t key) {
    if (!m->tab || (m->filled + 1) * 4 >= m->cap * 3) {
        size_t ncap = m->cap ? m->cap : 256;
        while ((m->used + 1) * 2 >= ncap) ncap *= 2;
        if (vmap_rehash(m, ncap)) return NULL;
    }
    vmap_entry_t *hit = vmap_find(m, kind, key);
    if (hit) return hit;
    size_t mask = m->cap - 1, i = vmap_hash(key, kind) & mask;
    for (;;) {
        vmap_entry_t *e = &m->tab[i];
        if (e->kind == 0 || e->kind == VMAP_TOMB) {
            if (e->kind == 0) m->filled++;
            memset(e, 0, sizeof *e);
            e->kind = kind;
            e->key = key;
            m->used++;
            return e;
        }
        i = (i + 1) & mask;
    }
}

static inline void vmap_del(vmap_t *m, vmap_entry_t *e) {
    e->kind = VMAP_TOMB;
    e->key = 0;
    m->used--;
}

static int vmap_rehash(vmap_t *m, size_t ncap) {
    vmap_entry_t *old = m->tab;
    size_t ocap = m->cap;
    vmap_entry_t *tab = calloc(ncap, sizeof *tab);
    if (!tab) return -1;
    m->tab = tab;
    m->cap = ncap;
    m->used = 0;
    m->filled = 0;
    for (size_t i = 0; i < ocap; i++) {
        if (old[i].kind && old[i].kind != VMAP_TOMB) {
            size_t mask = ncap - 1, j = vmap_hash(old[i].key, old[i].kind) & mask;
            while (tab[j].kind) j = (j + 1) & mask;
            tab[j] = old[i];
            m->used++;
            m->filled++;
        }
    }
    free(old);
    return 0;
}

static inline void vmap_clear(vmap_t *m) {
    free(m->tab);
    memset(m, 0, sizeof *m);
}

#endif
