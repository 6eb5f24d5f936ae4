/*
 * ridmap.h: rid -> slot, for the Writer alone (private memory, one thread).
 *
 * Open addressing with linear probing and tombstones; the table has at least twice as many
 * entries as there are slots, so a probe always ends. Each bound slot owns a private copy of
 * its rid (the key) in its own 64-byte record: inline up to RID_INLINE bytes (every rid tsfront
 * makes), on the heap beyond, so checking a slot's rid is one cache line. An entry holds the
 * slot and the key's hash.
 */
#ifndef TSFRONT_RIDMAP_H
#define TSFRONT_RIDMAP_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MAP_EMPTY 0u
#define MAP_TOMB 0xffffffffu
#define RID_INLINE 48u

typedef struct {
    uint32_t slot1; /* slot + 1, or MAP_EMPTY / MAP_TOMB */
    uint32_t hash;
} map_entry_t;

/* A slot's rid: bound, its length, and its bytes (inline, or `heap` past RID_INLINE). */
typedef struct {
    uint32_t bound;
    uint32_t len;
    uint8_t *heap;
    uint8_t inl[RID_INLINE];
} rid_key_t;

typedef struct {
    map_entry_t *map;
    uint32_t mask, used, tombs;
    uint32_t nslots;
    rid_key_t *keys; /* per slot, 64-byte aligned */
} ridmap_t;

static inline uint64_t rid_hash(const uint8_t *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t k;
        memcpy(&k, s, 8);
        h = (h ^ (k * 0xc2b2ae3d27d4eb4fULL)) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 29;
        s += 8;
        n -= 8;
    }
    uint64_t k = 0;
    memcpy(&k, s, n);
    h = (h ^ (k * 0xc2b2ae3d27d4eb4fULL)) * 0x9e3779b97f4a7c15ULL;
    h ^= h >> 32;
    return h;
}

static inline const uint8_t *rid_key_bytes(const rid_key_t *k) {
    return k->len <= RID_INLINE ? k->inl : k->heap;
}

/* Whether `key` is the rid bound to `slot` (a guess checked: same answer as a lookup, since a
 * rid is bound to at most one slot). */
static inline int ridmap_holds(const ridmap_t *m, uint32_t slot, const uint8_t *key, uint32_t len) {
    if (slot >= m->nslots) return 0;
    const rid_key_t *k = &m->keys[slot];
    return k->bound && k->len == len && memcmp(rid_key_bytes(k), key, len) == 0;
}

/* Index of the table entry holding `key`, or -1. Inline: called once per row on the hot path. */
static inline int64_t ridmap_find(const ridmap_t *m, const uint8_t *key, uint32_t len, uint32_t h32) {
    uint32_t i = h32 & m->mask;
    for (;;) {
        const map_entry_t *e = &m->map[i];
        if (e->slot1 == MAP_EMPTY) return -1;
        if (e->slot1 != MAP_TOMB && e->hash == h32 && ridmap_holds(m, e->slot1 - 1, key, len))
            return i;
        i = (i + 1) & m->mask;
    }
}

/* The slot bound to `key`, or -1. */
static inline int64_t ridmap_lookup(const ridmap_t *m, const uint8_t *key, uint32_t len) {
    int64_t at = ridmap_find(m, key, len, (uint32_t)rid_hash(key, len));
    return at < 0 ? -1 : (int64_t)m->map[at].slot1 - 1;
}

static inline int ridmap_bound(const ridmap_t *m, uint32_t slot) { return m->keys[slot].bound != 0; }

/* 0, or -1 when out of memory. */
int ridmap_init(ridmap_t *m, uint32_t nslots);
void ridmap_free(ridmap_t *m);
/* Bind `key` to `slot` (which must be unbound, and `key` not bound). 0, or -1 out of memory. */
int ridmap_insert(ridmap_t *m, const uint8_t *key, uint32_t len, uint32_t slot);
/* Forget the rid bound to `slot`, if any. */
void ridmap_remove_slot(ridmap_t *m, uint32_t slot);

#endif
